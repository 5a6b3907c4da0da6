"""vLLM's entry points into ttbundles; vLLM calls them in every process.

Kept cheap on purpose: importing this module imports nothing beyond the standard
library, `platform_plugin` never imports ttnn (it only looks for it), and
`register_models` reads bundle metadata without importing any adapter.
"""

from __future__ import annotations

import logging
import os

# A child of vLLM's logger, so messages appear wherever vLLM's own do.
logger = logging.getLogger("vllm.ttbundles")

PLATFORM_QUALNAME = "ttbundles.serving.platform.TTPlatform"


def platform_plugin() -> str | None:
    """The TT platform when a Tenstorrent stack is present or the host mesh is asked for.

    Returning None keeps ttbundles inert in any other environment (a CUDA box with
    ttbundles installed must never select it).
    """
    from ttbundles.format.meshes import is_host  # plain constants: cheap

    if is_host(os.environ.get("MESH_DEVICE")):
        logger.debug("ttbundles: MESH_DEVICE=HOST, activating the TT platform on the host mesh")
        return PLATFORM_QUALNAME
    import importlib.util

    if importlib.util.find_spec("ttnn") is not None:
        logger.debug("ttbundles: ttnn found, activating the TT platform")
        return PLATFORM_QUALNAME
    logger.debug("ttbundles: neither ttnn nor MESH_DEVICE=HOST; TT platform not activated")
    return None


def register_models() -> None:
    """Register every selected bundle's TT<arch> with vLLM (idempotent, lazy).

    Both general-plugin names point here: `tt_model_registry` (the reference plugin's, so
    its VLLM_PLUGINS filters select us) and `ttbundles` (the alias of earlier releases).
    With VLLM_PLUGINS unset vLLM calls each name, so this runs twice in one process; the
    registration itself runs once per process and environment (`register_all`).
    """
    from ttbundles.errors import TTBundleError
    from ttbundles.serving.registration import register_all

    try:
        register_all()
    except TTBundleError:
        # Raised before any platform hook, in every vLLM process: end `vllm serve` with
        # the message (TTB104 names the bad item), not a traceback.
        report_errors_cleanly()
        raise


def report_errors_cleanly() -> None:
    """Make an uncaught ttbundles error end the process with its message, not a traceback.

    Whoever catches the error (`ttbundle plan`, tests) still gets the exception. Only an
    uncaught one reaches this hook, and other exceptions keep Python's usual report.
    """
    import sys

    from ttbundles.errors import TTBundleError

    previous = sys.excepthook
    if getattr(previous, "_ttbundles", False):
        return

    def hook(kind, value, traceback):  # noqa: ANN001 - sys.excepthook's signature
        if isinstance(value, TTBundleError):
            sys.stderr.write(f"{value}\n")
            return
        from ttbundles.serving.faults import debugging, engine_report

        if kind is KeyboardInterrupt and str(value) == "terminated" and not debugging():
            # vLLM's API server turns a SIGTERM during startup into this exception.
            sys.stderr.write("ttbundles: vllm serve stopped by SIGTERM while starting\n")
            return

        # vLLM's "Engine core initialization failed" after the engine said why (one
        # line, in its log): that line again, not the API server's traceback.
        line = engine_report(value)
        if line is not None and not debugging():
            sys.stderr.write(f"ttbundles: the engine did not start: {line}\n")
            return
        previous(kind, value, traceback)

    hook._ttbundles = True  # type: ignore[attr-defined]
    sys.excepthook = hook
