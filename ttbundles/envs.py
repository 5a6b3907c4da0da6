"""Every environment variable ttbundles reads, with its default, in one table.

The one reader: no other module looks a variable up in `os.environ` (they may set one
for their child processes). Read lazily (attribute access reads `os.environ` each time),
so tests and subprocesses that change the environment are seen without reloading
anything. The variables the reference Tenstorrent plugin reads keep its names and
meanings, so a deployment written for it runs unchanged; ttbundles' own are named
`TT_BUNDLES_*`, and the names earlier releases used (`RENAMED`) are still read when the
new one is unset, with a deprecation note in the log once a process. Code that decides
for an environment other than its own process (the registry computing for `ttbundle
list`, tests) calls `read(name, environ)`.
"""

from __future__ import annotations

import logging
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


def _stripped(value: str | None) -> str | None:
    return (value or "").strip() or None


_VARIABLES: dict[str, Callable[[str | None], Any]] = {
    # os.pathsep-separated folders, each holding bundle folders; searched in order.
    "EXTRA_MODELS_DIR": _paths,
    # 0/false/no/off: register only the bundles from EXTRA_MODELS_DIR (and overrides).
    "TT_VLLM_BUILTIN_MODELS": _flag(True),
    # "Arch=module:Class,...": these classes serve these architectures, registered under
    # the name written and its TT form, before and over every bundle (registry.overrides).
    "TT_MODEL_CLASS_OVERRIDES": _text,
    # Variant selectors: which built-in bundle serves Llama / Qwen3 / Qwen3.5 / Gemma 4
    # (e.g. llama3_70b_galaxy). Unset: the default variant. The values are those the
    # bundles' `when` declares; any other value stops registration, naming the valid ones.
    "TT_LLAMA_TEXT_VER": _text,
    "TT_QWEN3_TEXT_VER": _text,
    "TT_QWEN35_TEXT_VER": _text,
    "TT_GEMMA4_TEXT_VER": _text,
    # 1: a broken bundle or an ambiguous registration is fatal instead of skipped (vllm
    # serve refuses to start, and `ttbundle list` exits 1).
    "TT_BUNDLES_STRICT": _flag(False),
    # The mesh: a preset name in any case (N150, T3K, TG, P150x4, BH-Galaxy, ...), a grid
    # such as "(4,8)", or HOST for the host mesh; parsed by `format.meshes.parse_mesh`
    # (TTB106 otherwise). It replaces vLLM's tensor/pipeline parallelism. Blank is unset.
    "MESH_DEVICE": _stripped,
    # Which chips this process may open (comma-separated ids; unset: every chip), read by
    # TT-Metal when the mesh opens; the platform's device control variable (per
    # data-parallel rank).
    "TT_VISIBLE_DEVICES": _text,
    # Set by the platform, read by its child processes: the data-parallel device groups
    # TT-Metal reported, so that processes planning again do not open the mesh again
    # (not for users).
    "TT_BUNDLES_DEVICE_GROUPS": _text,
    # The worker writes its step and sampling-path counters (JSON) here after each step,
    # for tests and benchmarks (one file per rank with multi-process data parallelism:
    # stats.dp0.json, ...).
    "TT_BUNDLES_STATS_FILE": _text,
    # Seconds since the epoch for archive entry times (reproducible builds).
    "SOURCE_DATE_EPOCH": _text,
    # 1: the CLI shows tracebacks of internal errors, and so does the engine.
    "TT_BUNDLES_DEBUG": _flag(False),
    # Set by `vllm serve`'s API server for its engine processes: the file an engine that
    # cannot start writes its one-line reason to (serving.faults; not for users).
    "TT_BUNDLES_ENGINE_REPORT": _text,
    # Set by the plugin once it warned that the installed vLLM is outside the tested
    # window (TTB217), so vLLM's child processes do not warn again (not for users).
    "TTBUNDLES_VLLM_WINDOW_WARNED": _flag(False),
    # XDG's (read, not ours): the user cache is $XDG_CACHE_HOME/ttbundles
    # (the registry's index, the demo's checkpoints, test logs) (default ~/.cache).
    "XDG_CACHE_HOME": _text,
    # vLLM's: DEBUG shows the engine's tracebacks (as TT_BUNDLES_DEBUG=1 does).
    "VLLM_LOGGING_LEVEL": _text,
    # vLLM's: 1 lets --max-model-len exceed the checkpoint's positions (the platform then
    # leaves that to vLLM instead of refusing it, TTB247).
    "VLLM_ALLOW_LONG_MAX_MODEL_LEN": _flag(False),
    # vLLM's: which plugins vLLM loads; when set it must name tt and tt_model_registry
    # (read by `ttbundle doctor`, TTB108).
    "VLLM_PLUGINS": _text,
    # The trust policy (ttbundles.trust.policy): a folder of trusted public keys (*.pem,
    # *.pub), one key file, or a policy file (*.json). Unset: every bundle may be served
    # (its signer is shown). Set: install, pull and registration refuse bundles not
    # signed by a trusted key or certificate chain; a policy file with
    # "require_evidence": true also skips bundles without evidence on the mesh served.
    "TT_BUNDLES_TRUST": _text,
    # Registry credentials for `ttbundle push`/`pull` (every registry), before the docker
    # config.
    "TT_BUNDLES_REGISTRY_USERNAME": _text,
    "TT_BUNDLES_REGISTRY_PASSWORD": _text,
    # The docker config folder push/pull read credentials from, as `docker login` writes
    # them (default ~/.docker).
    "DOCKER_CONFIG": _text,
    # Seconds to wait for a registry to connect or answer (default 30).
    "TT_BUNDLES_REGISTRY_TIMEOUT": _text,
}

# Deprecated names, still read when the new name is unset: new name -> old name.
RENAMED = {
    "TT_BUNDLES_DEBUG": "TTBUNDLE_DEBUG",
    "TT_BUNDLES_ENGINE_REPORT": "TTBUNDLES_ENGINE_REPORT",
}
_noted: set[str] = set()


def raw(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """The text of `name` in `environ` (default: this process's environment), from its
    deprecated name (`RENAMED`) when only that is set."""
    environ = os.environ if environ is None else environ
    value = environ.get(name)
    old = RENAMED.get(name)
    if value is None and old is not None:
        value = environ.get(old)
        if value is not None and old not in _noted:
            _noted.add(old)
            logging.getLogger("ttbundles").warning(
                "ttbundles: %s is deprecated and will stop working; set %s instead", old, name
            )
    return value


def read(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The parsed value of `name` in `environ` (default: this process's environment)."""
    return _VARIABLES[name](raw(name, environ))


def __getattr__(name: str) -> Any:
    if name in _VARIABLES:
        return read(name)
    raise AttributeError(name)


def __dir__() -> list[str]:
    return [*_VARIABLES, "RENAMED", "raw", "read"]
