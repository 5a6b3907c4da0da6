"""Embeddings per second through `/v1/embeddings` on the host mesh, against transformers
encoding the same inputs in batches.

In one run, on the demo checkpoint (a tiny Llama, float32, CPU):

- transformers: `LlamaModel` over `--num-inputs` texts of `--input-len` random tokens in
  batches of `--batch` (right-padded, last-token pooling, normalised: what the server
  answers);
- ours: the same texts as token ids to `vllm serve --runner pooling --convert embed`,
  `--concurrency` requests of `--batch` inputs at a time through the OpenAI client, of
  - `--form forward` (the default): the embedding bundle
    (`ttbundles.demo.embedding_bundle`: the same transformers model behind the pooling
    `forward` form), so the model is the same on both sides and the ratio is the serving
    path's cost: HTTP, tokenised input handling, vLLM's scheduler and the pooling runner;
  - `--form prefill_hidden`: the built-in demo bundle, the torch reference generator's
    prefill returning hidden states and vLLM's pooler on the host: the serving path plus
    the reference's own forward pass (paged attention over its cache) against
    transformers'.

The two sides alternate in `--rounds` rounds (the server idles while transformers runs),
which one goes first alternating too, so both are measured under the same machine load;
the ratio is taken per round (ours / transformers) and the median and spread (min-max) of
the rounds are reported.

    .venv/bin/python benchmarks/bench_pooling.py [--form forward|prefill_hidden] [--model DIR]
        [--num-inputs 256] [--batch 16] [--input-len 64] [--concurrency 4] [--rounds 5]
        [--json]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

from ttbundles.demo.checkpoint import write_demo_checkpoint
from ttbundles.demo.embedding_bundle import write_embedding_bundle
from ttbundles.demo.server import serve_environment, start_server

SPECIAL_TOKENS = 7  # the demo tokenizer's first ids are its special tokens


def inputs(checkpoint: Path, args: argparse.Namespace) -> list[list[int]]:
    from transformers import AutoTokenizer

    vocab = len(AutoTokenizer.from_pretrained(checkpoint))
    rng = random.Random(args.seed)
    return [
        [rng.randrange(SPECIAL_TOKENS, vocab) for _ in range(args.input_len)]
        for _ in range(args.num_inputs)
    ]


def transformers_side(checkpoint: Path, texts: list[list[int]], batch: int):
    """Load the model once; return a function that encodes every input once, in batches,
    and gives the seconds it took."""
    import torch
    from transformers import LlamaModel

    model = LlamaModel.from_pretrained(checkpoint, dtype=torch.float32).eval()

    def run() -> float:
        began = time.perf_counter()
        with torch.inference_mode():
            for start in range(0, len(texts), batch):
                rows = texts[start : start + batch]
                ids = torch.tensor(rows)
                mask = torch.ones_like(ids, dtype=torch.float32)
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state[:, -1]
                torch.nn.functional.normalize(hidden, dim=-1)
        return time.perf_counter() - began

    return run


def server_side(base_url: str, model: str, texts: list[list[int]], args: argparse.Namespace):
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
    batches = [texts[i : i + args.batch] for i in range(0, len(texts), args.batch)]

    def one(batch: list[list[int]]) -> int:
        return len(client.embeddings.create(model=model, input=batch).data)

    def run() -> float:
        began = time.perf_counter()
        with ThreadPoolExecutor(args.concurrency) as pool:
            done = sum(pool.map(one, batches))
        assert done == len(texts), (done, len(texts))
        return time.perf_counter() - began

    return run


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--num-inputs", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--input-len", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--form", choices=("forward", "prefill_hidden"), default="forward")
    parser.add_argument(
        "--model",
        type=Path,
        help="a Llama checkpoint folder instead of the tiny demo one (e.g. the demo's "
        "SmolLM2-135M-Instruct, from `ttbundle demo --prepare`): a model whose compute, "
        "not the serving path, dominates",
    )
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    unwind_on_sigterm()
    with tempfile.TemporaryDirectory(prefix="bench-pooling-") as tmp:
        root = Path(tmp)
        checkpoint = args.model or write_demo_checkpoint(root / "tiny-llama")
        (root / "models").mkdir()
        if args.form == "forward":  # else the built-in demo bundle serves the checkpoint
            write_embedding_bundle(root / "models")
        texts = inputs(checkpoint, args)
        env = serve_environment()
        env.update({"EXTRA_MODELS_DIR": str(root / "models"), "MESH_DEVICE": "HOST"})
        vllm_args = [
            "--runner",
            "pooling",
            "--convert",
            "embed",
            "--max-model-len",
            str(max(256, args.input_len)),
            "--max-num-seqs",
            str(args.batch * args.concurrency),
        ]
        server = start_server(checkpoint, vllm_args=vllm_args, env=env, log_path=root / "log")
        try:
            server.wait_ready(600)
            ours = server_side(server.api_url, str(checkpoint), texts, args)
            theirs = transformers_side(checkpoint, texts, args.batch)
            ours()  # warm both sides (first requests, first batches)
            theirs()
            rounds = []
            for index in range(args.rounds):
                if index % 2:
                    o, t = ours(), theirs()
                else:
                    t, o = theirs(), ours()
                rounds.append(
                    {
                        "transformers_per_s": len(texts) / t,
                        "ours_per_s": len(texts) / o,
                        "ratio": t / o,
                    }
                )
        finally:
            server.stop(60)
    ratios = [r["ratio"] for r in rounds]
    result = {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "rounds": rounds,
        "ours_per_s_median": statistics.median(r["ours_per_s"] for r in rounds),
        "transformers_per_s_median": statistics.median(r["transformers_per_s"] for r in rounds),
        "ratio_median": statistics.median(ratios),
        "ratio_spread": [min(ratios), max(ratios)],
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(
            f"embeddings/s: ours {result['ours_per_s_median']:.1f}, transformers "
            f"{result['transformers_per_s_median']:.1f} (medians of {args.rounds} rounds); "
            f"ours/transformers {result['ratio_median']:.2f}x "
            f"(spread {min(ratios):.2f}-{max(ratios):.2f})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
