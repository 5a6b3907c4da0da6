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
    """Register every selected bundle's TT<arch> with vLLM (idempotent, lazy)."""
    from ttbundles.serving.registration import register_all

    register_all()
