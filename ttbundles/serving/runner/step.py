"""One step's state between `execute_model` and `sample_tokens`, and the layout of a
batch's rows (what they imply while the same requests hold the same slots)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ttbundles.serving.runner.sampling_path import has_penalties

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from ttbundles.format.contract import SamplingParams

EMPTY_POSITION = -1  # start_pos of an empty decode slot, as TT-Metal's generators expect

StepObserver = Callable[[str, list[str], list[int], list[int], "torch.Tensor | None"], None]
"""`observer(kind, req_ids, starts, ends, logits)`, called after each prefill or decode
call returned: `kind` "prefill" or "decode"; row i is request `req_ids[i]`, which computed
positions `starts[i] .. ends[i] - 1` this step; `logits` `[rows, V]` float32 on the host
(row i predicts position `ends[i]`), or None when the generator sampled on the device.
`ttbundle test` records the served logits through it; serving leaves it None."""


@dataclass
class StepState:
    """What execute_model leaves for sample_tokens."""

    scheduler_output: SchedulerOutput
    req_ids: list[str]
    discard: np.ndarray  # rows whose prompt is not complete: no token this step
    positions: np.ndarray  # per row, the position the token drawn this step takes
    layout: Layout
    logits: torch.Tensor | None = None  # [num_reqs, vocab], host path
    tokens: torch.Tensor | None = None  # [num_reqs], device path, on the host
    logprobs: Any = None  # the device's log-probs for those rows (see _device_logprobs)
    readback: tuple[Any, list[Any]] | None = None  # device path, asynchronous readback
    rows: torch.Tensor | None = None  # decode: each request's slot in the device output
    order: Any = None  # decode: the compacted row order sent (`compact_rows.RowOrder`)
    verify: Any = None  # a verify step's inputs (`runner.speculation.Verify`)
    verify_out: Any = None  # and the generator's VerifyOutput
    # Prompt logprobs of the prompts this step completed, by request (`LogprobsTensors`).
    prompt_logprobs: dict[str, Any] | None = None
    # A structured decode on a device grammar: the decode call, made by sample_tokens
    # with the grammar bitmask (per slot) vLLM hands it.
    submit: Callable[[torch.Tensor | None], None] | None = None


class Layout:
    """What a batch's rows imply and does not change while the same requests hold the
    same slots: computed once per layout, not once per step (the per-row work of a
    steady decode). `key` is the runner's slot epoch and the request ids in row order;
    `states` those requests' states, `slot_of` each request's slot, `capacity` the slots
    there are."""

    def __init__(
        self,
        key: tuple[int, tuple[str, ...]],
        states: list[Any],
        slot_of: Mapping[str, int],
        capacity: int,
    ):
        self.key = key
        req_ids = key[1]
        self.states = states
        self.params = [s.sampling_params for s in self.states]
        slots = [slot_of.get(r, -1) for r in req_ids]
        self.slots = np.asarray(slots, dtype=np.int64)
        self.rows = torch.from_numpy(self.slots)
        owners: list[str | None] = [None] * capacity
        for req_id, slot in zip(req_ids, slots):
            if slot >= 0:
                owners[slot] = req_id
        self.owners = tuple(owners)  # the request in each slot (decode)
        self.idle = np.ones(capacity, dtype=bool)  # slots no row of this batch holds
        self.idle[self.slots[self.slots >= 0]] = False
        self.any_logprobs = any(p is not None and p.logprobs is not None for p in self.params)
        self.any_prompt_logprobs = any(
            p is not None and p.prompt_logprobs is not None for p in self.params
        )
        self.penalised = any(p is not None and has_penalties(p) for p in self.params)
        self.reasons: dict[tuple[bool, bool], str | None] = {}
        self.slot_params: SamplingParams | None = None
        # Per-step work of a steady decode, done once here: each row's output list (the
        # state's own, appended to in place), the `req_id_to_index` every output of this
        # layout carries (vLLM only reads it), whether row i is slot i (a device output
        # read back by slot then needs no gather), the idle slots' rows, and the decode
        # page table of each KV-cache group with the table version it was cut at (see
        # `BlockTables.decode_table`).
        self.outputs = [s.output_token_ids for s in self.states]
        self.index = {r: i for i, r in enumerate(req_ids)}
        self.id_set = frozenset(req_ids)
        self.in_order = bool(np.array_equal(self.slots, np.arange(len(slots))))
        self.idle_rows = torch.from_numpy(np.flatnonzero(self.idle))
        self.tables: dict[int, tuple[int, torch.Tensor]] = {}


def rows_of(logprobs: Any, rows: list[int]) -> Any:
    """The device's log-probs for `rows`: a (values, ids) pair or a flat tensor, indexed."""
    if logprobs is None:
        return None
    if isinstance(logprobs, tuple):
        return tuple(torch.as_tensor(t)[rows] for t in logprobs)
    return torch.as_tensor(logprobs).reshape(-1)[rows]
