"""Serving throughput on the host mesh, against transformers `generate()` as the floor.

In one run, on the demo checkpoint (a tiny Llama, float32, CPU) or SmolLM2-135M
(`--model smollm2`):

- transformers: `generate()` greedy, batches of `--max-concurrency` prompts of
  `--input-len` random tokens, `--output-len` new tokens each (EOS ignored), repeated
  until `--num-prompts` prompts are done;
- ours: the demo bundle served by `vllm serve` (started as the end-to-end tests start
  it), driven by vLLM's own client, `vllm bench serve --dataset-name random` with the
  same lengths, prompt count and concurrency.

The two sides alternate in `--rounds` rounds (transformers, then the client against the
server, which idles while transformers runs), so both are measured under the same machine
load; a ratio is taken per round (ours / transformers of that round) and the median and
spread (min-max) of the rounds are reported. Both run the same float32 torch model on the
same cores; the server adds HTTP, detokenization, scheduling, paged attention and a
separate client process competing for those cores.

    .venv/bin/python benchmarks/bench_serve.py [--num-prompts 64] [--max-concurrency 16]
        [--input-len 64] [--output-len 64] [--rounds 3] [--model tiny|smollm2] [--json]
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

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.server import serve_environment, start_server, vllm_command

SPECIAL_TOKENS = 7  # the demo tokenizer's first ids are its special tokens


def transformers_side(checkpoint: Path, args: argparse.Namespace):
    """Load the model once; return a function that runs one round of batched greedy
    `generate()` over `num_prompts` prompts and gives its figures."""
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

    def one_round() -> dict:
        output_tokens = 0
        start = time.perf_counter()
        for first in range(0, args.num_prompts, args.max_concurrency):
            batch = prompts[first : first + args.max_concurrency]
            out = generate(batch, args.output_len)
            output_tokens += (out.shape[1] - batch.shape[1]) * batch.shape[0]
        duration = time.perf_counter() - start
        return {
            "output_tokens": output_tokens,
            "duration_s": duration,
            "output_tokens_per_s": output_tokens / duration,
            "torch_threads": torch.get_num_threads(),
        }

    return one_round


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
        # Greedy, as the transformers side decodes: without it `vllm bench serve` leaves
        # the temperature to the server (1.0), and the two sides would not do the same work.
        "--temperature",
        "0",
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


def interleaved(checkpoint: Path, workdir: Path, args: argparse.Namespace) -> dict:
    """`args.rounds` rounds of (transformers, `vllm bench serve` against the server)."""
    transformers_round = transformers_side(checkpoint, args)
    log_path = workdir / "server.log"
    stats_path = workdir / "stats.json"
    env = {**serve_environment(), "TT_BUNDLES_STATS_FILE": str(stats_path)}
    server = start_server(
        checkpoint, port=args.port, vllm_args=args.serve_args, env=env, log_path=log_path
    )
    baseline, ours = [], []
    try:
        startup = server.wait_ready()
        for _ in range(args.rounds):
            baseline.append(transformers_round())
            ours.append(client_summary(bench_client(server.base_url, checkpoint, workdir, args)))
        steps = json.loads(stats_path.read_text())  # includes the client's warm-up requests
    except BaseException:
        print(f"server log: {log_path}", file=sys.stderr)
        raise
    finally:
        server.stop()
    return {
        "startup_s": startup,
        "transformers_rounds": baseline,
        "serve_rounds": ours,
        "prefill_steps": steps.get("step.prefill", 0),
        "decode_steps": steps.get("step.decode", 0),
    }


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def _client_env() -> dict[str, str]:
    """The benchmark client only talks HTTP: no TT platform in it, and no model hub."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "MESH_DEVICE"}
    env["HF_HUB_OFFLINE"] = "1"
    return env


def main() -> None:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-prompts", type=int, default=64)
    parser.add_argument("--max-concurrency", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rounds", type=int, default=3, help="interleaved rounds (transformers, then ours)"
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
        run = interleaved(checkpoint, workdir, args)
    tps = lambda rounds: [r["output_tokens_per_s"] for r in rounds]  # noqa: E731
    theirs, ours = tps(run["transformers_rounds"]), tps(run["serve_rounds"])
    report = {
        "workload": {
            k: getattr(args, k)
            for k in ("num_prompts", "max_concurrency", "input_len", "output_len", "rounds")
        },
        "transformers_generate_tok_s": spread(theirs),
        "vllm_serve_host_mesh_tok_s": spread(ours),
        "ratio_ours_over_transformers": spread([o / t for o, t in zip(ours, theirs)]),
        "mean_ttft_ms": spread([r["mean_ttft_ms"] for r in run["serve_rounds"]]),
        "mean_tpot_ms": spread([r["mean_tpot_ms"] for r in run["serve_rounds"]]),
        "run": run,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    w = report["workload"]

    def fmt(s: dict, digits: int = 1) -> str:
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"

    print(
        f"workload: {w['num_prompts']} prompts x {w['input_len']} tokens in, "
        f"{w['output_len']} out, concurrency/batch {w['max_concurrency']}; median (min-max) "
        f"of {w['rounds']} interleaved rounds"
    )
    print(f"transformers generate(): {fmt(report['transformers_generate_tok_s'])} output tok/s")
    print(
        f"vllm serve (host mesh):  {fmt(report['vllm_serve_host_mesh_tok_s'])} output tok/s "
        f"(TTFT {fmt(report['mean_ttft_ms'], 0)} ms, TPOT {fmt(report['mean_tpot_ms'])} ms; "
        f"server ready after {run['startup_s']:.0f} s)"
    )
    print(
        f"ratio (ours / transformers, per round): {fmt(report['ratio_ours_over_transformers'], 2)}"
    )


if __name__ == "__main__":
    main()
