"""Mesh names a bundle may target, as `MESH_DEVICE` spells them.

The list follows the reference Tenstorrent plugin's presets, plus HOST: the host mesh on
which the reference generator runs in torch, for tests and bring-up without a card.
"""

from __future__ import annotations

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


def is_host(name: str | None) -> bool:
    """Whether a MESH_DEVICE value asks for the host mesh (any case)."""
    return (name or "").strip().upper() == HOST


def mesh_shape(name: str) -> tuple[int, int]:
    """A preset's shape, or a literal grid such as "(4,8)" or "4,8"."""
    if name in MESH_SHAPES:
        return MESH_SHAPES[name]
    rows, _, columns = name.strip().strip("()").partition(",")
    return int(rows), int(columns)
