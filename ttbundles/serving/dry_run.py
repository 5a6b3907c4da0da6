"""`ttbundle plan`: what a `vllm serve` would decide, without starting an engine.

It builds the configuration exactly as `vllm serve` does (vLLM's own argument parser and
`EngineArgs.create_engine_config`), with the TT platform forced active, so the platform
hook that decides in the server decides here: one code path, the same errors.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ttbundles import envs
from ttbundles.errors import Diagnostic, Severity, TTBundleError


class _LogSink:
    """The stream vLLM's log handler writes to during a plan: forwards to `target`."""

    def __init__(self) -> None:
        self.target: Any = sys.stderr

    def write(self, text: str) -> int:
        return self.target.write(text)

    def flush(self) -> None:
        self.target.flush()

    def isatty(self) -> bool:
        return False


LOG_SINK = _LogSink()


class ServeOptionsError(TTBundleError):
    """The vllm serve options do not parse: a usage error (exit 2), said in one line.

    `unknown` holds the options vLLM did not recognise and `known` every option it has,
    for callers that add options of their own to suggest from."""

    def __init__(self, diagnostic: Diagnostic, unknown: list[str], known: list[str]):
        super().__init__(diagnostic)
        self.unknown = unknown
        self.known = known


def plan_serve(
    model: str | None,
    serve_args: list[str],
    *,
    mesh: str | None = None,
    models_dirs: list[Path] | None = None,
    log: Any = None,
) -> tuple[dict[str, Any], list[Diagnostic]]:
    """`ttbundle plan`'s work: (the plan, its problems as diagnostics).

    What can be refused before vLLM's import (15 s) is refused first: a `--models-dir`
    typed wrong (TTB001, as for `list`), and, without a network, a hub id not in the
    cache (TTB208; not after vLLM's and the hub's retries, 33 s). The model is `model`,
    else the first of `serve_args` when it is not an option, as `vllm serve` reads it.
    """
    from ttbundles.errors import missing_path
    from ttbundles.hub import answer_offline

    absent = [folder for folder in models_dirs or [] if not Path(folder).is_dir()]
    if absent:
        raise TTBundleError([missing_path(folder, what="models folder") for folder in absent])
    source = model or (serve_args[0] if serve_args and not serve_args[0].startswith("-") else None)
    if source is not None:
        answer_offline(source)
    result = make_plan(model, serve_args, mesh=mesh, models_dirs=models_dirs, log=log)
    problems = [
        Diagnostic(**{**p, "severity": Severity(p["severity"])})
        for p in result.pop("problems", None) or []
    ]
    return result, problems


def make_plan(
    model: str | None,
    serve_args: list[str],
    *,
    mesh: str | None = None,
    models_dirs: list[Path] | None = None,
    log: Any = None,
) -> dict[str, Any]:
    """The plan as a dict: bundle, mesh, effective device options, decisions, problems.

    `serve_args` are `vllm serve`'s own arguments, the model positional among them when
    `model` is None (`ttbundle plan MODEL --max-model-len 2048` reads like `vllm serve`).
    `models_dirs` replaces EXTRA_MODELS_DIR, as `ttbundle list --models-dir` does.
    vLLM's log (and ours, its child) goes to `log`, a text stream, instead of stderr:
    the plan is the output; a caller shows the log on request (`plan --vllm-log`).
    """
    from ttbundles.format.meshes import mesh_or_none
    from ttbundles.paths import model_argument
    from ttbundles.registry import servable

    # The mesh and the model first: either missing or wrong is the one error, before
    # vLLM is even imported.
    if model is None and not serve_args:
        _no_model()
    if mesh is not None:
        chosen = mesh_or_none(mesh, source="--mesh")
    else:
        chosen = mesh_or_none(envs.MESH_DEVICE)
    if chosen is not None:
        os.environ["MESH_DEVICE"] = chosen.name
    else:
        os.environ.pop("MESH_DEVICE", None)
    for typed in [model] if model is not None else serve_args[:1]:
        if not typed.startswith("-"):
            model_argument(typed)  # a missing local folder: TTB001 before vLLM loads
    if models_dirs is not None:
        os.environ["EXTRA_MODELS_DIR"] = os.pathsep.join(str(p) for p in models_dirs)
    # vLLM logs to stdout by default; stdout carries the plan (JSON for machines), and
    # the log goes to `log` (vLLM configures its logging again while it builds the
    # config, each time from this variable).
    LOG_SINK.target = log if log is not None else sys.stderr
    os.environ["VLLM_LOGGING_STREAM"] = f"ext://{__name__}.LOG_SINK"
    from ttbundles.serving import compat
    from ttbundles.serving.platform import TTPlatform

    # A vLLM lacking a module the plan imports: TTB216, as vllm serve says it.
    compat.require_modules()
    # Planning for a mesh that is not attached here: the TT platform decides regardless.
    TTPlatform.planning = True
    compat.set_current_platform(TTPlatform())
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.usage.usage_lib import UsageContext
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ttbundles.serving.planning.plan import served_plan
    from ttbundles.serving.registration import register_all

    register_all()
    parser = make_arg_parser(FlexibleArgumentParser(prog="ttbundle plan"))
    args = _parse(parser, serve_args, model)
    args.model = model_argument(args.model)  # what the user typed, from where they typed it
    try:
        # The server's call, with the server's usage context: its defaults (max_num_seqs
        # 256 rather than the offline 128) are the server's.
        # `--headless` (a host of a multi-node data-parallel server other than the head)
        # changes what vLLM makes of --data-parallel-start-rank: planned as that host.
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config(
            usage_context=UsageContext.OPENAI_API_SERVER, headless=bool(args.headless)
        )
    except TTBundleError:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's own validation errors, reported cleanly
        code = "TTB208" if not Path(args.model).exists() and "/" not in args.model else "TTB209"
        raise TTBundleError(Diagnostic(code, Severity.ERROR, server_error_text(exc))) from None
    served = served_plan(config)  # as the engine reads it: the round trip included
    plan = served.to_dict() if served is not None else {}
    plan["model"] = args.model
    plan["mesh"] = chosen.name if chosen is not None else None
    # What the server would warn of at start-up (a lowered setting: TTB246) comes first.
    warnings = list(plan.pop("warnings", None) or [])
    problems = []
    device = servable.device_problem(chosen)
    if device is not None:
        problems.append(
            Diagnostic(
                "TTB107",
                Severity.WARNING,
                f"planned for mesh {chosen.name}, which this machine cannot open (ttnn, "
                "TT-Metal, is not importable here): vllm serve here would fail with TTB107; "
                "whether the bundle's class imports there was not checked",
                hint="run the plan where the mesh is attached for the full check",
            )
        )
    plan["problems"] = warnings + [d.to_dict() for d in problems]
    return plan


def server_error_text(exc: BaseException) -> str:
    """What `vllm serve` says when its configuration fails, without the noise.

    vLLM's configs are pydantic dataclasses: their errors read "1 validation error for
    ModelConfig / Value error, <the reason> [type=..., input_value=...] / For further
    information visit <url>". The reason is the message; the rest is pydantic's."""
    errors = getattr(exc, "errors", None)
    if callable(errors):
        try:
            items = errors()
        except Exception:  # noqa: BLE001 - not pydantic's errors() after all
            items = None
        if items:
            reasons = []
            for item in items:
                text = str(item.get("msg", "")).strip()
                for prefix in ("Value error, ", "Assertion failed, "):
                    text = text.removeprefix(prefix)
                where = ".".join(str(part) for part in item.get("loc", ()) if part != "__root__")
                reasons.append(f"{where}: {text}" if where and text else text)
            title = getattr(exc, "title", "") or type(exc).__name__
            return f"{title}: " + "; ".join(r for r in reasons if r)
    lines = [
        line.strip()
        for line in str(exc).strip().splitlines()
        if line.strip() and "errors.pydantic.dev" not in line
    ]
    return f"{type(exc).__name__}: {' '.join(lines)}" if lines else type(exc).__name__


def _parse(parser: Any, serve_args: list[str], model: str | None) -> Any:
    """vllm serve's parse, with its errors as one line (and a did-you-mean) instead of
    argparse's usage of every vLLM option."""
    from ttbundles.suggest import did_you_mean

    def error(message: str) -> None:
        hint = "see vllm serve --help for its options"
        known = list(parser._option_string_actions)
        unknown = []
        if message.startswith("unrecognized arguments:"):
            words = message.partition(":")[2].split()
            unknown = [w.split("=")[0] for w in words if w.startswith("-") and w not in known]
        for word in unknown:
            best = did_you_mean(word, [k for k in known if k.startswith("--")])
            if best is not None:
                hint = f"did you mean {best}? ({hint})"
                break
        raise ServeOptionsError(
            Diagnostic("TTB004", Severity.ERROR, f"vllm serve options: {message}", hint=hint),
            unknown,
            [k for k in known if k.startswith("--")],
        )

    parser.error = error
    args = parser.parse_args(serve_args)
    if model is not None and args.model_tag is not None and args.model_tag != model:
        error(f"two models given: {args.model_tag} and --model {model}")
    default = parser.get_default("model")  # vLLM's stand-in model: plan refuses to guess
    args.model = model or args.model_tag or (None if args.model == default else args.model)
    if not args.model:
        _no_model()
    return args


def _no_model() -> None:
    raise ServeOptionsError(
        Diagnostic(
            "TTB004",
            Severity.ERROR,
            "no model given",
            hint="ttbundle plan MODEL [vllm serve options], as for vllm serve; "
            "e.g. ttbundle plan ./checkpoint --mesh HOST",
        ),
        [],
        [],
    )
