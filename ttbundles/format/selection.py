"""Whether a bundle applies in a process, and which one it selects: the one rule.

Pure functions over what a bundle declares, typed by `Selectable`, which a validated
`BundleMetadata` and the registry's `Facts` (read straight from an indexed document)
both are. `BundleMetadata.applies_to` and registration ask `applies`; `ttbundle list`
and `plan` say why a bundle does not apply with `why_inactive`, from the same `verdict`;
the registry picks among the bundles that apply by `rank`, and the validator reports
ambiguity with `overlaps`, so all of them always agree.

A bundle that names the current mesh in its `targets` beats one that targets any mesh;
then the one with the more specific `when`.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from enum import Enum
from typing import Protocol

from ttbundles.format.meshes import HOST


class Conditions(Protocol):
    """A bundle's `when`: the environment variables it needs, with their values."""

    @property
    def env(self) -> Mapping[str, str]: ...


class Selectable(Protocol):
    """What selection reads of a bundle."""

    @property
    def tt_arch(self) -> str: ...

    @property
    def targets(self) -> Collection[str]: ...

    @property
    def when(self) -> Conditions: ...


class Verdict(Enum):
    """Whether a bundle applies here, and if not, the first reason why not."""

    APPLIES = "applies"
    OTHER_MESH = "other mesh"  # it targets meshes, not this one
    HOST_ONLY = "host only"  # it targets only the host mesh, and no mesh is set
    CONDITIONS = "conditions"  # its `when.env` does not match the environment


def verdict(bundle: Selectable, mesh: str | None, environ: Mapping[str, str]) -> Verdict:
    """Whether `bundle` applies on `mesh` (None: no mesh set) under `environ`."""
    targets = bundle.targets
    if targets:
        if mesh is not None:
            if mesh not in targets:
                return Verdict.OTHER_MESH
        elif set(targets) == {HOST}:
            return Verdict.HOST_ONLY  # the host mesh is only ever chosen explicitly
    for name, value in bundle.when.env.items():
        if environ.get(name) != value:
            return Verdict.CONDITIONS
    return Verdict.APPLIES


def applies(bundle: Selectable, mesh: str | None, environ: Mapping[str, str]) -> bool:
    """Whether `bundle` applies on `mesh` under `environ` (`verdict`)."""
    return verdict(bundle, mesh, environ) is Verdict.APPLIES


def why_inactive(bundle: Selectable, mesh: str | None, environ: Mapping[str, str]) -> str:
    """Why `bundle` does not apply (TTB101 and the words `ttbundle list` shows)."""
    found = verdict(bundle, mesh, environ)
    if found is Verdict.OTHER_MESH:
        return f"TTB101 targets {', '.join(bundle.targets)}, not {mesh}"
    if found is Verdict.HOST_ONLY:
        return "TTB101 targets only the host mesh; set MESH_DEVICE=HOST to use it"
    unmatched = [f"{k}={v}" for k, v in bundle.when.env.items() if environ.get(k) != v]
    return f"TTB101 applies only when {', '.join(unmatched)}"


def specificity(bundle: Selectable) -> int:
    """How many conditions a bundle's `when` sets; a more specific match wins."""
    return len(bundle.when.env)


def rank(bundle: Selectable, mesh: str | None) -> tuple[int, int]:
    """Higher wins: (names this mesh explicitly, number of `when` conditions)."""
    explicit = int(mesh is not None and mesh in bundle.targets)
    return explicit, specificity(bundle)


def overlaps(a: Selectable, b: Selectable) -> bool:
    """Whether some mesh and environment would select both for the same TT architecture
    with equal rank: registration would be ambiguous."""
    if a.tt_arch != b.tt_arch or specificity(a) != specificity(b):
        return False
    if bool(a.targets) != bool(b.targets):
        return False  # the one naming meshes wins on them; elsewhere only the other applies
    if a.targets and not set(a.targets) & set(b.targets):
        return False
    return all(b.when.env.get(k, v) == v for k, v in a.when.env.items())
