"""A legacy-form decode's rows compacted (`runner.compact_rows`): the active slots first,
every per-slot input gathered with them, each request's output read at its rank."""

from __future__ import annotations

import numpy as np
import torch

from ttbundles.format import contract
from ttbundles.format.contract import SamplingParams
from ttbundles.serving.runner.compact_rows import row_order


def test_slots_that_are_already_the_first_ones_are_sent_as_they_are():
    idle = np.array([False, False, False, True])
    assert row_order(np.array([2, 0, 1]), idle) is None
    assert row_order(np.array([], dtype=np.int64), np.ones(4, dtype=bool)) is None


def test_a_hole_is_closed_and_every_per_slot_input_moves_with_its_row():
    # Requests in rows (scheduler order) hold slots 3 and 1; slots 0 and 2 are idle.
    order = row_order(np.array([3, 1]), np.array([True, False, True, False]))
    assert order is not None
    assert order.order.tolist() == [1, 3, 0, 2]  # active slots first, in slot order
    assert order.ranks.tolist() == [1, 0]  # row 0 (slot 3) is read at place 1
    params = SamplingParams(temperature=[0.0, 0.5, 0.0, 0.9], top_k=[0, 1, 2, 3], top_p=1.0)
    table = torch.arange(8).reshape(4, 2)
    values = {
        "tokens": torch.tensor([[10], [11], [12], [13]]),
        "start_pos": torch.tensor([-1, 7, -1, 9]),
        "page_table": table,
        "page_tables_per_layer": [table, table + 100],
        "sampling_params": params,
        contract.STATE_INDICES_KEYWORD: [0, 1, 2, 3],
        "kv_cache": [(torch.zeros(4, 1),)],  # per block, not per slot: left alone
        "slot_remap": [0, 1, 2, 3],  # moves device state once: left alone
    }
    sent = order.gather(values)
    assert sent["tokens"].reshape(-1).tolist() == [11, 13, 10, 12]
    assert sent["start_pos"].tolist() == [7, 9, -1, -1]  # the active rows, a prefix
    assert sent["page_table"][:, 0].tolist() == [2, 6, 0, 4]
    assert [t[:, 0].tolist() for t in sent["page_tables_per_layer"]] == [
        [2, 6, 0, 4],
        [102, 106, 100, 104],
    ]
    assert sent["sampling_params"].temperature == [0.5, 0.9, 0.0, 0.0]
    assert sent["sampling_params"].top_k == [1, 3, 0, 2]
    assert sent[contract.STATE_INDICES_KEYWORD] == [1, 3, 0, 2]
    assert sent["kv_cache"] is values["kv_cache"] and sent["slot_remap"] == [0, 1, 2, 3]
    # The class answers its active rows first (here only those): each request's token.
    answer = torch.tensor([111, 133])
    assert answer[order.ranks].tolist() == [133, 111]
