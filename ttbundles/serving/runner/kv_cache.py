"""The generator's KV cache: the engine's KV groups taken on, and the cache allocated.

vLLM's runner keeps this apart from the step loop too (`initialize_kv_cache`): the
groups come once, from the engine's `KVCacheConfig` (`serving.kv_layout.LayerGroups`),
before any request, and the cache is allocated once after them. What does not yet follow
several groups is refused here, before a request could be served wrong.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.serving.binding import GeneratorContractError

if TYPE_CHECKING:
    import torch

    from ttbundles.serving.kv_layout import LayerGroups
    from ttbundles.serving.runner.contract_binding import GeneratorMethods

HYBRID_HINT = "--disable-hybrid-kv-cache-manager"


def refuse_unserved_groups(groups: LayerGroups, *, speculating: bool, lanes: int) -> None:
    """TTB262 where several groups meet what reads one table: the early-exit drafter and
    verify read one, and lanes split one block pool by lane."""
    if groups.num_groups <= 1:
        return
    unserved = []
    if speculating:
        unserved.append("speculative decoding")
    if lanes > 1:
        unserved.append("in-process data-parallel lanes")
    if unserved:
        raise GeneratorContractError.single(
            "TTB262",
            f"{' and '.join(unserved)} with {groups.describe()} (hybrid KV cache) is "
            "not supported yet",
            hint=f"serve with {HYBRID_HINT} (every layer keeps the whole context), or "
            "without the feature",
        )


def allocate_cache(
    methods: GeneratorMethods,
    class_name: str,
    groups: LayerGroups | None,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    num_layers: int,
) -> tuple[Any, int]:
    """The generator's cache (`shape`: one lane's blocks) and how many layers it holds
    one tensor each (0: one tensor for every layer). Several groups need the per-layer
    allocation: layers that share one tensor cannot be allocated in one piece (TTB261)."""
    if groups is not None and groups.num_groups > 1 and methods.allocate_per_layer is None:
        raise GeneratorContractError.single(
            "TTB261",
            f"{class_name} declares {groups.num_groups} KV groups "
            "(get_kv_cache_spec) but has no allocate_kv_cache_per_layer: layers that "
            "share one tensor cannot be allocated through allocate_kv_cache",
            hint=f"implement allocate_kv_cache_per_layer(per_layer_specs), or serve with "
            f"{HYBRID_HINT}",
        )
    tensors = groups.tensor if groups is not None else None
    return methods.allocate_cache(shape, dtype, num_layers, tensors)
