"""Import a bundle's adapter as a package of its own, never through `sys.path`.

Each bundle folder is mapped to a synthetic top-level package whose name is derived from
the bundle's name and absolute path, so it is the same in every process (the API server,
the engine core, workers and vLLM's model-inspection subprocess all compute it). Two
bundles that both ship `adapter.py` import as `_ttb_a_<key>.adapter` and
`_ttb_b_<key>.adapter`, side by side; relative imports inside a bundle work.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
import threading
from pathlib import Path

PACKAGE_PREFIX = "_ttb_"


_KEY_LENGTH = 10
# A synthetic package name in text: the prefix, the name's stem, "_", the key; with the
# dot that follows it when a module of the bundle is named.
_PACKAGE_IN_TEXT = re.compile(
    rf"{PACKAGE_PREFIX}[0-9A-Za-z_]*?_[0-9a-f]{{{_KEY_LENGTH}}}(?![0-9A-Za-z_])(\.)?"
)


_NOT_IN_NAME = re.compile(r"[^0-9a-zA-Z_]")


def package_name(bundle_dir: Path, bundle_name: str, *, resolved: Path | str | None = None) -> str:
    """The synthetic package a bundle's modules import under (`resolved`: the folder's
    resolved path, where the caller knows it: resolving costs a system call per path component)."""
    resolved = Path(bundle_dir).resolve() if resolved is None else resolved
    key = hashlib.sha256(str(resolved).encode()).hexdigest()[:_KEY_LENGTH]
    stem = _NOT_IN_NAME.sub("_", bundle_name)
    return f"{PACKAGE_PREFIX}{stem}_{key}"


def public_names(text: str) -> str:
    """`text` with the synthetic packages taken out, for users: a bundle's module reads
    as the bundle names it (`_ttb_demo_0123456789.adapter:Gen` -> `adapter:Gen`), a bare
    package as "the bundle's package". These names are internal: a user never types one.
    """
    if PACKAGE_PREFIX not in text:
        return text
    return _PACKAGE_IN_TEXT.sub(lambda m: "" if m.group(1) else "<the bundle's package>", text)


class BundleFinder(importlib.abc.MetaPathFinder):
    """Resolves synthetic bundle packages to their folders; submodules load normally."""

    def __init__(self) -> None:
        self._packages: dict[str, Path] = {}
        self._lock = threading.Lock()

    def add(self, package: str, folder: Path) -> None:
        folder = folder if isinstance(folder, Path) else Path(folder)
        with self._lock:
            self._packages[package] = folder

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib API
        folder = self._packages.get(fullname)
        if folder is None:
            return None
        init = folder / "__init__.py"
        if init.is_file():
            return importlib.util.spec_from_file_location(
                fullname, init, submodule_search_locations=[str(folder)]
            )
        # A namespace-style package: no code of the bundle runs to create it.
        spec = importlib.machinery.ModuleSpec(fullname, None, is_package=True)
        spec.submodule_search_locations = [str(folder)]
        return spec


_finder: BundleFinder | None = None


def finder() -> BundleFinder:
    """The process-wide finder, installed on first use (idempotent)."""
    global _finder
    if _finder is None:
        for existing in sys.meta_path:
            if type(existing).__name__ == "BundleFinder" and hasattr(existing, "add"):
                _finder = existing  # type: ignore[assignment]
                break
        else:
            _finder = BundleFinder()
            sys.meta_path.append(_finder)
    return _finder


def qualified_class(
    bundle_dir: Path, bundle_name: str, main_class: str, *, resolved: Path | str | None = None
) -> str:
    """`pkg.module:Class` for a bundle-sourced main class, with its package mapped."""
    package = package_name(bundle_dir, bundle_name, resolved=resolved)
    finder().add(package, bundle_dir)
    module, _, cls = main_class.partition(":")
    return f"{package}.{module}:{cls}"
