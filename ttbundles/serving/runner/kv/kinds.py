"""What kind of cache a layer keeps, asked of its vLLM `KVCacheSpec` and nowhere else.

Every spec answers for itself in vLLM (`page_size_bytes`, `max_memory_usage_bytes`,
`max_num_blocks_per_req`); the few facts it does not answer as a method are read here, by
the spec's own attributes rather than its class, so that a new kind of spec (a recurrent
state next) is one new case in this package and not a switch in every caller:

- `reach`: how many tokens below a step's first position the layer still reads (a sliding
  window's `num_retained_tokens`; 0: everything, full attention);
- `held_blocks`: the blocks one request holds at most whatever its length (a sliding
  window's `max_admission_blocks_per_request`; None: its blocks grow with its context);
- `describe`: the kind in the start-up log's words.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheSpec


def full_attention(block_size: int, kv_heads: int, head_size: int, dtype: Any) -> KVCacheSpec:
    """The spec of a layer that keeps the whole context with the model's shape: what a
    layer gets when its class declares nothing for it."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(
        block_size=block_size, num_kv_heads=kv_heads, head_size=head_size, dtype=dtype
    )


def whole_context(spec: KVCacheSpec) -> KVCacheSpec:
    """The same layer keeping the whole context: an attention spec (a sliding window's)
    as full attention in its own shape (block size, KV heads, head size, dtype), where the
    launch does not serve the class's groups but its layers' shapes differ (Gemma 4's
    global layers); any other spec as it is."""
    heads, size = getattr(spec, "num_kv_heads", None), getattr(spec, "head_size", None)
    if heads is None or size is None or not getattr(spec, "sliding_window", None):
        return spec
    return full_attention(spec.block_size, heads, size, spec.dtype)


def cache_shape(spec: KVCacheSpec, num_blocks: int) -> tuple[int, int, int, int]:
    """A layer's cache `(N, KV, Bs, D)` as its spec shapes it."""
    return (num_blocks, spec.num_kv_heads, spec.block_size, spec.head_size)


def reach(spec: KVCacheSpec) -> int:
    """Tokens below a step's first position that the layer's attention still reads
    (`SlidingWindowSpec.num_retained_tokens`); 0 for a layer that reads everything."""
    return int(getattr(spec, "num_retained_tokens", 0) or 0)


def held_blocks(spec: KVCacheSpec, vllm_config: VllmConfig) -> int | None:
    """The blocks one request of this layer kind holds at most, whatever its length
    (`max_admission_blocks_per_request`, vLLM's own bound for sizing and admission);
    None when its blocks grow with its context."""
    bound = getattr(spec, "max_admission_blocks_per_request", None)
    if bound is None:
        return None
    return int(bound(vllm_config.max_in_flight_tokens, vllm_config.model_config.max_model_len))


def describe(spec: KVCacheSpec) -> str:
    """`full attention`, `sliding window 32`: the kind in the start-up log's words."""
    window = getattr(spec, "sliding_window", None)
    return f"sliding window {window}" if window else "full attention"
