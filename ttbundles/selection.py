"""When two bundles compete for one architecture, and which one a process selects.

Pure functions over metadata: the validator uses them to report ambiguity, the registry
to pick a bundle, so both always agree.
"""

from __future__ import annotations

from collections.abc import Mapping

from ttbundles.metadata import BundleMetadata


def specificity(metadata: BundleMetadata) -> int:
    """How many conditions a bundle's `when` sets; a more specific match wins."""
    return len(metadata.when.env)


def overlaps(a: BundleMetadata, b: BundleMetadata) -> bool:
    """Whether some mesh and environment would select both for the same TT architecture,
    with neither more specific than the other: registration would be ambiguous."""
    if a.tt_arch != b.tt_arch or specificity(a) != specificity(b):
        return False
    if a.targets and b.targets and not set(a.targets) & set(b.targets):
        return False
    return all(b.when.env.get(k, v) == v for k, v in a.when.env.items())


def applies(metadata: BundleMetadata, mesh: str | None, environ: Mapping[str, str]) -> bool:
    return metadata.applies_to(mesh, environ)
