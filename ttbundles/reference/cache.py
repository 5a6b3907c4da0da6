"""The reference's paged KV cache: allocation, vLLM's per-layer specs, and page tables.

Apart from the forward pass because a cache is a contract of its own (the worker sizes
and allocates it before the first forward; `allocate_kv_cache`, `get_kv_cache_spec`,
`allocate_kv_cache_per_layer` in `format.contract`), and because a new KV kind (a
hybrid model's groups today, recurrent state next) should change this module and not
the model's math. Float32 always: the reference keeps full precision, so differences
from it are the TT generator's own.
"""

from __future__ import annotations

from typing import Any

import torch

from ttbundles.format.attention_window import attention_window
from ttbundles.reference.config import ModelDims

KVCache = list[list[torch.Tensor]]
"""Per layer `[k_cache, v_cache]`, each `[N, KV, Bs, D]`."""

PageTables = torch.Tensor | list[torch.Tensor]
"""One page table for every layer, or one per layer (`page_tables_per_layer`: each layer
its KV group's, the groups of a hybrid cache)."""


def rows_of(tables: PageTables, index: torch.Tensor) -> PageTables:
    """The rows `index` of a page table or of each layer's (a layer's table shared with
    others stays shared)."""
    if isinstance(tables, torch.Tensor):
        return tables[index]
    picked: dict[int, torch.Tensor] = {}
    return [picked.setdefault(id(t), t[index]) for t in tables]


def as_tables(page_table: Any) -> PageTables:
    """A page table as int64, or each layer's as given (`host_tables` made them)."""
    if isinstance(page_table, list):
        return page_table
    return torch.as_tensor(page_table).long()


def host_tables(page_table: Any, per_layer: Any) -> PageTables | None:
    """The step's tables as int64 host tensors: each layer's when `per_layer` is given
    (tables shared between layers stay one tensor), else the one `page_table`."""
    if per_layer is None:
        return None if page_table is None else torch.as_tensor(page_table).long().clone()
    converted: dict[int, torch.Tensor] = {}
    return [converted.setdefault(id(t), torch.as_tensor(t).long().clone()) for t in per_layer]


def _check_fits(shape: Any, dims: ModelDims) -> None:
    """A cache shape `(N, KV, Bs, D)` must have the model's KV heads and head size."""
    _, kv_heads, _, head_size = shape
    if (kv_heads, head_size) != (dims.num_kv_heads, dims.head_dim):
        raise ValueError(
            f"kv_cache_shape {tuple(shape)} does not fit the model "
            f"({dims.num_kv_heads} KV heads of size {dims.head_dim})"
        )


class PagedCache:
    """The cache half of the contract, mixed into the generator (`reference.generator`),
    which provides `dims` and `lanes`."""

    dims: ModelDims
    lanes: int

    def kv_layer_count(self) -> int:
        """How many layers keep KV in the paged cache: every layer here; a hybrid with
        recurrent layers (`reference.qwen3_5`) only its attention layers."""
        return self.dims.num_layers

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> KVCache:
        """Zeroed paged cache: per layer `[k_cache, v_cache]`, each `kv_cache_shape`
        = `(N, KV, Bs, D)`; with lanes, one such cache per lane, each of that shape (the
        shape is a lane's, as TT-Metal sizes each submesh's cache). Always float32,
        whatever `dtype` asks: the reference keeps full precision so differences from it
        are the TT generator's own."""
        _check_fits(kv_cache_shape, self.dims)
        if num_layers != self.kv_layer_count():
            raise ValueError(
                f"num_layers {num_layers} != the model's {self.kv_layer_count()} KV layers"
            )
        shape = tuple(kv_cache_shape)

        def one_cache() -> KVCache:
            return [
                [torch.zeros(shape, dtype=torch.float32), torch.zeros(shape, dtype=torch.float32)]
                for _ in range(num_layers)
            ]

        if self.lanes == 1:
            return one_cache()
        return [one_cache() for _ in range(self.lanes)]  # type: ignore[return-value]

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any] | None:
        """Each layer's KV cache for vLLM (`serving.runner.kv.groups`): a `SlidingWindowSpec`
        for the checkpoint's sliding layers (`format.attention_window`), None (full
        attention) for the others; None for a model without a window. On vLLM's hybrid
        manager a sliding layer then holds only the blocks of its window (the blocks
        before it are vLLM's null block, which the window never reads)."""
        from vllm.v1.kv_cache_interface import SlidingWindowSpec

        model_config = vllm_config.model_config
        hf_config = model_config.hf_config
        window = attention_window(hf_config)
        if window is None:
            return None
        dims = ModelDims.from_hf_config(hf_config)
        spec = SlidingWindowSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=dims.num_kv_heads,
            head_size=dims.head_dim,
            dtype=model_config.dtype,
            sliding_window=window.size,
        )
        return {
            f"model.layers.{i}.self_attn": spec if i in window.layers else None
            for i in range(dims.num_layers)
        }

    def allocate_kv_cache_per_layer(self, per_layer_specs: list[tuple[Any, Any, int]]) -> KVCache:
        """Zeroed paged cache from one `(kv_cache_shape, dtype, tensor_idx)` per layer:
        layers with the same `tensor_idx` share one `[k_cache, v_cache]` (vLLM's KV
        groups overlay one block pool: a block id belongs to one group at a time), so a
        hybrid model's cache is the size of its groups' pool, not of every layer's
        context. With lanes, one such cache per lane. Float32, as `allocate_kv_cache`."""
        if len(per_layer_specs) != self.kv_layer_count():
            raise ValueError(
                f"per_layer_specs has {len(per_layer_specs)} layers; the model has "
                f"{self.kv_layer_count()} KV layers"
            )
        for shape, _, _ in per_layer_specs:
            _check_fits(shape, self.dims)

        def one_cache() -> KVCache:
            shared: dict[int, list[torch.Tensor]] = {}
            return [
                shared.setdefault(
                    int(index),
                    [
                        torch.zeros(tuple(shape), dtype=torch.float32),
                        torch.zeros(tuple(shape), dtype=torch.float32),
                    ],
                )
                for shape, _, index in per_layer_specs
            ]

        if self.lanes == 1:
            return one_cache()
        return [one_cache() for _ in range(self.lanes)]  # type: ignore[return-value]
