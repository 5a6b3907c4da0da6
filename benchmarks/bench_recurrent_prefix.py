"""Time to first token on a prefix-cache hit against cold, for a gated delta net hybrid in
either state form: `--owner generator` (the class's slots, the prefix cache of snapshots:
`serving.recurrent_prefix`) or `--owner vllm` (vLLM's KV manager, its "align" mode:
position-indexed Mamba blocks, the state copied on at block boundaries).

The tests' tiny Qwen3.5 (8 layers, 3 GDN : 1 full attention) with room for 2,048
positions, a bundle from `ttbundle init --reference [--recurrent-owner vllm]`, and
vLLM's `LLMEngine` in this process on the host mesh with `--max-num-batched-tokens 256`
(chunks end on block boundaries, where snapshots are taken or Mamba blocks kept). Each
round sends, one after the other:

- cold: a new random prefix of `--prefix` tokens and a 16-token suffix, nothing cached;
- hit: the same prefix with another suffix: its whole chunks come from the cache (the
  attention layers' KV from vLLM's blocks, the GDN state restored from a snapshot, or
  continued from the cached Mamba block).

The figure is the time from `add_request` to the step that returns the first token,
median and spread (min-max) over the rounds, and hit / cold per round; the two kinds
alternate within each round, so both see the same machine load. The hit's tokens are
checked against the cold run of the same prompt (the generator's own greedy tokens).

    .venv/bin/python benchmarks/bench_recurrent_prefix.py [--owner generator|vllm]
        [--prefix 1024] [--rounds 5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

MAX_MODEL_LEN = 2048
BATCHED_TOKENS = 256
SUFFIX = 16
REPO = Path(__file__).resolve().parents[1]


def write_checkpoint(folder: Path) -> Path:
    """The tests' tiny Qwen3.5 with room for MAX_MODEL_LEN."""
    sys.path.insert(0, str(REPO))
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from tests.recurrent_checkpoints import _gdn_sizes, _tokens
    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    folder.mkdir(parents=True)
    tokenizer = build_tokenizer(folder)
    sizes = {**_gdn_sizes(), "max_position_embeddings": MAX_MODEL_LEN}
    config = Qwen3_5TextConfig(**sizes, **_tokens(tokenizer))
    save_random(Qwen3_5ForCausalLM(config), "Qwen3_5ForCausalLM", folder)
    return folder


class Engine:
    def __init__(self, checkpoint: Path):
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        self.engine = LLMEngine.from_engine_args(
            EngineArgs(
                model=str(checkpoint),
                max_model_len=MAX_MODEL_LEN,
                max_num_batched_tokens=BATCHED_TOKENS,
                max_num_seqs=4,
                enable_prefix_caching=True,
            )
        )
        self.count = 0

    def first_token(self, prompt: list[int], max_tokens: int = 8) -> tuple[float, list[int], int]:
        """Seconds to the first token, the greedy tokens and the prompt's tokens vLLM
        took from its prefix cache."""
        from vllm import SamplingParams

        self.count += 1
        params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        self.engine.add_request(f"r{self.count}", {"prompt_token_ids": prompt}, params)
        first: float | None = None
        tokens: list[int] = []
        cached = 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if first is None and out.outputs[0].token_ids:
                    first = time.perf_counter() - started
                if out.finished:
                    tokens = list(out.outputs[0].token_ids)
                    cached = int(out.num_cached_tokens or 0)
        assert first is not None
        return first, tokens, cached

    def close(self) -> None:
        import contextlib

        with contextlib.suppress(Exception):
            self.engine.engine_core.shutdown()


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--owner", choices=("generator", "vllm"), default="generator")
    parser.add_argument("--prefix", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from ttbundles.demo.server import serve_environment
    from ttbundles.scaffold.init import init_bundle

    with tempfile.TemporaryDirectory(prefix="bench-recurrent-prefix-") as tmp:
        work = Path(tmp)
        checkpoint = write_checkpoint(work / "checkpoint")
        folder = work / "models" / "bench-qwen3-5"
        init_bundle(
            folder,
            arch=None,
            from_hf=str(checkpoint),
            reference=True,
            recurrent_owner=args.owner,
        )
        os.environ.update(serve_environment())
        os.environ.update(
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            EXTRA_MODELS_DIR=str(work / "models"),
            TT_VLLM_BUILTIN_MODELS="0",
        )
        rng = random.Random(0)
        engine = Engine(checkpoint)
        engine.first_token([rng.randrange(10, 200) for _ in range(64)])  # warm-up
        cold: list[float] = []
        hit: list[float] = []
        hit_tokens: list[int] = []
        same = True
        try:
            for _ in range(args.rounds):
                prefix = [rng.randrange(10, 200) for _ in range(args.prefix)]
                first = prefix + [rng.randrange(10, 200) for _ in range(SUFFIX)]
                second = prefix + [rng.randrange(10, 200) for _ in range(SUFFIX)]
                seconds, _, _ = engine.first_token(first)
                cold.append(seconds)
                seconds, tokens, cached = engine.first_token(second)
                hit.append(seconds)
                hit_tokens.append(cached)
                # The hit's tokens against the same prompt computed cold (cache reset).
                engine.engine.reset_prefix_cache()
                _, expected, _ = engine.first_token(second)
                same &= tokens == expected
            core = engine.engine.engine_core.engine_core
            snapshots = getattr(core.scheduler, "snapshots", None)
            restores = snapshots.restores if snapshots is not None else None
        finally:
            engine.close()
    result = {
        "owner": args.owner,
        "prefix": args.prefix,
        "suffix": SUFFIX,
        "max_num_batched_tokens": BATCHED_TOKENS,
        "rounds": args.rounds,
        "ttft_cold_s": spread(cold),
        "ttft_hit_s": spread(hit),
        "ratio_hit_over_cold": spread([h / c for h, c in zip(hit, cold, strict=True)]),
        "snapshot_restores": restores,
        "hit_cached_tokens": hit_tokens,
        "hit_tokens_equal_cold": same,
    }
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        ratio = result["ratio_hit_over_cold"]
        print(
            f"TTFT cold {result['ttft_cold_s']['median'] * 1e3:.1f} ms, hit "
            f"{result['ttft_hit_s']['median'] * 1e3:.1f} ms ({args.prefix}-token prefix, "
            f"{SUFFIX}-token suffix): hit / cold {ratio['median']:.3f} "
            f"({ratio['min']:.3f}-{ratio['max']:.3f}), state owned by the {args.owner}, "
            f"cached tokens per hit {hit_tokens}, {restores} snapshot restores, "
            f"hit tokens equal cold: {same}"
        )
    if not same:
        sys.exit("the hit's tokens differ from the cold run's")


if __name__ == "__main__":
    main()
