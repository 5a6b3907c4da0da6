"""`ttbundle plan`: what a `vllm serve` would decide, without starting an engine.

It builds the configuration exactly as `vllm serve` does (vLLM's own argument parser and
`EngineArgs.create_engine_config`), with the TT platform forced active, so the platform
hook that decides in the server decides here: one code path, the same errors.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ttbundles.errors import Diagnostic, Severity, TTBundleError


class ServeOptionsError(TTBundleError):
    """The vllm serve options do not parse: a usage error (exit 2), said in one line.

    `unknown` holds the options vLLM did not recognise and `known` every option it has,
    for callers that add options of their own to suggest from."""

    def __init__(self, diagnostic: Diagnostic, unknown: list[str], known: list[str]):
        super().__init__(diagnostic)
        self.unknown = unknown
        self.known = known


def make_plan(
    model: str | None,
    serve_args: list[str],
    *,
    mesh: str | None = None,
    models_dirs: list[Path] | None = None,
) -> dict[str, Any]:
    """The plan as a dict: bundle, mesh, effective device options, decisions, problems.

    `serve_args` are `vllm serve`'s own arguments, the model positional among them when
    `model` is None (`ttbundle plan MODEL --max-model-len 2048` reads like `vllm serve`).
    `models_dirs` replaces EXTRA_MODELS_DIR, as `ttbundle list --models-dir` does.
    """
    from ttbundles.format.meshes import mesh_or_none
    from ttbundles.registry import servable

    # The mesh and the model first: either missing or wrong is the one error, before
    # vLLM is even imported.
    if model is None and not serve_args:
        _no_model()
    if mesh is not None:
        chosen = mesh_or_none(mesh, source="--mesh")
    else:
        chosen = mesh_or_none(os.environ.get("MESH_DEVICE"))
    if chosen is not None:
        os.environ["MESH_DEVICE"] = chosen.name
    else:
        os.environ.pop("MESH_DEVICE", None)
    if models_dirs is not None:
        os.environ["EXTRA_MODELS_DIR"] = os.pathsep.join(str(p) for p in models_dirs)
    # vLLM logs to stdout by default; stdout carries the plan (JSON for machines).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import vllm.platforms

    from ttbundles.serving.platform import TTPlatform

    # Planning for a mesh that is not attached here: the TT platform decides regardless.
    TTPlatform.planning = True
    vllm.platforms._current_platform = TTPlatform()
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ttbundles.serving.configuration import PLAN_KEY
    from ttbundles.serving.registration import register_all

    register_all()
    parser = make_arg_parser(FlexibleArgumentParser(prog="ttbundle plan"))
    args = _parse(parser, serve_args, model)
    try:
        config = AsyncEngineArgs.from_cli_args(args).create_engine_config()
    except TTBundleError:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's own validation errors, reported cleanly
        code = "TTB208" if not Path(args.model).exists() and "/" not in args.model else "TTB209"
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise TTBundleError(
            Diagnostic(code, Severity.ERROR, f"{type(exc).__name__}: {message}")
        ) from None
    plan = dict((config.additional_config or {}).get(PLAN_KEY) or {})
    plan["model"] = args.model
    plan["mesh"] = chosen.name if chosen is not None else None
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
    plan["problems"] = [d.to_dict() for d in problems]
    return plan


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
            Diagnostic("TTB209", Severity.ERROR, f"vllm serve options: {message}", hint=hint),
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
            "TTB209",
            Severity.ERROR,
            "no model given",
            hint="ttbundle plan MODEL [vllm serve options], as for vllm serve; "
            "e.g. ttbundle plan ./checkpoint --mesh HOST",
        ),
        [],
        [],
    )
