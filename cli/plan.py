"""`ttbundle plan`: which bundle serves a model, and every configuration decision."""

from __future__ import annotations

import io
import sys
import time
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
    for arg in ctx.args:
        option = arg.partition("=")[0]
        slip = next((o for o in ours if o.startswith("--") and _one_slip(option, o)), None)
        if slip is not None:
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
    from ttbundles.errors import TTBundleError, missing_path
    from ttbundles.hub import answer_offline

    # A --models-dir typed wrong is an error now, as for list (not a note in vLLM's log).
    absent = [folder for folder in models_dir or [] if not folder.is_dir()]
    if absent:
        raise TTBundleError([missing_path(folder, what="models folder") for folder in absent])

    # Without a network a hub id is answered from the cache or refused (TTB208) now, not
    # after vLLM's and the hub's retries (33 s).
    source = model or (ctx.args[0] if ctx.args and not ctx.args[0].startswith("-") else None)
    if source is not None:
        answer_offline(source)
    from ttbundles.serving.dry_run import ServeOptionsError, make_plan

    log = io.StringIO()  # vLLM's log: the plan is the output; --vllm-log shows it too
    stages = not out.is_json and out.err.is_terminal
    if stages:
        out.err.print("plan: building the configuration as vllm serve does (imports vLLM)...")
    began = time.monotonic()
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
        if vllm_log:
            sys.stderr.write(log.getvalue())
        if stages:
            out.err.print(f"plan: vLLM took {time.monotonic() - began:.1f} s")
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


def _one_slip(word: str, option: str) -> bool:
    """`word` is `option` with one typing slip: two neighbours swapped (`--fromat`), one
    character wrong, missing or extra. Tighter than a did-you-mean, since a word that is
    not ours may be one of vLLM's options (`--load-format` is not a slip of `--format`)."""
    if word == option:
        return False
    if len(word) == len(option):
        diff = [i for i, (a, b) in enumerate(zip(word, option)) if a != b]
        if len(diff) == 1:
            return True
        return (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and word[diff[0]] == option[diff[1]]
            and word[diff[1]] == option[diff[0]]
        )
    short, long = sorted((word, option), key=len)
    if len(long) - len(short) != 1:
        return False
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))
