"""A steady decode step scheduled without vLLM's per-row scheduling loop.

In a decode step of a batch that only continues (no prompt chunk, nothing waiting, no
drafts, no encoder inputs), vLLM's `Scheduler.schedule` walks every running request
through its general loop: budgets, the long-prefill threshold, the Mamba alignment, the
encoder budget, the prefill lookahead, the KV allocation with its preemption loop, the
drafts' bookkeeping. For such a row every one of those answers "one token", and at a
Galaxy's 4 x 32 rows that walk is the largest single part of the host's work per step
(issue 58's profile).

`SteadyDecode.schedule` gives the same step another way, and only where it is provably
the same:

1. A first pass, changing nothing, computes each row's tokens exactly as vLLM's loop does
   for a decode row (the async placeholder skip, the pipeline cadence, the budgets, the
   model length) and counts the KV blocks the rows need. Any row that would not be one
   token, or blocks short of what the rows need (vLLM would preempt), and the step is
   left to vLLM's `schedule()` whole.
2. vLLM's own `schedule()` runs with `running` emptied for the call: it builds the step's
   output as the release defines it (finished and preempted ids, freed encoder entries,
   block copies, its counters, its `_update_after_schedule`), with no rows.
3. The rows are added as vLLM's loop would have added them: the slots of a row that
   gets a block or fills one from the manager's `allocate_slots`, in the running order
   (the others' answer is vLLM's empty one, by `steady_slots`' test), the
   cached request data from vLLM's own `_make_cached_request_data`, the step counted,
   then vLLM's own `_update_after_schedule` over the rows.

What step 2 computes before the rows exist must not depend on them; that is why the
configurations where it would are left to vLLM (checked once, `why_not`): speculative
decoding or any lookahead (drafts), LoRA, pipeline parallelism, connectors,
encoder-decoder models, KV-cache zeroing of new blocks, deferred block frees, Mamba
alignment, and any manager but `steady_slots`' one full-attention group (block copies,
boundary states). Per step (`schedule`): no request waits in any queue, no multimodal
request is pending, no copy-on-write hit is pending, the scheduler is not paused.
A differential test runs the real scheduler with and without this, step for step.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from ttbundles.serving import compat
from ttbundles.serving.compat import steady_slots


def why_not(scheduler: Any) -> str | None:
    """Why this scheduler's steady decode steps must go through vLLM's loop, or None."""
    manager = scheduler.kv_cache_manager
    if steady_slots.installed(manager) is None:
        return "the KV manager is not one plain full-attention group"
    checks = (
        ("speculative decoding", scheduler.vllm_config.speculative_config is not None),
        ("LoRA", scheduler.lora_config is not None),
        ("pipeline parallelism", scheduler.use_pp),
        ("a KV connector", scheduler.connector is not None),
        ("an encoder-cache connector", scheduler.ec_connector is not None),
        ("encoder-decoder", scheduler.is_encoder_decoder),
        ("KV-cache zeroing", scheduler.needs_kv_cache_zeroing),
        ("deferred block frees", scheduler.defer_block_free),
        ("Mamba block alignment", scheduler.need_mamba_block_aligned_split),
        ("a sampled token per step other than one", scheduler.num_sampled_tokens_per_step != 1),
        ("dynamic speculative lengths", scheduler.dynamic_sd_lookup is not None),
    )
    for name, present in checks:
        if present:
            return name
    if _cached_data_takes_resumed(scheduler) is None:
        return "_make_cached_request_data takes unknown parameters"
    return None


def _cached_data_takes_resumed(scheduler: Any) -> bool | None:
    """Whether vLLM's `_make_cached_request_data` takes the resumed requests (0.33.0) or
    not (0.34.0); None for a signature neither release has."""
    params = tuple(inspect.signature(scheduler._make_cached_request_data).parameters)
    if params == (
        "running_reqs",
        "num_scheduled_tokens",
        "spec_decode_tokens",
        "req_to_new_blocks",
    ):
        return False
    if params == (
        "running_reqs",
        "resumed_reqs",
        "num_scheduled_tokens",
        "spec_decode_tokens",
        "req_to_new_blocks",
    ):
        return True
    return None


class SteadyDecode:
    """One scheduler's steady decode steps (see the module docstring)."""

    def __init__(self, scheduler: Any):
        from vllm.v1.core.sched.interface import PauseState

        rows = steady_slots.installed(scheduler.kv_cache_manager)
        assert rows is not None, "why_not checked it"
        self.rows = rows
        self.block_pool = scheduler.kv_cache_manager.block_pool
        self.resumed_parameter = bool(_cached_data_takes_resumed(scheduler))
        self.unpaused = PauseState.UNPAUSED
        self.steps = 0  # steps scheduled here (the tests read it)

    def schedule(
        self, scheduler: Any, base_schedule: Callable[[], Any], running: list[Any]
    ) -> Any | None:
        """The step's output, or None (nothing changed) where vLLM's loop must run."""
        if (
            not running
            # Read per step: a block-output class sets its lookahead after this was built.
            or scheduler.num_lookahead_tokens
            or scheduler._pause_state != self.unpaused
            or scheduler.waiting
            or scheduler.kv_holding_waiting
            or getattr(scheduler, "async_kv_waiting", None)
            or scheduler._pending_encoder_input_ids
            or self.rows.partial_hits
        ):
            return None
        # 1. The rows, as vLLM's running loop takes a decode row, nothing changed yet.
        step = scheduler.current_step + 1  # what schedule() makes it first
        token_budget = scheduler.max_num_scheduled_tokens
        input_budget = scheduler.scheduler_config.max_num_batched_tokens
        max_model_len = scheduler.max_model_len
        steady = self.rows
        block_size = steady.block_size
        blocks_of = steady.req_to_blocks.get
        answers_empty = steady.answers_empty
        rows = []
        allocating = []  # rows vLLM's allocation must see (a new block, a block to cache)
        blocks_needed = 0
        for request in running:
            if token_budget <= 0 or input_budget <= 0:
                break
            if request.spec_token_ids or request.mm_features:
                return None
            placeholders = request.num_output_placeholders
            computed = request.num_computed_tokens
            if (
                placeholders > 0
                and computed + 2 - placeholders >= request.num_prompt_tokens + request.max_tokens
            ):
                continue  # async: the step in flight already reaches max_tokens
            if step < request.next_decode_eligible_step:
                continue
            if request.num_tokens + placeholders - computed != 1:
                return None  # not a decode row
            if max_model_len - computed - 1 < 1:
                continue  # vLLM schedules it nothing: at the model length
            if not answers_empty(request, computed + 1, 0):
                allocating.append(request)
                held = len(blocks_of(request.request_id) or ())
                blocks_needed += max(-(-(computed + 1) // block_size) - held, 0)
            rows.append(request)
            token_budget -= 1
            input_budget -= 1
        if not rows or blocks_needed > self.block_pool.get_num_free_blocks():
            return None  # nothing to decode, or vLLM would preempt: its loop decides

        # 2. vLLM's own schedule() with no rows: the step's output as the release has it.
        # (It records no rows as the previous step's, which the cached data reads: the
        # record is put back until the rows' data is made.)
        previous = compat.previous_step_ids(scheduler)
        scheduler.running = []
        try:
            output = base_schedule()
        finally:
            scheduler.running = running
            if previous is not None:
                compat.restore_previous_step_ids(scheduler, previous)
        assert output.total_num_scheduled_tokens == 0 and not output.scheduled_new_reqs

        # 3. The rows, as vLLM's loop adds them.
        # Allocated in the running order, as vLLM's loop allocates (the same block ids);
        # every other row's answer is vLLM's empty one.
        scheduled = dict.fromkeys([request.request_id for request in rows], 1)
        new_blocks: dict[str, Any] = dict.fromkeys(scheduled, steady.empty)
        allocate = scheduler.kv_cache_manager.allocate_slots
        for request in allocating:
            blocks = allocate(request, 1, num_lookahead_tokens=0)
            assert blocks is not None, "the free blocks were counted"
            new_blocks[request.request_id] = blocks
        if self.resumed_parameter:
            cached = scheduler._make_cached_request_data(rows, [], scheduled, {}, new_blocks)
        else:
            cached = scheduler._make_cached_request_data(rows, scheduled, {}, new_blocks)
        output.scheduled_cached_reqs = cached
        output.num_scheduled_tokens = scheduled
        output.total_num_scheduled_tokens = len(scheduled)
        scheduler.num_executed_steps += 1
        if previous is not None:
            compat.restore_previous_step_ids(scheduler, set(scheduled))
        scheduler._update_after_schedule(output)
        self.steps += 1
        return output
