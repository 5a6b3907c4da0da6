"""The page tables a decode sends: one persistent block table per KV-cache group, one row
per slot, as vLLM's own runner keeps them (`vllm/v1/worker/gpu/block_table.py`,
`BlockTables`: one table per KV-cache group).

A model whose layers are all paged alike has one KV-cache group. A hybrid model
(sliding-window layers beside full-attention ones, `runner.kv.groups`) served on vLLM's
hybrid manager has several, each with its own block ids per request (vLLM's
`block_ids[group]`) and so its own table here. A sliding group's row is indexed by
absolute position like every other (column `p // block_size` holds position p's block);
the blocks before the window are vLLM's null block (id 0), which the window never reads.

A row is written when its request's blocks change and cleared when its slot changes
hands; `version` is bumped on every write, so a table cut for a batch layout is sent
again (the same tensor, never written after it was sent) while it holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch

if TYPE_CHECKING:
    from ttbundles.serving.runner.kv.groups import LayerGroups
    from ttbundles.serving.runner.step import Layout


class BlockTables:
    """`num_groups` tables of `[capacity, width]` int32 block ids by slot (a group's
    width its spec's `max_num_blocks_per_req`, else `ceil(max_model_len / block_size)`),
    and how many columns of each row are live; with the engine's KV groups (`groups`),
    what a step sends of them: each sliding group's window, the main table, the
    per-layer tables."""

    def __init__(
        self,
        capacity: int,
        max_model_len: int,
        block_size: int,
        num_groups: int = 1,
        groups: LayerGroups | None = None,
        widths: Sequence[int] = (),
    ):
        width = -(-max_model_len // block_size)
        self.capacity = capacity
        self.block_size = block_size
        self.num_groups = groups.num_groups if groups is not None else num_groups
        self.groups = groups
        num_groups = self.num_groups
        # Each group's row as wide as its spec asks (`LayerGroups.table_widths`), else a
        # column per block of the longest request.
        widths = tuple(widths) or (width,) * num_groups
        self.tables = [torch.zeros((capacity, w), dtype=torch.int32) for w in widths]
        # numpy views of the same memory: row writes without a torch call per row.
        self.tables_np = [table.numpy() for table in self.tables]
        self.counts = [np.zeros(capacity, dtype=np.int64) for _ in range(num_groups)]
        self.version = 0
        # The sliding groups' distinct reaches, and the last decode's cut tables with what
        # they were cut from (`decode_tables`).
        self.reaches = sorted({r for r in groups.reach if r}) if groups is not None else []
        self._last_decode: tuple | None = None

    def stage(self, slot: int, blocks: Sequence[int], group: int = 0) -> None:
        """Write a slot's block ids (its request's, in order) into its row."""
        count = len(blocks)
        row = self.tables_np[group][slot]
        row[:count] = blocks
        if count < self.counts[group][slot]:
            row[count:] = 0
        self.counts[group][slot] = count
        self.version += 1

    def append_one_each(self, slots: np.ndarray, block_ids: np.ndarray, group: int = 0) -> None:
        """One new block at the end of each of `slots`' rows (a steady decode crossing a
        block boundary): the same writes as `stage` per row, as whole-array ones. Each
        row must be staged up to its request's blocks (`count`)."""
        counts = self.counts[group]
        self.tables_np[group][slots, counts[slots]] = block_ids
        counts[slots] += 1
        self.version += 1

    def count(self, slot: int, group: int = 0) -> int:
        """The live columns of a slot's row."""
        return int(self.counts[group][slot])

    def row(self, slot: int, group: int = 0) -> list[int]:
        """A slot's whole row (live columns, then zeros)."""
        return self.tables_np[group][slot].tolist()

    def clear(self, slot: int) -> None:
        """A slot changing hands: its row in every group is emptied."""
        for table, counts in zip(self.tables_np, self.counts):
            table[slot] = 0
            counts[slot] = 0
        self.version += 1

    def decode_table(self, layout: Layout, group: int = 0) -> torch.Tensor:
        """`[capacity, W]` int32 by slot: the group's table cut to the widest row of this
        batch, rows of slots outside it zero. A copy: the generator may read it after the
        host has moved on. Cut again only when a row changed since this layout's last
        cut; otherwise the same tensor, which `DecodeCommands.decide` also takes as
        unchanged without comparing."""
        cached = layout.tables.get(group)
        if cached is not None and cached[0] == self.version:
            return cached[1]
        slots = layout.slots
        width = max(int(self.counts[group][slots].max()) if len(slots) else 0, 1)
        table = self.tables[group][:, :width].clone()
        if len(layout.idle_rows):
            table.index_fill_(0, layout.idle_rows, 0)
        layout.tables[group] = (self.version, table)
        return table

    # --- what a step sends ----------------------------------------------------------------

    def decode_tables(
        self, layout: Layout, starts: np.ndarray
    ) -> tuple[list[torch.Tensor], torch.Tensor]:
        """A decode's table of every group (`starts`: each slot's position), and what
        tells a change of any of them (the one table itself with one group)."""
        tables = [self.decode_table(layout, g) for g in range(self.num_groups)]
        if len(tables) == 1:
            return tables, tables[0]
        # A sliding group's cut moves only when a row's window passes a block boundary
        # (once in block_size steps) and a table only when a row gained a block: from
        # the same tables and boundaries, the same tensors again, which
        # `DecodeCommands.decide` takes as unchanged without comparing them.
        key = (
            *map(id, tables),
            *(np.floor_divide(starts - r, self.block_size).tobytes() for r in self.reaches),
        )
        last = self._last_decode
        if last is not None and last[0] == key:
            return last[1], last[2]
        windowed = self.windowed(tables, torch.from_numpy(starts))
        combined = torch.cat(windowed, dim=1)
        # The source tables are kept with the key: their ids cannot be reused meanwhile.
        self._last_decode = (key, windowed, combined, tables)
        return windowed, combined

    def prefill_tables(
        self, block_ids: Sequence[Sequence[Sequence[int]]], computed: Sequence[int]
    ) -> list[torch.Tensor]:
        """A prefill's table of every group: row r the r-th request's blocks
        (`block_ids[r][g]`), sliding groups cut to each row's window (`computed[r]`: the
        row's first position)."""
        tables = [prefill_table([ids[g] for ids in block_ids]) for g in range(self.num_groups)]
        if len(tables) > 1:
            tables = self.windowed(tables, torch.tensor(computed))
        return tables

    def windowed(self, tables: list[torch.Tensor], starts: torch.Tensor) -> list[torch.Tensor]:
        """Each sliding group's table with what lies wholly below its window nulled
        (`null_before_window`); `starts[r]` row r's first position."""
        if self.groups is None:
            return tables
        return [
            null_before_window(table, starts, reach, self.block_size) if reach else table
            for table, reach in zip(tables, self.groups.reach)
        ]

    def main(self, tables: list[torch.Tensor]) -> torch.Tensor:
        """The table sent as `page_table`: the first full-attention group's."""
        return tables[self.groups.main if self.groups is not None else 0]

    def per_layer(self, tables: list[torch.Tensor], layers: int) -> dict[str, list[torch.Tensor]]:
        """`page_tables_per_layer` for a cache allocated per layer (see `per_layer`)."""
        return per_layer(tables, self.groups.group if self.groups is not None else None, layers)


def prefill_table(rows: Sequence[Sequence[int]]) -> torch.Tensor:
    """`[len(rows), W]` int32 block ids, row r the r-th prefill row's blocks (a prefill's
    rows are its requests, not slots), zero padded to the longest."""
    width = max(len(r) for r in rows)
    table = torch.zeros((len(rows), width), dtype=torch.int32)
    for i, row in enumerate(rows):
        table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
    return table


def null_before_window(
    table: torch.Tensor, starts: torch.Tensor, reach: int, block_size: int
) -> torch.Tensor:
    """A sliding group's table with the entries wholly below each row's window made
    vLLM's null block (0), as vLLM's own runner masks them (`gather_block_tables`): the
    scheduler frees those blocks without telling the worker, and may already have given
    them to another request. `starts[r]`: row r's first position this step (< 0: an
    empty row); `reach`: the group's `num_retained_tokens`. The table itself when
    nothing is below a window (no copy)."""
    limit = torch.div(starts - reach, block_size, rounding_mode="floor")  # [rows]
    columns = torch.arange(table.shape[1])[None, :]
    below = columns < limit[:, None]
    if not bool(below.any()):
        return table
    return table.masked_fill(below, 0)


def per_layer(
    tables: Sequence[torch.Tensor], layer_group: Sequence[int] | None, layers: int
) -> dict[str, list[torch.Tensor]]:
    """`page_tables_per_layer` for a generator whose cache was allocated per layer
    (`layers` > 0): each layer gets its KV group's table (`tables[g]`, `layer_group[i]`
    layer i's group; None: one group), as the reference plugin expands them through its
    layer-to-group map. With one group every layer's table is the step's one (Gemma-4
    26B-A4B's autoport raises without the keyword)."""
    if not layers:
        return {}
    if layer_group is None or len(tables) == 1:
        return {"page_tables_per_layer": [tables[0]] * layers}
    return {"page_tables_per_layer": [tables[layer_group[i]] for i in range(layers)]}
