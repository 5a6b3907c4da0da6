"""The runner's mirror of the scheduler's view, as vLLM's own runner keeps it
(`vllm/v1/worker/gpu/states.py`): each request's state, the host batch's rows, the slots
and the page tables, brought up to date from each step's `SchedulerOutput`.

Requests not scheduled in a step leave the host batch (the phase-based scheduler leaves
decodes out of prefill steps) and rejoin when scheduled again; their slot stays theirs.
A finished or preempted request gives its slot back; a resumed one takes a slot again (it
prefills into it). A steady decode step (the same requests continuing) takes a shorter
path, whole-array writes only (`_update_steady`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.sampling_params import SamplingType

from ttbundles.serving import compat
from ttbundles.serving.lane_output import lane_of
from ttbundles.serving.runner.kv.tables import BlockTables
from ttbundles.serving.runner.slots import SlotStates
from ttbundles.serving.runner.step import Layout, StepState
from ttbundles.serving.stats import STATS

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput

    from ttbundles.serving.runner.speculation import Speculation


class RequestStates:
    """The requests the runner holds (`compat.request_state(...)` by id), the host batch
    (`batch`, vLLM's `InputBatch` or ours), the slots and the block tables.

    `on_finish(req_id)` is called for every finished request, for what other parts of
    the runner keep per request (prompt logprobs, speculation)."""

    def __init__(
        self,
        batch: Any,
        slots: SlotStates,
        tables: BlockTables,
        *,
        device: torch.device,
        on_finish: Callable[[str], None] = lambda req_id: None,
        on_release: Callable[[int], None] = lambda slot: None,
    ):
        self.batch = batch
        self.slots = slots
        self.tables = tables
        self.device = device
        self.on_finish = on_finish
        # A slot given back (finished, preempted): the generator's per-slot state there is
        # released (`release_request`, a generator that owns recurrent state).
        self.on_release = on_release
        self.requests: dict[str, Any] = {}
        # Vision-language prefills return one RoPE delta per request, which its decodes send.
        self.rope_deltas: dict[str, int] = {}
        # Requests whose last chunk left their prompt incomplete: the scheduler's
        # `is_prefill_chunk`, which does not cross the process boundary, kept here.
        self.mid_prefill: set[str] = set()
        self._layout: Layout | None = None
        # The scheduler's order of a steady step's requests and their batch rows, valid
        # until the general path moves rows (see `_update_steady`).
        self._steady_ids: list[str] | None = None
        self._steady_index = np.zeros(0, dtype=np.int64)

    # --- slots and their page-table rows ----------------------------------------------

    def take_slot(self, req_id: str) -> None:
        """The lowest free row of the request's lane (its lane's first row upward)."""
        self.slots.take(req_id)

    def release_slot(self, req_id: str) -> None:
        slot = self.slots.release(req_id)
        if slot is not None:
            self.tables.clear(slot)
            self.on_release(slot)
        self.rope_deltas.pop(req_id, None)

    def stage_blocks(self, req_id: str) -> None:
        """Write a request's block ids into its slot's rows, one per KV-cache group."""
        slot = self.slots.slot_of.get(req_id)
        if slot is None:
            return
        block_ids = self.requests[req_id].block_ids
        for group in range(self.tables.num_groups):
            self.tables.stage(slot, block_ids[group], group)

    def layout_of(self, req_ids: list[str]) -> Layout:
        """The cached layout of these rows, rebuilt when the rows or any slot changed."""
        key = (self.slots.epoch, tuple(req_ids))
        if self._layout is None or self._layout.key != key:
            self._layout = Layout(
                key,
                [self.requests[r] for r in key[1]],
                self.slots.slot_of,
                self.slots.capacity,
            )
        return self._layout

    # --- a step's scheduler output ----------------------------------------------------

    def update(self, so: SchedulerOutput) -> None:
        """Mirror the scheduler's view: finished, new, resumed and continuing requests."""
        if self._update_steady(so):
            return
        self._steady_ids = None  # rows may move below
        self._drop_finished_and_preempted(so)
        scheduled = so.num_scheduled_tokens.keys()
        resumed = compat.resumed_req_ids(so)
        for req_id in resumed:
            self.release_slot(req_id)  # preempted earlier: its old slot is gone
        batch = self.batch
        for req_id in list(batch.req_id_to_index.keys() - (scheduled - resumed)):
            batch.remove_request(req_id)
        to_add, staged = self._new_requests(so)
        self._update_cached(so, resumed, to_add, staged)
        for state in to_add:
            batch.add_request(state)
        for req_id in scheduled:
            if req_id not in self.slots.slot_of:
                self.take_slot(req_id)
        for req_id in staged:
            self.stage_blocks(req_id)
        batch.condense()
        batch.refresh_metadata()

    def _drop_finished_and_preempted(self, so: SchedulerOutput) -> None:
        batch = self.batch
        for req_id in so.finished_req_ids:
            self.on_finish(req_id)
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
            self.release_slot(req_id)
            self.slots.forget(req_id)
            self.mid_prefill.discard(req_id)
        placed = lane_of(so)
        if placed:
            self.slots.place(placed)
        for req_id in so.preempted_req_ids or ():
            self.release_slot(req_id)
            self.mid_prefill.discard(req_id)
            if not compat.RESUMED_IN_CACHED:
                # It will be re-sent in full, as a new request: its state goes now.
                self.requests.pop(req_id, None)
                batch.remove_request(req_id)

    def _new_requests(self, so: SchedulerOutput) -> tuple[list[Any], list[str]]:
        """The states of the newly scheduled requests (to add to the batch), and their
        ids (their table rows to stage)."""
        to_add: list[Any] = []
        staged: list[str] = []
        for new in so.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            state = compat.request_state(
                req_id=new.req_id,
                prompt_token_ids=new.prompt_token_ids,
                mm_features=new.mm_features,
                sampling_params=params,
                generator=generator,
                block_ids=tuple(list(ids) for ids in new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                output_token_ids=compat.new_request_outputs(new),
                lora_request=new.lora_request,
            )
            self.requests[new.req_id] = state
            to_add.append(state)
            staged.append(new.req_id)
        return to_add, staged

    def _update_cached(
        self, so: SchedulerOutput, resumed: set[str], to_add: list[Any], staged: list[str]
    ) -> None:
        """The continuing and resumed requests: computed tokens, outputs the scheduler
        took back, new blocks; those not in the batch are appended to `to_add`."""
        batch = self.batch
        cached = so.scheduled_cached_reqs
        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            num_output = cached.num_output_tokens[i]
            index = batch.req_id_to_index.get(req_id)
            if num_output < len(state.output_token_ids):
                del state.output_token_ids[num_output:]
                if index is not None:  # the batch's token count follows the state's
                    batch.num_tokens_no_spec[index] = state.num_tokens
            new_blocks = cached.new_block_ids[i]
            if req_id in resumed:
                assert new_blocks is not None
                state.block_ids = tuple(list(ids) for ids in new_blocks)
            elif new_blocks is not None:
                for ids, extra in zip(state.block_ids, new_blocks):
                    ids.extend(extra)
            if new_blocks is not None:
                staged.append(req_id)
            if index is None:
                to_add.append(state)
                continue
            batch.num_computed_tokens_cpu[index] = state.num_computed_tokens

    def _update_steady(self, so: SchedulerOutput) -> bool:
        """The bookkeeping of a step that only continues the batch's requests (none
        finished, admitted, resumed, preempted or left out, no output taken back): the
        scheduler's cached data written as whole arrays, and row-level work only for the
        rows that got new KV blocks. Returns False, having changed nothing, for any other
        step; then the general path of `update` runs.

        While a request is in the host batch its row is authoritative for its computed
        tokens; its state's count is written by the general path, the only one that
        (re-)adds a request to the batch and so the only reader of it."""
        cached = so.scheduled_cached_reqs
        batch = self.batch
        req_ids = cached.req_ids
        n = len(req_ids)
        if (
            n == 0
            or so.finished_req_ids
            or so.scheduled_new_reqs
            or compat.resumed_req_ids(so)
            or so.preempted_req_ids
            or n != batch.num_reqs
            or n != len(so.num_scheduled_tokens)
        ):
            return False
        if req_ids != self._steady_ids:
            get = batch.req_id_to_index.get
            rows = [get(r) for r in req_ids]
            if None in rows:
                return False
            self._steady_ids = list(req_ids)
            self._steady_index = np.asarray(rows, dtype=np.int64)
        index = self._steady_index
        # A batch row holds its prompt and the outputs its request state holds.
        held = batch.num_tokens_no_spec[index] - batch.num_prompt_tokens[index]
        if (np.asarray(cached.num_output_tokens, dtype=np.int64) < held).any():
            return False  # the scheduler took tokens back: the general path trims them
        batch.num_computed_tokens_cpu[index] = cached.num_computed_tokens
        new_blocks = cached.new_block_ids
        if new_blocks.count(None) != n:
            grown = [i for i, blocks in enumerate(new_blocks) if blocks is not None]
            if not self.append_one_block_each(req_ids, new_blocks, grown):
                for i in grown:
                    req_id = req_ids[i]
                    for ids, extra in zip(self.requests[req_id].block_ids, new_blocks[i]):
                        ids.extend(extra)
                    self.stage_blocks(req_id)
        batch.refresh_metadata()
        STATS.count("bookkeeping.steady")
        return True

    def append_one_block_each(
        self, req_ids: list[str], new_blocks: list[Any], grown: list[int]
    ) -> bool:
        """The common case of new KV blocks in a steady decode, as whole-array writes: one
        KV-cache group, and each grown row (`grown`, positions in `req_ids`) got exactly
        one block and holds a decode slot whose page-table row is staged up to its
        request's blocks. With prompts of one length every row grows in the same step
        (every 16 tokens), so this is where a per-row loop would cost most. The same
        writes as `stage_blocks` per row. False, having changed nothing, when the case
        does not hold."""
        block_ids, slots = [], []
        for i in grown:
            blocks = new_blocks[i]
            if len(blocks) != 1 or len(blocks[0]) != 1:
                return False
            req_id = req_ids[i]
            slot = self.slots.slot_of.get(req_id)
            owned = self.requests[req_id].block_ids[0]
            if slot is None or self.tables.count(slot) != len(owned):
                return False
            block_ids.append(blocks[0][0])
            slots.append(slot)
        for i, block in zip(grown, block_ids):
            self.requests[req_ids[i]].block_ids[0].append(block)
        self.tables.append_one_each(
            np.asarray(slots, dtype=np.int64), np.asarray(block_ids, dtype=np.int64)
        )
        STATS.count("bookkeeping.blocks_whole")
        return True

    # --- a step's rows ----------------------------------------------------------------

    def prepare_step(
        self, so: SchedulerOutput, speculation: Speculation | None, *, async_decode: bool
    ) -> tuple[StepState, np.ndarray, np.ndarray, list[list[int]], bool]:
        """The step over the batch's rows (after `update`): their computed and total
        tokens, the drafts a verify checks, and whether the step is a decode."""
        batch = self.batch
        req_ids = list(batch.req_ids)
        n = len(req_ids)
        layout = self.layout_of(req_ids)
        num_sched = so.num_scheduled_tokens
        # The batch's arrays mirror the request states: computed and total tokens per
        # row, without a loop over rows.
        computed = batch.num_computed_tokens_cpu[:n].astype(np.int64)
        totals = batch.num_tokens_no_spec[:n].astype(np.int64)
        counts = np.fromiter(map(num_sched.__getitem__, req_ids), dtype=np.int64, count=n)
        # Speculative decoding: a row's scheduled tokens include its drafts (vLLM's
        # `scheduled_spec_decode_tokens`), which only a verify computes.
        scheduled_drafts = so.scheduled_spec_decode_tokens
        drafts: list[list[int]] = []
        if scheduled_drafts:
            counts = counts - np.fromiter(
                (len(scheduled_drafts.get(r, ())) for r in req_ids), dtype=np.int64, count=n
            )
            assert speculation is not None
            if async_decode:
                drafts = speculation.own_drafts(scheduled_drafts, req_ids)
            else:
                drafts = speculation.valid_drafts(scheduled_drafts, req_ids)
        if speculation is not None and async_decode:
            computed = speculation.computed_under_async(computed, totals, batch)
        # A row is decoding when it computes one token, its newest (known or in flight),
        # and is not in prefill as the scheduler sees it: admitted (new or resumed) in
        # this step, or continuing a prompt, however few of its tokens are left (a final
        # chunk can be one token; a resumed request recomputes its output too).
        admitted = {new.req_id for new in so.scheduled_new_reqs}
        admitted |= compat.resumed_req_ids(so)
        is_decode = (
            bool((counts == 1).all() and (computed >= totals - 1).all())
            and admitted.isdisjoint(req_ids)
            and self.mid_prefill.isdisjoint(req_ids)
        )
        ends = computed + counts
        step = StepState(so, req_ids, ends < totals, ends, layout)
        if self.mid_prefill:
            self.mid_prefill.difference_update(req_ids)
        for i in np.flatnonzero(step.discard):
            self.mid_prefill.add(req_ids[int(i)])
        return step, computed, totals, drafts, is_decode

    # --- tokens a step committed ------------------------------------------------------

    def append_rows(self, step: StepState, values: list[int], array: np.ndarray) -> bool:
        """One token for every row of a step whose rows are still the batch's first rows
        in the same order (a steady decode): the batch's arrays written in one operation
        per array, each request's output list appended to (`values` and `array` hold the
        same tokens). False when that does not hold (then `append_sampled` does it)."""
        batch = self.batch
        n = len(values)
        if batch.req_ids[:n] != step.req_ids:
            return False
        for output, token in zip(step.layout.outputs, values):
            output.append(token)
        rows = np.arange(n)
        ends = batch.num_tokens_no_spec[:n]
        batch.token_ids_cpu[rows, ends] = array
        batch.num_tokens_no_spec[:n] = ends + 1
        return True

    def append_sampled(self, req_ids: list[str], sampled: list[list[int]]) -> None:
        """Record sampled tokens in the request states and, where present, the batch."""
        batch = self.batch
        for req_id, token_ids in zip(req_ids, sampled):
            state = self.requests.get(req_id)
            if not token_ids or state is None:
                continue
            state.output_token_ids.extend(token_ids)
            index = batch.req_id_to_index.get(req_id)
            if index is None:
                continue
            start = int(batch.num_tokens_no_spec[index])
            end = start + len(token_ids)
            batch.token_ids_cpu[index, start:end] = token_ids
            batch.num_tokens_no_spec[index] = end
