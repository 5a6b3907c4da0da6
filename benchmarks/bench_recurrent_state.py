"""A gated delta net hybrid's memory per request against the same model with every layer
full attention: the state bytes a request holds at 512 and 4,096 tokens of context, and
the concurrency at one memory budget, from what vLLM's engine sizes and what the
generator allocates.

The tests' tiny Qwen3.5 (8 layers, 3 GDN : 1 full attention, conv kernel 4), with room
for 4,096 positions, twice: as is (a bundle from `ttbundle init --reference`: its GDN
state is the generator's, one slot per user, and vLLM's KV manager holds the 2 attention
layers only) and with `layer_types` all `full_attention` (the same weights' shapes, 8
attention layers, no state). vLLM's `LLMEngine` runs in this process on the host mesh.

- state bytes per request: the generator's own allocation (`GdnState`, its tensors'
  bytes over its slots, read from the engine's generator) plus the attention KV at the
  context (the KV spec's page size per block, from vLLM's KV cache config); the
  full-attention model's KV at the same context. Deterministic: one figure each.
- concurrency at one budget (`--memory`): the hybrid gets `--memory` less its states
  (every slot is allocated at start, outside vLLM's pool) as `--kv-cache-memory-bytes`,
  the full model the whole budget; each figure is what vLLM's start-up line "Maximum
  concurrency for N tokens per request" says (`get_max_concurrency_for_kv_cache_config`),
  the hybrid's capped at its slots (`max_num_seqs`).

Nothing here is timed: the figures are bytes and requests, the same on every run.

    .venv/bin/python benchmarks/bench_recurrent_state.py [--memory 16777216]
        [--slots 32] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

MAX_MODEL_LEN = 4096
CONTEXTS = (512, 4096)
REPO = Path(__file__).resolve().parents[1]


def write_checkpoints(root: Path) -> dict[str, Path]:
    """The tests' tiny Qwen3.5 with room for MAX_MODEL_LEN, and its all-attention twin
    (the same sizes, `layer_types` all `full_attention`, its own random weights)."""
    sys.path.insert(0, str(REPO))
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    from tests.recurrent_checkpoints import _gdn_sizes, _tokens
    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    out = {}
    for name in ("hybrid", "full"):
        folder = root / name
        folder.mkdir(parents=True)
        tokenizer = build_tokenizer(folder)
        sizes = {**_gdn_sizes(), "max_position_embeddings": MAX_MODEL_LEN}
        if name == "full":
            sizes["layer_types"] = ["full_attention"] * sizes["num_hidden_layers"]
        config = Qwen3_5TextConfig(**sizes, **_tokens(tokenizer))
        save_random(Qwen3_5ForCausalLM(config), "Qwen3_5ForCausalLM", folder)
        out[name] = folder
    return out


def write_bundle(models: Path, checkpoint: Path, slots: int, recurrent: bool) -> None:
    """`ttbundle init --reference --from-hf` (the library call), the host target raised
    to MAX_MODEL_LEN and `slots` users."""
    from ttbundles.scaffold.init import init_bundle

    folder = models / "bench-qwen3-5"
    init_bundle(folder, arch=None, from_hf=str(checkpoint), reference=True)
    path = folder / "vllm_metadata.json"
    metadata = json.loads(path.read_text())
    metadata["targets"]["HOST"].update(max_model_len=MAX_MODEL_LEN, max_num_seqs=slots)
    if not recurrent:  # the all-attention twin keeps no state (TTB043 otherwise)
        metadata["capabilities"].pop("recurrent_state")
    path.write_text(json.dumps(metadata, indent=2) + "\n")


def measure(checkpoint: Path, kv_bytes: int, slots: int) -> dict:
    """One engine: its KV groups, blocks, page bytes, concurrency and generator state."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.engine.llm_engine import LLMEngine

    engine = LLMEngine.from_engine_args(
        EngineArgs(
            model=str(checkpoint),
            max_model_len=MAX_MODEL_LEN,
            max_num_seqs=slots,
            kv_cache_memory_bytes=kv_bytes,
            enable_prefix_caching=False,
        )
    )
    try:
        core = engine.engine_core.engine_core
        config = core.vllm_config
        kv_config = core.scheduler.kv_cache_config
        [group] = kv_config.kv_cache_groups  # the attention layers, one group
        spec = group.kv_cache_spec
        layers = len(group.layer_names)
        generator = core.model_executor.driver_worker.worker.model_runner.generator
        state = getattr(generator, "state", None)
        state_bytes = 0
        state_slots = 0
        if state is not None:
            tensors = [v for v in vars(state).values() if hasattr(v, "element_size")]
            state_bytes = sum(t.numel() * t.element_size() for t in tensors)
            state_slots = state.slots
        per_token = spec.page_size_bytes * layers // spec.block_size
        return {
            "attention_layers": layers,
            "block_size": spec.block_size,
            "num_blocks": kv_config.num_blocks,
            "kv_bytes_per_token": per_token,
            "state_bytes_per_request": state_bytes // state_slots if state_slots else 0,
            "state_bytes_allocated": state_bytes,
            "max_concurrency": get_max_concurrency_for_kv_cache_config(config, kv_config),
        }
    finally:
        import contextlib

        with contextlib.suppress(Exception):
            engine.engine_core.shutdown()


def main() -> None:
    unwind_on_sigterm()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--memory", type=int, default=16 * 1024 * 1024)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()

    from ttbundles.demo.server import serve_environment

    with tempfile.TemporaryDirectory(prefix="bench-recurrent-") as tmp:
        work = Path(tmp)
        checkpoints = write_checkpoints(work / "checkpoints")
        os.environ.update(serve_environment())
        os.environ.update(VLLM_ENABLE_V1_MULTIPROCESSING="0", TT_VLLM_BUILTIN_MODELS="0")
        layouts = {}
        for name in ("hybrid", "full"):
            models = work / f"models-{name}"
            write_bundle(models, checkpoints[name], args.slots, recurrent=name == "hybrid")
            os.environ["EXTRA_MODELS_DIR"] = str(models)
            # The hybrid's states come out of the same budget (allocated at start): a
            # first engine reads their size, the measured one gets the rest.
            kv_bytes = args.memory
            if name == "hybrid":
                probe = measure(checkpoints[name], args.memory, args.slots)
                kv_bytes = args.memory - probe["state_bytes_allocated"]
            layouts[name] = {"kv_cache_memory_bytes": kv_bytes, **measure(
                checkpoints[name], kv_bytes, args.slots
            )}  # fmt: skip
    hybrid, full = layouts["hybrid"], layouts["full"]
    per_request = {
        name: {
            str(context): layout["state_bytes_per_request"] + layout["kv_bytes_per_token"] * context
            for context in CONTEXTS
        }
        for name, layout in layouts.items()
    }
    hybrid_requests = min(hybrid["max_concurrency"], args.slots)
    result = {
        "memory": args.memory,
        "slots": args.slots,
        "max_model_len": MAX_MODEL_LEN,
        "layouts": layouts,
        "bytes_per_request": per_request,
        "bytes_ratio": {
            str(c): per_request["hybrid"][str(c)] / per_request["full"][str(c)] for c in CONTEXTS
        },
        "concurrency": {"hybrid": hybrid_requests, "full": full["max_concurrency"]},
        "concurrency_ratio": hybrid_requests / full["max_concurrency"],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    for name, layout in layouts.items():
        print(
            f"{name:6s}: {layout['attention_layers']} attention layers "
            f"({layout['kv_bytes_per_token']:,} B a token), state "
            f"{layout['state_bytes_per_request']:,} B a request; "
            + ", ".join(f"{per_request[name][str(c)]:,} B at {c} tokens" for c in CONTEXTS)
            + f"; {layout['max_concurrency']:.2f}x concurrency at {MAX_MODEL_LEN} tokens in "
            f"{layout['kv_cache_memory_bytes']:,} B of KV"
        )
    print(
        "bytes per request hybrid / full: "
        + ", ".join(f"{result['bytes_ratio'][str(c)]:.3f} at {c}" for c in CONTEXTS)
        + f"; concurrency at {args.memory:,} B: hybrid {hybrid_requests:.2f} (of "
        f"{args.slots} slots) / full {full['max_concurrency']:.2f} = "
        f"{result['concurrency_ratio']:.2f}x"
    )


if __name__ == "__main__":
    main()
