"""Decode rows as TT-Metal's legacy-form classes take them: the active rows first.

The runner keeps a request in one slot for its life (its page-table row, its device
sampling state), and a decode call carries every slot, an empty one at position -1. A
request that finishes in the middle leaves a hole. The reference plugin never shows a
class a hole: vLLM's input batch condenses its rows, so row i of a decode is the i-th
active request and the padding comes after the last. TT-Metal's legacy-form classes
(`reset_batch`, no `slot_remap`) are written against that: the Gemma 4 31B autoport's
traced decode refuses "active requests in a contiguous prefix" otherwise, and returns
only those rows.

So, for such a class, a decode whose slots are not a prefix is sent compacted: the
active slots in slot order, then the idle ones; every per-row input is gathered in that
order, and each request's output is read at its rank there. The order changes only when
the set of slots changes, which changes the batch, so the class is told by `reset_batch`
(and the runner drains what is in flight first): what the class keeps per row on the
device is reloaded from the host's inputs.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import torch

from ttbundles.format import contract
from ttbundles.format.contract import SamplingParams

ROW_KEYWORDS: frozenset[str] = frozenset(
    {
        "tokens",
        "start_pos",
        "page_table",
        "page_tables_per_layer",
        "sampling_params",
        "rope_deltas_all_users",
        "prompt_tokens",
        "output_tokens",
        contract.STATE_INDICES_KEYWORD,
        contract.GRAMMAR_BITMASK_KEYWORD,
    }
)
"""The decode keywords with one entry per slot (first dimension or list index). Not
`slot_remap`: it moves what the device holds per slot, once, and a compacted call's moves
are made by the `reset_batch` that comes with every new order (the identity stays)."""


@dataclasses.dataclass(frozen=True)
class RowOrder:
    """A compacted decode: `order[i]` the slot row i holds (active slots first), `ranks`
    each request row's place in that order (where its output is)."""

    order: np.ndarray
    ranks: torch.Tensor

    def gather(self, values: dict[str, Any]) -> dict[str, Any]:
        """`values` with every per-slot keyword in this order."""
        return {
            key: _gather(value, self.order) if key in ROW_KEYWORDS else value
            for key, value in values.items()
        }


def row_order(slots: np.ndarray, idle: np.ndarray) -> RowOrder | None:
    """The compacted order for a decode whose request rows hold `slots` (`idle`: the
    slots no row holds), or None when the active slots are already the first ones."""
    n = len(slots)
    active = np.sort(slots)
    if n == 0 or int(active[-1]) == n - 1:
        return None  # slots 0..n-1, in whatever row order: no hole
    order = np.concatenate([active, np.flatnonzero(idle)])
    ranks = np.searchsorted(active, slots)
    return RowOrder(order, torch.from_numpy(ranks))


def _gather(value: Any, order: np.ndarray) -> Any:
    if value is None:
        return None
    if isinstance(value, torch.Tensor):
        return value[torch.from_numpy(order)]
    if isinstance(value, SamplingParams):
        return dataclasses.replace(
            value,
            **{
                field.name: _gather(getattr(value, field.name), order)
                for field in dataclasses.fields(value)
                if isinstance(getattr(value, field.name), list)
            },
        )
    if isinstance(value, list | tuple) and value and isinstance(value[0], torch.Tensor):
        return type(value)(_gather(v, order) for v in value)  # per layer
    if isinstance(value, list | tuple):
        return [value[int(i)] for i in order]
    return value
