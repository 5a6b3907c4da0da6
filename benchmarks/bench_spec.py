"""Speculative decoding on the host mesh: speculation against none, per workload.

In one run, on the demo checkpoint (a tiny Llama, float32, CPU) or SmolLM2-135M
(`--model smollm2`), two `vllm serve` processes with synchronous scheduling: one with
`--speculative-config` (k=`--k`): `--method ngram` (the demo bundle, lookup 1..3) or
`--method custom_class` (the demo-drafter variant, TT_DEMO_VARIANT=drafter: the model's
own early-exit drafter), and the demo bundle without it.
Two workloads of greedy requests (EOS ignored, `--output-len` tokens each,
`--concurrency` at a time, `--num-prompts` in all):

- repetitive: prompts that repeat a short phrase (drafts from the prompt are often right);
- random: prompts of random words (drafts are mostly wrong).

Per round and workload, the speculating server and the baseline run one after the other
(the order alternating by round), so both are measured under the same machine load. A
round gives the time per output token (wall time over output tokens) of each and their
ratio (speculating / baseline), and, from vLLM's counters on `/metrics`, the acceptance
rate (accepted / proposed draft tokens) and the mean tokens committed per verify. The
median and the spread (min-max) over `--rounds` rounds are reported.

    .venv/bin/python benchmarks/bench_spec.py [--rounds 5] [--num-prompts 16]
        [--concurrency 4] [--output-len 64] [--k 4] [--model tiny|smollm2]
        [--method ngram|custom_class] [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import re
import statistics
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.server import serve_environment, start_server

COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)
METRIC = re.compile(r"^(vllm:[a-z_]+)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)
PHRASES = ["one two three four", "the cat sat on the mat", "a b c d e", "red green blue"]
WORKLOADS = ("repetitive", "random")


def prompts(kind: str, count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    if kind == "repetitive":
        return [" ".join([PHRASES[i % len(PHRASES)]] * 6) for i in range(count)]
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        " ".join("".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(24))
        for _ in range(count)
    ]


def counters(base_url: str) -> dict[str, float]:
    with urllib.request.urlopen(f"{base_url}/metrics", timeout=30) as response:
        body = response.read().decode()
    values = dict.fromkeys(COUNTERS, 0.0)
    for name, value in METRIC.findall(body):
        if name in values:
            values[name] += float(value)
    return values


def complete(api_url: str, model: str, prompt: str, output_len: int) -> int:
    body = {
        "model": model,
        "prompt": prompt,
        "max_tokens": output_len,
        "temperature": 0,
        "ignore_eos": True,
    }
    request = urllib.request.Request(
        f"{api_url}/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=600) as response:
        return int(json.load(response)["usage"]["completion_tokens"])


def run(server, model: str, texts: list[str], args: argparse.Namespace) -> dict:
    before = counters(server.base_url)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        tokens = sum(pool.map(lambda p: complete(server.api_url, model, p, args.output_len), texts))
    elapsed = time.perf_counter() - start
    after = counters(server.base_url)
    delta = {name: after[name] - before[name] for name in COUNTERS}
    return {"ms_per_token": 1000 * elapsed / tokens, "tokens": tokens, **delta}


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--output-len", type=int, default=64)
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--model", choices=["tiny", "smollm2"], default="tiny")
    parser.add_argument("--method", choices=["ngram", "custom_class"], default="ngram")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="bench-spec-"))
    if args.model == "tiny":
        checkpoint = write_demo_checkpoint(workdir / "tiny-llama")
    else:
        from ttbundles.demo import model as demo_model

        checkpoint, _ = demo_model.prepare()
    common = ["--block-size", "16", "--max-model-len", "512", "--max-num-seqs", "8"]
    common += ["--no-async-scheduling"]
    if args.method == "ngram":
        speculative = {"method": "ngram", "prompt_lookup_min": 1, "prompt_lookup_max": 3}
        variant = {}
    else:
        speculative = {"method": "custom_class", "model": "vllm_tt_plugin.model_owned_drafter"}
        variant = {"TT_DEMO_VARIANT": "drafter"}
    speculative["num_speculative_tokens"] = args.k
    plans = {
        "spec": ([*common, "--speculative-config", json.dumps(speculative)], variant),
        "off": (common, {}),
    }
    servers = {}
    try:
        for name, (vllm_args, extra_env) in plans.items():
            servers[name] = start_server(
                checkpoint,
                vllm_args=vllm_args,
                env={**serve_environment(), **extra_env},
                log_path=workdir / f"{name}.log",
            )
        for server in servers.values():
            server.wait_ready()
        model = str(checkpoint)
        workloads = {kind: prompts(kind, args.num_prompts, args.seed) for kind in WORKLOADS}
        warm_up = argparse.Namespace(**{**vars(args), "concurrency": 1})
        for texts in workloads.values():  # one request each, before anything is timed
            for server in servers.values():
                run(server, model, texts[:1], warm_up)
        rounds: dict[str, list[dict]] = {kind: [] for kind in workloads}
        for index in range(args.rounds):
            for kind, texts in workloads.items():
                order = ["spec", "off"] if index % 2 == 0 else ["off", "spec"]
                result = {name: run(servers[name], model, texts, args) for name in order}
                spec_run, base = result["spec"], result["off"]
                proposed = spec_run[COUNTERS[1]]
                rounds[kind].append(
                    {
                        "ratio": spec_run["ms_per_token"] / base["ms_per_token"],
                        "ms_per_token_spec": spec_run["ms_per_token"],
                        "ms_per_token_off": base["ms_per_token"],
                        "acceptance": spec_run[COUNTERS[2]] / proposed if proposed else 0.0,
                        "tokens_per_verify": (
                            (spec_run[COUNTERS[2]] + spec_run[COUNTERS[0]]) / spec_run[COUNTERS[0]]
                            if spec_run[COUNTERS[0]]
                            else 0.0
                        ),
                    }
                )
    finally:
        for server in servers.values():
            server.stop()
    summary = {
        kind: {key: spread([r[key] for r in results]) for key in results[0]}
        for kind, results in rounds.items()
    }
    if args.json:
        print(json.dumps({"args": vars(args), "summary": summary, "rounds": rounds}, indent=2))
        return
    print(
        f"{args.method} speculation (k={args.k}) vs none, {args.model} model, {args.num_prompts} "
        f"greedy prompts x {args.output_len} tokens, concurrency {args.concurrency}, "
        f"{args.rounds} interleaved rounds: median (min-max)"
    )
    for kind, figures in summary.items():
        parts = [
            f"{key} {v['median']:.3f} ({v['min']:.3f}-{v['max']:.3f})" for key, v in figures.items()
        ]
        print(f"  {kind}: " + "; ".join(parts))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
