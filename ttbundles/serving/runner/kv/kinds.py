"""What kind of cache a layer keeps, asked of its vLLM `KVCacheSpec` and nowhere else.

Every spec answers for itself in vLLM (`page_size_bytes`, `max_memory_usage_bytes`,
`max_num_blocks_per_req`); the few facts it does not answer as a method are read here, by
the spec's own attributes rather than its class, so that a new kind of spec (a recurrent
state next) is one new case in this package and not a switch in every caller:

- `reach`: how many tokens below a step's first position the layer still reads (a sliding
  window's `num_retained_tokens`; 0: everything, full attention);
- `held_blocks`: the blocks one request holds at most whatever its length (a sliding
  window's `max_admission_blocks_per_request`; None: its blocks grow with its context);
- `describe`: the kind in the start-up log's words;
- `holds_state`: the layer keeps a fixed-size recurrent state per request (a `MambaSpec`:
  one block per request in vLLM's "none" mode, position-indexed blocks in its "align"
  mode, what `gated_delta_net` builds), not tokens.
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


def gated_delta_net(
    vllm_config: VllmConfig, block_size: int, page_size_padded: int | None, *, host: bool
) -> KVCacheSpec:
    """The `MambaSpec` of a gated delta net layer, as vLLM's own Qwen3.5 declares it:
    shapes from `MambaStateShapeCalculator.gated_delta_net_state_shape` (conv
    `(K - 1, conv_dim)`, recurrent `(Hv, Dv, Dk)`), `mamba_type` GDN, the cache mode the
    config settled, `block_size` the Mamba block (`mamba_block_size`), the page padded to
    the attention page (`page_size_padded`). Dtypes: float32 for both on the host mesh
    (the reference computes the state in float32, as transformers keeps it); elsewhere
    vLLM's rule (the model dtype; `mamba_ssm_cache_dtype` or the checkpoint's
    `mamba_ssm_dtype` for the recurrent part)."""
    import torch
    from vllm.model_executor.layers.mamba.mamba_utils import MambaStateShapeCalculator
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.kv_cache_interface import MambaSpec

    model = vllm_config.model_config
    config = getattr(model.hf_config, "text_config", None) or model.hf_config
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1,
        config.linear_num_key_heads,
        config.linear_num_value_heads,
        config.linear_key_head_dim,
        config.linear_value_head_dim,
        config.linear_conv_kernel_dim,
        0,
    )
    if host:
        dtypes: tuple[Any, ...] = (torch.float32, torch.float32)
    else:
        ssm: Any = getattr(vllm_config.cache_config, "mamba_ssm_cache_dtype", "auto")
        if ssm == "auto":
            ssm = getattr(config, "mamba_ssm_dtype", None) or model.dtype
        dtypes = (model.dtype, getattr(torch, ssm) if isinstance(ssm, str) else ssm)
    return MambaSpec(
        block_size=block_size,
        shapes=tuple(tuple(s) for s in shapes),
        dtypes=dtypes,
        page_size_padded=page_size_padded,
        mamba_type=MambaAttentionBackendEnum.GDN_ATTN,
        mamba_cache_mode=vllm_config.cache_config.mamba_cache_mode,
    )


def holds_state(spec: KVCacheSpec) -> bool:
    """The layer keeps a recurrent state per request (`MambaSpec`: its `shapes`), not
    the tokens of its context."""
    return getattr(spec, "mamba_type", None) is not None and hasattr(spec, "shapes")


def state_descriptor(spec: KVCacheSpec, tensor_idx: int, slots: int) -> dict[str, Any]:
    """What `allocate_kv_cache_per_layer` gets for a layer that keeps recurrent state
    (the reference plugin's descriptor): its state's shapes and dtypes, the allocation
    it shares with the layers at its index in other groups, and `compact_slots` states
    (one per batch slot: a request keeps its slot for its life)."""
    return {
        "type": "mamba",
        "shapes": [tuple(s) for s in spec.shapes],  # type: ignore[attr-defined]
        "dtypes": list(spec.dtypes),  # type: ignore[attr-defined]
        "tensor_idx": tensor_idx,
        "compact_slots": slots,
    }


def reach(spec: KVCacheSpec) -> int:
    """Tokens below a step's first position that the layer's attention still reads
    (`SlidingWindowSpec.num_retained_tokens`); 0 for a layer that reads everything."""
    return int(getattr(spec, "num_retained_tokens", 0) or 0)


def held_blocks(spec: KVCacheSpec, vllm_config: VllmConfig) -> int | None:
    """The blocks one request of this layer kind holds at most, whatever its length
    (`max_admission_blocks_per_request`, vLLM's own bound for sizing and admission);
    None when its blocks grow with its context."""
    # Recurrent state: vLLM's own count of what a request keeps (`max_memory_usage_bytes`,
    # what its planner sizes the pool by): a block per request in "none" mode; in "align"
    # mode two (the live column and the one being copied on), though its position-indexed
    # row is as wide as the context (retired columns point at the null block).
    if holds_state(spec):
        return -(-int(spec.max_memory_usage_bytes(vllm_config)) // int(spec.page_size_bytes))
    bound = getattr(spec, "max_admission_blocks_per_request", None)
    if bound is None:
        return None
    return int(bound(vllm_config.max_in_flight_tokens, vllm_config.model_config.max_model_len))


def describe(spec: KVCacheSpec) -> str:
    """`full attention`, `sliding window 32`, `gated delta net state`: the kind in the
    start-up log's words."""
    if holds_state(spec):
        return "gated delta net state" if _is_gdn(spec) else "recurrent state"
    window = getattr(spec, "sliding_window", None)
    return f"sliding window {window}" if window else "full attention"


def _is_gdn(spec: KVCacheSpec) -> bool:
    return str(getattr(getattr(spec, "mamba_type", None), "name", "")) == "GDN_ATTN"
