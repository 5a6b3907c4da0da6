"""In-process lanes end to end: `vllm serve --data-parallel-size 4` of a single-execute
bundle (the demo's `demo-lanes` variant) on the host mesh, through the real OpenAI client.

The "lanes" server (conftest.py) runs 4 lanes x 2 sequences with 12 KV blocks per lane,
async decode and device sampling; transformers on the same checkpoint is the reference
(one lane, one sequence: what every lane must reproduce).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.conftest import LANES
from tests.e2e.test_serving import GREEDY, complete, output_ids, random_ids

pytestmark = pytest.mark.server


def concurrently(server, prompts, max_tokens):
    barrier = threading.Barrier(len(prompts))

    def send(prompt):
        barrier.wait()
        return complete(server, prompt, max_tokens=max_tokens, **GREEDY)

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(send, prompts))


def wait_idle(server, timeout: float = 30.0) -> dict:
    """The lane gauges once every lane is empty: nothing running or waiting, no KV."""
    deadline = time.monotonic() + timeout
    while True:
        lanes = server.lane_metrics()
        busy = any(
            any(lanes.get(name, {}).values())
            for name in (
                "ttbundles:lane_num_requests_running",
                "ttbundles:lane_num_requests_waiting",
                "ttbundles:lane_kv_cache_usage_perc",
            )
        )
        if not busy or time.monotonic() > deadline:
            return lanes
        time.sleep(0.1)


def test_the_server_runs_one_engine_with_four_lanes(lanes_server):
    log = lanes_server.log_since(0)
    assert "4 in-process lanes in one engine" in log  # the plan's decision
    assert "4 in-process lanes, max_num_seqs 2 per lane (8 in all), 12 KV blocks per lane" in log
    assert log.count("Initializing a V1 LLM engine") == 1


def test_eight_concurrent_requests_spread_over_the_lanes_and_match_one_lane(
    lanes_server, demo_server, reference
):
    wait_idle(lanes_server)
    before = lanes_server.lane_metrics().get("ttbundles:lane_requests_assigned", {})
    prompts = [random_ids(700 + i, 12 + 4 * i, reference.vocab_size) for i in range(8)]
    # 48 tokens each: every request still runs when the last one arrives (a request that
    # finished first would free its lane for a late one: two each is what the policy
    # gives eight requests in flight together); two of the longest fill a lane's 12
    # blocks, so nothing is preempted.
    responses = concurrently(lanes_server, prompts, max_tokens=48)
    for prompt, response in zip(prompts, responses, strict=True):
        assert output_ids(response) == reference.greedy(prompt, 48)
    # The same prompts on the one-lane demo server give the same tokens.
    one_lane = concurrently(demo_server, prompts, max_tokens=48)
    assert [output_ids(r) for r in one_lane] == [output_ids(r) for r in responses]
    lanes = wait_idle(lanes_server)
    assigned = lanes["ttbundles:lane_requests_assigned"]
    delta = {lane: assigned[lane] - before.get(lane, 0) for lane in range(LANES)}
    assert delta == {0: 2, 1: 2, 2: 2, 3: 2}  # the least-loaded lane, two each


def test_kv_pressure_inside_the_lanes_preempts_and_loses_nothing(lanes_server, reference):
    """Eight 40-token prompts generating 120 tokens: two per lane are admitted (3 blocks
    each) and grow to 20 blocks where a lane has 12, so lanes preempt and resume inside
    themselves; every request finishes with transformers' tokens and every lane's cache
    is empty afterwards."""
    before = lanes_server.metrics().get("vllm:num_preemptions_total", 0.0)
    prompts = [random_ids(800 + i, 40, reference.vocab_size) for i in range(8)]
    responses = concurrently(lanes_server, prompts, max_tokens=120)
    for prompt, response in zip(prompts, responses, strict=True):
        assert output_ids(response) == reference.greedy(prompt, 120)
    metrics = lanes_server.wait_for_metric("vllm:num_preemptions_total", before + 1)
    assert metrics["vllm:num_preemptions_total"] > before
    lanes = wait_idle(lanes_server)
    assert set(lanes["ttbundles:lane_kv_cache_usage_perc"].values()) == {0.0}


def test_an_aborted_stream_frees_its_lane(lanes_server, reference):
    prompt = random_ids(900, 20, reference.vocab_size)
    with lanes_server.client() as client:
        stream = client.completions.create(
            model=lanes_server.model,
            prompt=prompt,
            max_tokens=160,
            stream=True,
            extra_body={"ignore_eos": True},
            **GREEDY,
        )
        for count, _ in enumerate(stream):
            if count == 3:
                break
        stream.close()
    lanes = wait_idle(lanes_server)
    assert not any(lanes["ttbundles:lane_num_requests_running"].values())
    assert set(lanes["ttbundles:lane_kv_cache_usage_perc"].values()) == {0.0}
    # The lane serves again, exactly.
    again = complete(lanes_server, prompt, max_tokens=8, **GREEDY)
    assert output_ids(again) == reference.greedy(prompt, 8)


def test_lanes_decode_asynchronously_and_cache_prefixes_per_lane(lanes_server, reference):
    wait_idle(lanes_server)
    before = lanes_server.settled_stats()
    hits_before = lanes_server.metrics().get("vllm:prefix_cache_hits_total", 0.0)
    prompt = random_ids(950, 48, reference.vocab_size)  # three full blocks
    first = complete(lanes_server, prompt, max_tokens=10, **GREEDY)
    wait_idle(lanes_server)
    second = complete(lanes_server, prompt, max_tokens=10, **GREEDY)  # lane 0 again
    assert output_ids(first) == output_ids(second) == reference.greedy(prompt, 10)
    metrics = lanes_server.wait_for_metric("vllm:prefix_cache_hits_total", hits_before + 32)
    assert metrics["vllm:prefix_cache_hits_total"] >= hits_before + 32
    delta = lanes_server.stats_delta(before)
    assert delta.get("decode.async", 0) > 0  # device sampling with async decode
    assert delta.get("sampling.device", 0) > 0


def test_demo_command_serves_lanes(tmp_path):
    """`ttbundle demo --tiny --lanes 2 --query`: the demo-lanes variant, written into the
    cache, served as 2 in-process lanes of one engine, answering through the API."""
    from tests.e2e.test_serving import _demo

    run = _demo(["--query", "--tiny", "--lanes", "2"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    bundle = tmp_path / "ttbundles" / "lanes-models" / "demo-lanes"
    assert f"serving 2 in-process lanes with demo-lanes ({bundle})" in run.stdout
    assert any(line.startswith("completion: 'The capital of France is' -> ") for line in
               run.stdout.splitlines())  # fmt: skip
    log = (tmp_path / "ttbundles" / "demo-server.log").read_text()
    assert "serving TTLlamaForCausalLM with demo-lanes@1.0.0" in log
    assert "2 in-process lanes, max_num_seqs" in log
    assert (bundle / "vllm_metadata.json").is_file()


def test_demo_command_refuses_lanes_with_a_data_parallel_option(tmp_path):
    from tests.e2e.test_serving import _demo

    run = _demo(["--tiny", "--lanes", "2", "--", "--data-parallel-size", "4"], tmp_path)
    assert run.returncode == 1
    assert "TTB209" in run.stderr and "contradict --lanes" in run.stderr
