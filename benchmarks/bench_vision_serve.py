"""Image-request serving throughput: `vllm serve` of demo-vision against transformers' generate().

In one run, on the tiny Qwen2.5-VL checkpoint (`ttbundles.demo.vision_checkpoint`, random
weights, float32, CPU) and the same pictures and prompts:

- ours: the built-in demo-vision bundle (the reference Qwen2.5-VL generator) served by
  `vllm serve` on the host mesh, started as the end-to-end tests start it; `--requests`
  image chat requests (one picture each, as a PNG data URL, and "What is in this
  picture?") through the `openai` client with `--concurrency` in flight, greedy,
  `--tokens` output tokens each (EOS ignored). Timed from the first request sent to the
  last answer: HTTP, PNG decoding, vLLM's image processor, scheduling and the model.
- transformers: `Qwen2_5_VLForConditionalGeneration.generate()` greedy on the same
  prompts and pictures, in batches of `--concurrency` (bench_vl_reference's inputs:
  the processor's output, made before timing; the model only is timed).

The sides take turns, one round of `--requests` requests each per round, after a warm-up
round; every round has new pictures, so no round reuses the server's prefix cache of
another. Reported: output tokens/s of each side, median and spread (min..max) over the
rounds, and ours / transformers. As a check, the server's prompt ids must be the
processor's (exit 1 otherwise). Reported beside: how many served rows have the greedy ids
of transformers run one prompt at a time (`VisionGolden`, as the end-to-end tests check;
outside the timing) and of the batched generate(), with the first token where each other
row parts (not all rows agree under 8 concurrent image requests: docs/performance). generate() runs
on `--threads` torch threads (default 1: the server's engine shares the 2 cores).

    .venv/bin/python benchmarks/bench_vision_serve.py --rounds 3 --requests 16
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
import transformers

from ttbundles.demo.picture import data_url
from ttbundles.demo.server import serve_environment, start_server
from ttbundles.demo.vision_checkpoint import write_vision_checkpoint
from ttbundles.reference.vl_golden import VisionGolden

sys.path.insert(0, str(Path(__file__).resolve().parent))
# The same pictures, prompt and generate() side as the reference benchmark.
from bench_vl_reference import batch_inputs, pictures, transformers_batch  # noqa: E402
from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

PROMPT = "What is in this picture?"  # bench_vl_reference.batch_inputs' text


def serve_round(client, model: str, urls: list[str], args: argparse.Namespace) -> tuple:
    """One round of image requests, `args.concurrency` in flight: (seconds, output
    tokens, [(prompt ids, output ids)] in request order)."""

    def send(url: str):
        response = client.chat.completions.create(
            model=model,
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": url}},
                        {"type": "text", "text": PROMPT},
                    ],
                }
            ],
            max_tokens=args.tokens,
            temperature=0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
        return response

    start = time.perf_counter()
    with ThreadPoolExecutor(args.concurrency) as pool:
        responses = list(pool.map(send, urls))
    seconds = time.perf_counter() - start
    tokens = sum(r.usage.completion_tokens for r in responses)
    ids = [(list(r.prompt_token_ids), list(r.choices[0].token_ids)) for r in responses]
    return seconds, tokens, ids


def main(argv: list[str] | None = None) -> int:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=16, help="image requests per round")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="requests in flight, and transformers' batch (the bundle serves 8 sequences)",
    )
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens per request")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds per side")
    parser.add_argument("--size", default="112x140", help="picture HEIGHTxWIDTH in pixels")
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads of generate() (0: default)"
    )
    parser.add_argument(
        "--serve-args",
        nargs=argparse.REMAINDER,
        default=[],
        help="Further vllm serve options (last on the command line).",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    height, width = (int(v) for v in args.size.split("x"))

    import openai

    with tempfile.TemporaryDirectory(prefix="bench-vision-serve-") as tmp:
        folder = write_vision_checkpoint(Path(tmp) / "vl")
        processor = transformers.AutoProcessor.from_pretrained(folder)
        images = pictures(args.requests * (args.rounds + 1), height, width)
        rounds = []  # the warm-up round first; each: data URLs, transformers' batches
        round_images = []
        for r in range(args.rounds + 1):
            mine = images[r * args.requests : (r + 1) * args.requests]
            round_images.append(mine)
            batches = []
            for first in range(0, args.requests, args.concurrency):
                inputs = batch_inputs(processor, mine[first : first + args.concurrency])
                batches.append((inputs, transformers_batch(folder, inputs, args.tokens)))
            rounds.append(([data_url(im) for im in mine], batches))

        log_path = Path(tmp) / "server.log"
        server = start_server(
            folder, vllm_args=args.serve_args, env=serve_environment(), log_path=log_path
        )
        client = None
        try:
            startup = server.wait_ready()
            client = openai.OpenAI(
                base_url=server.api_url, api_key="EMPTY", timeout=600, max_retries=0
            )
            model = client.models.list().data[0].id
            times: dict[str, list[float]] = {"vllm_serve": [], "transformers": []}
            rates: dict[str, list[float]] = {"vllm_serve": [], "transformers": []}
            same_prompts = True
            same_rows = rows = exact = 0
            first_mismatches: list = []
            check = VisionGolden(folder)
            for index, (urls, batches) in enumerate(rounds):
                seconds, tokens, served = serve_round(client, model, urls, args)
                if index:
                    times["vllm_serve"].append(seconds)
                    rates["vllm_serve"].append(tokens / seconds)
                start = time.perf_counter()
                golden = [row for _, run in batches for row in run()]
                seconds = time.perf_counter() - start
                if index:
                    times["transformers"].append(seconds)
                    rates["transformers"].append(args.requests * args.tokens / seconds)
                prompts = [row for inputs, _ in batches for row in inputs["input_ids"].tolist()]
                same_prompts &= [p for p, _ in served] == prompts
                same_rows += sum(out == g for (_, out), g in zip(served, golden, strict=True))
                rows += len(golden)
                first_mismatches += [
                    (row, g) for row, g in zip(served, golden, strict=True) if row[1] != g
                ]
                if index:  # the golden check: one prompt at a time, as the tests do
                    exact += sum(out == check.greedy(p, [im], args.tokens) for (p, out), im
                                 in zip(served, round_images[index], strict=True))  # fmt: skip
        finally:
            if client is not None:
                client.close()
            server.stop()

    same_ids = exact == args.rounds * args.requests
    diverging = [  # per row: the first token where the server and batched generate() part
        next(i for i, (a, b) in enumerate(zip(out, g, strict=True)) if a != b)
        for (_, out), g in first_mismatches
    ]
    results = {
        "requests": args.requests,
        "concurrency": args.concurrency,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "picture": args.size,
        "prompt_tokens": len(prompts[0]),
        "image_tokens": prompts[0].count(
            processor.tokenizer.convert_tokens_to_ids("<|image_pad|>")
        ),
        "threads": torch.get_num_threads(),
        "server_ready_s": startup,
        "same_prompt_ids": same_prompts,
        "same_greedy_ids": same_ids,
        "rows_equal_to_one_prompt_at_a_time": f"{exact}/{args.rounds * args.requests}",
        "rows_equal_to_batched_generate": f"{same_rows}/{rows}",
        "first_differing_token": diverging,
    }
    for name in times:
        results[f"{name}_tokens_per_s"] = statistics.median(rates[name])
        results[f"{name}_spread_tokens_per_s"] = [min(rates[name]), max(rates[name])]
        results[f"{name}_s"] = statistics.median(times[name])
    ratios = [a / b for a, b in zip(rates["vllm_serve"], rates["transformers"], strict=True)]
    results["ratio"] = results["vllm_serve_tokens_per_s"] / results["transformers_tokens_per_s"]
    results["ratio_spread"] = [min(ratios), max(ratios)]
    ok = same_prompts
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if ok else 1
    print(
        f"{args.requests} image requests per round ({results['prompt_tokens']} prompt tokens, "
        f"{results['image_tokens']} of them image), {args.tokens} greedy tokens each, "
        f"{args.concurrency} in flight / per batch, {args.rounds} rounds, "
        f"{results['threads']} torch threads here; output tokens/s"
    )
    for name in times:
        low, high = results[f"{name}_spread_tokens_per_s"]
        print(
            f"  {name:13s} median {results[f'{name}_tokens_per_s']:8.1f}  ({low:.1f}..{high:.1f}; "
            f"{results[f'{name}_s']:.2f} s per round)"
        )
    low, high = results["ratio_spread"]
    print(f"  vllm serve / transformers: {results['ratio']:.2f}x (per round {low:.2f}..{high:.2f})")
    print(
        f"  prompt ids identical: {same_prompts}; rows with greedy ids equal to transformers "
        f"one prompt at a time: {results['rows_equal_to_one_prompt_at_a_time']}, to the "
        f"batched generate(): {results['rows_equal_to_batched_generate']} (others part at "
        f"tokens {diverging})"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
