"""`ttbundle plan`: which bundle serves a model, and every configuration decision."""

from __future__ import annotations

import io
import sys
import time
from pathlib import Path
from typing import Annotated

import typer

from ttbundles.suggest import slipped_option

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
    vllm_log: Annotated[
        bool, typer.Option("--vllm-log", help="Also show vLLM's log (on stderr).")
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="More detail: whole paths (default: shortened)."),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Print what `vllm serve MODEL ...` would decide, and fail with the error it would give.

    Takes vllm serve's command line: the model first, then any vllm serve options.

    Example: ttbundle plan ./ckpt --mesh HOST --max-model-len 2048 --async-scheduling
    """
    out = Output(fmt)
    ours = [o for p in ctx.command.params for o in getattr(p, "opts", [])]
    # A slip in one of our own options is answered at once, not after vLLM's import (15 s)
    # and its parser: vLLM's options are not known before then, ours are.
    slipped = slipped_option(ctx.args, ours)
    if slipped is not None:
        option, slip = slipped
        if out.is_json:
            from ttbundles.errors import Diagnostic, Severity

            out.result(
                False,
                [
                    Diagnostic(
                        "TTB004",
                        Severity.ERROR,
                        f"no such option {option}",
                        hint=f"did you mean {slip}?",
                    )
                ],
            )
        else:
            sys.stderr.write(no_such_option(ctx.command_path, option, ours, also="") + "\n")
        sys.exit(2)
    from ttbundles.serving.dry_run import ServeOptionsError, plan_serve

    log = io.StringIO()  # vLLM's log: the plan is the output; --vllm-log shows it too
    stages = not out.is_json and out.err.is_terminal
    if stages:
        out.err.print("plan: building the configuration as vllm serve does (imports vLLM)...")
    began = time.monotonic()
    try:
        result, problems = plan_serve(
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
        if vllm_log:
            sys.stderr.write(log.getvalue())
        if stages:
            out.err.print(f"plan: vLLM took {time.monotonic() - began:.1f} s")
    if out.is_json:
        out.result(True, problems, **result)  # the problems as every command's diagnostics
        return
    bundle = result["bundle"]
    out.line(
        f"{result['tt_arch']}: {bundle['name']}@{bundle['version']} ({bundle['source']}, "
        f"{short_path(bundle['path'], verbose=verbose)}) on mesh {result['mesh'] or 'unset'}",
        style="bold",
    )
    out.table(
        "decisions",
        ["setting", "requested", "effective", "reason"],
        [[d["setting"], d["requested"], d["effective"], d["reason"]] for d in result["decisions"]],
        head=3,
    )
    if result.get("evidence_note"):
        out.line(result["evidence_note"])
    out.diagnostics(problems, stderr=True)
