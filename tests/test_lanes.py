"""The lane coordinator's rules, as behaviour, through the scheduler interface.

A real `TTLaneCoordinator` over real per-lane phase schedulers, on a real `VllmConfig`
(the demo checkpoint) whose plan says 4 lanes. A small driver plays the engine core: it
schedules, "executes" by sampling one token for every request whose prompt is complete,
and feeds `ModelRunnerOutput` back through `update_from_output`, checking every step:
one phase for all lanes, each request in the lane it was bound to, finished and
preempted ids reported once, nothing lost.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from vllm.config import VllmConfig
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.outputs import ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from tests.vllm_config import kv_cache_config, vllm_config
from ttbundles.demo.checkpoint import write_checkpoint
from ttbundles.errors import ConfigurationError
from ttbundles.serving import compat
from ttbundles.serving.api_server.lane_metrics import take_lane_stats
from ttbundles.serving.lane_output import lane_of, lane_outputs
from ttbundles.serving.lanes import TTLaneCoordinator, merge_outputs, pick_lane
from ttbundles.serving.planning.options import TT_DEFAULTS
from ttbundles.serving.planning.plan import PLAN_KEY, BundleRef, Plan
from ttbundles.serving.scheduler import TTAsyncScheduler, TTScheduler

BLOCK = 16
TOKEN = 7


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("lanes") / "demo"
    write_checkpoint(path)
    return path


def make_config(
    checkpoint: Path,
    *,
    lanes: int,
    per_lane: int,
    budget: int = 64,
    max_model_len: int = 256,
    async_scheduling: bool = False,
    tt: dict | None = None,
    prefix_caching: bool = False,
) -> VllmConfig:
    """A config as the platform's plan leaves it for `lanes` lanes: max_num_seqs is the
    total, the plan carries the lanes (the plan's own rules are tested with the plan)."""
    options = TT_DEFAULTS.model_dump(exclude_none=True) | dict(tt or {})
    bundle = BundleRef("demo-lanes", "1.0.0", "built-in", "", "adapter:DemoGenerator")
    plan = Plan(tt_arch="TTLlamaForCausalLM", bundle=bundle, mesh="HOST", options=options)
    plan.lanes = lanes
    return vllm_config(
        checkpoint,
        max_num_seqs=lanes * per_lane,
        max_num_batched_tokens=budget,
        max_model_len=max_model_len,
        block_size=BLOCK,
        async_scheduling=async_scheduling,
        prefix_caching=prefix_caching,
        additional_config={PLAN_KEY: plan.to_dict()},
    )


def kv_config(num_blocks: int) -> KVCacheConfig:
    return kv_cache_config(num_blocks, BLOCK)


@pytest.fixture
def make_coordinator(checkpoint):
    def build(*, lanes: int = 4, per_lane: int = 2, num_blocks: int = 400, **kwargs):
        config = make_config(checkpoint, lanes=lanes, per_lane=per_lane, **kwargs)
        config.cache_config.num_gpu_blocks = num_blocks  # what the engine sets
        return TTLaneCoordinator(
            vllm_config=config,
            kv_cache_config=kv_config(num_blocks),
            structured_output_manager=StructuredOutputManager(config),
            block_size=BLOCK,
            log_stats=True,
        )

    return build


def make_request(name: str, prompt_len: int, max_tokens: int, first: int = 10) -> Request:
    return Request(
        request_id=name,
        prompt_token_ids=[first + i % 300 for i in range(prompt_len)],
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
        pooling_params=None,
    )


@dataclass
class LaneDriver:
    """The engine core's synchronous loop around the coordinator, checking each step."""

    coordinator: TTLaneCoordinator
    requests: dict[str, Request] = field(default_factory=dict)
    outputs: list[SchedulerOutput] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)
    bound: dict[str, int] = field(default_factory=dict)
    reported_finished: Counter = field(default_factory=Counter)
    reported_preempted: int = 0

    def add(self, request: Request) -> None:
        self.requests[request.request_id] = request
        self.coordinator.add_request(request)
        lane = self.coordinator.lane_of_request(request.request_id)
        assert lane is not None
        self.bound[request.request_id] = lane

    def step(self) -> SchedulerOutput:
        coordinator = self.coordinator
        before = {
            r.request_id: r.is_prefill_chunk or r.num_computed_tokens == 0
            for lane in coordinator.lanes
            for r in lane.running
        }
        admitting = {r.request_id for lane in coordinator.lanes for r in lane.waiting}
        output = coordinator.schedule()
        self.check(output, before, admitting)
        self.outputs.append(output)
        coordinator.update_from_output(output, self.model_output(output))
        return output

    def check(self, output: SchedulerOutput, before: dict[str, bool], admitting: set) -> None:
        kinds = {
            "prefill" if req_id in admitting or before.get(req_id, True) else "decode"
            for req_id in output.num_scheduled_tokens
        }
        assert len(kinds) <= 1, f"lanes mixed phases: {output.num_scheduled_tokens}"
        self.kinds.append(kinds.pop() if kinds else "empty")
        slices = lane_outputs(output)
        placed = lane_of(output)
        assert (
            slices is not None and placed is not None and len(slices) == len(self.coordinator.lanes)
        )
        # The merged step is exactly the lanes' slices, each lane's requests its own.
        merged: dict[str, int] = {}
        for index, part in enumerate(slices):
            for req_id, count in part.num_scheduled_tokens.items():
                assert self.bound[req_id] == index, f"{req_id} left lane {self.bound[req_id]}"
                assert placed[req_id] == index
                merged[req_id] = count
        assert merged == output.num_scheduled_tokens
        assert output.total_num_scheduled_tokens == sum(merged.values())
        for index, lane in enumerate(self.coordinator.lanes):
            assert len(lane.running) <= self.coordinator.per_lane
            for request in lane.running:
                assert self.bound[request.request_id] == index
        self.reported_finished.update(output.finished_req_ids)
        self.reported_preempted += len(output.preempted_req_ids or ())

    def model_output(self, output: SchedulerOutput) -> ModelRunnerOutput:
        req_ids = list(output.num_scheduled_tokens)
        sampled = [[] if self.requests[r].is_prefill_chunk else [TOKEN] for r in req_ids]
        return compat.model_runner_output(
            req_ids, {r: i for i, r in enumerate(req_ids)}, sampled, None
        )

    def run(self, arrivals: dict[int, list[Request]] | None = None, max_steps: int = 3000):
        arrivals = dict(arrivals or {})
        for step in range(max_steps):
            for request in arrivals.pop(step, []):
                self.add(request)
            if not arrivals and not self.coordinator.has_requests():
                return
            self.step()
        raise AssertionError(f"no progress: {self.coordinator.get_request_counts()} after {step}")

    def assert_all_done(self) -> None:
        for request in self.requests.values():
            assert request.status == RequestStatus.FINISHED_LENGTH_CAPPED, request
            assert len(request.output_token_ids) == request.max_tokens
        assert set(self.reported_finished) == set(self.requests)
        assert max(self.reported_finished.values()) == 1, "a finished id reported twice"
        preemptions = sum(r.num_preemptions for r in self.requests.values())
        assert self.reported_preempted == preemptions
        assert self.coordinator.get_request_counts() == (0, 0)
        assert self.coordinator.get_kv_cache_usage() == 0.0


# --- assignment -------------------------------------------------------------------------


def test_least_loaded_lane_counts_waiting_four_times():
    assert pick_lane([(0, 0), (0, 0)]) == 0  # ties go to the lowest lane
    assert pick_lane([(0, 2), (0, 1), (0, 1)]) == 1
    assert pick_lane([(1, 0), (0, 3)]) == 1  # 4 x 1 waiting > 3 running
    assert pick_lane([(1, 0), (0, 4)]) == 0  # 4 = 4: the lower lane


def test_eight_requests_spread_two_per_lane_and_stay_bound(make_coordinator):
    coordinator = make_coordinator()
    driver = LaneDriver(coordinator)
    driver.run({0: [make_request(f"r{i}", 20, 6) for i in range(8)]})
    driver.assert_all_done()
    assert Counter(driver.bound.values()) == {0: 2, 1: 2, 2: 2, 3: 2}
    # All eight admitted in the first step, across the lanes.
    assert len(driver.outputs[0].num_scheduled_tokens) == 8
    assert [len(o.scheduled_new_reqs) for o in lane_outputs(driver.outputs[0])] == [2, 2, 2, 2]


def test_lanes_are_capped_at_their_own_max_num_seqs(make_coordinator):
    """A lane admits at most per_lane requests even when the others have room: bound
    requests wait in their lane (no migration), as with vLLM's DP engines."""
    coordinator = make_coordinator(lanes=2, per_lane=2)
    driver = LaneDriver(coordinator)
    # All arrive at once: the least-loaded rule spreads them 3 and 3 (waiting counts 4x).
    driver.run({0: [make_request(f"r{i}", 10, 5) for i in range(6)]})
    driver.assert_all_done()
    assert Counter(driver.bound.values()) == {0: 3, 1: 3}
    assert max(len(o.num_scheduled_tokens) for o in driver.outputs) == 4


# --- the shared step mode ---------------------------------------------------------------


def test_a_prefill_in_one_lane_makes_every_lane_prefill(make_coordinator):
    coordinator = make_coordinator()
    driver = LaneDriver(coordinator)
    for i in range(3):
        driver.add(make_request(f"d{i}", 10, 30))
    for _ in range(3):
        driver.step()
    assert driver.kinds == ["prefill", "decode", "decode"]
    driver.add(make_request("late", 10, 3))
    output = driver.step()
    # The late request's lane prefills; the decoding lanes contribute empty slices.
    assert driver.kinds[-1] == "prefill"
    assert list(output.num_scheduled_tokens) == ["late"]
    assert [p.total_num_scheduled_tokens for p in lane_outputs(output)].count(0) == 3
    driver.run()
    driver.assert_all_done()


def test_decode_interleave_is_the_steps_not_a_lanes(make_coordinator):
    """A long chunked prompt in lane 1 while lane 0 decodes: P P D P P D ... over the
    whole step (the cadence is kept once, by the coordinator)."""
    coordinator = make_coordinator(budget=32)
    driver = LaneDriver(coordinator)
    driver.add(make_request("d", 20, 40))
    driver.step()
    driver.step()
    driver.add(make_request("long", 160, 3))  # 5 chunks of 32
    for _ in range(7):
        driver.step()
    assert "".join(k[0].upper() for k in driver.kinds[2:9]) == "PPDPPDP"
    driver.run()
    driver.assert_all_done()


def test_idle_lanes_drain_their_finished_ids(make_coordinator):
    """A request that finishes in a lane reports its id in the next step, whatever the
    other lanes do (every lane is scheduled every step)."""
    coordinator = make_coordinator()
    driver = LaneDriver(coordinator)
    driver.add(make_request("short", 10, 1))  # lane 0, done after its prefill
    driver.add(make_request("long", 10, 20))  # lane 1
    driver.step()
    assert driver.requests["short"].status == RequestStatus.FINISHED_LENGTH_CAPPED
    output = driver.step()
    assert "short" in output.finished_req_ids
    assert "short" in lane_outputs(output)[0].finished_req_ids
    driver.run()
    driver.assert_all_done()


# --- the retry rule and KV pressure -----------------------------------------------------


def test_a_prefill_that_admits_nothing_is_rerun_as_decode(make_coordinator):
    """Lane 0's cache is full of running decodes when a prompt arrives for it: the
    forced prefill admits nothing, so the step is re-run as decode and the decodes
    advance, free blocks, and the prompt gets in. Nothing loops, nothing is lost."""
    # 2 lanes x 12 blocks (192 tokens); two 80-token prompts generating 60 tokens each
    # need 18 blocks in lane 0 when only 12 exist.
    coordinator = make_coordinator(lanes=2, per_lane=2, num_blocks=24, max_model_len=192)
    assert coordinator.lane_kv_cache_config.num_blocks == 12
    driver = LaneDriver(coordinator)
    driver.add(make_request("a", 80, 60))  # lane 0
    driver.add(make_request("b", 16, 60, first=200))  # lane 1
    driver.add(make_request("c", 80, 60, first=400))  # lane 0 (4 x 0 + 1 running ties)
    assert driver.bound == {"a": 0, "b": 1, "c": 0}
    driver.run()
    driver.assert_all_done()
    assert coordinator.retries > 0
    assert sum(r.num_preemptions for r in driver.requests.values()) > 0


@pytest.mark.parametrize("async_scheduling", [False, True])
def test_tiny_kv_cache_under_load_everyone_finishes(make_coordinator, async_scheduling):
    coordinator = make_coordinator(
        lanes=4, per_lane=2, num_blocks=48, max_model_len=160, async_scheduling=async_scheduling
    )
    assert isinstance(coordinator.lanes[0], TTAsyncScheduler if async_scheduling else TTScheduler)
    driver = LaneDriver(coordinator)
    arrivals = {step: [make_request(f"r{step}-{j}", 40 + 7 * j, 50) for j in range(2)]
                for step in range(0, 40, 5)}  # fmt: skip
    driver.run(arrivals)
    driver.assert_all_done()
    assert sum(r.num_preemptions for r in driver.requests.values()) > 0


def test_a_cache_too_small_for_one_sequence_per_lane_is_refused(make_coordinator):
    with pytest.raises(ConfigurationError) as info:
        make_coordinator(lanes=4, num_blocks=40, max_model_len=256)  # 10 per lane < 16
    assert info.value.diagnostics[0].code == "TTB214"
    assert "10 blocks per lane" in str(info.value)


# --- aborts ------------------------------------------------------------------------------


def test_an_abort_reaches_its_lane_and_is_reported_once(make_coordinator):
    coordinator = make_coordinator()
    driver = LaneDriver(coordinator)
    for i in range(6):
        driver.add(make_request(f"r{i}", 10, 30))
    for _ in range(3):
        driver.step()
    assert coordinator.has_request("r4")
    aborted = coordinator.finish_requests(["r4", "unknown"], RequestStatus.FINISHED_ABORTED)
    assert [r.request_id for r in aborted] == ["r4"]
    assert not coordinator.has_request("r4")
    output = driver.step()
    assert "r4" in output.finished_req_ids
    assert "r4" in lane_outputs(output)[driver.bound["r4"]].finished_req_ids
    del driver.requests["r4"]
    driver.run()
    assert driver.reported_finished["r4"] == 1
    assert set(driver.reported_finished) == set(driver.requests) | {"r4"}


# --- merge and statistics ---------------------------------------------------------------


def test_merge_concatenates_in_lane_order_and_takes_the_largest_common_prefix():
    if not hasattr(SchedulerOutput.make_empty(), "num_common_prefix_blocks"):
        pytest.skip("this vLLM release has no num_common_prefix_blocks (removed in 0.34.0)")
    lanes = [SchedulerOutput.make_empty() for _ in range(3)]
    lanes[0].num_scheduled_tokens = {"a": 3}
    lanes[0].total_num_scheduled_tokens = 3
    lanes[0].num_common_prefix_blocks = [2]
    lanes[0].finished_req_ids = {"x"}
    lanes[1].num_common_prefix_blocks = [5]
    lanes[1].preempted_req_ids = {"p"}
    lanes[2].num_scheduled_tokens = {"b": 1, "c": 1}
    lanes[2].total_num_scheduled_tokens = 2
    lanes[2].num_common_prefix_blocks = [1]
    lanes[2].finished_req_ids = {"y"}
    lanes[2].free_encoder_mm_hashes = ["h"]
    merged = merge_outputs(lanes)
    assert list(merged.num_scheduled_tokens) == ["a", "b", "c"]
    assert merged.total_num_scheduled_tokens == 5
    assert merged.num_common_prefix_blocks == [5]
    assert merged.finished_req_ids == {"x", "y"}
    assert merged.preempted_req_ids == {"p"}
    assert merged.free_encoder_mm_hashes == ["h"]
    assert merge_outputs([SchedulerOutput.make_empty()]).preempted_req_ids is None


def test_stats_are_totals_with_each_lanes_numbers_alongside(make_coordinator):
    coordinator = make_coordinator(lanes=2, per_lane=2)
    driver = LaneDriver(coordinator)
    for i in range(3):
        driver.add(make_request(f"r{i}", 10, 20))
    output = coordinator.schedule()
    result = coordinator.update_from_output(output, driver.model_output(output))
    stats = next(iter(result.values())).scheduler_stats
    assert (stats.num_running_reqs, stats.num_waiting_reqs) == (3, 0)
    lanes = take_lane_stats(stats.num_kv_fetch_reqs_by_stage)
    assert {lane: values["running"] for lane, values in lanes.items()} == {0: 2, 1: 1}
    assert lanes[0]["kv_usage"] > lanes[1]["kv_usage"] > 0
    mean = (lanes[0]["kv_usage"] + lanes[1]["kv_usage"]) / 2
    assert stats.kv_cache_usage == pytest.approx(mean, abs=1e-5)  # travels in ppm
    assert {lane: values["assigned"] for lane, values in lanes.items()} == {0: 2, 1: 1}
    assert not any(k.startswith("ttbundles:") for k in stats.num_kv_fetch_reqs_by_stage)
