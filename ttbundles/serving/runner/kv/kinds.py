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
