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


def make_plan(model: str, serve_args: list[str], *, mesh: str | None = None) -> dict[str, Any]:
    """The plan as a dict: bundle, mesh, effective device options and decisions."""
    if mesh is not None:
        os.environ["MESH_DEVICE"] = mesh
    mesh = os.environ.get("MESH_DEVICE") or None
    # vLLM logs to stdout by default; stdout carries the plan (JSON for machines).
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    import vllm.platforms

    from ttbundles.serving.platform import TTPlatform

    # Planning for a mesh that is not attached here: the TT platform decides regardless.
    vllm.platforms._current_platform = TTPlatform()
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ttbundles.serving.configuration import PLAN_KEY
    from ttbundles.serving.registration import register_all

    register_all()
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser(prog="ttbundle plan"))
    try:
        args = parser.parse_args(["--model", model, *serve_args])
    except SystemExit as exc:
        raise TTBundleError(
            Diagnostic(
                "TTB209",
                Severity.ERROR,
                f"invalid vllm serve options: {' '.join(serve_args)}",
                hint="check them with vllm serve --help",
            )
        ) from exc
    try:
        config = EngineArgs.from_cli_args(args).create_engine_config()
    except TTBundleError:
        raise
    except Exception as exc:  # noqa: BLE001 - vLLM's own validation errors, reported cleanly
        code = "TTB208" if not Path(model).exists() and "/" not in model else "TTB209"
        message = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise TTBundleError(
            Diagnostic(code, Severity.ERROR, f"{type(exc).__name__}: {message}")
        ) from None
    plan = dict((config.additional_config or {}).get(PLAN_KEY) or {})
    plan["model"] = model
    plan["mesh"] = mesh
    return plan
