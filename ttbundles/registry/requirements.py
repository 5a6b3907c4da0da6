"""Does the running environment meet a bundle's `requires`?

Versions are read from installed distributions' metadata, never by importing the package
(importing vLLM or ttnn at registration would cost seconds in every process).
"""

from __future__ import annotations

import platform
from functools import lru_cache
from importlib import metadata as importlib_metadata

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


def unmet(requires: Requires) -> list[str]:
    """One message per requirement the environment does not meet, naming both versions."""
    problems: list[str] = []
    for dist in ("python", "vllm", "ttnn"):
        spec = getattr(requires, dist)
        if spec is None:
            continue
        have = installed_version(dist)
        if have is None:
            problems.append(f"requires {dist}{spec}, but {dist} is not installed")
        elif not _satisfies(have, SpecifierSet(spec)):
            problems.append(f"requires {dist}{spec}, but {dist} {have} is installed")
    for item in requires.packages:
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
