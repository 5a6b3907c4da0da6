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
