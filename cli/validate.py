"""`ttbundle validate`: every problem of bundles, archives or folders of bundles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ttbundles.check.validate import validate_path
from ttbundles.errors import Severity

from .options import FormatOption
from .output import Format, Output, summary


def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(help="Bundle folders, .ttbundle archives, or folders of bundles."),
    ],
    strict: Annotated[bool, typer.Option("--strict", help="Treat warnings as errors.")] = False,
    import_: Annotated[
        bool,
        typer.Option(
            "--import",
            help="Also import each adapter in a subprocess and check "
            "its signatures (runs bundle code).",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds allowed for each --import.", min=1)
    ] = 60.0,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also show notes (what was not checked).")
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Check bundles against the format and the generator contract, without running them.

    Exit 0 when valid (warnings allowed unless --strict), 1 when invalid.

    Example: ttbundle validate bundles/ my-bundle/ dist/my-bundle-1.0.0.ttbundle
    """
    out = Output(fmt)
    results = [(path, validate_path(path, import_check=import_, timeout=timeout)) for path in paths]
    ok = all(result.ok(strict) for _, result in results)
    if out.is_json:
        out.json(
            {
                "valid": ok,
                "strict": strict,
                "paths": [
                    {
                        "path": str(path),
                        "valid": result.ok(strict),
                        "bundles": [
                            {
                                "path": str(b.path),
                                "name": b.metadata.name if b.metadata else None,
                                "version": b.metadata.version if b.metadata else None,
                                "legacy": b.metadata.legacy if b.metadata else None,
                            }
                            for b in result.bundles
                        ],
                        "diagnostics": [d.to_dict() for d in result.report.diagnostics],
                    }
                    for path, result in results
                ],
            }
        )
    else:
        for path, result in results:
            diagnostics = result.report.diagnostics
            if strict:
                diagnostics = [
                    d
                    if d.severity is not Severity.WARNING
                    else d.__class__(**{**d.__dict__, "severity": Severity.ERROR})
                    for d in diagnostics
                ]
            out.diagnostics([d for d in diagnostics if verbose or d.severity is not Severity.INFO])
            names = ", ".join(b.metadata.name for b in result.bundles if b.metadata) or "-"
            verdict = "valid" if result.ok(strict) else "INVALID"
            style = "green" if result.ok(strict) else "bold red"
            out.line(f"{path}: {verdict} ({summary(diagnostics)}; bundles: {names})", style=style)
    raise typer.Exit(0 if ok else 1)
