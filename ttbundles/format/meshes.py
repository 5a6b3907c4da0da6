"""Mesh names a bundle may target, and the one parse of `MESH_DEVICE`.

The presets follow the reference Tenstorrent plugin's and TT-Metal's (`N150`, `T3K`, `TG`,
`P150x4`, ...), plus HOST: the host mesh on which the reference generator runs in torch,
for tests and bring-up without a card. `MESH_DEVICE` may also be a literal grid such as
"(4,8)", as TT-Metal's own parser accepts.

Every reader of the mesh (the platform's activation, bundle selection, `ttbundle plan`,
`list` and `doctor`) goes through `parse_mesh`, so they cannot disagree: names are
case-insensitive (`host` is HOST, `t3k` is T3K), and a value that is neither a preset nor
a grid is one error naming the valid ones, with a did-you-mean that knows the product
names people type (`T3000` is a T3K, not a `P300`). Plain data: cheap to import.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.suggest import did_you_mean

HOST = "HOST"

MESH_NAMES: tuple[str, ...] = (
    "N150",
    "N300",
    "N150x4",
    "T3K",
    "TG",
    "P100",
    "P150",
    "P150x2",
    "P150x4",
    "P150x8",
    "P300",
    "P300x2",
    "BH-Galaxy",
    HOST,
)

# Each preset's (rows, columns) of chips, as TT-Metal opens them; HOST is one host "chip".
MESH_SHAPES: dict[str, tuple[int, int]] = {
    "N150": (1, 1),
    "N300": (1, 2),
    "N150x4": (1, 4),
    "T3K": (1, 8),
    "TG": (8, 4),
    "P100": (1, 1),
    "P150": (1, 1),
    "P150x2": (1, 2),
    "P150x4": (1, 4),
    "P150x8": (1, 8),
    "P300": (1, 2),
    "P300x2": (1, 4),
    "BH-Galaxy": (8, 4),
    HOST: (1, 1),
}

# What people type for a preset: product and board names (suggested, never accepted:
# TT-Metal's model code reads MESH_DEVICE by its preset spelling too). Keys are compared
# after `_key` (case, spaces, '-' and '_' ignored).
ALIASES: dict[str, str] = {
    "t3000": "T3K",
    "t3k000": "T3K",
    "loudbox": "T3K",
    "ttloudbox": "T3K",
    "n150s": "N150",
    "n150d": "N150",
    "n300s": "N300",
    "n300d": "N300",
    "galaxy": "TG",
    "whgalaxy": "TG",
    "wormholegalaxy": "TG",
    "tg32": "TG",
    "bhgalaxy": "BH-Galaxy",
    "bhglx": "BH-Galaxy",
    "blackholegalaxy": "BH-Galaxy",
    "p100a": "P100",
    "p150a": "P150",
    "p150b": "P150",
    "p150c": "P150",
    "p300a": "P300",
    "p300b": "P300",
    "p300c": "P300",
    "cpu": HOST,
    "hostmesh": HOST,
    "none": HOST,
}

# Accepted: each preset in any case.
_BY_LOWER: dict[str, str] = {name.lower(): name for name in MESH_NAMES}


def _key(text: str) -> str:
    return re.sub(r"[\s_\-]", "", text).lower()


_GRID = re.compile(r"^\s*[(\[]?\s*(\d+)\s*,\s*(\d+)\s*[)\]]?\s*$")


@dataclass(frozen=True)
class Mesh:
    """A parsed mesh: its canonical name (a preset's spelling, or "(R,C)" for a grid)
    and its (rows, columns) of chips."""

    name: str
    shape: tuple[int, int]
    grid: bool = False

    @property
    def is_host(self) -> bool:
        return self.name == HOST

    @property
    def chips(self) -> int:
        return self.shape[0] * self.shape[1]

    def describe(self) -> str:
        if self.is_host:
            return "the host mesh (torch reference, no Tenstorrent device)"
        kind = "grid" if self.grid else "preset"
        return f"{kind} {self.name}, {self.shape[0]}x{self.shape[1]} chips"


def suggest(value: str) -> str | None:
    """The preset a mistyped or product-named value most likely means, or None: an alias
    exactly (case, spaces, '-' and '_' ignored), else the closest preset name, else a
    close alias."""
    import difflib

    key = _key(value)
    if key in ALIASES:
        return ALIASES[key]
    best = did_you_mean(value.strip(), MESH_NAMES)
    if best is not None:
        return best
    match = difflib.get_close_matches(key, list(ALIASES), n=1, cutoff=0.8)
    return ALIASES[match[0]] if match else None


def valid_values() -> str:
    """The accepted spellings, for error messages."""
    return ", ".join(MESH_NAMES) + ", or a grid such as (4,8)"


def mesh_error(value: str, *, source: str = "MESH_DEVICE", detail: str = "") -> Diagnostic:
    """The one diagnostic for a mesh value that is not a preset or a grid (TTB106)."""
    best = suggest(value)
    given = f"{source}={value!r}" if not source.startswith("-") else f"{source} {value!r}"
    return Diagnostic(
        "TTB106",
        Severity.ERROR,
        f"{given} is not a mesh" + (f": {detail}" if detail else ""),
        hint=(f"did you mean {best}? " if best else "") + f"valid meshes: {valid_values()}",
    )


MAX_GRID_DEVICES = 1024
"""The most devices a grid may name: the largest Tenstorrent systems are a few Galaxies
of 32 chips each; a grid far beyond that is a typo (`(8,40000)`), not a machine."""


def parse_mesh(value: str, *, source: str = "MESH_DEVICE") -> Mesh:
    """The mesh `value` names: a preset (any case), HOST, or a grid "(R,C)" / "R,C".

    Raises ConfigurationError (TTB106) naming the valid values otherwise; `source` says
    where the value came from in that message (`MESH_DEVICE`, `--mesh`).
    """
    text = value.strip()
    name = _BY_LOWER.get(text.lower())
    if name is not None:
        return Mesh(name, MESH_SHAPES[name])
    grid = _GRID.match(text)
    if grid:
        rows, columns = int(grid.group(1)), int(grid.group(2))
        if rows < 1 or columns < 1:
            raise ConfigurationError(
                mesh_error(value, source=source, detail="a grid needs at least one row and column")
            )
        if rows * columns > MAX_GRID_DEVICES:
            raise ConfigurationError(
                mesh_error(
                    value,
                    source=source,
                    detail=f"a grid of {rows * columns} devices; a mesh has at most "
                    f"{MAX_GRID_DEVICES}",
                )
            )
        return Mesh(f"({rows},{columns})", (rows, columns), grid=True)
    raise ConfigurationError(mesh_error(value, source=source))


def mesh_or_none(value: str | None, *, source: str = "MESH_DEVICE") -> Mesh | None:
    """`parse_mesh`, with unset (None or blank) meaning no mesh chosen."""
    if value is None or not value.strip():
        return None
    return parse_mesh(value, source=source)


def canonical(value: str | None, *, source: str = "MESH_DEVICE") -> str | None:
    """The canonical spelling of a mesh value (None when unset); raises TTB106."""
    mesh = mesh_or_none(value, source=source)
    return mesh.name if mesh is not None else None


def is_host(name: str | None) -> bool:
    """Whether a MESH_DEVICE value asks for the host mesh (any case)."""
    return (name or "").strip().upper() == HOST


def mesh_shape(name: str) -> tuple[int, int]:
    """A preset's shape, or a literal grid's, such as "(4,8)" or "4,8"."""
    return parse_mesh(name).shape
