"""What one request holds of the KV cache with hybrid KV groups and without them, at a
step budget, and the step budget at which the groups pay.

vLLM does not give a sliding-window layer only its window: it sizes and admits a sliding
group for the last `window - 1` tokens plus every token in flight
(`SlidingWindowSpec.max_admission_blocks_per_request(max_in_flight_tokens,
max_model_len)`, with `max_in_flight_tokens` = the step budget times the batches in
flight), since blocks below the window are freed only once their step settled. With a
step budget as large as the context (a prompt prefilled whole) a sliding layer holds as
much as a full-attention one, plus a block, and the groups then cost capacity instead of
giving it. The sizes here are vLLM's own methods on specs built from the checkpoint's
declared window (the planner never sees the class's specs: those are the engine's,
`runner.kv`), so the plan's numbers are the ones vLLM sizes and admits with.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ttbundles.format.kv_shapes import FULL_LAYER_TYPE as FULL
from ttbundles.format.kv_shapes import layer_types, own_layer_shapes
from ttbundles.units import byte_size

if TYPE_CHECKING:
    from vllm.config import VllmConfig


@dataclass(frozen=True)
class RequestBlocks:
    """What one request of `max_model_len` tokens holds at a step budget: `full` blocks
    per full-attention layer, `sliding` per sliding-window layer (vLLM's admission bound),
    `page` bytes a block of one sliding layer, `full_page` of one full-attention layer
    (where the layers' shapes differ, Gemma 4's, each kind's own; else the same)."""

    budget: int
    in_flight: int
    max_model_len: int
    window: int
    full: int
    sliding: int
    full_layers: int
    sliding_layers: int
    page: int
    full_page: int

    @property
    def with_groups(self) -> int:
        """Bytes of one request on vLLM's hybrid KV-cache manager (every group draws
        from one pool of blocks: a request's blocks summed over its layers)."""
        return self.full_page * self.full * self.full_layers + (
            self.page * self.sliding * self.sliding_layers
        )

    @property
    def without_groups(self) -> int:
        """Bytes of one request when every layer keeps the whole context."""
        return self.full * (self.full_page * self.full_layers + self.page * self.sliding_layers)

    @property
    def pays(self) -> bool:
        """The groups hold less per request than one group does."""
        return self.with_groups < self.without_groups

    def gain(self) -> float:
        """Requests with groups per request without them, in the same bytes."""
        return self.without_groups / self.with_groups

    def describe(self) -> str:
        """`a 512-token request holds 32 blocks per full-attention layer, 33 per sliding
        layer (window 16: 15 tokens + 1,024 in flight): 394 KiB with groups, 384 KiB
        without (0.97x the requests)`."""
        return (
            f"a {self.max_model_len}-token request holds {self.full} blocks per "
            f"full-attention layer, {self.sliding} per sliding layer (window {self.window}: "
            f"{self.window - 1} tokens + {self.in_flight:,} in flight at a step budget of "
            f"{self.budget}): {byte_size(self.with_groups)} with groups, "
            f"{byte_size(self.without_groups)} without ({self.gain():.2f}x the requests)"
        )


def request_blocks(
    vllm_config: VllmConfig, window: int, sliding_layers: int, budget: int
) -> RequestBlocks:
    """`RequestBlocks` at step budget `budget`, with the model's shape and the batches vLLM
    keeps in flight (`max_concurrent_batches`), asked of vLLM's own specs."""
    return _sizer(vllm_config, window, sliding_layers)(budget)


def _sizer(vllm_config: VllmConfig, window: int, sliding_layers: int):
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    model = vllm_config.model_config
    parallel = vllm_config.parallel_config
    shape = {
        "block_size": vllm_config.cache_config.block_size,
        "num_kv_heads": model.get_num_kv_heads(parallel),
        "head_size": model.get_head_size(),
        "dtype": model.dtype,
    }
    own = own_layer_shapes(model.hf_config)
    if own is not None:  # Gemma 4: the sliding and the global layers' own shapes
        local = next(s for s, kind in zip(own, layer_types(model.hf_config)) if kind != FULL)
        wide = next(s for s, kind in zip(own, layer_types(model.hf_config)) if kind == FULL)
        full = FullAttentionSpec(
            **{**shape, "num_kv_heads": wide.num_kv_heads, "head_size": wide.head_dim}
        )
        shape.update(num_kv_heads=local.num_kv_heads, head_size=local.head_dim)
    else:
        full = FullAttentionSpec(**shape)
    sliding = SlidingWindowSpec(**shape, sliding_window=window)
    length = model.max_model_len
    layers = model.get_num_layers(parallel)
    full_blocks = -(-full.max_memory_usage_bytes(vllm_config) // full.page_size_bytes)
    batches = vllm_config.max_concurrent_batches

    def at(budget: int) -> RequestBlocks:
        in_flight = batches * budget
        return RequestBlocks(
            budget=budget,
            in_flight=in_flight,
            max_model_len=length,
            window=window,
            full=full_blocks,
            sliding=sliding.max_admission_blocks_per_request(in_flight, length),
            full_layers=layers - sliding_layers,
            sliding_layers=sliding_layers,
            page=sliding.page_size_bytes,
            full_page=full.page_size_bytes,
        )

    return at


def paying_budget(
    vllm_config: VllmConfig, window: int, sliding_layers: int, ceiling: int
) -> int | None:
    """The step budget to serve hybrid groups at when the current one does not pay: the
    largest (in whole blocks, from the smallest vLLM allows: `max_num_seqs`, one block) at
    which a sliding layer holds at most half a full layer's blocks, so that prompts still
    prefill in few chunks while the groups keep most of what the window saves; else the
    smallest budget, when the groups pay there at all; None when no budget up to
    `ceiling` makes them pay (a window close to `max_model_len`)."""
    block = vllm_config.cache_config.block_size
    seqs = vllm_config.scheduler_config.max_num_seqs
    floor = max(block, -(-seqs // block) * block)
    at = _sizer(vllm_config, window, sliding_layers)
    sizes = [at(b) for b in range(floor, ceiling + 1, block)]
    halving = [s.budget for s in sizes if 2 * s.sliding <= s.full and s.pays]
    if halving:
        return halving[-1]
    if sizes and sizes[0].pays:
        return sizes[0].budget
    return None
