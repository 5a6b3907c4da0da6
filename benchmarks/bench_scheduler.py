"""Benchmark the host overhead of `TTScheduler` against vLLM's own `Scheduler`.

The workload is the steady state a server spends most of its time in: a full batch of
running requests in decode (32 by default, long `max_tokens`, no EOS), nothing waiting.
Each step is `schedule()` plus `update_from_output()` with a fake model output (one
token per request), the work the engine core does on the host between device steps.

Both schedulers are built from the same configuration in one process, and their steps
run in alternating repetitions (the order flips every repetition) so that drift in
machine load hits both alike. Reported: the median microseconds per step for each, and
the ratio ours / vLLM (target: <= 1.2).

With `--lanes N` the comparison is the lane coordinator (N in-process lanes of
requests / N running each, one phase scheduler per lane) against one `TTScheduler` with
all the requests running: the price of lanes on the host (target: <= 1.3).

Usage: python benchmarks/bench_scheduler.py [--steps 4000] [--repetitions 20]
       [--requests 32] [--async-scheduling] [--lanes N] [--json]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from unittest import mock

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

BLOCK_SIZE = 16
PROMPT_LEN = 32
TOKEN = 7


def build_scheduler(
    cls: type,
    checkpoint: Path,
    *,
    num_requests: int,
    max_len: int,
    async_scheduling: bool,
    lanes: int = 1,
) -> Any:
    """A scheduler on a real VllmConfig, whatever platform this process picked.

    Built as the tests build theirs (`tests/vllm_config.py`): the platform's
    configuration hook bypassed, a CPU device config that builds on any platform.
    """
    from vllm.v1.structured_output import StructuredOutputManager

    from tests.vllm_config import kv_cache_config, vllm_config
    from ttbundles.serving.planning.options import TT_DEFAULTS
    from ttbundles.serving.planning.plan import PLAN_KEY, BundleRef, Plan

    num_blocks = (num_requests * (max_len // BLOCK_SIZE + 2) + 1) * lanes
    # The plan a single-execute bundle gets (lanes), or none (the scheduler's defaults).
    bundle = BundleRef("demo-lanes", "1.0.0", "built-in", "", "adapter:DemoGenerator")
    plan = Plan("TTLlamaForCausalLM", bundle, "HOST", TT_DEFAULTS.model_dump(exclude_none=True))
    plan.lanes = lanes
    additional = {PLAN_KEY: plan.to_dict()} if lanes > 1 else {}
    # The V1 runner's bookkeeping (what the TT model runner uses) is the costlier one.
    config = vllm_config(
        checkpoint,
        max_num_seqs=num_requests,
        max_num_batched_tokens=max(2048, num_requests * PROMPT_LEN),
        max_model_len=max_len,
        block_size=BLOCK_SIZE,
        async_scheduling=async_scheduling,
        additional_config=additional,
        hf_overrides={"max_position_embeddings": max_len},
    )
    config.cache_config.num_gpu_blocks = num_blocks
    from ttbundles.serving import compat

    with mock.patch.dict(os.environ, compat.runner_protocol_env()):
        return cls(
            vllm_config=config,
            kv_cache_config=kv_cache_config(num_blocks, BLOCK_SIZE),
            structured_output_manager=StructuredOutputManager(config),
            block_size=BLOCK_SIZE,
        )


class Bench:
    """One scheduler with its running batch, stepped like the engine core steps it."""

    def __init__(self, name: str, scheduler: Any, num_requests: int, max_tokens: int, depth: int):
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        self.name = name
        self.scheduler = scheduler
        self.depth = depth  # batches in flight: 1 synchronous, 2 async scheduling
        self.in_flight: list[tuple[Any, Any]] = []
        self.step_ns: list[int] = []
        for i in range(num_requests):
            scheduler.add_request(
                Request(
                    request_id=f"r{i}",
                    prompt_token_ids=[10 + (i + j) % 300 for j in range(PROMPT_LEN)],
                    sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                    pooling_params=None,
                )
            )
        # The prefill step (and the async pipeline fill) are not what is measured.
        for _ in range(depth + 1):
            self.step(timed=False)
        assert scheduler.get_request_counts() == (num_requests, 0)

    def step(self, timed: bool = True) -> None:
        from ttbundles.serving import compat

        scheduler = self.scheduler
        start = time.perf_counter_ns()
        output = scheduler.schedule()
        elapsed = time.perf_counter_ns() - start
        # The fake model: built outside the timed region (it is the device's part).
        req_ids = list(output.num_scheduled_tokens)
        model_output = compat.model_runner_output(
            req_ids, {req_id: i for i, req_id in enumerate(req_ids)}, [[TOKEN]] * len(req_ids), None
        )
        self.in_flight.append((output, model_output))
        if len(self.in_flight) >= self.depth:
            done, done_output = self.in_flight.pop(0)
            start = time.perf_counter_ns()
            scheduler.update_from_output(done, done_output)
            elapsed += time.perf_counter_ns() - start
        if timed:
            assert output.total_num_scheduled_tokens == scheduler.get_request_counts()[0]
            self.step_ns.append(elapsed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--steps", type=int, default=4000, help="decode steps measured per scheduler (default 4000)"
    )
    parser.add_argument(
        "--repetitions",
        type=int,
        default=20,
        help="alternating blocks the steps are split into (default 20)",
    )
    parser.add_argument(
        "--requests", type=int, default=32, help="running requests in the batch (default 32)"
    )
    parser.add_argument(
        "--async-scheduling",
        action="store_true",
        help="compare TTAsyncScheduler with vLLM's AsyncScheduler",
    )
    parser.add_argument(
        "--lanes",
        type=int,
        default=1,
        help="compare the lane coordinator with this many lanes (requests split evenly) "
        "against one TTScheduler",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)

    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler

    from ttbundles.demo.checkpoint import write_checkpoint
    from ttbundles.serving.lanes import TTLaneCoordinator
    from ttbundles.serving.scheduler import TTAsyncScheduler, TTScheduler

    depth = 2 if args.async_scheduling else 1
    per_rep = max(1, args.steps // args.repetitions)
    max_tokens = per_rep * args.repetitions + 16
    max_len = PROMPT_LEN + max_tokens + 16
    lanes = args.lanes
    if lanes > 1:
        if args.requests % lanes:
            parser.error(f"--requests {args.requests} must be a multiple of --lanes {lanes}")
        baseline = TTAsyncScheduler if args.async_scheduling else TTScheduler
        pairs: tuple[type, type] = (baseline, TTLaneCoordinator)
        target = 1.3
    else:
        pairs = (
            (AsyncScheduler, TTAsyncScheduler)
            if args.async_scheduling
            else (Scheduler, TTScheduler)
        )
        target = 1.2
    with tempfile.TemporaryDirectory(prefix="bench-scheduler-") as tmp:
        checkpoint = Path(tmp) / "demo"
        write_checkpoint(checkpoint)
        benches = [
            Bench(
                cls.__name__,
                build_scheduler(
                    cls,
                    checkpoint,
                    num_requests=args.requests,
                    max_len=max_len,
                    async_scheduling=args.async_scheduling,
                    lanes=lanes if cls is TTLaneCoordinator else 1,
                ),
                args.requests,
                max_tokens,
                depth,
            )
            for cls in pairs
        ]

    gc.collect()
    for rep in range(args.repetitions):
        for bench in benches if rep % 2 == 0 else reversed(benches):
            for _ in range(per_rep):
                bench.step()

    vllm_bench, tt_bench = benches
    tt_kinds = dict(tt_bench.scheduler.step_kinds)  # the coordinator counts steps too
    assert tt_kinds["decode"] >= per_rep * args.repetitions, tt_kinds
    medians = {b.name: statistics.median(b.step_ns) / 1000 for b in benches}
    ratio = medians[tt_bench.name] / medians[vllm_bench.name]
    result = {
        "workload": f"{args.requests} running requests, decode only"
        + (f", {lanes} lanes x {args.requests // lanes}" if lanes > 1 else ""),
        "async_scheduling": args.async_scheduling,
        "steps_per_scheduler": len(tt_bench.step_ns),
        "repetitions": args.repetitions,
        "median_us_per_step": medians,
        "mean_us_per_step": {b.name: statistics.fmean(b.step_ns) / 1000 for b in benches},
        "ratio": ratio,
        "target": target,
        "within_target": ratio <= target,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        for bench in benches:
            print(
                f"{bench.name:>18}: {medians[bench.name]:8.1f} us/step (median of "
                f"{len(bench.step_ns)} steps)"
            )
        verdict = "ok" if ratio <= target else "MISSED"
        print(f"{'ratio':>18}: {ratio:8.3f}  (target <= {target}: {verdict})")
    return 0 if ratio <= target else 1


if __name__ == "__main__":
    sys.exit(main())
