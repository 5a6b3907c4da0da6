"""Does the running environment meet a bundle's `requires`?

Versions are read from installed distributions' metadata, never by importing the package
(importing vLLM or ttnn at registration would cost seconds in every process).
"""

from __future__ import annotations

import platform
from collections.abc import Mapping
from functools import lru_cache
from importlib import metadata as importlib_metadata
from typing import Any

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from ttbundles.format.metadata import Requires


@lru_cache(maxsize=64)
def installed_version(distribution: str) -> str | None:
    if distribution == "python":
        return platform.python_version()
    try:
        return importlib_metadata.version(distribution)
    except importlib_metadata.PackageNotFoundError:
        return None


def unmet(requires: Requires | Mapping[str, Any]) -> list[str]:
    """One message per requirement the environment does not meet, naming both versions.

    `requires` is the model or its validated JSON form (what the registry's index keeps,
    so a bundle with requirements is not validated again just to read them).
    """
    if not isinstance(requires, Mapping):
        requires = requires.model_dump()
    problems: list[str] = []
    for dist in ("python", "vllm", "ttnn"):
        spec = requires.get(dist)
        if spec is None:
            continue
        have = installed_version(dist)
        if have is None:
            problems.append(f"requires {dist}{spec}, but {dist} is not installed")
        elif not _satisfies(have, SpecifierSet(spec)):
            problems.append(f"requires {dist}{spec}, but {dist} {have} is installed")
    for item in requires.get("packages") or ():
        req = Requirement(item)
        have = installed_version(req.name)
        if have is None:
            problems.append(f"requires {item}, but {req.name} is not installed")
        elif req.specifier and not _satisfies(have, req.specifier):
            problems.append(f"requires {item}, but {req.name} {have} is installed")
    return problems


def _satisfies(version: str, spec: SpecifierSet) -> bool:
    try:
        # Local labels (+empty, +cpu) name a build, not a release: compare the release.
        return spec.contains(Version(version).public, prereleases=True)
    except InvalidVersion:
        return False
