"""`ttbundle plan`: which bundle serves a model, and every configuration decision."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Annotated

import typer

from .options import FormatOption
from .output import Format, Output, short_path
from .usage import no_such_option


def plan(
    ctx: typer.Context,
    model: Annotated[
        str | None,
        typer.Option(
            "--model",
            metavar="MODEL",
            help="Checkpoint folder or hub repo (or give it first, as for vllm serve).",
        ),
    ] = None,
    mesh: Annotated[
        str | None,
        typer.Option(metavar="MESH", help="Mesh to plan for (default: $MESH_DEVICE)."),
    ] = None,
    models_dir: Annotated[
        list[Path] | None,
        typer.Option(
            "--models-dir",
            metavar="DIR",
            help="Folders of bundles, in order (repeatable). Default: $EXTRA_MODELS_DIR.",
            file_okay=False,
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Also show vLLM's log (on stderr).")
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Print what `vllm serve MODEL ...` would decide, and fail with the error it would give.

    Takes vllm serve's command line: the model first, then any vllm serve options.

    Example: ttbundle plan ./ckpt --mesh HOST --max-model-len 2048 --async-scheduling
    """
    from ttbundles.serving.dry_run import ServeOptionsError, make_plan

    out = Output(fmt)
    log = io.StringIO()  # vLLM's log: the plan is the output; -v shows the log too
    try:
        result = make_plan(
            model, list(ctx.args), mesh=mesh, models_dirs=models_dir or None, log=log
        )
    except ServeOptionsError as exc:  # a usage error: one line and exit 2, not vLLM's usage
        if out.is_json:
            out.result(False, exc.diagnostics)
        elif exc.unknown:
            ours = [o for p in ctx.command.params for o in getattr(p, "opts", [])]
            text = no_such_option(
                ctx.command_path, exc.unknown[0], ours + exc.known, also="vllm serve --help"
            )
            sys.stderr.write(text + "\n")
        else:
            out.diagnostics(exc.diagnostics, stderr=True)
        sys.exit(2)
    finally:
        if verbose:
            sys.stderr.write(log.getvalue())
    from ttbundles.errors import Diagnostic, Severity

    problems = [
        Diagnostic(**{**p, "severity": Severity(p["severity"])})
        for p in result.pop("problems", None) or []
    ]
    if out.is_json:
        out.result(True, problems, **result)  # the problems as every command's diagnostics
        return
    bundle = result["bundle"]
    out.line(
        f"{result['tt_arch']}: {bundle['name']}@{bundle['version']} ({bundle['source']}, "
        f"{short_path(bundle['path'])}) on mesh {result['mesh'] or 'unset'}",
        style="bold",
    )
    out.table(
        "decisions",
        ["setting", "requested", "effective", "reason"],
        [[d["setting"], d["requested"], d["effective"], d["reason"]] for d in result["decisions"]],
        head=3,
    )
    out.diagnostics(problems, stderr=True)
