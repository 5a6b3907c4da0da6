"""Every environment variable ttbundles reads, with its default, in one table.

Read lazily (attribute access reads `os.environ` each time), so tests and subprocesses
that change the environment are seen without reloading anything.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

_FALSE = {"0", "false", "no", "off"}


def _flag(name: str, default: bool) -> Callable[[], bool]:
    def read() -> bool:
        value = os.environ.get(name)
        if value is None or not value.strip():
            return default
        return value.strip().lower() not in _FALSE

    return read


_VARIABLES: dict[str, Callable[[], Any]] = {
    # os.pathsep-separated folders, each holding bundle folders; searched in order.
    "EXTRA_MODELS_DIR": lambda: [p for p in os.environ.get("EXTRA_MODELS_DIR", "").split(
        os.pathsep) if p],
    # 0/false/no/off: register only the bundles from EXTRA_MODELS_DIR.
    "TT_VLLM_BUILTIN_MODELS": _flag("TT_VLLM_BUILTIN_MODELS", True),
    # 1: a broken bundle or an ambiguous registration is fatal instead of skipped.
    "TT_BUNDLES_STRICT": _flag("TT_BUNDLES_STRICT", False),
    # The mesh: a preset name (N150, T3K, ...) or HOST for the host mesh.
    "MESH_DEVICE": lambda: os.environ.get("MESH_DEVICE") or None,
    # 1: the CLI shows tracebacks of internal errors.
    "TTBUNDLE_DEBUG": _flag("TTBUNDLE_DEBUG", False),
}


def __getattr__(name: str) -> Any:
    if name in _VARIABLES:
        return _VARIABLES[name]()
    raise AttributeError(name)


def __dir__() -> list[str]:
    return list(_VARIABLES)
