"""How many bytes the KV cache takes, from the specs' own answers.

vLLM divides the bytes a worker offers (`determine_available_memory`) back into blocks
with the page sizes of the groups it makes from the specs (`get_kv_cache_groups`,
`get_uniform_page_size`); the bytes here are those that divide back into the blocks the
generator can hold.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from ttbundles.serving.runner.kv.kinds import describe, held_blocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec


def pool_bytes(
    vllm_config: VllmConfig, specs: dict[str, KVCacheSpec], tokens: int, per_lane: int
) -> int:
    """The bytes of a pool holding `tokens` tokens of context for `per_lane` users, for
    one lane: each group whose blocks grow with the context gets that context's blocks
    (and one spare), each group of a bounded kind (a sliding window) the blocks a request
    holds at most, per user; times the bytes vLLM counts per block (a page of every
    shared tensor). One group of every layer: the blocks of `tokens` times every layer's
    page, as before there were groups."""
    from vllm.v1.core.kv_cache_planning import get_kv_cache_groups, get_uniform_page_size

    block = vllm_config.cache_config.block_size
    groups = get_kv_cache_groups(vllm_config, dict(specs))
    bounded = [held_blocks(g.kv_cache_spec, vllm_config) for g in groups]
    held = sum(b for b in bounded if b is not None)
    growing = sum(1 for b in bounded if b is None)
    num_blocks = growing * (-(-tokens // block) + 1) + held * per_lane
    if len(groups) == 1 and hasattr(groups[0].kv_cache_spec, "kv_cache_specs"):
        # One group of layers with pages of their own sizes (vLLM's
        # UniformTypeKVCacheSpecs: its page is every layer's page summed).
        return num_blocks * groups[0].kv_cache_spec.page_size_bytes
    tensors = max(len(g.layer_names) for g in groups)
    page = get_uniform_page_size([g.kv_cache_spec for g in groups])
    return num_blocks * page * tensors


def block_bytes(specs: dict[str, KVCacheSpec]) -> int:
    """The bytes of one block of one layer (`get_cache_block_size_bytes`): the largest
    page of the layers' specs (the groups share one page size where there are several)."""
    return max((spec.page_size_bytes for spec in specs.values()), default=0)


@dataclass(frozen=True)
class Capacity:
    """What the KV cache vLLM made holds: its `bytes`, the blocks one request of
    `max_model_len` holds in a group of each kind (`per_request`, vLLM's own count: a
    sliding window's is its window plus the tokens in flight), the requests of that
    length it holds at once (`with_groups`, vLLM's `get_max_concurrency_for_kv_cache_config`)
    and, with several groups, what the same bytes would hold with every layer keeping the
    whole context (`without_groups`)."""

    bytes: int
    max_model_len: int
    per_request: tuple[tuple[str, int], ...]
    with_groups: float
    without_groups: float | None = None

    def describe(self) -> str:
        """`a 512-token request holds 32 blocks of a full attention group, 33 of a
        sliding window 16 group: 41.58x concurrency (42.66x without KV groups)`."""
        held = ", ".join(
            f"{blocks}{' blocks' if i == 0 else ''} of a {kind} group"
            for i, (kind, blocks) in enumerate(self.per_request)
        )
        without = (
            f" ({self.without_groups:.2f}x without KV groups)"
            if self.without_groups is not None
            else ""
        )
        return (
            f"a {self.max_model_len}-token request holds {held}: "
            f"{self.with_groups:.2f}x concurrency{without}"
        )


def capacity(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig, num_layers: int) -> Capacity:
    """The `Capacity` of the cache vLLM configured, every number from vLLM's own methods;
    without groups, the same bytes as blocks of every layer's page, each request the
    blocks of `max_model_len`."""
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config

    length = vllm_config.model_config.max_model_len
    block = vllm_config.cache_config.block_size
    # Every tensor of a config aliases one allocation from byte 0 (the groups overlay
    # one pool): its size is the pool's, not a share of it.
    size = max((t.size for t in kv_cache_config.kv_cache_tensors), default=0)
    growing: dict[str, int] = {}  # the kinds whose blocks grow with the context first
    bounded: dict[str, int] = {}
    for group in kv_cache_config.kv_cache_groups:
        spec = group.kv_cache_spec
        bound = held_blocks(spec, vllm_config)
        if bound is None:
            blocks = -(-spec.max_memory_usage_bytes(vllm_config) // spec.page_size_bytes)
            growing.setdefault(describe(spec), blocks)
        else:
            bounded.setdefault(describe(spec), bound)
    with_groups = get_max_concurrency_for_kv_cache_config(vllm_config, kv_cache_config)
    without = None
    if len(kv_cache_config.kv_cache_groups) > 1:
        page = max(g.kv_cache_spec.page_size_bytes for g in kv_cache_config.kv_cache_groups)
        without = (size // (page * num_layers)) / -(-length // block)
    return Capacity(size, length, (*growing.items(), *bounded.items()), with_groups, without)
