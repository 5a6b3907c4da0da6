"""The reference Gemma 4 text generator: the Llama-family generator with Gemma 4's layers,
as transformers' `modeling_gemma4` computes them (`families.gemma4` says what differs and
what is refused).

The one thing the shared pass cannot hold is a KV shape per layer: Gemma 4's global
layers have their own head size and KV heads, so each layer's cache is `[N, KV_l, Bs_l,
D_l]` (`layer_shapes`), and the forward pass builds its attention groups per distinct
(page table, cache shape) rather than once per table. The cache contract follows:
`allocate_kv_cache` takes the model's shape (the sliding layers', which vLLM's config
reads) for its block count and block size and gives every layer its own heads and size;
`get_kv_cache_spec` declares each layer's spec with its own shape (a sliding window for
the sliding layers), so vLLM's KV groups, their page sizes and the plan's bytes are the
layers' own; `allocate_kv_cache_per_layer` takes each layer's shape as vLLM's group gives
it, and layers that share one allocation (vLLM's groups overlay one block pool) view one
buffer, each in its own shape (equal bytes per block: vLLM unifies the page size).

Speculative decoding is not declared: the verify and the drafter read one KV shape.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ttbundles.format.attention_window import attention_window
from ttbundles.reference.attention import (
    Segment,
    apply_rope,
    attention_groups,
    rms_norm,
    rope_cos_sin,
)
from ttbundles.reference.cache import KVCache, PageTables
from ttbundles.reference.config import ModelDims
from ttbundles.reference.families.gemma4 import (
    FULL_LAYER_TYPE,
    LayerShape,
    dims_config,
    gemma4_style,
    layer_shapes,
    layer_types,
    text_config,
    unimplemented,
)
from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.reference.weights import (
    LayerWeights,
    Linear,
    LlamaWeights,
    checkpoint_dir,
    load_safetensors,
)

_TEXT_PREFIX = "model.language_model."


@dataclasses.dataclass
class Gemma4LayerWeights(LayerWeights):
    """A Gemma 4 decoder layer: the base layer's weights (its `v_proj` is `k_proj` where
    values are the keys' projection) and the scalar its output is multiplied by."""

    layer_scalar: torch.Tensor | None = None  # [1]


def text_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The text model's weights, float32, under `Gemma4ForCausalLM`'s names: a
    `Gemma4ForConditionalGeneration` keeps them under `model.language_model.`; its vision
    and audio towers and their embedders are dropped."""
    if not any(name.startswith(_TEXT_PREFIX) for name in state):
        return {name: tensor.float() for name, tensor in state.items()}
    out = {}
    for name, tensor in state.items():
        if name.startswith(_TEXT_PREFIX):
            out["model." + name[len(_TEXT_PREFIX) :]] = tensor.float()
        elif name == "lm_head.weight":
            out[name] = tensor.float()
    return out


def gemma4_weights(
    state: dict[str, torch.Tensor], shapes: list[LayerShape], tied: bool
) -> LlamaWeights:
    """Every layer's `Gemma4LayerWeights` (norms scale by `w`: nothing folded in)."""

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"checkpoint lacks {name}")
        return state[name]

    def linear(name: str) -> Linear:
        return Linear(take(f"{name}.weight"), state.get(f"{name}.bias"))

    layers: list[LayerWeights] = []
    for i, shape in enumerate(shapes):
        p, a = f"model.layers.{i}", f"model.layers.{i}.self_attn"
        k_proj = linear(f"{a}.k_proj")
        layers.append(
            Gemma4LayerWeights(
                input_norm=take(f"{p}.input_layernorm.weight"),
                q_proj=linear(f"{a}.q_proj"),
                k_proj=k_proj,
                # attention_k_eq_v: the global layers have no v_proj; values are the
                # keys' projection before the k norm and RoPE.
                v_proj=k_proj if shape.values_from_keys else linear(f"{a}.v_proj"),
                o_proj=linear(f"{a}.o_proj"),
                post_attention_norm=take(f"{p}.post_attention_layernorm.weight"),
                gate_proj=linear(f"{p}.mlp.gate_proj"),
                up_proj=linear(f"{p}.mlp.up_proj"),
                down_proj=linear(f"{p}.mlp.down_proj"),
                q_norm=take(f"{a}.q_norm.weight"),
                k_norm=take(f"{a}.k_norm.weight"),
                pre_feedforward_norm=take(f"{p}.pre_feedforward_layernorm.weight"),
                post_feedforward_norm=take(f"{p}.post_feedforward_layernorm.weight"),
                layer_scalar=state.get(f"{p}.layer_scalar"),
            )
        )
    embed = take("model.embed_tokens.weight")
    lm_head = embed if tied or "lm_head.weight" not in state else state["lm_head.weight"]
    return LlamaWeights(embed, layers, take("model.norm.weight"), lm_head)


def gemma4_rope(hf_config: Any, layer_type: str, head_dim: int) -> torch.Tensor:
    """The inverse frequencies `[D / 2]` of one layer type's RoPE: "default" over the
    whole head, or "proportional" (transformers' own function): the first
    `partial_rotary_factor` of the head's angles rotate with frequencies of the whole
    head size, the rest have frequency 0 (cos 1, sin 0: not rotated)."""
    params = dict((text_config(hf_config).rope_parameters or {}).get(layer_type) or {})
    params.setdefault("rope_type", "default")
    params.setdefault("rope_theta", 10_000.0)
    if params["rope_type"] == "default":
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        return 1.0 / (float(params["rope_theta"]) ** exponents)
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    view = _RopeView(params, head_dim)
    inv_freq, _ = ROPE_INIT_FUNCTIONS[params["rope_type"]](view)
    return inv_freq.float()


class _RopeView:
    """What transformers' proportional RoPE reads of a config, for one layer type."""

    def __init__(self, params: dict[str, Any], head_dim: int):
        self.rope_parameters = params
        self.head_dim = head_dim

    def standardize_rope_params(self) -> None:
        """Already standard."""


class ReferenceGemma4Generator(ReferenceLlamaGenerator):
    """The generator contract for Gemma 4 text checkpoints (see the module docstring)."""

    model_capabilities = {
        key: value
        for key, value in ReferenceLlamaGenerator.model_capabilities.items()
        if key not in ("supports_spec_decode", "supports_async_spec_decode")
    }

    shapes: list[LayerShape]
    global_rope: tuple[torch.Tensor, frozenset[int]]

    @classmethod
    def check_config(cls, hf_config: Any) -> None:
        """Refuse (NotImplementedError) what this generator does not compute, before any
        weight is read (`families.gemma4.unimplemented`)."""
        missing = unimplemented(hf_config)
        if missing is not None:
            raise NotImplementedError(f"Gemma 4: {missing}")
        layer_shapes(hf_config)

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> ReferenceGemma4Generator:
        """Load the checkpoint named by `hf_config._name_or_path`, float32 (see the base)."""
        cls.check_config(hf_config)
        config = text_config(hf_config)
        dims = ModelDims.from_hf_config(dims_config(hf_config))
        style = gemma4_style(hf_config, dims)
        shapes = layer_shapes(config)
        kinds = layer_types(config)
        state = text_state_dict(load_safetensors(checkpoint_dir(hf_config)))
        tied = bool(getattr(config, "tie_word_embeddings", False))
        weights = gemma4_weights(state, shapes, tied)
        if n_layers is not None:
            weights.layers = weights.layers[:n_layers]
            shapes, kinds = shapes[:n_layers], kinds[:n_layers]
            dims = dataclasses.replace(dims, num_layers=len(weights.layers))
        window = attention_window(config)
        sliding = frozenset(i for i, kind in enumerate(kinds) if kind != FULL_LAYER_TYPE)
        local_freq = gemma4_rope(config, "sliding_attention", dims.head_dim)
        generator = cls(
            weights,
            dims,
            local_freq,
            1.0,
            max_batch_size,
            max_seq_len,
            lanes=tt_data_parallel,
            window=window,
            style=style,
            local_rope=None,
        )
        generator.shapes = shapes
        full = frozenset(range(dims.num_layers)) - sliding
        global_dim = next((shapes[i].head_dim for i in sorted(full)), dims.head_dim)
        generator.global_rope = (gemma4_rope(config, FULL_LAYER_TYPE, global_dim), full)
        return generator

    # ---- the model ----------------------------------------------------------------------

    def layer_rope(
        self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cos and sin: the sliding layers' (`cos`, `sin`, of the head size),
        the global layers' of their own head size and (partial) RoPE."""
        global_freq, full = self.global_rope
        rotated = rope_cos_sin(positions, global_freq, 1.0)
        return [rotated if i in full else (cos, sin) for i in range(self.dims.num_layers)]

    def attention_inputs(
        self, layer: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[T, H, D_l]`, k and v `[T, KV_l, D_l]` of the layer's own shape: q and k
        RMS-normalised per head and rotated; v RMS-normalised without a scale (its
        projection is the keys' where the layer takes values from keys)."""
        eps = self.dims.rms_norm_eps
        assert layer.q_norm is not None and layer.k_norm is not None
        head_dim = layer.q_norm.shape[0]
        h = rms_norm(x, layer.input_norm, eps)
        q = layer.q_proj(h).view(-1, self.dims.num_heads, head_dim)
        k = layer.k_proj(h).view(len(h), -1, head_dim)
        v = k if layer.v_proj is layer.k_proj else layer.v_proj(h).view(len(h), -1, head_dim)
        q = rms_norm(q, layer.q_norm, eps)
        k = rms_norm(k, layer.k_norm, eps)
        v = rms_norm(v, torch.ones(head_dim), eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def layer_output(
        self, layer: LayerWeights, x: torch.Tensor, attended: torch.Tensor
    ) -> torch.Tensor:
        """Sandwich norms around attention and the MLP (as Gemma 3), then the layer's
        output times its `layer_scalar`."""
        eps = self.dims.rms_norm_eps
        assert layer.pre_feedforward_norm is not None and layer.post_feedforward_norm is not None
        out = layer.o_proj(attended.flatten(1))
        x = x + rms_norm(out, layer.post_attention_norm, eps)
        h = rms_norm(x, layer.pre_feedforward_norm, eps)
        x = x + rms_norm(self.mlp(layer, h), layer.post_feedforward_norm, eps)
        scalar = getattr(layer, "layer_scalar", None)
        return x if scalar is None else x * scalar

    @torch.no_grad()
    def forward_segments(
        self,
        segments: list[Segment],
        page_table: PageTables,
        kv_cache: KVCache,
        *,
        all_positions: bool = False,
        hidden: bool = False,
    ) -> torch.Tensor:
        """As the base's (`reference.model`), with each layer's cache in its own shape:
        the write addresses and attention groups are built once per distinct (page
        table, cache shape), each with its block size and KV heads."""
        lengths = torch.tensor([len(s.tokens) for s in segments])  # [n]
        token_ids = torch.cat([s.tokens for s in segments])  # [T]
        positions = torch.cat([torch.arange(s.start, s.end) for s in segments])  # [T]
        rows = torch.tensor([s.row for s in segments]).repeat_interleave(lengths)  # [T]
        tables = page_table if isinstance(page_table, list) else [page_table] * self.dims.num_layers
        window = None if self.window is None else self.window.size
        built: dict[tuple[int, tuple[int, ...]], tuple[Any, Any, Any]] = {}

        x, cos, sin = self.segment_inputs(segments, token_ids, positions)
        rotations = self.layer_rope(positions, cos, sin)
        for index, (layer, (k_cache, v_cache)) in enumerate(
            zip(self.weights.layers, kv_cache, strict=True)
        ):
            table, shape = tables[index], k_cache.shape
            key = (id(table), tuple(shape))
            if key not in built:
                block_size = shape[2]
                built[key] = (
                    table[rows, positions // block_size],  # [T]
                    positions % block_size,  # [T]
                    attention_groups(segments, positions, table, shape, window),
                )
            block_of_token, slot_of_token, groups = built[key]
            q, k, v = self.attention_inputs(layer, x, *rotations[index])
            k_cache[block_of_token, :, slot_of_token, :] = k
            v_cache[block_of_token, :, slot_of_token, :] = v
            sliding = self.window is not None and index in self.window.layers
            attended = torch.cat(
                [g.attend(q, k_cache, v_cache, self.scale, sliding) for g in groups]
            )
            x = self.layer_output(layer, x, attended)

        if hidden:
            return self.final_hidden(x)
        if not all_positions:
            x = x[lengths.cumsum(0) - 1]
        return self.lm_logits(x)

    # ---- the cache: a shape per layer ---------------------------------------------------

    def layer_cache_shape(self, index: int, blocks: int, block_size: int) -> tuple[int, ...]:
        """Layer `index`'s cache shape for `blocks` blocks of `block_size` tokens."""
        shape = self.shapes[index]
        return (blocks, shape.num_kv_heads, block_size, shape.head_dim)

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> KVCache:
        """Zeroed paged cache: `kv_cache_shape` is the model's (KV heads and head size of
        one of its layer kinds: vLLM's config reads one); every layer gets its N blocks
        of Bs tokens in its own heads and size. With lanes, one such cache per lane.
        Float32, as the base."""
        blocks, kv_heads, block_size, head_size = kv_cache_shape
        own = {(s.num_kv_heads, s.head_dim) for s in self.shapes}
        if (kv_heads, head_size) not in own:
            raise ValueError(
                f"kv_cache_shape {tuple(kv_cache_shape)} does not fit the model (its "
                f"layers' KV heads and sizes: {', '.join(f'{h}x{d}' for h, d in sorted(own))})"
            )
        if num_layers != self.kv_layer_count():
            raise ValueError(
                f"num_layers {num_layers} != the model's {self.kv_layer_count()} KV layers"
            )

        def one_cache() -> KVCache:
            return [
                [
                    torch.zeros(self.layer_cache_shape(i, blocks, block_size)),
                    torch.zeros(self.layer_cache_shape(i, blocks, block_size)),
                ]
                for i in range(num_layers)
            ]

        if self.lanes == 1:
            return one_cache()
        return [one_cache() for _ in range(self.lanes)]  # type: ignore[return-value]

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any] | None:
        """Every layer's spec in its own shape: a `SlidingWindowSpec` for the sliding
        layers, a `FullAttentionSpec` for the global ones (their head size and KV heads)."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

        model_config = vllm_config.model_config
        config = text_config(model_config.hf_config)
        window = attention_window(config)
        block_size = vllm_config.cache_config.block_size
        specs: dict[str, Any] = {}
        for i, shape in enumerate(layer_shapes(config)):
            common = dict(
                block_size=block_size,
                num_kv_heads=shape.num_kv_heads,
                head_size=shape.head_dim,
                dtype=model_config.dtype,
            )
            name = f"model.layers.{i}.self_attn"
            if window is not None and i in window.layers:
                specs[name] = SlidingWindowSpec(**common, sliding_window=window.size)
            else:
                specs[name] = FullAttentionSpec(**common)
        return specs

    def allocate_kv_cache_per_layer(self, per_layer_specs: list[tuple[Any, Any, int]]) -> KVCache:
        """Zeroed paged cache from one `(kv_cache_shape, dtype, tensor_idx)` per layer,
        each shape the layer's group's (its own KV heads and head size, refused when not
        the layer's; its group's block size). Layers with the same `tensor_idx` share one
        allocation, each viewing it in its own shape: vLLM's groups overlay one block
        pool, with one page size. Float32, as `allocate_kv_cache`."""
        if len(per_layer_specs) != self.kv_layer_count():
            raise ValueError(
                f"per_layer_specs has {len(per_layer_specs)} layers; the model has "
                f"{self.kv_layer_count()} KV layers"
            )
        for index, (shape, _, _) in enumerate(per_layer_specs):
            own = self.shapes[index]
            if (shape[1], shape[3]) != (own.num_kv_heads, own.head_dim):
                raise ValueError(
                    f"layer {index}'s kv_cache_shape {tuple(shape)} does not fit it "
                    f"({own.num_kv_heads} KV heads of size {own.head_dim})"
                )

        sizes: dict[int, int] = {}
        for shape, _, index in per_layer_specs:
            count = int(torch.Size(shape).numel())
            sizes[int(index)] = max(sizes.get(int(index), 0), count)

        def one_cache() -> KVCache:
            pools = {index: (torch.zeros(size), torch.zeros(size)) for index, size in sizes.items()}
            cache = []
            for shape, _, index in per_layer_specs:
                k_pool, v_pool = pools[int(index)]
                count = int(torch.Size(shape).numel())
                cache.append([k_pool[:count].view(tuple(shape)), v_pool[:count].view(tuple(shape))])
            return cache

        if self.lanes == 1:
            return one_cache()
        return [one_cache() for _ in range(self.lanes)]  # type: ignore[return-value]


__all__ = ["ReferenceGemma4Generator", "gemma4_weights", "text_state_dict"]
