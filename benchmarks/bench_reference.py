"""Decode step time of the reference generator against transformers' cached decode.

Writes the demo checkpoint (`ttbundles.demo.checkpoint.write_checkpoint`) to a temporary
folder, fills `--batch` rows of `--context` tokens, then measures, in one run:

- reference: `ReferenceLlamaGenerator.decode_forward` over a paged KV cache (logits out,
  as with host sampling), and again with greedy on-device sampling (tokens out, the
  worker's path when sampling is on the device);
- transformers: `LlamaForCausalLM` forward of one token per row with `past_key_values`
  (the step `generate()` repeats), same checkpoint, same batch, float32.

Every row advances one position per step, so both sides attend over context .. context +
warmup + steps tokens. The three take turns, ten steps at a time (a load change on the
machine hits them alike). Reported: median ms per step of each, and reference / transformers.
As a sanity check the first step's logits of the two are compared.

One torch thread by default: at this size every op is overhead-bound, and the reference
computes on its device-queue thread while transformers runs on the main thread, so with
more threads two OpenMP pools (one per calling thread) spin against each other and both
sides measure the contention more than themselves (`--threads 0` shows it).

    .venv/bin/python benchmarks/bench_reference.py --batch 16 --context 128 --steps 50
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

import torch
import transformers

from ttbundles.demo.checkpoint import write_checkpoint
from ttbundles.format.contract import HostMesh, SamplingParams
from ttbundles.reference.generator import ReferenceLlamaGenerator


def interleaved_step_times(
    steps: dict[str, Callable[[], None]], count: int, warmup: int, turn: int = 10
) -> dict[str, list[float]]:
    """Seconds per call of each step function (`count` calls each), after `warmup`.

    The functions take turns, `turn` calls at a time, so a load change on the machine
    (other processes, frequency scaling) hits all of them alike and the ratio holds,
    while each still runs with warm caches as it would in a loop of its own.
    """
    for step in steps.values():
        for _ in range(warmup):
            step()
    times: dict[str, list[float]] = {name: [] for name in steps}
    while len(times[next(iter(steps))]) < count:
        for name, step in steps.items():
            for _ in range(min(turn, count - len(times[name]))):
                start = time.perf_counter()
                step()
                times[name].append(time.perf_counter() - start)
    return times


def reference_decode(
    folder: Path, prompts: torch.Tensor, args: argparse.Namespace, greedy_on_device: bool
) -> tuple[Callable[[], None], torch.Tensor]:
    """A decode step (decode_forward, next position), and the first step's logits `[B, V]`.
    Prefill and the first decode happen here, untimed."""
    batch, context = prompts.shape
    total = context + 1 + args.warmup + args.steps  # prefill, first decode, the steps
    blocks_per_row = -(-total // args.block_size)
    config = transformers.AutoConfig.from_pretrained(folder)
    gen = ReferenceLlamaGenerator.initialize_vllm_model(
        hf_config=config, mesh_device=HostMesh(), max_batch_size=batch, max_seq_len=total
    )
    dims = gen.dims
    kv = gen.allocate_kv_cache(
        (batch * blocks_per_row, dims.num_kv_heads, args.block_size, dims.head_dim),
        torch.float32,
        dims.num_layers,
    )
    # Blocks scattered over the cache, as a long-running server's would be.
    order = torch.randperm(batch * blocks_per_row, generator=torch.Generator().manual_seed(0))
    page_table = order.reshape(batch, blocks_per_row).int()
    logits = gen.prefill_forward(
        tokens=prompts,
        page_table=page_table,
        kv_cache=kv,
        prompt_lens=torch.full((batch,), context),
        start_pos=torch.zeros(batch, dtype=torch.long),
    )
    tokens = logits[:, 0].argmax(-1)  # [B]
    sampling = None
    if greedy_on_device:
        sampling = SamplingParams(
            temperature=[0.0] * batch, top_k=[0] * batch, top_p=[1.0] * batch, seed=[None] * batch
        )
    first_logits = gen.decode_forward(
        tokens=tokens[:, None],
        start_pos=torch.full((batch,), context),
        page_table=page_table,
        kv_cache=kv,
    )[0][:, 0]
    state = {"tokens": first_logits.argmax(-1), "position": context + 1}

    def step() -> None:
        out = gen.decode_forward(
            tokens=state["tokens"][:, None],
            start_pos=torch.full((batch,), state["position"]),
            page_table=page_table,
            kv_cache=kv,
            sampling_params=sampling,
            reload_inputs=True,
            reload_sampling_params=greedy_on_device,
            reset_sampling_state=greedy_on_device,
        )[0]
        state["tokens"] = out if greedy_on_device else out[:, 0].argmax(-1)
        state["position"] += 1

    return step, first_logits


@torch.no_grad()
def transformers_decode(
    folder: Path, prompts: torch.Tensor
) -> tuple[Callable[[], None], torch.Tensor]:
    """A cached one-token forward step, and the first step's logits `[B, V]`."""
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = model(input_ids=prompts, use_cache=True)
    tokens = out.logits[:, -1].argmax(-1)  # [B]
    cache = out.past_key_values
    out = model(input_ids=tokens[:, None], past_key_values=cache, use_cache=True)
    first_logits = out.logits[:, -1]
    state = {"tokens": out.logits[:, -1].argmax(-1), "cache": out.past_key_values}

    @torch.no_grad()
    def step() -> None:
        out = model(
            input_ids=state["tokens"][:, None], past_key_values=state["cache"], use_cache=True
        )
        state["tokens"] = out.logits[:, -1].argmax(-1)
        state["cache"] = out.past_key_values

    return step, first_logits


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--context", type=int, default=128, help="tokens per row before decode")
    parser.add_argument("--steps", type=int, default=50, help="timed decode steps")
    parser.add_argument("--warmup", type=int, default=5, help="untimed decode steps first")
    parser.add_argument("--block-size", type=int, default=16, help="KV cache tokens per block")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (0: torch's default); see the docstring",
    )
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument(
        "--model",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="tiny: the demo's random checkpoint; smollm2: the demo's real model (prepared "
        "into the cache once)",
    )
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory() as tmp:
        if args.model == "smollm2":
            from ttbundles.demo import model

            folder, _ = model.prepare()
        else:
            folder = write_checkpoint(Path(tmp) / "demo")
        vocab = transformers.AutoConfig.from_pretrained(folder).vocab_size
        generator = torch.Generator().manual_seed(0)
        prompts = torch.randint(3, vocab, (args.batch, args.context), generator=generator)
        ours, ours_logits = reference_decode(folder, prompts, args, greedy_on_device=False)
        ours_greedy, _ = reference_decode(folder, prompts, args, greedy_on_device=True)
        theirs, theirs_logits = transformers_decode(folder, prompts)
        times = interleaved_step_times(
            {"reference": ours, "reference_greedy": ours_greedy, "transformers": theirs},
            args.steps,
            args.warmup,
        )

    results = {
        "batch": args.batch,
        "context": args.context,
        "steps": args.steps,
        "block_size": args.block_size,
        "threads": torch.get_num_threads(),
        "reference_ms": statistics.median(times["reference"]) * 1e3,
        "reference_greedy_ms": statistics.median(times["reference_greedy"]) * 1e3,
        "transformers_ms": statistics.median(times["transformers"]) * 1e3,
        "max_abs_logit_diff": float((ours_logits - theirs_logits).abs().max()),
    }
    results["ratio"] = results["reference_ms"] / results["transformers_ms"]
    results["ratio_greedy"] = results["reference_greedy_ms"] / results["transformers_ms"]
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(
        f"batch {args.batch}, context {args.context} (+{args.warmup} warmup, "
        f"+{args.steps} timed steps), block size {args.block_size}, "
        f"{results['threads']} torch threads; median ms per decode step"
    )
    print(
        f"  reference, logits out         {results['reference_ms']:8.3f} ms"
        f"   {results['ratio']:5.2f}x transformers"
    )
    print(
        f"  reference, greedy on device   {results['reference_greedy_ms']:8.3f} ms"
        f"   {results['ratio_greedy']:5.2f}x transformers"
    )
    print(f"  transformers, past_key_values {results['transformers_ms']:8.3f} ms")
    print(f"  first step max |logits diff|  {results['max_abs_logit_diff']:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
