"""The phase-based scheduler, driven like the engine core drives it, without a server.

The real `TTScheduler` / `TTAsyncScheduler` run on a real `VllmConfig` (the demo
checkpoint as the model) and a `KVCacheConfig` with one full-attention group; a small
driver plays the engine core (`EngineCore.step` / `step_with_batch_queue`): it schedules,
"executes" by sampling one token for every request whose prompt is complete, and feeds
`ModelRunnerOutput` back through `update_from_output`. Every step is checked against the
rules: never mixed, decode steps one token each, finished and preempted ids reported
exactly once, `running` and `waiting` consistent.

Configuration: vLLM picks its platform once per process and the shared conftest makes it
the TT platform on the host mesh for the whole session. The platform's configuration hook
would plan the config from a bundle (switching async scheduling, chunked prefill and the
device options to what the bundle declares), so it is bypassed while the test config is
built: the scheduler sees exactly the settings each test asks for. `DeviceConfig("cpu")`
makes the config buildable on any platform (without one, vLLM fails to infer a device).
"""

from __future__ import annotations

import functools
import logging
import os
from collections import Counter, deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from vllm.sampling_params import SamplingParams, StructuredOutputsParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.interface import PauseState
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from tests.vllm_config import kv_cache_config, runner_env, vllm_config
from ttbundles.demo.checkpoint import write_checkpoint
from ttbundles.errors import ConfigurationError
from ttbundles.serving import compat
from ttbundles.serving.planning.plan import effective_options
from ttbundles.serving.scheduler import (
    TTAsyncScheduler,
    TTScheduler,
    _restore_running,
)

BLOCK_SIZE = 16
TOKEN = 7  # what the fake model samples; never a stop token (requests ignore EOS)


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("scheduler") / "demo"
    write_checkpoint(path)
    return path


@pytest.fixture
def make_scheduler(checkpoint: Path):
    """Build a scheduler on a real VllmConfig; keyword arguments choose the settings."""

    def build(
        cls: type[Scheduler] = TTScheduler,
        *,
        num_blocks: int = 200,
        max_num_seqs: int = 8,
        max_num_batched_tokens: int = 64,
        max_model_len: int = 512,
        tt: dict[str, Any] | None = None,
        policy: str = "fcfs",
        prefix_caching: bool = False,
        v2_runner: bool | None = None,
        prefill_schedule_interval: int = 1,
    ) -> Scheduler:
        env = runner_env(v2_runner)
        config = vllm_config(
            checkpoint,
            max_num_seqs=max_num_seqs,
            max_num_batched_tokens=max_num_batched_tokens,
            max_model_len=max_model_len,
            block_size=BLOCK_SIZE,
            async_scheduling=issubclass(cls, TTAsyncScheduler),
            prefix_caching=prefix_caching,
            additional_config={"tt": dict(tt or {})},
            v2_runner=v2_runner,
            policy=policy,
            prefill_schedule_interval=prefill_schedule_interval,
        )
        config.cache_config.num_gpu_blocks = num_blocks
        # The scheduler reads the runner choice when it is built, as in the engine.
        with mock.patch.dict(os.environ, env):
            return cls(
                vllm_config=config,
                kv_cache_config=kv_cache_config(num_blocks, BLOCK_SIZE),
                structured_output_manager=StructuredOutputManager(config),
                block_size=BLOCK_SIZE,
            )

    return build


@functools.cache
def block_hasher() -> Any:
    """vLLM's prefix-cache block hasher (sha256), initialised once per process."""
    init_none_hash(sha256)
    return get_request_block_hasher(BLOCK_SIZE, sha256)


def make_request(
    request_id: str,
    prompt_len: int,
    max_tokens: int,
    *,
    priority: int = 0,
    prefix_caching: bool = False,
    first_token: int = 10,
) -> Request:
    return Request(
        request_id=request_id,
        prompt_token_ids=[first_token + i % 300 for i in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
        priority=priority,
        block_hasher=block_hasher() if prefix_caching else None,
    )


def random_arrivals(
    rng: Any,
    count: int,
    *,
    max_prompt: int,
    max_tokens: int,
    last_arrival: int,
    prefix_caching: bool,
    priorities: bool = False,
) -> dict[int, list[Request]]:
    """`count` requests of random lengths by the step they arrive at, drawn from `rng`
    (with prefix caching they share their first tokens, so that prompts hit)."""
    arrivals: dict[int, list[Request]] = {}
    for i in range(count):
        prompt_len = rng.randint(1, max_prompt)
        tokens = rng.randint(1, max_tokens)
        priority = rng.randint(0, 2) if priorities else 0
        request = make_request(
            f"q{i}",
            prompt_len,
            tokens,
            priority=priority,
            prefix_caching=prefix_caching,
            first_token=10 if prefix_caching else rng.randint(10, 50),
        )
        arrivals.setdefault(rng.randint(0, last_arrival), []).append(request)
    return arrivals


@dataclass
class Driver:
    """The engine core's loop around a scheduler, with a fake model, checking each step.

    depth 1 is `EngineCore.step` (synchronous); depth 2 is `step_with_batch_queue` with
    two batches in flight (async scheduling).
    """

    scheduler: Scheduler
    depth: int = 1
    kinds: list[str] = field(default_factory=list)
    outputs: list[SchedulerOutput] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)
    reported_finished: Counter = field(default_factory=Counter)
    reported_preempted: int = 0
    requests: dict[str, Request] = field(default_factory=dict)
    queue: deque = field(default_factory=deque)
    # The driver's own account of prefill, kept apart from the scheduler's: a request is
    # in prefill from its (re)admission until its computed tokens reach what it had
    # then (the prompt; for a resumed request, the prompt and its output so far).
    prefill_target: dict[str, int] = field(default_factory=dict)
    # What the DP engine core passes as `throttle_prefills`, by step (None: never).
    throttle: Callable[[int], bool] | None = None
    carried_prefill: list[bool] = field(default_factory=list)  # by step

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.scheduler.add_request(request)

    def in_prefill(self, request: Request) -> bool:
        return request.num_computed_tokens < self.prefill_target[request.request_id]

    def schedule(self) -> SchedulerOutput:
        scheduler = self.scheduler
        before = {r.request_id: self.in_prefill(r) for r in scheduler.running}
        for request in scheduler.running:
            # vLLM's flag agrees with the driver's account for every running request.
            assert request.is_prefill_chunk == before[request.request_id], request
        if self.throttle is None:
            output = scheduler.schedule()
        else:
            output = scheduler.schedule(self.throttle(len(self.outputs)))
        admitted = [new.req_id for new in output.scheduled_new_reqs]
        admitted += compat.resumed_req_ids(output)
        for req_id in admitted:
            self.prefill_target[req_id] = self.requests[req_id].num_tokens
        self.carried_prefill.append(
            any(r in admitted or before[r] for r in output.num_scheduled_tokens)
        )
        self.check(before, set(admitted), output)
        self.outputs.append(output)
        return output

    def check(self, before: dict[str, bool], admitted: set[str], output: SchedulerOutput) -> None:
        scheduler = self.scheduler
        kinds = {
            "prefill" if req_id in admitted or before[req_id] else "decode"
            for req_id in output.num_scheduled_tokens
        }
        assert len(kinds) <= 1, f"mixed step: {output.num_scheduled_tokens} from {before}"
        kind = kinds.pop() if kinds else "empty"
        assert scheduler.last_step_kind == kind
        if kind == "decode":
            assert set(output.num_scheduled_tokens.values()) == {1}
        self.kinds.append(kind)
        self.reported_finished.update(output.finished_req_ids)
        self.reported_preempted += len(output.preempted_req_ids or ())

        running_ids = [r.request_id for r in scheduler.running]
        waiting_ids = [r.request_id for r in scheduler.waiting]
        waiting_ids += [r.request_id for r in scheduler.kv_holding_waiting]
        assert len(set(running_ids)) == len(running_ids), running_ids
        assert not set(running_ids) & set(waiting_ids)
        assert len(running_ids) <= scheduler.max_num_running_reqs
        assert all(r.status == RequestStatus.RUNNING for r in scheduler.running)
        assert set(output.num_scheduled_tokens) <= set(running_ids)

    def model_output(self, output: SchedulerOutput) -> ModelRunnerOutput:
        """One token for each request whose prompt is complete after this step."""
        req_ids = list(output.num_scheduled_tokens)
        sampled = [[] if self.in_prefill(self.requests[req_id]) else [TOKEN] for req_id in req_ids]
        return compat.model_runner_output(
            req_ids, {req_id: i for i, req_id in enumerate(req_ids)}, sampled, None
        )

    def schedule_and_finish(self) -> None:
        """One step with nothing left in flight afterwards (any depth)."""
        while self.queue:
            output, model_output = self.queue.pop()
            self.scheduler.update_from_output(output, model_output)
            self.finished |= self.scheduler.finished_req_ids
        output = self.schedule()
        self.scheduler.update_from_output(output, self.model_output(output))
        self.finished |= self.scheduler.finished_req_ids

    def step(self) -> None:
        """One engine-core step (mirrors vLLM's `step_with_batch_queue`)."""
        scheduler = self.scheduler
        if scheduler.has_requests():
            output = self.schedule()
            self.queue.appendleft((output, self.model_output(output)))
            if len(self.queue) < self.depth and (
                output.total_num_scheduled_tokens > 0 or scheduler.has_requests()
            ):
                return
        elif not self.queue:
            return
        output, model_output = self.queue.pop()
        scheduler.update_from_output(output, model_output)
        self.finished |= scheduler.finished_req_ids

    def run(self, arrivals: dict[int, list[Request]] | None = None, max_steps: int = 2000) -> None:
        """Step until every request finished and was reported; fail past max_steps."""
        arrivals = dict(arrivals or {})
        for step in range(max_steps):
            for request in arrivals.pop(step, []):
                self.add(request)
            if not arrivals and not self.queue and not self.scheduler.has_requests():
                return
            self.step()
        raise AssertionError(
            f"not done after {max_steps} steps: {self.scheduler.get_request_counts()}"
        )

    def assert_all_done(self) -> None:
        for request in self.requests.values():
            assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED, request
            assert len(request.output_token_ids) == request.max_tokens
        assert set(self.reported_finished) == self.finished == set(self.requests)
        assert max(self.reported_finished.values()) == 1, "a finished id reported twice"
        preemptions = sum(r.num_preemptions for r in self.requests.values())
        assert self.reported_preempted == preemptions


def kinds_string(kinds: list[str]) -> str:
    return "".join(kind[0].upper() for kind in kinds)


# --- phase rule ------------------------------------------------------------------------


def test_arrival_while_decoding_inserts_a_prefill_step(make_scheduler):
    driver = Driver(make_scheduler())
    driver.run({0: [make_request("r0", 20, 10)], 3: [make_request("r1", 20, 5)]})
    driver.assert_all_done()
    # r0: prefill, 2 decodes; r1 arrives at step 3: one prefill step, then decodes (r0
    # has 7 tokens to go), then one empty step that reports the last finished ids.
    assert kinds_string(driver.kinds) == "PDD" + "P" + "D" * 7 + "E"
    prefill = driver.outputs[3]
    assert list(prefill.num_scheduled_tokens) == ["r1"]
    assert set(driver.outputs[4].num_scheduled_tokens) == {"r0", "r1"}
    assert driver.scheduler.step_kinds == {"prefill": 2, "decode": 9, "empty": 1}


def test_decodes_are_hidden_not_reordered(make_scheduler):
    scheduler = make_scheduler()
    driver = Driver(scheduler)
    for name in ("r0", "r1"):
        driver.add(make_request(name, 20, 50))
    for _ in range(3):
        driver.step()
    driver.add(make_request("r2", 20, 5))
    driver.step()
    assert driver.kinds[-1] == "prefill"
    assert [r.request_id for r in scheduler.running] == ["r0", "r1", "r2"]


def test_same_schedule_as_vllm_when_phases_never_mix(make_scheduler):
    """All prompts admitted in one step, then pure decode: nothing for us to change."""
    runs = []
    for cls in (Scheduler, TTScheduler):
        scheduler = make_scheduler(cls, max_num_batched_tokens=256)
        driver = Driver(scheduler)
        if cls is Scheduler:
            driver.check = lambda *args: None  # vLLM reports no step kind
        driver.run({0: [make_request(f"r{i}", 30, 20 + i) for i in range(6)]})
        runs.append([o.num_scheduled_tokens for o in driver.outputs])
    assert runs[0] == runs[1]


@pytest.mark.parametrize(
    ("tt", "expected"),
    [
        ({}, "PPDPPDP"),  # the defaults: 2 prefill steps, then 1 decode step
        ({"decode_interleave_prefill_steps": 1, "decode_interleave_decode_steps": 1}, "PDPDPDPDP"),
        (
            {"decode_interleave_prefill_steps": 1, "decode_interleave_decode_steps": 2},
            "PDDPDDPDDPDDP",
        ),
        ({"decode_interleave_enabled": False}, "PPPPP"),
    ],
    ids=["defaults", "1-1", "1-2", "disabled"],
)
def test_long_prompt_is_chunked_with_decodes_interleaved(make_scheduler, tt, expected):
    scheduler = make_scheduler(max_num_batched_tokens=32, tt=tt)
    driver = Driver(scheduler)
    # r1's 160-token prompt needs 5 chunks of 32 while r0 decodes.
    driver.run({0: [make_request("r0", 20, 40)], 3: [make_request("r1", 160, 3)]})
    driver.assert_all_done()
    assert kinds_string(driver.kinds[3 : 3 + len(expected)]) == expected
    chunks = [
        o.num_scheduled_tokens["r1"]
        for o in driver.outputs
        if o.num_scheduled_tokens.get("r1", 0) > 1
    ]
    assert chunks == [32] * 5


def test_a_final_prompt_chunk_of_one_token_is_a_prefill(make_scheduler):
    """In prefill is vLLM's notion (the prompt is not fully computed), not a count of the
    tokens left: a final chunk of one prompt token runs in a prefill step, never
    alongside decodes, and samples the request's first token there."""
    scheduler = make_scheduler(max_num_batched_tokens=32)
    driver = Driver(scheduler)
    driver.run({0: [make_request("r0", 20, 10)], 2: [make_request("r1", 33, 3)]})
    driver.assert_all_done()
    # r0 prefills, decodes; r1's 33 tokens are chunks of 32 and 1, two prefill steps
    # (which the default cadence allows before a decode step), then both decode.
    assert kinds_string(driver.kinds[:5]) == "PDPPD"
    assert driver.outputs[2].num_scheduled_tokens == {"r1": 32}
    assert driver.outputs[3].num_scheduled_tokens == {"r1": 1}
    assert driver.outputs[4].num_scheduled_tokens == {"r0": 1, "r1": 1}


@pytest.mark.parametrize("cls", [TTScheduler, TTAsyncScheduler])
def test_a_resumed_request_is_in_prefill_until_its_output_is_recomputed(make_scheduler, cls):
    """A preempted request recomputes its prompt and the tokens it had generated; vLLM
    counts all of them as its prefill (`num_tokens`), so a last recompute chunk of one
    output token is a prefill step too, not a decode beside the running ones."""
    # Budget 27: on resume, d's 6 tokens and 21 of v's 22 fit; v's last token is left.
    scheduler = make_scheduler(cls, max_num_batched_tokens=27)
    driver = Driver(scheduler, depth=2 if cls is TTAsyncScheduler else 1)
    d, v = make_request("d", 4, 12), make_request("v", 20, 12, first_token=100)
    driver.add(d)
    driver.add(v)
    while len(v.output_token_ids) < 2:
        driver.schedule_and_finish()
    assert (d.num_tokens, v.num_tokens) == (6, 22)
    assert driver.kinds[0] == "prefill" and set(driver.kinds[1:]) <= {"decode", "empty"}
    # Preempt both (what the engine core's reset_prefix_cache utility does).
    assert scheduler.reset_prefix_cache(reset_running_requests=True)
    first = len(driver.outputs)
    for _ in range(3):
        driver.schedule_and_finish()
    resumed, last_chunk, decode = driver.outputs[first:]
    if compat.RESUMED_IN_CACHED:
        assert resumed.scheduled_cached_reqs.resumed_req_ids == {"d", "v"}
    else:  # re-sent in full, their outputs after the prompt
        sent = {new.req_id: new for new in resumed.scheduled_new_reqs}
        assert set(sent) == {"d", "v"}
        # (the request's own token buffer, which has grown since: its first 22 then)
        assert list(sent["v"].prefill_token_ids)[:22] == list(v.all_token_ids)[:22]
    assert resumed.num_scheduled_tokens == {"d": 6, "v": 21}
    assert v.num_computed_tokens - 1 > v.num_prompt_tokens  # v's prompt was complete
    assert last_chunk.num_scheduled_tokens == {"v": 1}
    assert decode.num_scheduled_tokens == {"d": 1, "v": 1}
    assert driver.kinds[first:] == ["prefill", "prefill", "decode"]
    driver.run()
    driver.assert_all_done()


def test_interleave_counts_only_prefill_steps_that_kept_decodes_waiting(make_scheduler):
    """Prefill steps with no decode running do not bank a decode step for later."""
    scheduler = make_scheduler(max_num_batched_tokens=32, tt={"decode_interleave_prefill_steps": 2})
    driver = Driver(scheduler)
    driver.run({0: [make_request("r0", 96, 20)], 4: [make_request("r1", 96, 2)]})
    driver.assert_all_done()
    # r0 prefills alone (3 chunks), decodes; r1's 3 chunks: P P, then D, then P.
    assert kinds_string(driver.kinds[:8]) == "PPPD" + "PPDP"


def test_a_decode_step_with_nothing_pending_clears_the_allowance(make_scheduler):
    """Decode steps owed to a prefill run are not kept once no prefill is pending: a
    prompt arriving later starts with its prefill step."""
    tt = {"decode_interleave_prefill_steps": 1, "decode_interleave_decode_steps": 2}
    scheduler = make_scheduler(tt=tt)
    driver = Driver(scheduler)
    arrivals = {0: [make_request("r0", 20, 30)], 2: [make_request("r1", 20, 5)]}
    arrivals[4] = [make_request("r2", 20, 5)]
    driver.run(arrivals)
    driver.assert_all_done()
    # r1's prefill step earns two decode steps; the first runs with nothing pending and
    # clears the second, so r2's prefill is not held behind it.
    assert kinds_string(driver.kinds[:6]) == "PDPDPD"
    assert list(driver.outputs[4].num_scheduled_tokens) == ["r2"]


def test_a_prefill_step_with_no_decode_running_clears_the_allowance(make_scheduler):
    """Decode steps owed to decodes that have finished are not paid to later ones."""
    tt = {"decode_interleave_prefill_steps": 2, "decode_interleave_decode_steps": 2}
    scheduler = make_scheduler(max_num_batched_tokens=32, tt=tt)
    driver = Driver(scheduler)
    # r0 decodes its last token in the first of the two decode steps r1's chunks earn;
    # r1 then prefills alone while r2 waits for the budget r1's chunks use up.
    arrivals = {0: [make_request("r0", 16, 3)], 2: [make_request("r1", 160, 20)]}
    arrivals[3] = [make_request("r2", 64, 3)]
    driver.run(arrivals)
    driver.assert_all_done()
    assert kinds_string(driver.kinds[:9]) == "PDPPD" + "PPP" + "P"
    assert driver.outputs[4].num_scheduled_tokens == {"r0": 1}
    assert [o.num_scheduled_tokens for o in driver.outputs[5:8]] == [{"r1": 32}] * 3
    # After r1's last chunk r1 decodes and r2 is pending: r2's prefill goes first.
    assert driver.outputs[8].num_scheduled_tokens == {"r2": 32}


def test_a_decode_turn_that_schedules_nothing_spends_its_allowance(make_scheduler):
    """Under async scheduling a decode whose last token is in flight has nothing to
    schedule; the decode turn is spent anyway (and the step runs the prefill)."""
    tt = {"decode_interleave_prefill_steps": 2, "decode_interleave_decode_steps": 2}
    scheduler = make_scheduler(TTAsyncScheduler, max_num_batched_tokens=32, tt=tt)
    driver = Driver(scheduler, depth=2)
    arrivals = {0: make_request("r0", 16, 3), 2: make_request("r1", 320, 5)}
    owed = []
    for step in range(7):
        if step in arrivals:
            driver.add(arrivals[step])
        driver.step()
        owed.append(scheduler.decode_steps_owed)
    # r1's chunks 1-2 earn two decode steps; the first schedules r0's last token, the
    # second finds it in flight, schedules nothing and falls back to r1's third chunk.
    assert kinds_string(driver.kinds) == "PDPPD" + "P" + "P"
    assert driver.outputs[5].num_scheduled_tokens == {"r1": 32}
    assert owed[3:6] == [2, 1, 0]
    driver.run()
    driver.assert_all_done()


# --- continuous batching under pressure ------------------------------------------------


@pytest.mark.parametrize("cls", [TTScheduler, TTAsyncScheduler])
@pytest.mark.parametrize("policy", ["fcfs", "priority"])
def test_tiny_kv_cache_preempts_and_everyone_finishes(make_scheduler, cls, policy):
    # 11 usable blocks (one is vLLM's null block): 176 tokens for up to 240 wanted.
    scheduler = make_scheduler(cls, num_blocks=12, max_num_batched_tokens=32, policy=policy)
    driver = Driver(scheduler, depth=2 if cls is TTAsyncScheduler else 1)
    arrivals = {
        0: [make_request(f"a{i}", 24, 36, priority=i % 2) for i in range(4)],
        10: [make_request("long", 120, 20, priority=0)],
        12: [make_request("b0", 40, 30, priority=1)],
    }
    driver.run(arrivals, max_steps=1500)
    driver.assert_all_done()
    assert sum(r.num_preemptions for r in driver.requests.values()) > 0
    assert {"prefill", "decode"} <= set(driver.kinds)


@pytest.mark.parametrize("seed", range(12))
def test_random_workloads_keep_every_rule(make_scheduler, seed):
    import random

    rng = random.Random(seed)
    cls = TTAsyncScheduler if seed % 2 else TTScheduler
    prefix_caching = seed % 3 == 0
    # vLLM's prefill throttling, from a generator of its own (the workloads stay as
    # they were): the local cadence on some seeds, a DP-like throttle on others.
    cadence = random.Random(seed + 1000).choice([1, 1, 2, 3])
    throttled = seed % 4 == 1
    scheduler = make_scheduler(
        cls,
        num_blocks=rng.randint(10, 20),  # 9 to 19 usable: preemption is common
        max_num_seqs=rng.choice([2, 4, 8]),
        max_num_batched_tokens=rng.choice([16, 32, 64]),
        policy=rng.choice(["fcfs", "priority"]),
        prefix_caching=prefix_caching,
        prefill_schedule_interval=1 if throttled else cadence,
        tt={
            "decode_interleave_enabled": rng.random() < 0.7,
            "decode_interleave_prefill_steps": rng.randint(1, 3),
            "decode_interleave_decode_steps": rng.randint(1, 3),
        },
    )
    arrivals = random_arrivals(
        rng,
        14,
        max_prompt=100,
        max_tokens=40,
        last_arrival=60,
        prefix_caching=prefix_caching,
        priorities=True,
    )
    driver = Driver(
        scheduler,
        depth=2 if cls is TTAsyncScheduler else 1,
        throttle=(lambda step: step % 3 != 0) if throttled else None,
    )
    driver.run(arrivals, max_steps=3000)
    driver.assert_all_done()
    assert scheduler.step_kinds.total() == len(driver.kinds)


class CompiledGrammar:
    """What a compiled grammar answers the scheduler: every token is acceptable."""

    def accept_tokens(self, request_id: str, tokens: list[int]) -> bool:
        return True

    def is_terminated(self) -> bool:
        return False


def test_a_request_parked_for_its_grammar_is_pending_and_hidden_in_decode_steps(
    make_scheduler,
):
    """vLLM keeps a request whose grammar is compiling in `waiting`
    (WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR, counted in `deferred_waiting`) and skips it in
    every scan until the grammar is ready. It is prefill work: it keeps the decode
    allowance from being cleared, and a decode step never admits it, even once its
    grammar is ready."""
    tt = {"decode_interleave_prefill_steps": 1, "decode_interleave_decode_steps": 2}
    scheduler = make_scheduler(tt=tt)
    driver = Driver(scheduler)
    driver.add(make_request("r0", 20, 30))
    driver.step()  # r0's prefill
    structured = SamplingParams(
        max_tokens=3, ignore_eos=True, structured_outputs=StructuredOutputsParams(regex="a+")
    )
    g = Request("g", [10] * 20, structured, None)
    grammar: Future = Future()  # compiling
    g.structured_output_request._grammar = grammar
    driver.add(g)
    assert g.status == RequestStatus.WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR
    driver.add(make_request("r1", 20, 3))
    driver.step()  # r1's prefill (g is skipped): two decode steps are owed
    driver.step()  # the first, with g pending: the second is kept
    assert scheduler.deferred_waiting == {g}
    grammar.set_result(CompiledGrammar())
    driver.step()  # the second: a decode step, which does not see g
    driver.step()  # then prefill: g is admitted
    assert kinds_string(driver.kinds) == "PPDDP"
    assert driver.outputs[3].num_scheduled_tokens == {"r0": 1, "r1": 1}
    assert driver.outputs[4].num_scheduled_tokens == {"g": 20}
    assert not scheduler.deferred_waiting
    driver.run()
    driver.assert_all_done()


# --- vLLM's prefill throttling ------------------------------------------------------


def prefill_steps(make_scheduler, cls, arrivals, *, throttle=None, depth=1, **settings):
    """Run a workload; the steps that carried prefill (an admission or a prompt chunk)."""
    scheduler = make_scheduler(cls, **settings)
    driver = Driver(scheduler, depth=depth, throttle=throttle)
    phased = issubclass(cls, (TTScheduler, TTAsyncScheduler))
    if not phased:
        driver.check = lambda *args: None  # vLLM's steps mix phases and report no kind
    driver.run(arrivals)
    if phased:
        driver.assert_all_done()
    return [i for i, carried in enumerate(driver.carried_prefill) if carried], driver


def long_prompt_while_decoding():
    # r1's 150 tokens take 5 chunks (32 or, beside r0's decode in vLLM's steps, 31).
    return {0: [make_request("r0", 20, 40)], 3: [make_request("r1", 150, 3)]}


@pytest.mark.parametrize(
    ("pair", "depth"),
    [((Scheduler, TTScheduler), 1), ((AsyncScheduler, TTAsyncScheduler), 2)],
    ids=["sync", "async"],
)
@pytest.mark.parametrize("interval", [2, 3, 4])
def test_the_local_prefill_cadence_holds_prefill_on_vllms_steps(
    make_scheduler, pair, depth, interval
):
    """`prefill_schedule_interval` > 1 without a DP coordinator: vLLM holds prefill, new
    prompts and the next chunk of an admitted one alike, until that many executed steps
    have passed since the last step that carried prefill. The phase scheduler carries
    prefill on exactly the same steps, and runs the held ones as decode steps."""
    ours, driver = prefill_steps(
        make_scheduler,
        pair[1],
        long_prompt_while_decoding(),
        depth=depth,
        max_num_batched_tokens=32,
        prefill_schedule_interval=interval,
    )
    vllms, _ = prefill_steps(
        make_scheduler,
        pair[0],
        long_prompt_while_decoding(),
        depth=depth,
        max_num_batched_tokens=32,
        prefill_schedule_interval=interval,
    )
    # r0's prefill was step 0; r1 arrives at step 3, released once `interval` steps
    # have passed, then every `interval` steps.
    release = max(3, interval)
    assert ours == vllms == [0] + [release + interval * i for i in range(5)]
    held = ("P" + "D" * (interval - 1)) * 5
    assert kinds_string(driver.kinds)[release : release + len(held)] == held


@pytest.mark.parametrize("cadence", [2, 3])
def test_throttle_prefills_holds_prefill_on_vllms_steps(make_scheduler, cadence):
    """`schedule(throttle_prefills=True)`, which vLLM's DP engine core passes off its
    cadence (`step_counter % prefill_schedule_interval != 0`), holds every prefill while
    a decode runs; the phase scheduler holds it on the same steps."""

    def throttle(step: int) -> bool:
        return step % cadence != 0

    got = {
        cls: prefill_steps(
            make_scheduler,
            cls,
            long_prompt_while_decoding(),
            throttle=throttle,
            max_num_batched_tokens=32,
        )[0]
        for cls in (Scheduler, TTScheduler)
    }
    assert got[TTScheduler] == got[Scheduler]
    # Released on the first step of each cadence from r1's arrival at step 3 on.
    first = -(-3 // cadence) * cadence
    assert got[TTScheduler] == [0] + [first + cadence * i for i in range(5)]


def test_an_undrained_queue_lifts_the_hold_like_vllm(make_scheduler):
    """vLLM's capacity escape: once a release step leaves requests waiting, prefill is
    not held (`prefill_capacity_bound`) until a release step drains the queue."""

    def arrivals():
        return {
            0: [make_request("r0", 20, 40)],
            2: [make_request(f"a{i}", 20, 2 if i == 0 else 3) for i in range(3)],
            10: [make_request("a3", 20, 3)],
        }

    settings = dict(max_num_seqs=2, max_num_batched_tokens=64, prefill_schedule_interval=4)
    ours, _ = prefill_steps(make_scheduler, TTScheduler, arrivals(), **settings)
    vllms, _ = prefill_steps(make_scheduler, Scheduler, arrivals(), **settings)
    # Held at 2 and 3, released at 4 (a0; a1 and a2 wait for a run slot), then a1 and a2
    # are admitted as soon as slots free (6, 9: the queue was not drained), and a3, after
    # a release that drained it, waits out the interval again (10 -> 13).
    assert ours == vllms == [0, 4, 6, 9, 13]


def test_the_cadence_counts_executed_steps_not_schedule_calls(make_scheduler):
    """Calls that schedule nothing (here: while paused) do not advance the hold."""
    got = {}
    for cls in (Scheduler, TTScheduler):
        scheduler = make_scheduler(cls, max_num_batched_tokens=32, prefill_schedule_interval=3)
        driver = Driver(scheduler)
        if cls is Scheduler:
            driver.check = lambda *args: None
        driver.add(make_request("r0", 20, 40))
        for _ in range(3):
            driver.step()
        driver.add(make_request("r1", 150, 3))
        for _ in range(2):
            driver.step()  # r1's first chunk (released), then a held decode step
        scheduler.set_pause_state(PauseState.PAUSED_ALL)
        for _ in range(4):
            driver.schedule_and_finish()
        scheduler.set_pause_state(PauseState.UNPAUSED)
        for _ in range(5):
            driver.step()
        got[cls] = [o.total_num_scheduled_tokens for o in driver.outputs]
    assert got[TTScheduler] == got[Scheduler] == [20, 1, 1, 32, 1] + [0] * 4 + [1, 32, 1, 1, 32]


def test_a_prompt_cached_to_its_last_token_waits_for_the_release(make_scheduler):
    """Where vLLM admits a prompt cached to its last token during a hold (it carries no
    prefill compute and joins a decode step), the phase scheduler cannot: an admission
    runs in a prefill step of its own, which is what the hold keeps out, so it waits for
    the release."""

    def arrivals():
        return {
            0: [
                make_request("a", 33, 2, prefix_caching=True),
                make_request("r1", 20, 30, prefix_caching=True, first_token=200),
            ],
            2: [make_request("b", 33, 3, prefix_caching=True)],
        }

    settings = dict(max_num_batched_tokens=64, prefill_schedule_interval=4, prefix_caching=True)
    _, driver = prefill_steps(make_scheduler, TTScheduler, arrivals(), **settings)
    _, vllm_driver = prefill_steps(make_scheduler, Scheduler, arrivals(), **settings)
    assert vllm_driver.outputs[2].num_scheduled_tokens == {"r1": 1, "b": 1}
    assert [o.num_scheduled_tokens for o in driver.outputs[2:5]] == [
        {"r1": 1},
        {"r1": 1},
        {"b": 1},  # released at step 4
    ]
    (admitted,) = driver.outputs[4].scheduled_new_reqs
    assert admitted.num_computed_tokens == 32  # the cached blocks are reused


# --- state consumed by a discarded attempt ---------------------------------------------


@pytest.mark.parametrize("v2_runner", [False, True], ids=["runner-v1", "runner-v2"])
@pytest.mark.parametrize("how", ["length", "abort"])
def test_finished_ids_survive_a_discarded_prefill_attempt(make_scheduler, v2_runner, how):
    # 11 usable blocks; "big" needs all 11 for its prompt, and r0 always holds 2 or more:
    # every prefill attempt while r0 runs finds nothing to admit and is discarded.
    scheduler = make_scheduler(num_blocks=12, v2_runner=v2_runner)
    driver = Driver(scheduler)
    driver.add(make_request("r0", 20, 60))
    driver.add(make_request("r1", 20, 4 if how == "length" else 60))
    for _ in range(2):
        driver.step()
    driver.add(make_request("big", 170, 2))
    carried = []
    original = scheduler._carry_over
    scheduler._carry_over = lambda *args: (carried.append(1), original(*args))
    if how == "abort":
        driver.step()
        scheduler.finish_requests("r1", RequestStatus.FINISHED_ABORTED)
        driver.finished.add("r1")
    while "r1" not in driver.finished:
        driver.step()
    calls = len(driver.outputs)
    step_before = scheduler.current_step
    carried.clear()

    driver.step()
    output = driver.outputs[-1]
    assert carried, "the prefill attempt was not discarded"
    assert output.finished_req_ids == {"r1"}
    assert list(output.num_scheduled_tokens) == ["r0"]
    assert scheduler.last_step_kind == "decode"
    assert scheduler.current_step == step_before + 1  # one step, however many attempts
    if compat.RESUMED_IN_CACHED and not v2_runner:
        # r0 ran in the previous step: the runner already has its tokens.
        assert output.scheduled_cached_reqs.all_token_ids == {}
    assert len(driver.outputs) == calls + 1

    driver.run(max_steps=500)
    assert driver.reported_finished["r1"] == 1
    assert driver.requests["big"].status == RequestStatus.FINISHED_LENGTH_CAPPED


def test_async_variant_keeps_the_phase_rule(make_scheduler):
    scheduler = make_scheduler(
        TTAsyncScheduler,
        max_num_batched_tokens=32,
        tt={"decode_interleave_prefill_steps": 2},
    )
    driver = Driver(scheduler, depth=2)
    driver.run({0: [make_request("r0", 20, 30)], 6: [make_request("r1", 160, 5)]})
    driver.assert_all_done()
    kinds = kinds_string(driver.kinds)
    assert "PPDPPDP" in kinds
    assert scheduler.step_kinds["prefill"] == 1 + 5


# --- pieces ------------------------------------------------------------------------------


def test_step_kind_is_logged_at_debug_level(make_scheduler, caplog):
    scheduler = make_scheduler()
    name = "vllm.ttbundles.scheduler"
    with caplog.at_level(logging.DEBUG, logger=name):
        Driver(scheduler).run({0: [make_request("r0", 8, 2)]})
    messages = [r.getMessage() for r in caplog.records if r.name == name]
    assert [m.split(": ")[1].split()[0] for m in messages] == ["prefill", "decode", "empty"]


def interleave_options(tt: dict[str, Any] | None) -> Any:
    return effective_options(SimpleNamespace(additional_config={"tt": tt} if tt else None))


def test_interleave_defaults_are_the_reference_plugins():
    got = interleave_options(None)
    assert (
        got.decode_interleave_enabled,
        got.decode_interleave_prefill_steps,
        got.decode_interleave_decode_steps,
    ) == (True, 2, 1)
    set_by_user = interleave_options({"decode_interleave_decode_steps": 3})
    assert set_by_user.decode_interleave_decode_steps == 3
    assert set_by_user.decode_interleave_prefill_steps == 2


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("decode_interleave_prefill_steps", 0),
        ("decode_interleave_decode_steps", -1),
        ("decode_interleave_prefill_steps", True),  # a bool is not an int
        ("decode_interleave_decode_steps", False),
        ("decode_interleave_prefill_steps", 2.0),
        ("decode_interleave_decode_steps", "1"),
        ("decode_interleave_enabled", 1),  # nor an int a bool
        ("decode_interleave_enabled", "true"),
    ],
)
def test_interleave_options_are_strictly_typed(key, value):
    with pytest.raises(ConfigurationError) as info:
        interleave_options({key: value})
    (problem,) = info.value.diagnostics
    assert problem.code == "TTB038"
    assert f"tt.{key}={value!r}" in problem.message


def test_restore_running_keeps_order_and_the_base_changes():
    a, b, c, d, e = (SimpleNamespace(name=n) for n in "abcde")
    # Nothing removed: hidden requests keep their places, admitted ones go last.
    assert _restore_running([a, b, c], [b], [b, e]) == [a, b, c, e]
    # b preempted from the visible [b, d]; e admitted.
    assert _restore_running([a, b, c, d], [b, d], [d, e]) == [a, c, d, e]
    # Everything visible preempted.
    assert _restore_running([a, b, c], [a, c], []) == [b]
