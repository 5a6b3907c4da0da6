"""Serving throughput with 2 data-parallel engines against 1, on the host mesh.

In one run, on the demo checkpoint (a tiny Llama, float32, CPU), the same workload is
driven by vLLM's own client (`vllm bench serve --dataset-name random`) against:

- `vllm serve` with one engine (the baseline), then
- `vllm serve --data-parallel-size 2`: two engine cores, each on its own host submesh,
  with vLLM's load balancer (two API servers and the DP coordinator) in front.

`--max-num-seqs` is per engine, as in vLLM, so two ranks hold twice the sequences. Reports
output tokens per second for each and the ratio (2 ranks / 1). On a machine with 2 cores
shared by the client, the API servers and both engines, the ratio says what the
multi-process path costs or gains here, not what two Tenstorrent submeshes would give.

    .venv/bin/python benchmarks/bench_dp.py [--num-prompts 64] [--max-concurrency 16]
        [--input-len 64] [--output-len 64] [--max-num-seqs 8] [--ranks 2] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.server import serve_environment, start_server

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_serve import bench_client, client_summary  # noqa: E402 - the same client as the serving benchmark
from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder


def serve_and_measure(checkpoint: Path, workdir: Path, ranks: int, args) -> dict:
    """Output tokens/s that `vllm bench serve` measures against a server with `ranks`."""
    workdir.mkdir(parents=True, exist_ok=True)
    log_path = workdir / "server.log"
    serve_args = [
        "--max-model-len",
        str(args.input_len + args.output_len + 16),
        "--max-num-seqs",
        str(args.max_num_seqs),
        *(["--data-parallel-size", str(ranks)] if ranks > 1 else []),
    ]
    env = {**serve_environment(), "TT_BUNDLES_STATS_FILE": str(workdir / "stats.json")}
    env.pop("TT_VISIBLE_DEVICES", None)
    server = start_server(checkpoint, vllm_args=serve_args, env=env, log_path=log_path)
    try:
        startup = server.wait_ready(900.0)
        result = bench_client(server.base_url, checkpoint, workdir, args)
    finally:
        server.stop()
    # Decode steps per rank: both engines must have worked for the figure to mean anything.
    files = sorted(workdir.glob("stats*.json"))
    decode_steps = [json.loads(f.read_text()).get("step.decode", 0) for f in files]
    return {
        "ranks": ranks,
        "startup_s": startup,
        **client_summary(result),
        "decode_steps_per_rank": decode_steps,
    }


def main() -> None:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="per engine, as in vLLM")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-dp-") as tmp:
        workdir = Path(tmp)
        checkpoint = write_demo_checkpoint(workdir / "checkpoint")
        one = serve_and_measure(checkpoint, workdir / "dp1", 1, args)
        many = serve_and_measure(checkpoint, workdir / f"dp{args.ranks}", args.ranks, args)
    if len(many["decode_steps_per_rank"]) != args.ranks or not all(many["decode_steps_per_rank"]):
        sys.exit(f"not every rank decoded: {many['decode_steps_per_rank']}")
    ratio = many["output_tokens_per_s"] / one["output_tokens_per_s"]
    report = {
        "workload": {
            k: getattr(args, k)
            for k in ("num_prompts", "max_concurrency", "input_len", "output_len", "max_num_seqs")
        },
        "one_engine": one,
        f"{args.ranks}_engines": many,
        "ratio": ratio,
        "cpu_count": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    w = report["workload"]
    print(
        f"workload: {w['num_prompts']} prompts x {w['input_len']} tokens in, "
        f"{w['output_len']} out, concurrency {w['max_concurrency']}, "
        f"max_num_seqs {w['max_num_seqs']} per engine; {os.cpu_count()} cores"
    )
    for label, run in (("1 engine  ", one), (f"{args.ranks} engines", many)):
        print(
            f"{label}: {run['output_tokens_per_s']:8.1f} output tok/s "
            f"({run['output_tokens']} tokens in {run['duration_s']:.2f} s; "
            f"TTFT {run['mean_ttft_ms']:.0f} ms, TPOT {run['mean_tpot_ms']:.1f} ms; "
            f"decode steps per rank {run['decode_steps_per_rank']}; "
            f"ready after {run['startup_s']:.0f} s)"
        )
    print(f"ratio ({args.ranks} engines / 1): {ratio:.2f}")


if __name__ == "__main__":
    main()
