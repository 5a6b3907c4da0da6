"""The generator's KV cache: the engine's KV groups taken on, and the cache allocated.

vLLM's runner keeps this apart from the step loop too (`initialize_kv_cache`): the
groups come once, from the engine's `KVCacheConfig` (`runner.kv.groups.LayerGroups`),
before any request, and the cache is allocated once after them. What does not yet follow
several groups is refused here, before a request could be served wrong. The one
allocator (`Allocator`) serves both runners: generation over vLLM's blocks, pooling over
a cache of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ttbundles.format import contract
from ttbundles.serving.binding import BoundMethod, GeneratorContractError, bind
from ttbundles.serving.runner.kv import kinds

if TYPE_CHECKING:
    import torch

    from ttbundles.serving.runner.kv.groups import LayerGroups

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


@dataclass(frozen=True)
class Allocator:
    """The generator's cache allocation methods, bound once: the per-layer one (hybrid
    attention: a (shape, dtype, tensor_idx) per layer) preferred where the class has it."""

    per_layer: BoundMethod | None
    whole: BoundMethod | None

    @classmethod
    def bind(cls, model: Any, class_name: str, *, needed_by: str = "") -> Allocator:
        """Both methods of `model`, TTB053 when it has neither (`needed_by`: what needs
        them, for the message)."""
        per_layer, whole = (
            bind(model, method, method.passes, class_name=class_name, optional=True)
            for method in (contract.ALLOCATE_KV_CACHE_PER_LAYER, contract.ALLOCATE_KV_CACHE)
        )
        if per_layer is None and whole is None:
            raise GeneratorContractError.single(
                "TTB053",
                f"{class_name} has neither allocate_kv_cache nor allocate_kv_cache_per_layer"
                + (f", which {needed_by} needs" if needed_by else ""),
                hint="implement one of them",
            )
        return cls(per_layer, whole)

    def allocate(
        self,
        shape: tuple[int, ...],
        dtype: Any,
        num_layers: int,
        tensors: Sequence[int] | None = None,
        shapes: Sequence[tuple[int, ...]] | None = None,
        states: dict[int, dict[str, Any]] | None = None,
    ) -> tuple[Any, int]:
        """The KV cache, and its layers when it was allocated per layer (then every
        step passes `page_tables_per_layer`; 0 otherwise). `tensors[i]` is layer i's
        `tensor_idx` (layers with the same one share one allocation: vLLM's KV groups
        overlay one block pool), each layer its own without it; `shapes[i]` layer i's
        shape where the layers' differ (its spec's KV heads and head size), `shape`
        for every layer without it and for the one-piece allocation (the model's).
        `states[i]`: layer i keeps recurrent state, allocated from that descriptor
        (`kinds.state_descriptor`) instead of a KV shape."""
        if self.per_layer is not None:
            indices = list(tensors) if tensors is not None else list(range(num_layers))
            own = list(shapes) if shapes is not None else [shape] * num_layers
            states = states or {}
            specs: list[Any] = [
                states.get(layer) or (own[layer], dtype, indices[layer])
                for layer in range(num_layers)
            ]
            return self.per_layer(per_layer_specs=specs), num_layers
        assert self.whole is not None
        return self.whole(kv_cache_shape=shape, dtype=dtype, num_layers=num_layers), 0


def allocate_cache(
    allocator: Allocator,
    class_name: str,
    groups: LayerGroups | None,
    shape: tuple[int, int, int, int],
    dtype: torch.dtype,
    num_layers: int,
    shapes: Sequence[tuple[int, int, int, int]] | None = None,
    state_slots: int = 0,
) -> tuple[Any, int]:
    """The generator's cache (`shape`: one lane's blocks; `shapes`: each layer's, where
    its spec gives it its own) and how many layers it holds one tensor each (0: one
    tensor for every layer). Several groups need the per-layer allocation: layers that
    share one tensor cannot be allocated in one piece (TTB261). A layer whose block size
    is not the engine's (vLLM grows a group's blocks to unify page sizes) is refused
    (TTB265): the block tables here have one block size. A layer of a group that keeps
    recurrent state (vLLM owns it: a `MambaSpec`) gets its state descriptor,
    `state_slots` states (one per batch slot)."""
    states: dict[int, dict[str, Any]] = {}
    if groups is not None:
        for layer, (group, tensor) in enumerate(zip(groups.group, groups.tensor)):
            spec = groups.specs[group]
            if kinds.holds_state(spec):
                states[layer] = kinds.state_descriptor(spec, tensor, state_slots)
    if states and allocator.per_layer is None:
        raise GeneratorContractError.single(
            "TTB261",
            f"{class_name} declares recurrent state vLLM's KV manager owns (MambaSpec "
            "groups) but has no allocate_kv_cache_per_layer: a layer's state is allocated "
            'from its {"type": "mamba", ...} descriptor there',
            hint="implement allocate_kv_cache_per_layer(per_layer_specs), or declare "
            "capabilities.recurrent_state owner 'generator'",
        )
    block_size = shape[2]
    odd = sorted(
        {s[2] for layer, s in enumerate(shapes or ()) if layer not in states} - {block_size}
    )
    if odd:
        raise GeneratorContractError.single(
            "TTB265",
            f"{class_name}'s KV groups have blocks of {', '.join(map(str, odd))} tokens "
            f"beside the engine's {block_size} (vLLM grew a group's blocks so that its "
            "page is the size of the others'), which the host runner does not serve yet",
            hint="give the layers shapes of one page size (KV heads x head size equal "
            f"across groups), or serve with {HYBRID_HINT}",
        )
    if groups is not None and groups.num_groups > 1 and allocator.per_layer is None:
        raise GeneratorContractError.single(
            "TTB261",
            f"{class_name} declares {groups.num_groups} KV groups "
            "(get_kv_cache_spec) but has no allocate_kv_cache_per_layer: layers that "
            "share one tensor cannot be allocated through allocate_kv_cache",
            hint=f"implement allocate_kv_cache_per_layer(per_layer_specs), or serve with "
            f"{HYBRID_HINT}",
        )
    tensors = groups.tensor if groups is not None else None
    return allocator.allocate(shape, dtype, num_layers, tensors, shapes, states)
