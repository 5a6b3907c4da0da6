"""`ttbundle pack`, `verify`, `install`, `uninstall`: archives and installs."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from .options import FormatOption, ModelsDirOption
from .output import Format, Output, summary


@contextmanager
def _progress(label: str, enabled: bool):
    """A rich progress bar on a terminal; nothing when output is piped."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
        console=Output().err,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def pack(
    bundle: Annotated[Path, typer.Argument(help="The bundle folder.")],
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Where to write the archive.")
    ] = Path("."),
) -> None:
    """Write <name>-<version>.ttbundle: a deterministic, verifiable archive.

    Refuses an invalid bundle. The archive's path is the last line of standard output.

    Example: ttbundle pack my-bundle -o dist/
    """
    from ttbundles.build import pack as pack_bundle

    with _progress(f"packing {bundle.name}", True) as progress:
        path = pack_bundle(bundle, output_dir, progress=progress)
    Output().plain(str(path))


def verify(
    path: Annotated[Path, typer.Argument(help="A .ttbundle archive or an installed bundle.")],
    fmt: FormatOption = Format.human,
) -> None:
    """Recompute every digest; name each mismatched, missing or extra file.

    Example: ttbundle verify dist/my-bundle-1.0.0.ttbundle
    """
    from ttbundles.archive.reader import verify as verify_path

    out = Output(fmt)
    report = verify_path(path)
    if out.is_json:
        out.json(
            {
                "path": str(path),
                "valid": report.ok(),
                "diagnostics": [d.to_dict() for d in report.diagnostics],
            }
        )
    else:
        out.diagnostics(report.diagnostics)
        out.line(
            f"{path}: {'verified' if report.ok() else 'FAILED'} ({summary(report.diagnostics)})",
            style="green" if report.ok() else "bold red",
        )
    raise typer.Exit(0 if report.ok() else 1)


def install(
    archive: Annotated[Path, typer.Argument(help="The .ttbundle archive.", dir_okay=False)],
    models_dir: ModelsDirOption = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace an installed bundle of the same name.")
    ] = False,
) -> None:
    """Verify, then install atomically into the models folder.

    Example: EXTRA_MODELS_DIR=/opt/tt-bundles ttbundle install my-bundle-1.0.0.ttbundle
    """
    from ttbundles.archive.install import install as install_archive
    from ttbundles.archive.install import resolve_models_dir

    target = install_archive(archive, resolve_models_dir(models_dir), replace=replace)
    Output().plain(str(target))


def uninstall(
    name: Annotated[str, typer.Argument(help="The bundle's name.")],
    models_dir: ModelsDirOption = None,
) -> None:
    """Remove an installed bundle.

    Example: ttbundle uninstall my-bundle --models-dir /opt/tt-bundles
    """
    from ttbundles.archive.install import resolve_models_dir
    from ttbundles.archive.install import uninstall as uninstall_bundle

    removed = uninstall_bundle(name, resolve_models_dir(models_dir))
    Output().plain(str(removed))
