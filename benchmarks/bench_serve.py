"""Serving throughput on the host mesh, against transformers `generate()` as the floor.

In one run, on the demo checkpoint (a tiny Llama, float32, CPU):

- transformers: `generate()` greedy, batches of `--max-concurrency` prompts of
  `--input-len` random tokens, `--output-len` new tokens each (EOS ignored), repeated
  until `--num-prompts` prompts are done; measured first, with nothing else running;
- ours: the demo bundle served by `vllm serve` (started as the end-to-end tests start
  it), driven by vLLM's own client, `vllm bench serve --dataset-name random` with the
  same lengths, prompt count and concurrency.

Reports output tokens per second for each and the ratio (ours / transformers). Both run
the same float32 torch model on the same cores; the server adds HTTP, detokenization,
scheduling, paged attention and a separate client process competing for those cores.

    .venv/bin/python benchmarks/bench_serve.py [--num-prompts 64] [--max-concurrency 16]
        [--input-len 64] [--output-len 64] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.server import serve_environment, start_server, vllm_command

SPECIAL_TOKENS = 7  # the demo tokenizer's first ids are its special tokens


def transformers_throughput(checkpoint: Path, args: argparse.Namespace) -> dict:
    """Output tokens/s of batched greedy `generate()` over `num_prompts` prompts."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(checkpoint))
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None  # like --ignore-eos: always output_len
    rng = random.Random(args.seed)
    prompts = torch.tensor(
        [
            [rng.randrange(SPECIAL_TOKENS, vocab) for _ in range(args.input_len)]
            for _ in range(args.num_prompts)
        ]
    )

    def generate(batch: torch.Tensor, new_tokens: int) -> torch.Tensor:
        with torch.no_grad():
            return model.generate(
                batch,
                attention_mask=torch.ones_like(batch),
                max_new_tokens=new_tokens,
                do_sample=False,
            )

    generate(prompts[: args.max_concurrency], 4)  # warm-up, as vllm bench serve does
    runs = []
    for _ in range(args.repeats):  # a run takes well under a second: keep the median
        output_tokens = 0
        start = time.perf_counter()
        for first in range(0, args.num_prompts, args.max_concurrency):
            batch = prompts[first : first + args.max_concurrency]
            out = generate(batch, args.output_len)
            output_tokens += (out.shape[1] - batch.shape[1]) * batch.shape[0]
        runs.append((time.perf_counter() - start, output_tokens))
    duration, output_tokens = statistics.median(runs)
    return {
        "output_tokens": output_tokens,
        "duration_s": duration,
        "output_tokens_per_s": output_tokens / duration,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
    }


def bench_client(base_url: str, checkpoint: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """Run `vllm bench serve` (random prompts of `args.input_len`, `args.output_len` out,
    `args.num_prompts` at `args.max_concurrency`) against `base_url`; its JSON result.
    Exits the benchmark if the client fails or any request did."""
    command = [
        *vllm_command(),
        "bench",
        "serve",
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--model",
        str(checkpoint),
        "--tokenizer",
        str(checkpoint),
        "--dataset-name",
        "random",
        "--random-input-len",
        str(args.input_len),
        "--random-output-len",
        str(args.output_len),
        "--num-prompts",
        str(args.num_prompts),
        "--max-concurrency",
        str(args.max_concurrency),
        "--ignore-eos",
        "--seed",
        str(args.seed),
        "--disable-tqdm",
        "--save-result",
        "--result-dir",
        str(workdir),
        "--result-filename",
        "bench-serve.json",
    ]
    run = subprocess.run(command, capture_output=True, text=True, env=_client_env())
    if run.returncode != 0:
        sys.exit(
            f"vllm bench serve failed ({run.returncode}):\n{run.stdout[-3000:]}\n"
            f"{run.stderr[-3000:]}"
        )
    result = json.loads((workdir / "bench-serve.json").read_text())
    if result["failed"]:
        sys.exit(f"{result['failed']} requests failed: {set(result['errors']) - {''}}")
    return result


def client_summary(result: dict) -> dict:
    """The figures both serving benchmarks report from a `vllm bench serve` result."""
    return {
        "completed": result["completed"],
        "output_tokens": result["total_output_tokens"],
        "duration_s": result["duration"],
        "output_tokens_per_s": result["output_throughput"],
        "mean_ttft_ms": result["mean_ttft_ms"],
        "mean_tpot_ms": result["mean_tpot_ms"],
    }


def serving_throughput(checkpoint: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """Output tokens/s that `vllm bench serve` measures against the demo server."""
    log_path = workdir / "server.log"
    stats_path = workdir / "stats.json"
    env = {**serve_environment(), "TT_BUNDLES_STATS_FILE": str(stats_path)}
    server = start_server(
        checkpoint, port=args.port, vllm_args=args.serve_args, env=env, log_path=log_path
    )
    try:
        startup = server.wait_ready()
        result = bench_client(server.base_url, checkpoint, workdir, args)
        steps = json.loads(stats_path.read_text())  # includes the client's warm-up request
    finally:
        server.stop()
    return {
        "startup_s": startup,
        **client_summary(result),
        "prefill_steps": steps.get("step.prefill", 0),
        "decode_steps": steps.get("step.decode", 0),
        "server_log": str(log_path),
    }


def _client_env() -> dict[str, str]:
    """The benchmark client only talks HTTP: no TT platform in it, and no model hub."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MESH_DEVICE"}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--repeats", type=int, default=3, help="transformers runs; the median is reported"
    )
    parser.add_argument("--port", type=int, default=None, help="Default: a free port.")
    parser.add_argument(
        "--checkpoint-dir",
        type=Path,
        default=None,
        help="Default: the demo checkpoint, written into a temporary folder.",
    )
    parser.add_argument(
        "--serve-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="Further vllm serve options (last on the command line).",
    )
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    parser.add_argument(
        "--model",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="tiny: the demo's random checkpoint; smollm2: the demo's real model.",
    )
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        workdir = Path(tmp)
        if args.checkpoint_dir is not None:
            checkpoint = args.checkpoint_dir
        elif args.model == "smollm2":
            from ttbundles.demo import model

            checkpoint, _ = model.prepare()
        else:
            checkpoint = write_demo_checkpoint(workdir / "checkpoint")
        baseline = transformers_throughput(checkpoint, args)
        ours = serving_throughput(checkpoint, workdir, args)
    ratio = ours["output_tokens_per_s"] / baseline["output_tokens_per_s"]
    report = {
        "workload": {
            k: getattr(args, k)
            for k in ("num_prompts", "max_concurrency", "input_len", "output_len")
        },
        "transformers_generate": baseline,
        "vllm_serve_host_mesh": {k: v for k, v in ours.items() if k != "server_log"},
        "ratio_ours_over_transformers": ratio,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    w = report["workload"]
    print(
        f"workload: {w['num_prompts']} prompts x {w['input_len']} tokens in, "
        f"{w['output_len']} out, concurrency/batch {w['max_concurrency']}"
    )
    print(
        f"transformers generate(): {baseline['output_tokens_per_s']:8.1f} output tok/s "
        f"({baseline['output_tokens']} tokens in {baseline['duration_s']:.2f} s)"
    )
    print(
        f"vllm serve (host mesh):  {ours['output_tokens_per_s']:8.1f} output tok/s "
        f"({ours['output_tokens']} tokens in {ours['duration_s']:.2f} s; "
        f"TTFT {ours['mean_ttft_ms']:.0f} ms, TPOT {ours['mean_tpot_ms']:.1f} ms; "
        f"{ours['decode_steps']} decode steps; server ready after {ours['startup_s']:.0f} s)"
    )
    print(f"ratio (ours / transformers): {ratio:.2f}")


if __name__ == "__main__":
    main()
