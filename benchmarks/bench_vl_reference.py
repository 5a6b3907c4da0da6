"""Image requests through the reference Qwen2.5-VL generator against transformers' generate().

Writes the tiny Qwen2.5-VL checkpoint (`ttbundles.demo.vision_checkpoint`) to a temporary
folder and makes `--batch` image prompts (one picture each, all the same size so neither
side pads), then measures, in one run, a whole batch of requests: prefill with the vision
tower and `--tokens` greedy tokens per row.

- reference: `ReferenceQwen2_5_VLGenerator` driven through its contract as the worker
  drives it (one prefill call with per-row `pixel_values` / `image_grid_thw`, then one
  batched decode call per token, `rope_deltas_all_users` on the first, host argmax);
- transformers: `Qwen2_5_VLForConditionalGeneration.generate()` on the same batch
  (processor output with `mm_token_type_ids`, greedy, float32).

The two take turns (`--rounds` rounds, one batch each per round), so a load change on the
machine hits both alike. Reported: median and spread (min..max) of seconds per batch,
and reference / transformers. As a check, both sides' greedy token ids must be equal.

    .venv/bin/python benchmarks/bench_vl_reference.py --batch 8 --tokens 16 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image

from ttbundles.demo.vision_checkpoint import write_vision_checkpoint
from ttbundles.format.contract import HostMesh
from ttbundles.reference.vl_generator import ReferenceQwen2_5_VLGenerator

BLOCK = 16


def pictures(count: int, height: int, width: int) -> list[Image.Image]:
    rng = np.random.default_rng(0)
    return [
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))
        for _ in range(count)
    ]


def batch_inputs(processor, images: list[Image.Image]) -> dict:
    messages = [
        {
            "role": "user",
            "content": [{"type": "image"}, {"type": "text", "text": "What is in this picture?"}],
        }
    ]
    text = processor.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return processor(text=[text] * len(images), images=images, return_tensors="pt")


def reference_batch(folder: Path, inputs: dict, tokens: int) -> Callable[[], list[list[int]]]:
    """One batch of requests through the contract; returns each row's greedy ids."""
    ids = inputs["input_ids"]
    batch, length = ids.shape
    config = transformers.AutoConfig.from_pretrained(folder)
    gen = ReferenceQwen2_5_VLGenerator.initialize_vllm_model(
        hf_config=config, mesh_device=HostMesh(), max_batch_size=batch, max_seq_len=length + tokens
    )
    per_row = -(-(length + tokens) // BLOCK)
    dims = gen.dims
    kv = gen.allocate_kv_cache(
        (batch * per_row, dims.num_kv_heads, BLOCK, dims.head_dim), torch.float32, dims.num_layers
    )
    table = torch.arange(batch * per_row, dtype=torch.int32).reshape(batch, per_row)
    grids = inputs["image_grid_thw"]
    pixels = torch.split(inputs["pixel_values"], grids.prod(-1).tolist())

    def run() -> list[list[int]]:
        logits, deltas = gen.prefill_forward(
            ids.int(),
            table,
            kv,
            torch.full((batch,), length),
            False,
            empty_slots=list(range(batch)),
            pixel_values=[[p] for p in pixels],
            image_grid_thw=[[g] for g in grids],
        )
        out = [[int(t)] for t in logits[:, 0].argmax(-1)]
        for step in range(tokens - 1):
            logits, _ = gen.decode_forward(
                torch.tensor([[row[-1]] for row in out]),
                torch.full((batch,), length + step),
                table,
                kv,
                enable_trace=False,
                rope_deltas_all_users=deltas[:, 0].tolist() if step == 0 else None,
            )
            for row, token in zip(out, logits[:, 0].argmax(-1).tolist(), strict=True):
                row.append(token)
        return out

    return run


def transformers_batch(folder: Path, inputs: dict, tokens: int) -> Callable[[], list[list[int]]]:
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        folder, dtype=torch.float32
    ).eval()
    length = inputs["input_ids"].shape[1]

    @torch.no_grad()
    def run() -> list[list[int]]:
        out = model.generate(
            **inputs, max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False
        )
        return out[:, length:].tolist()

    return run


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="image requests per batch")
    parser.add_argument("--tokens", type=int, default=16, help="greedy tokens per request")
    parser.add_argument("--rounds", type=int, default=5, help="timed batches per side")
    parser.add_argument("--size", default="112x140", help="picture HEIGHTxWIDTH in pixels")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: default)")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    height, width = (int(v) for v in args.size.split("x"))

    with tempfile.TemporaryDirectory() as tmp:
        folder = write_vision_checkpoint(Path(tmp) / "vl")
        processor = transformers.AutoProcessor.from_pretrained(folder)
        inputs = batch_inputs(processor, pictures(args.batch, height, width))
        sides = {
            "reference": reference_batch(folder, inputs, args.tokens),
            "transformers": transformers_batch(folder, inputs, args.tokens),
        }
        outputs = {name: run() for name, run in sides.items()}  # warm-up, and the check
        times: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(args.rounds):
            for name, run in sides.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)

    results = {
        "batch": args.batch,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "image_tokens": int(inputs["image_grid_thw"][0].prod()) // 4,
        "prompt_tokens": int(inputs["input_ids"].shape[1]),
        "threads": torch.get_num_threads(),
        "same_greedy_ids": outputs["reference"] == outputs["transformers"],
    }
    for name, values in times.items():
        results[f"{name}_s"] = statistics.median(values)
        results[f"{name}_spread_s"] = [min(values), max(values)]
    results["ratio"] = results["reference_s"] / results["transformers_s"]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0 if results["same_greedy_ids"] else 1
    print(
        f"batch {args.batch} image requests ({results['prompt_tokens']} prompt tokens, "
        f"{results['image_tokens']} of them image), {args.tokens} greedy tokens each, "
        f"{args.rounds} rounds, {results['threads']} torch threads; seconds per batch"
    )
    for name in sides:
        low, high = results[f"{name}_spread_s"]
        print(f"  {name:13s} median {results[f'{name}_s']:.3f} s  ({low:.3f}..{high:.3f})")
    print(f"  reference / transformers: {results['ratio']:.2f}x")
    print(f"  greedy ids identical: {results['same_greedy_ids']}")
    return 0 if results["same_greedy_ids"] else 1


if __name__ == "__main__":
    sys.exit(main())
