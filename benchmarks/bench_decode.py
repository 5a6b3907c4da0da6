"""Decode throughput on the host mesh: asynchronous decode on/off, device/host sampling.

Serves the demo checkpoint with the built-in demo bundle (`ttbundles.demo.server.start_server`,
as the end-to-end tests do), one server at a time, in three configurations:

- async+device: `sample_on_device_mode: "all"`, async scheduling on (vLLM's default): steady
  decode keeps two steps in flight;
- sync+device:  the same with `--no-async-scheduling`: one step at a time;
- async+host:   `sample_on_device_mode: "all"` with `always_compat_sampling: true`: every
  batch samples with vLLM's sampler on host logits, so decode is synchronous too.

Workload, on each: `--concurrency` greedy requests sent together (random short prompts of
`--input-len` token ids), each generating exactly `--output-len` tokens (ignore_eos), with
the OpenAI client in threads; one warm-up round, then `--rounds` measured rounds. Output
tokens/s of a round = its output tokens / wall time from the first send to the last
answer; the median round is reported, with the worker's counters (decode steps,
asynchronous and overlapped steps, sampling path) over the measured rounds, which show
each configuration took the path it claims. Ratios: async/sync (overlap on/off, both
device sampling) and device/host (sampling path, both async scheduling on).

    .venv/bin/python benchmarks/bench_decode.py [--concurrency 16] [--output-len 128]
        [--input-len 16] [--rounds 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.server import serve_environment, start_server

SPECIAL_TOKENS = 7  # the demo tokenizer's first ids are its special tokens


def tt_options(**options) -> list[str]:
    return ["--additional-config", json.dumps({"tt": options})]


CONFIGS = {
    "async+device": tt_options(sample_on_device_mode="all"),
    "sync+device": ["--no-async-scheduling", *tt_options(sample_on_device_mode="all")],
    "async+host": tt_options(sample_on_device_mode="all", always_compat_sampling=True),
}
COUNTERS = (
    "step.prefill",
    "step.decode",
    "decode.async",
    "decode.overlapped",
    "sampling.device",
    "sampling.host",
)


def run_round(client, model: str, prompts: list[list[int]], output_len: int) -> dict:
    """All prompts at once; (output tokens, seconds from first send to last answer)."""
    barrier = threading.Barrier(len(prompts) + 1)

    def send(prompt: list[int]) -> int:
        barrier.wait()
        response = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=output_len,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        return response.usage.completion_tokens

    with ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(send, p) for p in prompts]
        barrier.wait()
        start = time.perf_counter()
        tokens = sum(f.result() for f in futures)
        seconds = time.perf_counter() - start
    expected = len(prompts) * output_len
    if tokens != expected:
        sys.exit(f"expected {expected} output tokens, got {tokens}")
    return {"output_tokens": tokens, "duration_s": seconds, "output_tokens_per_s": tokens / seconds}


def measure(name: str, checkpoint: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """Start the server of configuration `name`, run the workload, stop the server."""
    import openai

    stats_path = workdir / f"{name}-stats.json"
    log_path = workdir / f"{name}-server.log"
    env = {**serve_environment(), "TT_BUNDLES_STATS_FILE": str(stats_path)}
    vllm_args = [
        "--max-model-len",
        str(args.input_len + args.output_len + 16),
        "--max-num-seqs",
        str(args.concurrency),
        *CONFIGS[name],
    ]
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(checkpoint))
    rng = random.Random(args.seed)
    rounds = [
        [
            [rng.randrange(SPECIAL_TOKENS, vocab) for _ in range(args.input_len)]
            for _ in range(args.concurrency)
        ]
        for _ in range(args.rounds + 1)
    ]
    server = start_server(checkpoint, vllm_args=vllm_args, env=env, log_path=log_path)
    try:
        startup = server.wait_ready()
        client = openai.OpenAI(base_url=server.api_url, api_key="EMPTY", timeout=600, max_retries=0)
        run_round(client, str(checkpoint), rounds[0], args.output_len)  # warm-up
        before = json.loads(stats_path.read_text())
        results = [
            run_round(client, str(checkpoint), prompts, args.output_len) for prompts in rounds[1:]
        ]
        time.sleep(0.5)  # the steps that retire the last requests
        after = json.loads(stats_path.read_text())
        client.close()
    except BaseException:
        print(f"{name}: server log {log_path}", file=sys.stderr)
        raise
    finally:
        server.stop()
    median = statistics.median(r["output_tokens_per_s"] for r in results)
    return {
        "startup_s": startup,
        "output_tokens_per_s": median,
        "rounds_output_tokens_per_s": [r["output_tokens_per_s"] for r in results],
        "counters": {k: after.get(k, 0) - before.get(k, 0) for k in COUNTERS},
        "max_in_flight": after.get("decode.max_in_flight"),  # None: no asynchronous step
    }


def main() -> None:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--input-len", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=10, help="measured rounds per server")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="Default: the demo checkpoint, written into a temporary folder.",
    )
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-decode-") as tmp:
        workdir = Path(tmp)
        checkpoint = args.checkpoint_dir or write_demo_checkpoint(workdir / "checkpoint")
        figures = {name: measure(name, checkpoint, workdir, args) for name in CONFIGS}
    tps = {name: f["output_tokens_per_s"] for name, f in figures.items()}
    report = {
        "workload": {
            k: getattr(args, k) for k in ("concurrency", "input_len", "output_len", "rounds")
        },
        "configurations": figures,
        "ratio_async_over_sync": tps["async+device"] / tps["sync+device"],
        "ratio_device_over_host": tps["async+device"] / tps["async+host"],
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"workload: {args.concurrency} concurrent requests x {args.output_len} output tokens "
        f"(prompts of {args.input_len} tokens, ignore_eos, greedy); median of "
        f"{args.rounds} rounds"
    )
    for name, f in figures.items():
        c = f["counters"]
        print(
            f"{name:13s} {f['output_tokens_per_s']:8.1f} output tok/s  "
            f"(rounds: {', '.join(f'{x:.0f}' for x in f['rounds_output_tokens_per_s'])}; "
            f"{c['step.decode']} decode steps, {c['decode.async']} async, "
            f"{c['decode.overlapped']} overlapped, max in flight {f['max_in_flight'] or '-'}; "
            f"sampled on device {c['sampling.device']}, host {c['sampling.host']} batches)"
        )
    print(f"overlap on/off (async/sync, device sampling):   {report['ratio_async_over_sync']:.2f}")
    print(
        f"device/host sampling (both async scheduling on): {report['ratio_device_over_host']:.2f}"
    )


if __name__ == "__main__":
    main()
