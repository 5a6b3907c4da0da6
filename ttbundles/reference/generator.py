"""The reference Llama-family generator: the Tenstorrent generator contract in plain torch.

It has two jobs. On the host mesh (MESH_DEVICE=HOST, no TT hardware) it is the generator
vLLM drives, so the whole serving path (paged KV cache, chunked prefill, prefix caching,
on-device sampling, asynchronous readback) runs end to end on a CPU. And it is the golden
reference that bundle authors compare their TT-NN generators against, call for call. So it
is written to be read: one small function per idea, shapes in the docstrings, float32
everywhere, plain torch ops and no tricks. The one fused call is attention, torch's
`scaled_dot_product_attention` with an explicit mask (`causal_attention` spells out what
it computes). A decode step attends for the whole batch in that one call, over contexts
gathered from the paged cache with one index_select each for K and V; prefill chunks
attend one row at a time (see `attention_groups`).

Checkpoints: Hugging Face format (safetensors, sharded or not) of Llama, Mistral, Qwen2
(q/k/v biases), Qwen3 (per-head RMSNorm on q and k) and Gemma 3 text (its differences
from Llama are `config.ModelStyle`: `1 + weight` norms, the scaled embedding and query,
sandwich norms, a GeGLU MLP, local RoPE on the sliding layers, the final soft cap). RoPE types:
"default", "linear", "llama3" and "yarn" (see `rope_frequencies`). Sliding windows
(Mistral's `sliding_window`, Qwen2/Qwen3's `use_sliding_window` layers, Gemma 3's
`layer_types`: `format.attention_window`) are masked as
transformers masks them, on every path (prefill chunks, prefix-cache hits, decode, the
speculative verify, prompt logprobs, the drafter); the cache still holds every position.

Shape conventions used throughout (all batch tensors are row-major in the batch):

    B   rows in the call's batch          V   vocabulary size
    S   padded token width of a call       H   query heads, KV key/value heads
    T   real tokens of a call, all rows    D   head size
    N   KV cache blocks                   Bs  tokens per block
    n   rows attending in one call         L   new tokens per row in that call
    C   positions 0 .. C-1 attended in that call: the blocks of the longest context

    tokens        prefill [B, S] int64; decode [B, 1] int64
    page_table    [B, max_blocks] int32: position p of row i lives in block
                  page_table[i, p // Bs], slot p % Bs
    kv_cache      list over layers of [k_cache, v_cache], each [N, KV, Bs, D] float32;
                  with lanes (tt_data_parallel > 1) one such list per lane, N lane-local
    logits        [B, 1, V] float32 (last token of each row)
    sampled       [B] int64
"""

from __future__ import annotations

import dataclasses
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.format import speculative as spec
from ttbundles.format.attention_window import (
    WINDOW_CAPABILITY_KEY,
    AttentionWindow,
    attention_window,
)
from ttbundles.format.contract import LEGACY_RESET_KEYWORD, SamplingParams
from ttbundles.reference.attention import (
    Segment,
    apply_rope,
    attention_groups,
    rms_norm,
    rope_cos_sin,
)
from ttbundles.reference.config import ModelDims, ModelRope, ModelStyle
from ttbundles.reference.families import style_of
from ttbundles.reference.readback import DeviceOutput, HostOutput, ReadEvent
from ttbundles.reference.sampling import MAX_DEVICE_TOP_K, DeviceSampler
from ttbundles.reference.weights import LlamaWeights, checkpoint_dir, load_safetensors

KVCache = list[list[torch.Tensor]]
"""Per layer `[k_cache, v_cache]`, each `[N, KV, Bs, D]`."""


def _int_list(values: Any, count: int, name: str) -> list[int]:
    """A list/tensor of `count` ints (positions, lengths) as Python ints."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    values = [int(v) for v in values]
    if len(values) < count:
        raise ValueError(f"{name} has {len(values)} entries for {count} rows")
    return values[:count]


@dataclass(frozen=True)
class ResidentInputs:
    """The decode inputs kept "on the device" between steps, per slot (on a card: the
    decode trace's input tensors): tokens `[B]`, positions, page table `[B, W]`."""

    tokens: torch.Tensor
    positions: list[int]
    page_table: PageTables | None

    def remapped(self, remap: list[int]) -> ResidentInputs:
        """Slot i takes slot remap[i]'s inputs (slots past the remap stay)."""
        order = list(remap) + list(range(len(remap), len(self.positions)))
        index = torch.tensor(order)
        table = None if self.page_table is None else _rows_of(self.page_table, index)
        return ResidentInputs(self.tokens[index], [self.positions[j] for j in order], table)


PageTables = torch.Tensor | list[torch.Tensor]
"""One page table for every layer, or one per layer (`page_tables_per_layer`: each layer
its KV group's, the groups of a hybrid cache)."""


def _rows_of(tables: PageTables, index: torch.Tensor) -> PageTables:
    """The rows `index` of a page table or of each layer's (a layer's table shared with
    others stays shared)."""
    if isinstance(tables, torch.Tensor):
        return tables[index]
    picked: dict[int, torch.Tensor] = {}
    return [picked.setdefault(id(t), t[index]) for t in tables]


def _as_tables(page_table: Any) -> PageTables:
    """A page table as int64, or each layer's as given (`_host_tables` made them)."""
    if isinstance(page_table, list):
        return page_table
    return torch.as_tensor(page_table).long()


def _host_tables(page_table: Any, per_layer: Any) -> PageTables | None:
    """The step's tables as int64 host tensors: each layer's when `per_layer` is given
    (tables shared between layers stay one tensor), else the one `page_table`."""
    if per_layer is None:
        return None if page_table is None else torch.as_tensor(page_table).long().clone()
    converted: dict[int, torch.Tensor] = {}
    return [converted.setdefault(id(t), torch.as_tensor(t).long().clone()) for t in per_layer]


class ReferenceLlamaGenerator:
    """The generator contract for Llama-family checkpoints, in torch, on the host.

    It speaks TT-Metal's current contract (`format.contract`): decode input-update
    contract v1, tuple returns, TT's `SamplingParams`, device penalties from the prompt
    and output history, top log-probabilities from the device. Like a card it keeps state
    between calls where TT-Metal's generators do: the resident decode inputs (what the
    decode trace reads: tokens, positions, page table) and the sampler's per-slot state.
    Every position's K/V lives in the paged cache the worker allocates through it, so
    chunked prefill, prefix caching and preemption need nothing more.

    Single-execute mode (`tt_data_parallel` = N > 1): like TT-Metal's Galaxy generators,
    one copy of the weights serves N lanes, each with its own KV cache (`kv_cache[lane]`,
    lane-local block ids). Batch slot s belongs to lane `s // (max_batch_size / N)`:
    decode rows are slots, prefill rows go to `empty_slots[i]`'s lane, and each lane's
    rows attend only to that lane's cache.
    """

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": MAX_DEVICE_TOP_K,
        "supports_spec_decode": True,
        # A deferred verify: read_decode_output serves the [B, 1+K] block, and there is
        # no hidden handle to keep (the host drafts).
        "supports_async_spec_decode": True,
        # Keys older than the checkpoint's sliding window are masked on every path.
        WINDOW_CAPABILITY_KEY: True,
    }
    decode_input_update_contract = 1
    MAX_SPEC_K = 8
    """The longest draft the reference verifies per step (a bound of this generator's
    choosing, so that `spec_plan` has something to refuse)."""
    DRAFT_LAYERS_FRACTION = 0.5
    """The early-exit drafter (`propose_draft_tokens`, `reference.drafter`) runs this
    share of the target's first layers (at least one)."""

    def __init__(
        self,
        weights: LlamaWeights,
        dims: ModelDims,
        inv_freq: torch.Tensor,
        attention_scaling: float = 1.0,
        max_batch_size: int = 32,
        max_seq_len: int = 2048,
        lanes: int = 1,
        window: AttentionWindow | None = None,
        style: ModelStyle | None = None,
        local_rope: tuple[torch.Tensor, float, frozenset[int]] | None = None,
    ):
        if lanes < 1 or max_batch_size % lanes:
            raise ValueError(
                f"tt_data_parallel={lanes} must divide max_batch_size={max_batch_size} "
                "(each lane holds an equal share of the batch)"
            )
        self.lanes = lanes
        self.per_lane = max_batch_size // lanes
        self.weights = weights
        self.dims = dims
        self.inv_freq = inv_freq  # [D / 2]
        self.attention_scaling = attention_scaling  # cos/sin scale (yarn), else 1
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        # How the family's forward pass differs from Llama's (Gemma 3; else the defaults).
        self.style = style or ModelStyle()
        self.scale = self.style.query_scale or dims.head_dim**-0.5
        # The checkpoint's sliding window (None: every layer attends over everything).
        self.window = window
        # Gemma 3's sliding layers rotate with their own base: (inv_freq, scale, layers).
        self.local_rope = local_rope
        self.sampler = DeviceSampler(max_batch_size, dims.vocab_size)
        # One worker thread stands in for the device's command queue: every forward and
        # readback runs there in submission order, so the host can schedule the next step
        # while a decode computes, as it would with a card.
        self._device_queue = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reference-device"
        )
        # The decode inputs "on the device"; only the device queue touches them.
        self._resident: ResidentInputs | None = None
        # For the drafter (`propose_draft_tokens`): each slot's page-table row as the last
        # forward over it had it, and the cache it wrote (device queue only).
        self._slot_pages: dict[int, torch.Tensor] = {}
        self._drafter_cache: Any = None

    # ---- construction ----------------------------------------------------------------

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
    ) -> ReferenceLlamaGenerator:
        """Load the checkpoint named by `hf_config._name_or_path`, float32.

        `tt_data_parallel` is the number of lanes (single-execute mode, see the class);
        `mesh_device` (a HostMesh) and `optimizations` change nothing here: float32
        torch has no accuracy/speed trade-off.
        `n_layers` keeps only the first layers (as TT-Metal's generators do, for tests).
        """
        dims = ModelDims.from_hf_config(hf_config)
        style = style_of(hf_config, dims)
        rope = ModelRope.from_hf_config(hf_config, dims, style)
        state = load_safetensors(checkpoint_dir(hf_config))
        weights = LlamaWeights.from_state_dict(
            state,
            dims,
            bool(getattr(hf_config, "tie_word_embeddings", False)),
            norm_offset=style.norm_offset,
        )
        if n_layers is not None:
            weights.layers = weights.layers[:n_layers]
            dims = dataclasses.replace(dims, num_layers=len(weights.layers))
        return cls(
            weights,
            dims,
            rope.inv_freq,
            rope.scaling,
            max_batch_size,
            max_seq_len,
            lanes=tt_data_parallel,
            window=attention_window(hf_config),
            style=style,
            local_rope=rope.local,
        )

    @classmethod
    def spec_plan(
        cls, vllm_config: Any, max_num_seqs: int, requested_k: int
    ) -> spec.SpecPlan | spec.SpecReject:
        """Speculative decoding (`format.speculative`): any draft length up to
        `MAX_SPEC_K`; the verify returns argmax ids (greedy) or logits (sampled); the
        generator keeps no drafter state, and serves its ordinary decode too."""
        if requested_k > cls.MAX_SPEC_K:
            return spec.SpecReject(
                f"the reference verifies at most {cls.MAX_SPEC_K} drafts per step",
                supported_k=tuple(range(1, cls.MAX_SPEC_K + 1)),
            )
        return spec.SpecPlan(
            effective_k=requested_k,
            lanes_per_request=1,
            extra_bytes_per_seq=0,
            extra_bytes_per_token=0,
            accept_modes=(spec.ACCEPT_MODE_ARGMAX_IDS, spec.ACCEPT_MODE_LOGITS),
            drafter_state="internal",
            supports_narrow_decode=True,
        )

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> KVCache:
        """Zeroed paged cache: per layer `[k_cache, v_cache]`, each `kv_cache_shape`
        = `(N, KV, Bs, D)`; with lanes, one such cache per lane, each of that shape (the
        shape is a lane's, as TT-Metal sizes each submesh's cache). Always float32,
        whatever `dtype` asks: the reference keeps full precision so differences from it
        are the TT generator's own."""
        num_blocks, kv_heads, block_size, head_size = kv_cache_shape
        if (kv_heads, head_size) != (self.dims.num_kv_heads, self.dims.head_dim):
            raise ValueError(
                f"kv_cache_shape {tuple(kv_cache_shape)} does not fit the model "
                f"({self.dims.num_kv_heads} KV heads of size {self.dims.head_dim})"
            )
        if num_layers != self.dims.num_layers:
            raise ValueError(f"num_layers {num_layers} != the model's {self.dims.num_layers}")
        shape = (num_blocks, kv_heads, block_size, head_size)

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
        """Each layer's KV cache for vLLM (`serving.kv_layout`): a `SlidingWindowSpec`
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
        if len(per_layer_specs) != self.dims.num_layers:
            raise ValueError(
                f"per_layer_specs has {len(per_layer_specs)} layers; the model has "
                f"{self.dims.num_layers}"
            )
        for shape, _, _ in per_layer_specs:
            _, kv_heads, _, head_size = shape
            if (kv_heads, head_size) != (self.dims.num_kv_heads, self.dims.head_dim):
                raise ValueError(
                    f"kv_cache_shape {tuple(shape)} does not fit the model "
                    f"({self.dims.num_kv_heads} KV heads of size {self.dims.head_dim})"
                )

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

    # ---- the forward pass ------------------------------------------------------------

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[T, D]` of the tokens' absolute positions `[T]`."""
        return rope_cos_sin(positions, self.inv_freq, self.attention_scaling)

    def layer_rope(
        self, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Each layer's cos and sin: `(cos, sin)` for every layer, except Gemma 3's
        sliding layers, which rotate the same positions with the local base."""
        rotations = [(cos, sin)] * self.dims.num_layers
        if self.local_rope is not None:
            local_freq, local_scaling, local_layers = self.local_rope
            local = rope_cos_sin(positions, local_freq, local_scaling)
            for index in local_layers:
                if index < len(rotations):
                    rotations[index] = local
        return rotations

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings `[T, hidden]` (Gemma multiplies them by sqrt(hidden))."""
        x = self.weights.embed_tokens[token_ids]
        if self.style.embed_scale is not None:
            x = x * self.style.embed_scale
        return x

    def attention_inputs(
        self, layer: Any, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """q `[T, H, D]`, k and v `[T, KV, D]` of one layer for the hidden states `x`:
        input norm, projections, per-head q/k norms (Qwen3, Gemma 3), RoPE."""
        dims = self.dims
        h = rms_norm(x, layer.input_norm, dims.rms_norm_eps)
        q = layer.q_proj(h).view(-1, dims.num_heads, dims.head_dim)  # [T, H, D]
        k = layer.k_proj(h).view(-1, dims.num_kv_heads, dims.head_dim)  # [T, KV, D]
        v = layer.v_proj(h).view(-1, dims.num_kv_heads, dims.head_dim)
        if layer.q_norm is not None:  # RMSNorm of each head, before RoPE
            q = rms_norm(q, layer.q_norm, dims.rms_norm_eps)
            k = rms_norm(k, layer.k_norm, dims.rms_norm_eps)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def layer_output(self, layer: Any, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output from its input `x [T, hidden]` and its attention `[T, H, D]`:
        output projection and residual, then the gated MLP and residual. Gemma 3 also
        normalises the attention output and the MLP's input and output (sandwich norms)."""
        dims = self.dims
        eps = dims.rms_norm_eps
        out = layer.o_proj(attended.reshape(-1, dims.num_heads * dims.head_dim))
        if self.style.sandwich_norms:
            x = x + rms_norm(out, layer.post_attention_norm, eps)
            h = rms_norm(x, layer.pre_feedforward_norm, eps)
            return x + rms_norm(self.mlp(layer, h), layer.post_feedforward_norm, eps)
        x = x + out
        return x + self.mlp(layer, rms_norm(x, layer.post_attention_norm, eps))

    def mlp(self, layer: Any, h: torch.Tensor) -> torch.Tensor:
        """The gated MLP: SwiGLU, or GeGLU with the tanh GELU (`gelu_pytorch_tanh`)."""
        gate = layer.gate_proj(h)
        if self.dims.hidden_act == "gelu_pytorch_tanh":
            gate = F.gelu(gate, approximate="tanh")
        else:
            gate = F.silu(gate)
        return layer.down_proj(gate * layer.up_proj(h))

    def final_hidden(self, x: torch.Tensor) -> torch.Tensor:
        """The last layer's hidden states after the final norm, `[n, hidden]`: what the
        LM head reads, and what a pooler pools (transformers' `last_hidden_state`)."""
        return rms_norm(x, self.weights.final_norm, self.dims.rms_norm_eps)

    def lm_logits(self, x: torch.Tensor) -> torch.Tensor:
        """Logits `[n, V]` of the last layer's hidden states: final norm, LM head, and
        the final soft cap when the config sets one (Gemma)."""
        logits = F.linear(self.final_hidden(x), self.weights.lm_head)
        cap = self.style.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    def segment_inputs(
        self, segments: list[Segment], token_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """What enters the first layer for the flattened tokens `[T]` at cache positions
        `[T]`: embeddings `[T, hidden]` and RoPE cos, sin `[T, D]`. Here the token
        embeddings and the positions' rotation; a vision-language generator substitutes
        image embeddings and multimodal positions (`reference.vl_generator`)."""
        cos, sin = self.rope(positions)
        return self.embed(token_ids), cos, sin

    def residual_additions(
        self, segments: list[Segment]
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """What is added to the hidden states after layer i: `{i: (tokens [k], values
        [k, hidden])}` over the flattened tokens. Nothing here; Qwen3-VL adds its deepstack
        image features after its first layers (`reference.vl_generator`)."""
        return {}

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
        """Run the model over new tokens of several sequences; last-token logits `[n, V]`
        (`all_positions`: every new token's, `[T, V]`, as a golden needs them; `hidden`:
        every new token's final hidden states `[T, hidden]`, after the last norm, which a
        pooling server's host pooler reads instead of logits).

        All rows' tokens are flattened into one `[T, hidden]` activation so projections
        and the MLP run once per layer. Each layer first writes the new K/V of every token
        into the paged cache (one indexed write), then attends over each row's context
        read back from it, so earlier chunks and prefix-cached blocks are seen exactly like
        new ones. Attention is batched per `AttentionGroup` (see `attention_groups`).

        `page_table` is every layer's, or a list of each layer's (a hybrid cache's KV
        groups: the groups and write addresses are then built once per distinct table).
        """
        lengths = torch.tensor([len(s.tokens) for s in segments])  # [n]
        token_ids = torch.cat([s.tokens for s in segments])  # [T]
        positions = torch.cat([torch.arange(s.start, s.end) for s in segments])  # [T]
        rows = torch.tensor([s.row for s in segments]).repeat_interleave(lengths)  # [T]
        block_size = kv_cache[0][0].shape[2]
        slot_of_token = positions % block_size  # [T]
        window = self.window
        tables = page_table if isinstance(page_table, list) else [page_table] * self.dims.num_layers
        # Per distinct table: where each token's K/V goes, and the attention groups.
        built: dict[int, tuple[torch.Tensor, list[Any]]] = {}
        for table in tables:
            if id(table) not in built:
                built[id(table)] = (
                    table[rows, positions // block_size],  # [T]
                    attention_groups(
                        segments,
                        positions,
                        table,
                        kv_cache[0][0].shape,
                        None if window is None else window.size,
                    ),
                )

        x, cos, sin = self.segment_inputs(segments, token_ids, positions)
        rotations = self.layer_rope(positions, cos, sin)
        additions = self.residual_additions(segments)
        for index, (layer, (k_cache, v_cache)) in enumerate(
            zip(self.weights.layers, kv_cache, strict=True)
        ):
            q, k, v = self.attention_inputs(layer, x, *rotations[index])
            block_of_token, groups = built[id(tables[index])]

            # cache[block, :, slot, :] for each token t gets k[t] ([KV, D]).
            k_cache[block_of_token, :, slot_of_token, :] = k
            v_cache[block_of_token, :, slot_of_token, :] = v

            # [T, H, D]: the groups' spans tile the flattened tokens in order.
            sliding = window is not None and index in window.layers
            attended = torch.cat(
                [g.attend(q, k_cache, v_cache, self.scale, sliding) for g in groups]
            )
            x = self.layer_output(layer, x, attended)
            if index in additions:
                tokens_at, values = additions[index]
                x = x.index_add(0, tokens_at, values)

        if hidden:
            return self.final_hidden(x)  # [T, hidden]
        if not all_positions:
            x = x[lengths.cumsum(0) - 1]  # [n] each segment's last token
        return self.lm_logits(x)  # [n, V] (all_positions: [T, V])

    def _run(
        self,
        segments: list[Segment],
        batch: int,
        page_table: Any,
        kv_cache: Any,
        slots: list[int] | None = None,
    ) -> torch.Tensor:
        """Logits `[B, V]` for a batch where only `segments`' rows are real (others 0).

        `slots[row]`: the batch slot of each row (prefill: `empty_slots`; decode: rows are
        slots). With lanes, each lane's rows run against its own cache."""
        if page_table is None:
            raise ValueError("the reference generator needs a page_table (paged KV cache only)")
        logits = torch.zeros(batch, self.dims.vocab_size, dtype=torch.float32)
        if not segments:
            return logits
        table = _as_tables(page_table)
        for group, cache in self._lane_groups(segments, kv_cache, slots):
            rows = torch.tensor([s.row for s in group])
            logits[rows] = self.forward_segments(group, table, cache)
        return logits

    def _every_position(
        self,
        segments: list[Segment],
        batch: int,
        page_table: Any,
        kv_cache: Any,
        slots: list[int] | None,
        width: int,
        *,
        hidden: bool = False,
    ) -> torch.Tensor:
        """`[B, width, V]` logits (prompt logprobs), or `[B, width, hidden]` final hidden
        states (pooling), of every new token of each row (width: the longest chunk),
        zero past a row's chunk and in padding rows."""
        size = self.dims.hidden_size if hidden else self.dims.vocab_size
        out = torch.zeros(batch, width, size, dtype=torch.float32)
        if not segments:
            return out
        table = _as_tables(page_table)
        for group, cache in self._lane_groups(segments, kv_cache, slots):
            every = self.forward_segments(group, table, cache, all_positions=True, hidden=hidden)
            for segment, rows in zip(group, every.split([len(s.tokens) for s in group])):
                out[segment.row, : len(rows)] = rows
        return out

    def _lane_groups(
        self, segments: list[Segment], kv_cache: Any, slots: list[int] | None = None
    ) -> list[tuple[list[Segment], Any]]:
        """The segments by lane, each with its lane's cache (one group without lanes); a
        row's lane is its slot's (`slots[row]`; None: rows are slots, as in decode)."""
        if self.lanes == 1:
            return [(segments, kv_cache)]
        if len(kv_cache) != self.lanes:
            raise ValueError(
                f"kv_cache has {len(kv_cache)} entries; with tt_data_parallel="
                f"{self.lanes} it must hold one cache per lane (allocate_kv_cache)"
            )
        by_lane: dict[int, list[Segment]] = {}
        for segment in segments:
            slot = segment.row if slots is None else slots[segment.row]
            by_lane.setdefault(slot // self.per_lane, []).append(segment)
        return [(group, kv_cache[lane]) for lane, group in sorted(by_lane.items())]

    def verify(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        num_valid_drafts: Any,
        spec_mode: str,
    ) -> spec.VerifyOutput:
        """The speculative verify (`format.speculative`): row i is slot i, its tokens
        `tokens[i, : 1 + num_valid_drafts[i]]` at positions `start_pos[i, ...]` (a row at
        position -1 is padding). One forward over every real column, K/V written for
        each; the logits at every column: column j predicts the token after column j, the
        one draft j must match (column `num_valid_drafts[i]`: the bonus). Returns
        argmax ids `[B, 1+K]` (-1 past a row's real columns) or logits `[B, 1+K, V]`."""
        tokens = torch.as_tensor(tokens).long()
        positions = torch.as_tensor(start_pos).long()
        batch, width = tokens.shape
        valid = _int_list(num_valid_drafts, batch, "num_valid_drafts")
        segments = [
            Segment(row, tokens[row, : 1 + valid[row]], int(positions[row, 0]))
            for row in range(batch)
            if int(positions[row, 0]) >= 0
        ]
        logits = torch.zeros(batch, width, self.dims.vocab_size, dtype=torch.float32)
        table = _as_tables(page_table)
        for group, cache in self._lane_groups(segments, kv_cache):
            flat = self.forward_segments(group, table, cache, all_positions=True)
            offset = 0
            for segment in group:
                count = len(segment.tokens)
                logits[segment.row, :count] = flat[offset : offset + count]
                offset += count
        if spec_mode == spec.ACCEPT_MODE_LOGITS:
            return spec.VerifyOutput(spec_mode, logits=logits)
        ids = logits.argmax(dim=-1)
        for row in range(batch):
            ids[row, 1 + valid[row] :] = spec.PLACEHOLDER_TOKEN_ID
        return spec.VerifyOutput(spec_mode, argmax_ids=ids)

    # ---- the drafter (custom_class) --------------------------------------------------

    def _remember_pages(
        self, slots: list[int], page_table: Any, rows: list[int], kv_cache: Any
    ) -> None:
        """Keep `page_table[rows[i]]` as slot `slots[i]`'s page-table row, and the cache
        (device queue only): the drafter reads the context a forward just extended."""
        if page_table is None or not slots:
            return
        if isinstance(page_table, list):
            if any(t is not page_table[0] for t in page_table):
                # Layers on several KV groups: the early-exit drafter reads one table,
                # so it offers no drafts rather than read another group's blocks.
                self._slot_pages.clear()
                return
            page_table = page_table[0]
        table = torch.as_tensor(page_table).long()
        for slot, row in zip(slots, rows):
            self._slot_pages[slot] = table[row].clone()
        self._drafter_cache = kv_cache

    @property
    def draft_layers(self) -> int:
        return max(1, int(self.dims.num_layers * self.DRAFT_LAYERS_FRACTION))

    def propose_draft_tokens(
        self,
        num_drafts: int,
        committed_tokens: Any,
        committed_positions: Any,
        accepted_counts: Any,
        hidden: Any = None,
    ) -> spec.DraftOutput:
        """The model's own drafter (`format.speculative`, vLLM's `custom_class`): after
        every commit, up to `num_drafts` greedy drafts per row from an early exit of the
        target (`reference.drafter`). Row i is slot i; its last committed token is
        `committed_tokens[i, accepted_counts[i] - 1]` at that column's position (-1: no
        request, nothing offered). `hidden` is not needed: the drafter reads the target's
        cache. Returns `DraftOutput([B, K] int32, num_valid [B] int32)`."""
        from ttbundles.reference.drafter import early_exit_drafts

        tokens = torch.as_tensor(committed_tokens).long()
        positions = torch.as_tensor(committed_positions).long()
        batch = tokens.shape[0]
        counts = _int_list(accepted_counts, batch, "accepted_counts")
        k = int(num_drafts)

        def compute() -> spec.DraftOutput:
            ids = torch.full((batch, k), spec.PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
            valid = torch.zeros(batch, dtype=torch.int32)
            rows = [
                r
                for r in range(batch)
                if counts[r] >= 1 and int(positions[r, counts[r] - 1]) > 0 and r in self._slot_pages
            ]
            if not rows or k == 0:
                return spec.DraftOutput(ids, valid)
            by_lane: dict[int, list[int]] = {}
            for r in rows:
                by_lane.setdefault(r // self.per_lane if self.lanes > 1 else 0, []).append(r)
            for lane, lane_rows in by_lane.items():
                cache = self._drafter_cache if self.lanes == 1 else self._drafter_cache[lane]
                index = torch.tensor(lane_rows)
                last = index.new_tensor([counts[r] - 1 for r in lane_rows])
                width = max(len(self._slot_pages[r]) for r in lane_rows)
                table = torch.zeros(len(lane_rows), width, dtype=torch.long)
                for i, r in enumerate(lane_rows):
                    table[i, : len(self._slot_pages[r])] = self._slot_pages[r]
                drafts = early_exit_drafts(
                    self,
                    self.draft_layers,
                    tokens[index, last],
                    positions[index, last],
                    table,
                    cache,
                    k,
                )
                ids[index] = drafts.to(torch.int32)
                valid[index] = k
            return spec.DraftOutput(ids, valid)

        return self._device_queue.submit(compute).result()

    # ---- the contract ----------------------------------------------------------------

    def prefill_forward(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        prompt_lens: Any,
        empty_slots: Any = None,
        enable_trace: bool = True,
        sampling_params: SamplingParams | None = None,
        start_pos: Any = None,
        return_prompt_logits: bool = False,
        page_tables_per_layer: Any = None,
        return_hidden_states: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor | tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor] | None]:
        """Prefill one chunk per row; logits `[B, 1, V]`, or `(tokens [B, 1], log_probs)`
        when sampling on the device (TT-Metal's `prefill_forward_text` forms). With
        `return_prompt_logits` (a bundle declaring prompt logprobs, ttbundles' own form):
        logits of every position of each row's chunk, `[B, L, V]` (L the longest chunk;
        column j of row i is the distribution after its token start_pos[i] + j).

        Row i computes positions `start_pos[i] .. prompt_lens[i] - 1` (start_pos None: 0).
        As in TT-Metal's generators, `tokens[i]` holds the row's tokens from position 0:
        the chunk is `tokens[i, start_pos[i]:prompt_lens[i]]`, and what lies before it is
        not read. Positions below start_pos[i] must already be in the cache: an earlier
        chunk, or blocks shared through prefix caching. Rows with nothing to compute
        (prompt_lens <= start_pos) are padding. `empty_slots[i]` is the batch slot row i
        is being placed in (default: row i): with `sampling_params`, the row's sampling
        state (parameters, seed, prompt history) is registered there, and the token drawn
        is the one at position prompt_lens[i]. `page_table` rows follow the request rows;
        `page_tables_per_layer` (one per layer, each its KV group's) supersedes it.

        With `return_hidden_states` (a bundle serving pooling of the form
        `prefill_hidden`): the final hidden states, after the last norm, of every position
        of each row's chunk, `[B, L, hidden]` (L the longest chunk, zero past a row's
        chunk), which vLLM's pooler finishes on the host (last token, mean or CLS
        pooling, normalisation, a classifier head).
        """
        if kwargs:
            raise TypeError(f"prefill_forward got unexpected keywords: {', '.join(sorted(kwargs))}")
        batch = tokens.shape[0]
        ends = _int_list(prompt_lens, batch, "prompt_lens")
        starts = [0] * batch if start_pos is None else _int_list(start_pos, batch, "start_pos")
        slots = (
            list(range(batch))
            if empty_slots is None
            else _int_list(empty_slots, batch, "empty_slots")
        )
        segments = []
        for row in range(batch):
            length = ends[row] - starts[row]
            if length <= 0:
                continue
            if ends[row] > tokens.shape[1]:
                raise ValueError(
                    f"row {row}: chunk of positions {starts[row]}..{ends[row] - 1} needs "
                    f"tokens up to position {ends[row] - 1} but tokens has width "
                    f"{tokens.shape[1]} (tokens hold the row from position 0)"
                )
            segments.append(Segment(row, tokens[row, starts[row] : ends[row]].long(), starts[row]))
        live = [slot if ends[row] > starts[row] else -1 for row, slot in enumerate(slots)]
        history = tokens.long().clone()
        for row, end in enumerate(ends):
            history[row, end:] = -1
        tables = _host_tables(page_table, page_tables_per_layer)

        def compute() -> Any:
            self._remember_pages(
                [slots[s.row] for s in segments], tables, [s.row for s in segments], kv_cache
            )
            if return_hidden_states or return_prompt_logits:
                width = max((len(s.tokens) for s in segments), default=1)
                return self._every_position(
                    segments, batch, tables, kv_cache, slots, width, hidden=return_hidden_states
                )
            logits = self._run(segments, batch, tables, kv_cache, slots)
            if sampling_params is None:
                return logits.unsqueeze(1)
            self.sampler.ensure_capacity(max(slots) + 1)
            self.sampler.reload_params(live, sampling_params, ends)
            self.sampler.reset_state(live, sampling_params, ends, history, None)
            sampled, logprobs = self.sampler.sample(logits, live)
            return sampled.view(batch, 1), logprobs

        return self._device_queue.submit(compute).result()

    def decode_forward(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: SamplingParams | None = None,
        prompt_tokens: torch.Tensor | None = None,
        output_tokens: torch.Tensor | None = None,
        slot_remap: Any = None,
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        num_valid_drafts: Any = None,
        accepted_counts: Any = None,
        spec_mode: str | None = None,
        page_tables_per_layer: Any = None,
        **kwargs: Any,
    ) -> Any:
        """One token per slot: row i is batch slot i, its token at position `start_pos[i]`
        (-1: an empty slot, skipped). Decode input-update contract v1.

        The commands say what the host inputs are worth (TT-Metal
        `models/common/decode_contract.py`): `reload_inputs` restages tokens, positions and
        the page table from the host; `reload_page_table` only the page table; neither:
        the resident inputs are used, which the last device-sampling decode left (its
        sampled tokens, positions advanced by one), so `tokens` and `start_pos` are
        deliberately stale and not read. `reload_sampling_params` uploads the parameters
        and registers changed seeds; `reset_sampling_state` rebuilds seeds, counters and
        the penalty history (`prompt_tokens`, `output_tokens`: `[B, L]`, -1 padded).
        `slot_remap[i] = j` moves slot j's state to slot i first. `page_tables_per_layer`
        (one per layer, each its KV group's) supersedes `page_table`, resident alike.

        With `spec_mode` (and `num_valid_drafts`, `accepted_counts`) it is a speculative
        verify over `[B, 1+K]` tokens and positions instead (`verify`): the host's
        inputs, read now, returning a `VerifyOutput`; with `read_from_device=False` its
        `argmax_ids` or `logits` is a DeviceOutput for `read_decode_output`
        (`supports_async_spec_decode`).

        Returns `(logits [B, 1, V], None)`, or with `sampling_params` `(tokens [B],
        log_probs)` where log_probs is None or `(top_logprobs [B, K], top_ids [B, K])`
        (rows asking for them); with `read_from_device=False`, a DeviceOutput for
        `read_decode_output`.
        """
        if LEGACY_RESET_KEYWORD in kwargs:
            raise ValueError(
                f"{LEGACY_RESET_KEYWORD} is not part of the decode input-update contract; "
                "the worker driving this generator predates it (send reload_inputs / "
                "reload_page_table / reload_sampling_params / reset_sampling_state)"
            )
        if kwargs:
            raise TypeError(f"decode_forward got unexpected keywords: {', '.join(sorted(kwargs))}")
        if reload_inputs and reload_page_table:
            raise ValueError("reload_page_table is meaningless with reload_inputs=True")
        if not reload_inputs and not enable_trace:
            raise ValueError(
                "Non-traced decode rebuilds its inputs every step: send reload_inputs=True"
            )
        if reset_sampling_state and not reload_inputs:
            raise ValueError(
                "reset_sampling_state needs reload_inputs=True (positions must be authoritative)"
            )
        speculative = (num_valid_drafts, accepted_counts, spec_mode)
        if any(v is not None for v in speculative):
            if any(v is None for v in speculative):
                raise ValueError("num_valid_drafts, accepted_counts and spec_mode come together")
            if not reload_inputs:
                raise ValueError("a verify reads the host's inputs: send reload_inputs=True")
            if page_table is None:
                raise ValueError("the reference generator needs a page_table (paged KV cache only)")
            verify_tables = _host_tables(page_table, page_tables_per_layer)

            def run_verify() -> spec.VerifyOutput:
                self._resident = None  # the host knows the committed tokens
                live = [r for r in range(len(start_pos)) if int(start_pos[r][0]) >= 0]
                self._remember_pages(live, verify_tables, live, kv_cache)
                return self.verify(
                    tokens, start_pos, verify_tables, kv_cache, num_valid_drafts, spec_mode
                )

            if read_from_device:
                return self._device_queue.submit(run_verify).result()
            # Deferred (asynchronous scheduling, supports_async_spec_decode): the block
            # stays "on the device" for read_decode_output; the host decides later how
            # much of it commits.
            pending = self._device_queue.submit(run_verify)

            def block() -> tuple[torch.Tensor, None]:
                done = pending.result()
                ids = done.argmax_ids if spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS else done.logits
                return ids, None

            held = DeviceOutput(
                self._device_queue.submit(block),
                is_tokens=spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS,
            )
            if spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS:
                return spec.VerifyOutput(spec_mode, argmax_ids=held)
            return spec.VerifyOutput(spec_mode, logits=held)
        batch = tokens.shape[0]
        host_tokens = tokens.reshape(batch, -1)[:, 0].long().clone()
        host_positions = _int_list(start_pos, batch, "start_pos")
        host_table = _host_tables(page_table, page_tables_per_layer)
        remap = None if slot_remap is None else _int_list(slot_remap, len(slot_remap), "slot_remap")
        if reload_inputs and bool((host_tokens[torch.tensor(host_positions) >= 0] < 0).any()):
            raise ValueError(
                "reload_inputs=True but tokens has unknown (-1) entries for live slots"
            )

        def compute() -> tuple[torch.Tensor, Any]:
            resident = self._resident
            if remap is not None:
                self.sampler.ensure_capacity(len(remap))
                self.sampler.remap(remap)
                if resident is not None:
                    resident = resident.remapped(remap)
            if reload_inputs:
                resident = ResidentInputs(host_tokens, host_positions, host_table)
            elif resident is None:
                raise ValueError("no resident decode inputs: the first decode must reload_inputs")
            elif reload_page_table:
                resident = ResidentInputs(resident.tokens, resident.positions, host_table)
            if resident.page_table is None:
                raise ValueError("the reference generator needs a page_table (paged KV cache only)")
            positions = resident.positions
            segments = [
                Segment(row, resident.tokens[row : row + 1], positions[row])
                for row in range(batch)
                if positions[row] >= 0
            ]
            live = [s.row for s in segments]
            self._remember_pages(live, resident.page_table, live, kv_cache)
            logits = self._run(segments, batch, resident.page_table, kv_cache)
            if sampling_params is None:
                # Host sampling: the host knows the next tokens; it reloads every step.
                self._resident = None
                return logits.unsqueeze(1), None
            slots = [row if positions[row] >= 0 else -1 for row in range(batch)]
            following = [p + 1 for p in positions]
            self.sampler.ensure_capacity(batch)
            if reload_sampling_params:
                self.sampler.reload_params(slots, sampling_params, following)
            if reset_sampling_state:
                self.sampler.reset_state(
                    slots, sampling_params, following, prompt_tokens, output_tokens
                )
            sampled, logprobs = self.sampler.sample(logits, slots)
            # Token feedback: this step's tokens and positions are the next step's inputs.
            advanced = [p + 1 if p >= 0 else p for p in positions]
            self._resident = ResidentInputs(sampled, advanced, resident.page_table)
            return sampled, logprobs

        out = DeviceOutput(
            self._device_queue.submit(compute), is_tokens=sampling_params is not None
        )
        if read_from_device:
            return self.process_decode_output_host(
                self.read_decode_output(out), is_tokens=sampling_params is not None
            )
        return out

    def read_decode_output(self, out: DeviceOutput, async_read: bool = False) -> Any:
        """Copy a decode result to the host.

        `async_read=False`: the host copy. `async_read=True`: `(host_out, events)`; the
        copy runs on the device queue, and host_out is valid once every event was waited
        on (on a card: `ttnn.event_synchronize`; here `event.wait()`).
        """
        if not async_read:
            return HostOutput.copy_of(out)
        host = HostOutput()
        future = self._device_queue.submit(lambda: host.fill(out))
        return host, [ReadEvent(future)]

    def process_decode_output_host(self, host_out: HostOutput, is_tokens: bool = False) -> Any:
        """`(tokens [B] int64, log_probs)` when `is_tokens`, else `(logits [B, 1, V], None)`;
        a verify block keeps its shape (`argmax_ids` `[B, 1+K]`, `logits` `[B, 1+K, V]`).
        Call it only after the read's events were waited on."""
        if not isinstance(host_out, HostOutput) or host_out.value is None:
            raise ValueError("process_decode_output_host needs a completed read_decode_output")
        primary, logprobs = host_out.value
        if is_tokens != (not primary.is_floating_point()):
            kind = "sampled tokens" if is_tokens else "logits"
            raise ValueError(f"is_tokens={is_tokens} but the decode output is not {kind}")
        if is_tokens:
            if primary.dim() == 2:  # a verify's argmax ids, [B, 1+K]
                return primary.long(), logprobs
            return primary.reshape(-1).long(), logprobs
        if primary.dim() == 3:  # a verify's logits, [B, 1+K, V]
            return primary, logprobs
        return primary.reshape(primary.shape[0], 1, -1), logprobs

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""


class ReferenceLlamaGeneratorLegacy(ReferenceLlamaGenerator):
    """The same generator in the pre-contract decode form (`reset_batch`), as TT-Metal's
    generators were before `decode_input_update_contract`: the generator decides itself
    what to restage. A reset, host sampling, no trace or a first call restage everything;
    otherwise the resident tokens are used and the page table is copied (TT-Metal compared
    it with the previous one; copying always is the same result). No `**kwargs`: a
    worker that sends the v1 commands to it fails with a TypeError.
    """

    decode_input_update_contract = 0
    _follows_device_decode = False
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
    }

    def prefill_forward(self, *args: Any, **kwargs: Any) -> Any:
        self._follows_device_decode = False  # TT-Metal restaged after a mode switch
        return super().prefill_forward(*args, **kwargs)

    def decode_forward(  # type: ignore[override]
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: SamplingParams | None = None,
        reset_batch: bool = False,
        prompt_tokens: torch.Tensor | None = None,
        output_tokens: torch.Tensor | None = None,
        slot_remap: Any = None,
    ) -> Any:
        device = sampling_params is not None
        # Decided on the host at submission, as TT-Metal did: a device-sampling decode
        # follows the last one unless a reset, a prefill or a host-sampled step came between.
        full = reset_batch or not device or not enable_trace or not self._follows_device_decode
        self._follows_device_decode = device and enable_trace
        return super().decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slot_remap=slot_remap,
            reload_inputs=full,
            reload_page_table=not full,
            reload_sampling_params=full and device,
            reset_sampling_state=full and device,
        )
