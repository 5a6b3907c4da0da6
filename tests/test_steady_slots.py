"""Steady decode without vLLM's per-row work: a steady row's KV slots answered before
vLLM's allocation path (`serving.compat.steady_slots`) and a steady decode step scheduled
without vLLM's running loop (`serving.compat.steady_decode`): the same schedule as
vLLM's own path, step for step.

Two real schedulers on the same configuration run the same random workload (arrivals,
a KV cache small enough to preempt, prefix caching on some seeds, sync and async): one
with both shortcuts, one with vLLM's `schedule()` and `allocate_slots` for everything. Every step's
scheduled tokens, new block ids (new and continuing requests), preemptions and finished
ids and every other field vLLM fills per step, each running request's counters after the
step (computed tokens, output placeholders, prefill flag, tokens in flight), the
scheduler's step counters, the blocks each request has cached for the prefix cache, and
the block pool's free count must be equal; and the
shortcuts must have answered most decode rows and steps.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from typing import Any
from unittest import mock

import pytest
from vllm.v1.core.kv_cache_manager import KVCacheManager

from tests import test_scheduler
from tests.test_scheduler import Driver, make_request, random_arrivals
from ttbundles.serving.compat import steady_decode, steady_slots
from ttbundles.serving.scheduler import TTAsyncScheduler, TTScheduler

# The scheduler tests' fixtures: a real VllmConfig on the demo checkpoint.
checkpoint = test_scheduler.checkpoint
make_scheduler = test_scheduler.make_scheduler


def counted(calls: list[int]):
    """vLLM's `allocate_slots`, counting its calls (patched on the class, so that the
    bound method the shortcut falls back to counts too)."""
    original = KVCacheManager.allocate_slots

    @functools.wraps(original)  # the same signature, which `steady_slots` checks
    def allocate_slots(self, *args: Any, **kwargs: Any):
        calls[0] += 1
        return original(self, *args, **kwargs)

    return allocate_slots


def step_record(output) -> tuple:
    cached = output.scheduled_cached_reqs
    fields = {
        name: getattr(output, name, None)
        for name in (
            "total_num_scheduled_tokens",
            "scheduled_spec_decode_tokens",
            "scheduled_encoder_inputs",
            "free_encoder_mm_hashes",
            "encoder_input_updates",
            "new_block_ids_to_zero",
            "has_structured_output_requests",
            "pending_structured_output_tokens",
            "num_spec_tokens_to_schedule",
            "skip_drafts",
            "kv_cache_block_copies",
            "has_sync_kv_loads",
        )
    }
    return (
        dict(output.num_scheduled_tokens),
        [(new.req_id, new.block_ids) for new in output.scheduled_new_reqs],
        # Every field the release's cached data has (0.33.0's `all_token_ids` and
        # `resumed_req_ids` too).
        {item.name: getattr(cached, item.name) for item in dataclasses.fields(cached)},
        sorted(output.preempted_req_ids or ()),
        sorted(output.finished_req_ids),
        fields,
    )


class RecordingDriver(Driver):
    """The engine core's loop, keeping after every schedule() what the KV manager has
    cached for each request (prefix caching publishes full blocks from there)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.cached_blocks: list[dict[str, int]] = []

    def schedule(self):
        output = super().schedule()
        scheduler = self.scheduler
        group = scheduler.kv_cache_manager.coordinator.single_type_managers[0]
        requests = [
            (
                r.request_id,
                r.num_computed_tokens,
                r.num_output_placeholders,
                r.is_prefill_chunk,
                r.num_in_flight_tokens,
                r.next_decode_eligible_step,
            )
            for r in scheduler.running
        ]
        counters = (scheduler.current_step, scheduler.num_executed_steps)
        self.cached_blocks.append((dict(group.num_cached_block), requests, counters))
        return output


def run(
    make_scheduler, seed: int, shortcut: bool, v2_runner: bool | None = None
) -> tuple[list[tuple], list, tuple, int]:
    rng = random.Random(seed)
    cls = TTAsyncScheduler if seed % 2 else TTScheduler
    prefix_caching = seed % 3 == 0
    calls = [0]
    with mock.patch.object(KVCacheManager, "allocate_slots", counted(calls)):
        settings = dict(
            num_blocks=rng.randint(12, 40),
            max_num_seqs=rng.choice([4, 8]),
            max_num_batched_tokens=rng.choice([32, 64]),
            prefix_caching=prefix_caching,
            v2_runner=v2_runner,
        )
        if shortcut:
            scheduler = make_scheduler(cls, **settings)
            assert scheduler.steady_decode is not None
        else:
            with (
                mock.patch.object(steady_slots, "install", return_value=False),
                mock.patch.object(steady_decode, "why_not", return_value="vLLM's path"),
            ):
                scheduler = make_scheduler(cls, **settings)
            assert scheduler.steady_decode is None
        assert (steady_slots.installed(scheduler.kv_cache_manager) is not None) == shortcut
        arrivals = random_arrivals(
            rng,
            12,
            max_prompt=60,
            max_tokens=50,
            last_arrival=40,
            prefix_caching=prefix_caching,
        )
        driver = RecordingDriver(scheduler, depth=2 if cls is TTAsyncScheduler else 1)
        driver.run(arrivals, max_steps=3000)
        driver.assert_all_done()
    records = [
        (*step_record(output), cached)
        for output, cached in zip(driver.outputs, driver.cached_blocks, strict=True)
    ]
    pool = scheduler.kv_cache_manager.block_pool
    preemptions = sum(r.num_preemptions for r in driver.requests.values())
    steady_steps = scheduler.steady_decode.steps if shortcut else 0
    decode_steps = driver.kinds.count("decode")
    counts = (calls[0], steady_steps, decode_steps)
    return records, [pool.get_num_free_blocks()], counts, preemptions


@pytest.mark.parametrize(
    ("seed", "v2_runner"),
    # The release's own runner protocol, and V2's on 0.33.0 (where V1's is the default).
    [(seed, None) for seed in range(8)] + [(8, True), (9, True)],
)
def test_the_shortcut_schedules_exactly_as_vllms_path(make_scheduler, seed, v2_runner):
    ours, our_pool, our_calls, our_preemptions = run(make_scheduler, seed, True, v2_runner)
    theirs, their_pool, their_calls, their_preemptions = run(make_scheduler, seed, False, v2_runner)
    assert len(ours) == len(theirs)
    for step, (a, b) in enumerate(zip(ours, theirs)):
        assert a == b, f"step {step} differs"
    assert our_pool == their_pool
    assert our_preemptions == their_preemptions
    # Most rows of most decode steps need no new block: vLLM's path ran far less.
    (our_calls, steady_steps, decode_steps), (their_calls, _, _) = our_calls, their_calls
    assert our_calls < their_calls / 2, (our_calls, their_calls)
    # Most decode steps were scheduled without vLLM's loop.
    assert steady_steps > decode_steps / 2, (steady_steps, decode_steps)


def test_preemption_still_happens_through_vllms_path(make_scheduler):
    """A row that needs a block when none is free goes to vLLM's path, which preempts."""
    scheduler = make_scheduler(TTScheduler, num_blocks=8, max_num_batched_tokens=64)
    assert steady_slots.installed(scheduler.kv_cache_manager) is not None
    driver = Driver(scheduler)
    driver.run({0: [make_request(f"p{i}", 30, 40) for i in range(3)]}, max_steps=1500)
    driver.assert_all_done()
    assert sum(r.num_preemptions for r in driver.requests.values()) > 0


def test_not_installed_where_vllms_answer_would_differ(make_scheduler):
    """A sliding-window group frees blocks as a row decodes: vLLM's path for every call."""
    from vllm.v1.core.single_type_kv_cache_manager import SlidingWindowManager

    manager = make_scheduler(TTScheduler).kv_cache_manager
    assert steady_slots.why_not(manager) is None
    window_group = object.__new__(SlidingWindowManager)
    with mock.patch.object(manager.coordinator, "single_type_managers", [window_group]):
        assert "SlidingWindowManager" in steady_slots.why_not(manager)
    # A release whose allocate_slots takes a parameter this was not checked against.
    with mock.patch.object(steady_slots, "KNOWN_PARAMETERS", ("request",)):
        assert "allocate_slots takes" in steady_slots.why_not(manager)
