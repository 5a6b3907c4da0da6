"""Block-output decode against one-token decode: engine steps and host work per token.

A class declaring `output_tokens_per_step` = k answers one device decode with k tokens per
row; the engine then takes one decode step per block instead of one per token, so the
host's whole work per step (vLLM's scheduler, ours, the runner, output processing) is
paid once per k tokens. This measures it on the host mesh, vLLM's `LLMEngine` in one
process (the engine core in this thread), the demo checkpoint, synchronous scheduling
(block output is served synchronously), device sampling, greedy, EOS ignored:

- k4: the reference generator's block mode (`reference.block`, 4 tokens per decode);
- k1: the same reference generator, one token per decode, same settings.

Each side runs in its own process (a bundle per process: both serve the same
architecture); the sides alternate in `--rounds` rounds, which goes first alternating, so
both see the same machine load. Per output token: the engine's decode steps, the engine
thread's CPU time less the generator's own calls (the host's work: what a card's host
pays, the forward being the device's), and the wall time. Median and spread (min-max).

    .venv/bin/python benchmarks/bench_block_output.py [--rounds 5] [--requests 8]
        [--tokens 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

REPO = Path(__file__).resolve().parents[1]
PROMPT_LEN = 16
ADAPTER = """\
from ttbundles.reference.block import ReferenceBlockGenerator
from ttbundles.reference.generator import ReferenceLlamaGenerator


class OneToken(ReferenceLlamaGenerator):
    # The block class's declarations, one token a decode.
    model_capabilities = {
        **ReferenceBlockGenerator.model_capabilities,
        "output_tokens_per_step": 1,
    }


class Blocks(ReferenceBlockGenerator):
    pass
"""


def _bundle(models: Path, side: str) -> None:
    bundle = models / f"bench-{side}"
    bundle.mkdir(parents=True)
    (bundle / "adapter.py").write_text(ADAPTER)
    document = {
        "schema_version": 1,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": "LlamaForCausalLM",
        "main_class": "adapter:Blocks" if side == "k4" else "adapter:OneToken",
        "capabilities": {"sample_on_device": ["decode_only", "all"], "chunked_prefill": True},
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(document))


def child(args: argparse.Namespace) -> None:
    """One side, one round, in this process: the figures as JSON on stdout."""
    import random

    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine

    from ttbundles.serving.stats import STATS

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=args.checkpoint,
            max_model_len=PROMPT_LEN + args.tokens + 32,
            max_num_seqs=args.requests,
            block_size=16,
            enable_prefix_caching=False,
            async_scheduling=False,
            additional_config={"tt": {"sample_on_device_mode": "all"}},
        )
    )
    core = engine.engine_core.engine_core
    generator = core.model_executor.driver_worker.worker.model_runner.generator
    inside = [0.0]
    for name in ("decode_forward", "prefill_forward"):
        original = getattr(generator, name)

        def timed(*a, _original=original, **k):
            start = time.thread_time()
            try:
                return _original(*a, **k)
            finally:
                inside[0] += time.thread_time() - start

        setattr(generator, name, timed)
    rng = random.Random(args.seed)
    vocab = engine.model_config.get_vocab_size()
    params = SamplingParams(max_tokens=args.tokens, temperature=0.0, ignore_eos=True)

    def generate(count: int) -> int:
        for i in range(count):
            prompt = [rng.randrange(7, vocab) for _ in range(PROMPT_LEN)]
            engine.add_request(f"r{rng.random()}-{i}", {"prompt_token_ids": prompt}, params)
        produced = 0
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:
                    produced += len(out.outputs[0].token_ids)
        return produced

    generate(2)  # warm-up
    before = STATS.snapshot()
    inside[0] = 0.0
    cpu, wall = time.thread_time(), time.perf_counter()
    produced = generate(args.requests)
    cpu, wall = time.thread_time() - cpu, time.perf_counter() - wall
    after = STATS.snapshot()
    steps = after.get("step.decode", 0) - before.get("step.decode", 0)
    print(
        json.dumps(
            {
                "tokens": produced,
                "decode_steps": steps,
                "host_us_per_token": (cpu - inside[0]) * 1e6 / produced,
                "wall_us_per_token": wall * 1e6 / produced,
            }
        )
    )
    sys.stdout.flush()
    os._exit(0)  # the engine's teardown is not measured and not needed


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", choices=("k1", "k4"), help=argparse.SUPPRESS)
    parser.add_argument("--checkpoint", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args)
        return

    from ttbundles.demo.checkpoint import write_demo_checkpoint
    from ttbundles.demo.server import serve_environment

    results: dict[str, list[dict]] = {"k1": [], "k4": []}
    with tempfile.TemporaryDirectory(prefix="bench-block-") as tmp:
        work = Path(tmp)
        checkpoint = write_demo_checkpoint(work / "checkpoint")
        for side in results:
            _bundle(work / side, side)
        for r in range(args.rounds):
            order = ("k1", "k4") if r % 2 == 0 else ("k4", "k1")
            for side in order:
                env = {
                    **serve_environment(dict(os.environ)),
                    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
                    "EXTRA_MODELS_DIR": str(work / side),
                    "TT_VLLM_BUILTIN_MODELS": "0",
                }
                run = subprocess.run(
                    [
                        sys.executable,
                        __file__,
                        "--child",
                        side,
                        "--checkpoint",
                        str(checkpoint),
                        "--requests",
                        str(args.requests),
                        "--tokens",
                        str(args.tokens),
                        "--seed",
                        str(args.seed + r),
                    ],
                    env=env,
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                )
                if run.returncode != 0:
                    sys.exit(f"the {side} side failed:\n{run.stderr[-3000:]}")
                results[side].append(json.loads(run.stdout.strip().splitlines()[-1]))
    summary = {
        side: {
            key: spread([row[key] for row in rows])
            for key in ("decode_steps", "host_us_per_token", "wall_us_per_token")
        }
        for side, rows in results.items()
    }
    ratios = [
        b["host_us_per_token"] / a["host_us_per_token"]
        for a, b in zip(results["k1"], results["k4"])
    ]
    summary["host_per_token_k4_over_k1"] = spread(ratios)
    if args.json:
        print(json.dumps(summary, indent=2))
        return
    print(
        f"demo checkpoint, {args.requests} requests x {args.tokens} greedy tokens, synchronous, "
        f"device sampling; median (min-max) of {args.rounds} interleaved rounds"
    )
    for side in ("k1", "k4"):
        s = summary[side]
        print(
            f"{side}: decode steps {s['decode_steps']['median']:.0f}, host work "
            f"{s['host_us_per_token']['median']:.1f} ({s['host_us_per_token']['min']:.1f}-"
            f"{s['host_us_per_token']['max']:.1f}) us/token, wall "
            f"{s['wall_us_per_token']['median']:.1f} us/token"
        )
    r = summary["host_per_token_k4_over_k1"]
    print(
        f"host work per token, k4 / k1: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}, "
        "per round)"
    )


if __name__ == "__main__":
    main()
