"""The runner's slot states and block tables on their own, table-driven: which row a
request takes and gives back (per lane), and what a decode's page table holds after each
write (per KV-cache group)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from ttbundles.serving.runner.kv.tables import (
    BlockTables,
    null_before_window,
    per_layer,
    prefill_table,
)
from ttbundles.serving.runner.slots import SlotStates
from ttbundles.serving.runner.step import Layout

# --- slots ---------------------------------------------------------------------------------

# (capacity, lanes, operations, slot_of after, epoch after); an operation is
# ("place", {req: lane}), ("take", req, expected return), ("release", req, expected return).
SLOT_CASES = [
    (4, 1, [("take", "a", 0), ("take", "b", 1), ("take", "a", None)], {"a": 0, "b": 1}, 2),
    (
        4,
        1,
        [("take", "a", 0), ("take", "b", 1), ("release", "a", 0), ("take", "c", 0)],
        {"b": 1, "c": 0},
        4,
    ),
    (4, 1, [("release", "x", None)], {}, 0),
    (
        4,
        2,
        [("place", {"a": 1, "b": 1, "c": 0}), ("take", "a", 2), ("take", "b", 3), ("take", "c", 0)],
        {"a": 2, "b": 3, "c": 0},
        3,
    ),
    (
        6,
        3,
        [("place", {"a": 2}), ("take", "a", 4), ("release", "a", 4), ("take", "a", 4)],
        {"a": 4},
        3,
    ),
]


@pytest.mark.parametrize("capacity, lanes, operations, slot_of, epoch", SLOT_CASES)
def test_slots_are_taken_lowest_first_in_the_request_s_lane(
    capacity, lanes, operations, slot_of, epoch
):
    slots = SlotStates(capacity, lanes)
    for operation in operations:
        if operation[0] == "place":
            slots.place(operation[1])
        else:
            kind, req_id, expected = operation
            assert getattr(slots, kind)(req_id) == expected, operation
    assert slots.slot_of == slot_of
    assert slots.epoch == epoch
    held = set(slot_of.values())
    for lane in range(lanes):
        rows = range(lane * slots.per_lane, (lane + 1) * slots.per_lane)
        assert slots.free_slots(lane) == [r for r in rows if r not in held]


def test_a_full_lane_refuses_another_request_though_other_lanes_have_rows():
    slots = SlotStates(4, 2)
    slots.place({"a": 0, "b": 0, "c": 0})
    slots.take("a")
    slots.take("b")
    with pytest.raises(RuntimeError, match="no free decode slot for c in lane 0"):
        slots.take("c")
    assert slots.free_slots(1) == [2, 3]


def test_a_preempted_request_keeps_its_lane_until_forgotten():
    slots = SlotStates(4, 2)
    slots.place({"a": 1})
    assert slots.take("a") == 2
    slots.release("a")
    assert slots.lane_of == {"a": 1}
    slots.forget("a")
    assert slots.lane_of == {}


# --- block tables --------------------------------------------------------------------------


def _layout(slot_of: dict[str, int], capacity: int) -> Layout:
    class State:
        sampling_params = None
        output_token_ids: list[int] = []

    req_ids = tuple(slot_of)
    return Layout((0, req_ids), [State() for _ in req_ids], slot_of, capacity)


# (writes, rows staged by the layout's requests, expected decode table); a write is
# ("stage", slot, blocks), ("append", slots, block ids) or ("clear", slot).
TABLE_CASES = [
    ([("stage", 0, [5, 6])], {"a": 0}, [[5, 6], [0, 0], [0, 0], [0, 0]]),
    ([("stage", 1, [7])], {"a": 1}, [[0], [7], [0], [0]]),
    (
        [("stage", 0, [1, 2, 3]), ("stage", 2, [4])],
        {"a": 0, "b": 2},
        [[1, 2, 3], [0, 0, 0], [4, 0, 0], [0, 0, 0]],
    ),
    # A shorter staging zeroes what was beyond it.
    ([("stage", 0, [1, 2, 3]), ("stage", 0, [9])], {"a": 0}, [[9], [0], [0], [0]]),
    # A row outside the layout is zero in the decode table, though still staged.
    ([("stage", 0, [1]), ("stage", 3, [2, 2])], {"a": 0}, [[1], [0], [0], [0]]),
    (
        [("stage", 0, [1]), ("stage", 1, [2, 3]), ("append", [0, 1], [8, 9])],
        {"a": 0, "b": 1},
        [[1, 8, 0], [2, 3, 9], [0, 0, 0], [0, 0, 0]],
    ),
    ([("stage", 2, [4, 5]), ("clear", 2), ("stage", 2, [6])], {"a": 2}, [[0], [0], [6], [0]]),
    ([], {}, [[0], [0], [0], [0]]),
]


@pytest.mark.parametrize("writes, slot_of, expected", TABLE_CASES)
def test_the_decode_table_holds_each_layout_slot_s_blocks(writes, slot_of, expected):
    tables = BlockTables(capacity=4, max_model_len=64, block_size=16)
    assert tables.tables[0].shape == (4, 4)
    for write in writes:
        if write[0] == "stage":
            tables.stage(write[1], write[2])
        elif write[0] == "append":
            tables.append_one_each(np.asarray(write[1]), np.asarray(write[2]))
        else:
            tables.clear(write[1])
    table = tables.decode_table(_layout(slot_of, 4))
    assert table.dtype == torch.int32
    assert table.tolist() == expected


def test_a_layout_s_table_is_cut_again_only_after_a_write():
    tables = BlockTables(capacity=2, max_model_len=32, block_size=16)
    tables.stage(0, [3])
    layout = _layout({"a": 0}, 2)
    first = tables.decode_table(layout)
    assert tables.decode_table(layout) is first  # unchanged: the same tensor is sent
    tables.stage(0, [3, 4])
    second = tables.decode_table(layout)
    assert second is not first and second.tolist() == [[3, 4], [0, 0]]
    assert first.tolist() == [[3], [0]]  # what was sent is never written after


@pytest.mark.parametrize("group", [0, 1])
def test_each_kv_cache_group_has_its_own_table(group):
    tables = BlockTables(capacity=2, max_model_len=32, block_size=16, num_groups=2)
    tables.stage(1, [7, 8], group=group)
    other = 1 - group
    layout = _layout({"a": 1}, 2)
    assert tables.decode_table(layout, group).tolist() == [[0, 0], [7, 8]]
    assert tables.decode_table(layout, other).tolist() == [[0], [0]]
    assert (tables.count(1, group), tables.count(1, other)) == (2, 0)
    tables.clear(1)
    assert tables.count(1, group) == 0 and tables.row(1, group) == [0, 0]


@pytest.mark.parametrize(
    "rows, expected",
    [([[1]], [[1]]), ([[1, 2], [3]], [[1, 2], [3, 0]]), ([[], [4, 5, 6]], [[0, 0, 0], [4, 5, 6]])],
)
def test_a_prefill_table_is_one_row_per_request(rows, expected):
    assert prefill_table(rows).tolist() == expected


@pytest.mark.parametrize("layers, count", [(0, None), (3, 3)])
def test_page_tables_per_layer_only_for_a_per_layer_cache(layers, count):
    table = torch.zeros((2, 1), dtype=torch.int32)
    sent = per_layer([table], None, layers)
    if count is None:
        assert sent == {}
    else:
        assert len(sent["page_tables_per_layer"]) == count
        assert all(t is table for t in sent["page_tables_per_layer"])


def test_each_layer_gets_its_groups_table():
    """Several KV groups: layer i gets `tables[group[i]]`, the very tensor."""
    full, sliding = torch.zeros((2, 3), dtype=torch.int32), torch.ones((2, 3), dtype=torch.int32)
    sent = per_layer([sliding, full], [0, 0, 1, 0], 4)["page_tables_per_layer"]
    assert [t is full for t in sent] == [False, False, True, False]
    assert all(t is sliding for i, t in enumerate(sent) if i != 2)


def test_entries_wholly_below_a_window_are_the_null_block():
    """Row 0 starts at 40 with a reach of 31 (window 32): positions 9.. are read, so
    block column 0 (positions 0..7, block size 8) is nulled and column 1 (8..15) kept;
    an empty row (-1) and a row inside its window are untouched."""
    table = torch.tensor([[5, 6, 7, 8, 9, 10], [1, 2, 3, 0, 0, 0], [4, 0, 0, 0, 0, 0]])
    out = null_before_window(table, torch.tensor([40, 20, -1]), 31, 8)
    assert out.tolist() == [[0, 6, 7, 8, 9, 10], [1, 2, 3, 0, 0, 0], [4, 0, 0, 0, 0, 0]]
    assert table[0, 0] == 5  # a copy: the table cut for the batch stays as it was
    inside = torch.tensor([[1, 2]])
    assert null_before_window(inside, torch.tensor([10]), 31, 8) is inside


def test_a_sliding_group_s_cut_is_made_again_only_when_a_window_passes_a_block():
    """Two groups, the second sliding (reach 20 tokens, blocks of 16): the same tables
    and the same block boundaries give the very tensors of the last decode (no copy, no
    comparison); a row's window passing a block boundary cuts again, nulling the block
    wholly below it; a write to a table does too."""
    from ttbundles.serving.runner.kv.groups import LayerGroups

    groups = LayerGroups(
        group=(0, 1), tensor=(0, 1), specs=("full", "sliding"), main=0, reach=(0, 20)
    )
    tables = BlockTables(capacity=2, max_model_len=64, block_size=16, groups=groups)
    for group in (0, 1):
        tables.stage(0, [1, 2, 3], group=group)
    layout = _layout({"a": 0}, 2)
    starts = np.array([36, -1])  # the window reaches back to 16: block 0 is below it
    first, combined = tables.decode_tables(layout, starts)
    assert first[1].tolist() == [[0, 2, 3], [0, 0, 0]] and first[0].tolist()[0] == [1, 2, 3]
    again, combined_again = tables.decode_tables(layout, np.array([37, -1]))
    assert combined_again is combined and again[1] is first[1]  # same boundary: as sent
    moved, combined_moved = tables.decode_tables(layout, np.array([52, -1]))  # reach back to 32
    assert combined_moved is not combined and moved[1].tolist()[0] == [0, 0, 3]
    tables.stage(0, [1, 2, 3, 4], group=1)
    grown, _ = tables.decode_tables(layout, np.array([52, -1]))
    assert grown[1].tolist()[0] == [0, 0, 3, 4]
