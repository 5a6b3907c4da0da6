"""How many bytes the KV cache takes, from the specs' own answers.

vLLM divides the bytes a worker offers (`determine_available_memory`) back into blocks
with the page sizes of the groups it makes from the specs (`get_kv_cache_groups`,
`get_uniform_page_size`); the bytes here are those that divide back into the blocks the
generator can hold.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ttbundles.serving.runner.kv.kinds import held_blocks

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheSpec


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
    tensors = max(len(g.layer_names) for g in groups)
    page = get_uniform_page_size([g.kv_cache_spec for g in groups])
    return num_blocks * page * tensors


def block_bytes(specs: dict[str, KVCacheSpec]) -> int:
    """The bytes of one block of one layer (`get_cache_block_size_bytes`): the largest
    page of the layers' specs (the groups share one page size where there are several)."""
    return max((spec.page_size_bytes for spec in specs.values()), default=0)
