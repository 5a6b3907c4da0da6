"""Every environment variable ttbundles reads, with its default, in one table.

Read lazily (attribute access reads `os.environ` each time), so tests and subprocesses
that change the environment are seen without reloading anything. Code that decides for
an environment other than its own process (the registry computing for `ttbundle list`,
tests) calls `read(name, environ)`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

_FALSE = {"0", "false", "no", "off"}


def _flag(default: bool) -> Callable[[str | None], bool]:
    def parse(value: str | None) -> bool:
        if value is None or not value.strip():
            return default
        return value.strip().lower() not in _FALSE

    return parse


def _paths(value: str | None) -> list[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def _text(value: str | None) -> str | None:
    return value or None


_VARIABLES: dict[str, Callable[[str | None], Any]] = {
    # os.pathsep-separated folders, each holding bundle folders; searched in order.
    "EXTRA_MODELS_DIR": _paths,
    # 0/false/no/off: register only the bundles from EXTRA_MODELS_DIR.
    "TT_VLLM_BUILTIN_MODELS": _flag(True),
    # 1: a broken bundle or an ambiguous registration is fatal instead of skipped.
    "TT_BUNDLES_STRICT": _flag(False),
    # The mesh: a preset name (N150, T3K, ...) or HOST for the host mesh.
    "MESH_DEVICE": _text,
    # The worker writes its step and sampling-path counters (JSON) here after each step.
    "TT_BUNDLES_STATS_FILE": _text,
    # Seconds since the epoch for archive entry times (reproducible builds).
    "SOURCE_DATE_EPOCH": _text,
    # 1: the CLI shows tracebacks of internal errors.
    "TTBUNDLE_DEBUG": _flag(False),
}


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of `name` in `environ` (default: this process's environment)."""
    return _VARIABLES[name]((os.environ if environ is None else environ).get(name))


def __getattr__(name: str) -> Any:
    if name in _VARIABLES:
        return read(name)
    raise AttributeError(name)


def __dir__() -> list[str]:
    return [*_VARIABLES, "read"]
