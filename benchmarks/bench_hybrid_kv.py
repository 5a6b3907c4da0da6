"""Hybrid KV groups against one full-attention group: the concurrency vLLM reports at a
fixed KV budget, and decode throughput at equal batch.

A Gemma 3 shaped checkpoint (12 layers: 10 local with `sliding_window=32`, 2 global; the
tiny shape of the tests, with room for 4096 positions), a bundle from `ttbundle init
--reference` with its KV groups declared, and vLLM's `LLMEngine` in this process on the
host mesh with `--kv-cache-memory-bytes`, `--max-model-len 4096` and
`--max-num-batched-tokens 128`, twice: as is (vLLM's hybrid KV-cache manager: 5 sliding
groups and 1 full one over one block pool) and with `--disable-hybrid-kv-cache-manager`
(one group, every layer the whole context).

- concurrency: what vLLM's start-up line "Maximum concurrency for 4096 tokens per
  request" says, from the engine's own KV cache config (`get_max_concurrency_for_kv_cache_config`,
  the function that prints it); deterministic, so one figure per layout. Beside it the
  ratio vLLM's sizing gives by formula (a sliding group holds `window - 1 +` the tokens in
  flight per request, plus a block) and the window-only ratio (a sliding layer holding
  exactly `window` tokens).
- decode: `--batch` requests of `--prompt` tokens (several windows), greedy, `--steps`
  tokens each; the rounds interleave the two layouts (hybrid, full, hybrid, ...), so both
  see the same machine load; the figure is output tokens per second over the decode phase
  (from the step where every request has its first token to the last), median and spread
  (min-max) of the rounds, and hybrid / full per round.

    .venv/bin/python benchmarks/bench_hybrid_kv.py [--kv-bytes 268435456] [--batch 8]
        [--prompt 160] [--steps 32] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

WINDOW = 32
LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 2
MAX_MODEL_LEN = 4096
BATCHED_TOKENS = 128
BLOCK = 16


def write_checkpoint(out: Path) -> Path:
    """The tests' tiny Gemma 3 (`tests/conftest.py`), with room for MAX_MODEL_LEN."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        max_position_embeddings=2 * MAX_MODEL_LEN,
        sliding_window=WINDOW,
        layer_types=list(LAYER_TYPES),
        final_logit_softcapping=30.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    save_random(Gemma3ForCausalLM(config), "Gemma3ForCausalLM", out)
    return out


GET_KV_CACHE_SPEC = """
    @classmethod
    def get_kv_cache_spec(cls, vllm_config):
        return super().get_kv_cache_spec(vllm_config)
"""


def write_bundle(models: Path, checkpoint: Path, batch: int) -> Path:
    """`ttbundle init --reference --from-hf` (the library call) with its KV groups
    declared by hand (the reference's get_kv_cache_spec, capabilities.kv_cache_spec,
    schema 5: init does not declare them yet), its host target raised to MAX_MODEL_LEN
    and the batch."""
    from ttbundles.scaffold.init import init_bundle

    folder = models / "bench-gemma3"
    init_bundle(folder, arch=None, from_hf=str(checkpoint), reference=True)
    adapter = folder / "adapter.py"
    adapter.write_text(adapter.read_text() + GET_KV_CACHE_SPEC)
    path = folder / "vllm_metadata.json"
    metadata = json.loads(path.read_text())
    metadata["schema_version"] = 5
    metadata["capabilities"]["kv_cache_spec"] = True
    metadata["targets"]["HOST"].update(max_model_len=MAX_MODEL_LEN, max_num_seqs=batch)
    path.write_text(json.dumps(metadata, indent=2) + "\n")
    return folder


class Engine:
    """vLLM's `LLMEngine` in this process with one KV layout."""

    def __init__(self, checkpoint: Path, hybrid: bool, kv_bytes: int, batch: int):
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
        from vllm.v1.engine.llm_engine import LLMEngine

        self.engine = LLMEngine.from_engine_args(
            EngineArgs(
                model=str(checkpoint),
                max_model_len=MAX_MODEL_LEN,
                max_num_batched_tokens=BATCHED_TOKENS,
                max_num_seqs=batch,
                block_size=BLOCK,
                kv_cache_memory_bytes=kv_bytes,
                enable_prefix_caching=False,  # every round's prompts are computed
                disable_hybrid_kv_cache_manager=not hybrid,
                additional_config={"tt": {"sample_on_device_mode": "all"}},
            )
        )
        core = self.engine.engine_core.engine_core
        config = core.vllm_config
        kv_config = core.scheduler.kv_cache_config
        self.groups = len(kv_config.kv_cache_groups)
        self.num_blocks = kv_config.num_blocks
        self.concurrency = get_max_concurrency_for_kv_cache_config(config, kv_config)
        # Tokens scheduled but not settled (two batches with async scheduling).
        self.in_flight = config.max_in_flight_tokens
        self.requests = 0

    def round(self, prompts: list[list[int]], steps: int) -> float:
        """Output tokens per second over the decode phase."""
        from vllm import SamplingParams

        params = SamplingParams(max_tokens=steps, temperature=0.0, ignore_eos=True)
        for prompt in prompts:
            self.requests += 1
            self.engine.add_request(f"r{self.requests}", {"prompt_token_ids": prompt}, params)
        started: float | None = None
        produced = 0
        first = 0
        while self.engine.has_unfinished_requests():
            outs = self.engine.step()
            for out in outs:
                if out.finished:
                    produced += len(out.outputs[0].token_ids)
            if started is None:
                first += sum(1 for out in outs if len(out.outputs[0].token_ids) >= 1)
                if first >= len(prompts):
                    started = time.perf_counter()
        ended = time.perf_counter()
        if produced != len(prompts) * steps or started is None:
            sys.exit(f"produced {produced} tokens, expected {len(prompts) * steps}")
        return len(prompts) * (steps - 1) / (ended - started)

    def close(self) -> None:
        import contextlib

        with contextlib.suppress(Exception):
            self.engine.engine_core.shutdown()


def formula_ratios(in_flight: int) -> tuple[float, float]:
    """(vLLM's sizing by formula, the window alone): full-layout blocks per request over
    hybrid blocks per request, each per byte of the pool (12 tensors against 2). A
    sliding group holds `window - 1 + in_flight` tokens (vLLM's
    `max_in_flight_tokens`: the batched tokens of every step in flight) and a block."""
    full_blocks = -(-MAX_MODEL_LEN // BLOCK)
    held = -(-(WINDOW - 1 + in_flight) // BLOCK) + 1
    sliding_groups = 5
    tensors_full, tensors_hybrid = len(LAYER_TYPES), 2
    vllm = (tensors_full * full_blocks) / (tensors_hybrid * (full_blocks + sliding_groups * held))
    # The window alone: 10 sliding layers of WINDOW tokens, 2 global of MAX_MODEL_LEN.
    window = (len(LAYER_TYPES) * MAX_MODEL_LEN) / (2 * MAX_MODEL_LEN + 10 * WINDOW)
    return vllm, window


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kv-bytes", type=int, default=256 * 1024 * 1024)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--prompt", type=int, default=5 * WINDOW)
    parser.add_argument("--steps", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from ttbundles.demo.server import serve_environment

    with tempfile.TemporaryDirectory(prefix="bench-hybrid-kv-") as tmp:
        work = Path(tmp)
        checkpoint = write_checkpoint(work / "checkpoint")
        write_bundle(work / "models", checkpoint, args.batch)
        os.environ.update(serve_environment())
        os.environ.update(
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            EXTRA_MODELS_DIR=str(work / "models"),
            TT_VLLM_BUILTIN_MODELS="0",
        )
        import random

        rng = random.Random(0)
        prompts = [[rng.randrange(10, 200) for _ in range(args.prompt)] for _ in range(args.batch)]
        engines = {
            name: Engine(checkpoint, name == "hybrid", args.kv_bytes, args.batch)
            for name in ("hybrid", "full")
        }
        rates: dict[str, list[float]] = {"hybrid": [], "full": []}
        try:
            for _ in range(args.rounds):
                for name in ("hybrid", "full"):
                    rates[name].append(engines[name].round(prompts, args.steps))
        finally:
            for engine in engines.values():
                engine.close()
    vllm_ratio, window_ratio = formula_ratios(engines["hybrid"].in_flight)
    result = {
        "kv_cache_memory_bytes": args.kv_bytes,
        "max_model_len": MAX_MODEL_LEN,
        "max_num_batched_tokens": BATCHED_TOKENS,
        "block_size": BLOCK,
        "layouts": {
            name: {
                "kv_groups": engines[name].groups,
                "num_blocks": engines[name].num_blocks,
                "max_concurrency": engines[name].concurrency,
                "decode_tok_s": spread(rates[name]),
            }
            for name in ("hybrid", "full")
        },
        "concurrency_ratio": engines["hybrid"].concurrency / engines["full"].concurrency,
        "formula_ratio_vllm_sizing": vllm_ratio,
        "formula_ratio_window_only": window_ratio,
        "max_in_flight_tokens": engines["hybrid"].in_flight,
        "decode_ratio": spread([h / f for h, f in zip(rates["hybrid"], rates["full"])]),
        "batch": args.batch,
        "prompt": args.prompt,
        "steps": args.steps,
        "rounds": args.rounds,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, layout in result["layouts"].items():
        rate = layout["decode_tok_s"]
        print(
            f"{name:6s}: {layout['kv_groups']} KV group(s), {layout['num_blocks']} blocks, "
            f"max concurrency {layout['max_concurrency']:.2f}x at {MAX_MODEL_LEN} tokens; "
            f"decode {rate['median']:.0f} tok/s ({rate['min']:.0f}-{rate['max']:.0f})"
        )
    decode = result["decode_ratio"]
    print(
        f"concurrency hybrid / full: {result['concurrency_ratio']:.2f}x (vLLM's sizing by "
        f"formula {vllm_ratio:.2f}x, the window alone {window_ratio:.2f}x); decode hybrid / "
        f"full at batch {args.batch}: {decode['median']:.2f}x ({decode['min']:.2f}-"
        f"{decode['max']:.2f})"
    )


if __name__ == "__main__":
    main()
