"""`ttbundle compat VERSION`: before a vLLM upgrade, what would still register."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import BundleFoldersOption, FormatOption, MeshOption
from .output import Format, Output, short_path


def compat(
    version: Annotated[str, typer.Argument(help="The vLLM release to ask about, e.g. 0.34.0.")],
    models_dir: BundleFoldersOption = None,
    mesh: MeshOption = None,
    fmt: FormatOption = Format.human,
) -> None:
    """Which installed and built-in bundles would register on vLLM VERSION, without
    installing it: each bundle's requires.vllm against VERSION, and VERSION against the
    tested window. Exits 1 when a bundle that registers now would not (TTB218); a release
    outside the window is a warning (TTB217).

    Example: ttbundle compat 0.34.0
    """
    from ttbundles import vllm_window
    from ttbundles.registry.upgrade import check_release

    try:
        report = check_release(version, models_dirs=models_dir or None, mesh=mesh)
    except ValueError as error:
        raise typer.BadParameter(str(error), param_hint="VERSION") from error
    out = Output(fmt)
    if out.is_json:
        out.result(not report.lost, report.problems, **report.to_dict())
    else:
        out.line(report.verdict.line())
        out.table(
            f"on vLLM {report.version} (tested window: {vllm_window.window_text()})",
            ["architecture", "bundle", "source", "now", f"on {report.version}", "path / reason"],
            [
                [
                    b.tt_arch or "-",
                    b.bundle or "-",
                    b.source,
                    b.now,
                    b.verdict,
                    b.reason or short_path(b.path, verbose=False),
                ]
                for b in report.bundles
            ],
            head=4,
        )
        out.diagnostics(report.problems)
    if report.lost:
        raise typer.Exit(1)
