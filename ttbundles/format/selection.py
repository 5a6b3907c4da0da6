"""When two bundles compete for one architecture, and which one a process selects.

Pure functions over metadata: the validator uses them to report ambiguity, the registry
to pick a bundle, so both always agree. A bundle that names the current mesh in its
`targets` beats one that targets any mesh; then the one with the more specific `when`.
"""

from __future__ import annotations

from collections.abc import Mapping

from ttbundles.format.metadata import BundleMetadata


def specificity(metadata: BundleMetadata) -> int:
    """How many conditions a bundle's `when` sets; a more specific match wins."""
    return len(metadata.when.env)


def rank(metadata: BundleMetadata, mesh: str | None) -> tuple[int, int]:
    """Higher wins: (names this mesh explicitly, number of `when` conditions)."""
    explicit = int(mesh is not None and mesh in metadata.targets)
    return explicit, specificity(metadata)


def overlaps(a: BundleMetadata, b: BundleMetadata) -> bool:
    """Whether some mesh and environment would select both for the same TT architecture
    with equal rank: registration would be ambiguous."""
    if a.tt_arch != b.tt_arch or specificity(a) != specificity(b):
        return False
    if bool(a.targets) != bool(b.targets):
        return False  # the one naming meshes wins on them; elsewhere only the other applies
    if a.targets and not set(a.targets) & set(b.targets):
        return False
    return all(b.when.env.get(k, v) == v for k, v in a.when.env.items())


def applies(metadata: BundleMetadata, mesh: str | None, environ: Mapping[str, str]) -> bool:
    return metadata.applies_to(mesh, environ)
