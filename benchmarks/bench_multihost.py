"""Serving throughput over two "hosts" (vLLM multi-node data parallelism) against one host.

In one run, on the demo checkpoint (a tiny Llama, CPU, host mesh), two servers are up
side by side:

- the baseline: one host, one rank (`vllm serve`, one engine);
- two hosts x one rank: a head (`--data-parallel-size 2 --data-parallel-size-local 1`:
  the API server, the DP coordinator, rank 0) and a `--headless` host (rank 1), each its
  own process group with its own environment on 127.0.0.1 (`ttbundles.demo.hosts`).

The same workload (concurrent greedy completions of fixed token prompts, `ignore_eos`, so
every request makes the same number of tokens) runs against each in interleaved rounds
(A B A B ...). Reports output tokens per second per round, the median of each side, the
spread (min-max) and the ratio of the medians (2 hosts / 1). On one machine the two
"hosts" share its cores with the client and the baseline: the figure shows that the
multi-node path serves, and what it costs here; it is not the speed-up two Tenstorrent
hosts would give.

    .venv/bin/python benchmarks/bench_multihost.py [--rounds 5] [--requests 32]
        [--concurrency 8] [--output-len 32] [--max-num-seqs 8] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.hosts import start_hosts
from ttbundles.demo.server import http_get, serve_environment, start_server

READY_TIMEOUT = 900.0
SUCCESS = re.compile(r'^vllm:request_success_total\{[^}]*engine="(\d+)"[^}]*\} (\S+)$', re.M)


def one_round(base_url: str, model: str, args) -> float:
    """Output tokens per second for `args.requests` greedy completions, `args.concurrency`
    at a time."""
    import openai

    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="EMPTY", timeout=300.0)
    prompts = [[1, *range(20 + 3 * i, 36 + 3 * i)] for i in range(args.requests)]

    def send(prompt: list[int]) -> int:
        response = client.completions.create(
            model=model, prompt=prompt, max_tokens=args.output_len, temperature=0.0,
            extra_body={"ignore_eos": True},
        )  # fmt: skip
        return response.usage.completion_tokens

    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        tokens = sum(pool.map(send, prompts))
    return tokens / (time.perf_counter() - start)


def per_engine(base_url: str) -> dict[str, float]:
    status, body = http_get(f"{base_url}/metrics")
    counts: dict[str, float] = {}
    for engine, value in SUCCESS.findall(body if status == 200 else ""):
        counts[engine] = counts.get(engine, 0.0) + float(value)
    return counts


def main() -> None:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--output-len", type=int, default=32)
    parser.add_argument("--max-num-seqs", type=int, default=8, help="per engine, as in vLLM")
    parser.add_argument("--json", action="store_true", help="Print the figures as JSON.")
    args = parser.parse_args()

    serve_args = ["--max-model-len", "256", "--max-num-seqs", str(args.max_num_seqs)]
    env = serve_environment()
    env.pop("TT_VISIBLE_DEVICES", None)
    with tempfile.TemporaryDirectory(prefix="bench-multihost-") as tmp:
        workdir = Path(tmp)
        checkpoint = write_demo_checkpoint(workdir / "checkpoint")
        model = str(checkpoint)
        single = start_server(
            checkpoint, vllm_args=serve_args, env=env, log_path=workdir / "one.log"
        )
        hosts = start_hosts(
            checkpoint,
            [1, 1],
            vllm_args=serve_args,
            head_args=["--api-server-count", "1"],
            envs=[env, dict(env)],
            logs=[workdir / "head.log", workdir / "headless.log"],
        )
        try:
            single.wait_ready(READY_TIMEOUT)
            hosts.wait_ready(READY_TIMEOUT)
            for url in (single.base_url, hosts.base_url):  # warm both before measuring
                one_round(url, model, args)
            one, two = [], []
            for _ in range(args.rounds):
                one.append(one_round(single.base_url, model, args))
                two.append(one_round(hosts.base_url, model, args))
            engines = per_engine(hosts.base_url)
        finally:
            hosts.stop()
            single.stop()
    if len(engines) != 2 or not all(engines.values()):
        sys.exit(f"not every rank served: {engines}")
    ratio = statistics.median(two) / statistics.median(one)
    report = {
        "workload": {
            k: getattr(args, k)
            for k in ("rounds", "requests", "concurrency", "output_len", "max_num_seqs")
        },
        "one_host_tok_s": one,
        "two_hosts_tok_s": two,
        "requests_per_engine_two_hosts": engines,
        "ratio_of_medians": ratio,
        "cpu_count": os.cpu_count(),
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"workload: {args.requests} greedy requests x {args.output_len} tokens, "
        f"concurrency {args.concurrency}, max_num_seqs {args.max_num_seqs} per engine, "
        f"{args.rounds} interleaved rounds; {os.cpu_count()} cores"
    )
    for label, values in (("1 host x 1 rank ", one), ("2 hosts x 1 rank", two)):
        print(
            f"{label}: median {statistics.median(values):7.1f} output tok/s "
            f"(min {min(values):.1f}, max {max(values):.1f})"
        )
    print(f"requests per engine (2 hosts): {engines}")
    print(f"ratio of medians (2 hosts / 1 host): {ratio:.2f}")


if __name__ == "__main__":
    main()
