"""`ttbundle validate`: every problem of bundles, archives or folders of bundles."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from ttbundles.check.validate import validate_path
from ttbundles.codes import UNVERIFIABLE
from ttbundles.errors import Severity

from .options import FormatOption
from .output import Format, Output, summary

_UNVERIFIABLE = ", ".join(sorted(UNVERIFIABLE))


def validate(
    paths: Annotated[
        list[Path],
        typer.Argument(help="Bundle folders, .ttbundle archives, or folders of bundles."),
    ],
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Treat warnings as errors, except those saying something could not be "
            f"checked here ({_UNVERIFIABLE}: a computed value, code outside the bundle, a "
            "class from an environment this machine lacks).",
        ),
    ] = False,
    strict_unverifiable: Annotated[
        bool,
        typer.Option(
            "--strict-unverifiable",
            help=f"Make what could not be checked here ({_UNVERIFIABLE}) errors, notes "
            "included; independent of --strict. For machines where TT-Metal and the "
            "bundle's dependencies are installed, with --import.",
        ),
    ] = False,
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
        bool,
        typer.Option("--verbose", "-v", help="More detail: notes too (what was not checked)."),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Check bundles against the format and the generator contract, without running them.

    Exit 0 when valid (warnings allowed unless --strict), 1 when invalid.
    --strict and --strict-unverifiable are independent; use both for the strictest check.

    Example: ttbundle validate bundles/demo my-bundle/ dist/my-bundle-1.0.0.ttbundle
    """
    out = Output(fmt)
    results = [(path, validate_path(path, import_check=import_, timeout=timeout)) for path in paths]
    ok = all(result.ok(strict, strict_unverifiable) for _, result in results)
    if out.is_json:
        out.result(
            ok,
            [d for _, result in results for d in result.diagnostics(strict, strict_unverifiable)],
            valid=ok,
            strict=strict,
            strict_unverifiable=strict_unverifiable,
            paths=[
                {
                    "path": str(path),
                    "valid": result.ok(strict, strict_unverifiable),
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
        )
    else:
        for path, result in results:
            diagnostics = result.diagnostics(strict, strict_unverifiable)
            out.diagnostics([d for d in diagnostics if verbose or d.severity is not Severity.INFO])
            names = ", ".join(b.metadata.name for b in result.bundles if b.metadata) or "-"
            valid = result.ok(strict, strict_unverifiable)
            verdict, style = ("valid", "green") if valid else ("INVALID", "bold red")
            out.line(f"{path}: {verdict} ({summary(diagnostics)}; bundles: {names})", style=style)
    raise typer.Exit(0 if ok else 1)
