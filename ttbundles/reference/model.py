"""The reference's model math: one decoder's forward pass over segments of new tokens.

Apart from the contract's driving (`reference.driver`) and its cache (`reference.cache`)
so that what a family computes reads in one place: embedding, RoPE, a layer's attention
inputs and output, the gated MLP, the final norm and LM head, and `forward_segments`,
which runs them over the paged cache. How a family's pass differs from Llama's is data
(`config.ModelStyle`, chosen by `reference.families`), not a branch here per family.

It is a mixin of the generator rather than an object the generator holds because the
methods are the seams a bundle author overrides: a subclass's `rope` or `segment_inputs`
(the vision-language generator's image embeddings) must be the one `forward_segments`
calls, and the drafter calls the same methods on the same object.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ttbundles.format.attention_window import AttentionWindow
from ttbundles.reference.attention import (
    AttentionGroup,
    Segment,
    apply_rope,
    attention_groups,
    rms_norm,
    rope_cos_sin,
)
from ttbundles.reference.cache import KVCache, PageTables
from ttbundles.reference.config import ModelDims, ModelStyle
from ttbundles.reference.weights import LayerWeights, LlamaWeights


class DecoderModel:
    """The forward pass of a Llama-family decoder, mixed into the generator
    (`reference.generator`), which sets the attributes below at construction."""

    weights: LlamaWeights
    dims: ModelDims
    inv_freq: torch.Tensor  # [D / 2]
    attention_scaling: float  # cos/sin scale (yarn), else 1
    style: ModelStyle
    scale: float  # the attention's query scale
    window: AttentionWindow | None
    local_rope: tuple[torch.Tensor, float, frozenset[int]] | None

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
        self, layer: LayerWeights, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
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

    def layer_output(
        self, layer: LayerWeights, x: torch.Tensor, attended: torch.Tensor
    ) -> torch.Tensor:
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

    def mlp(self, layer: LayerWeights, h: torch.Tensor) -> torch.Tensor:
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

    def _cache_addresses(
        self,
        segments: list[Segment],
        tables: list[torch.Tensor],
        positions: torch.Tensor,
        rows: torch.Tensor,
        cache_shape: torch.Size,
    ) -> dict[int, tuple[torch.Tensor, list[AttentionGroup]]]:
        """Per distinct table (by identity): the block each token's K/V goes to `[T]`, and
        the attention groups. Built once per forward pass: the tables and positions do
        not change between layers, and layers of one KV group share their table."""
        block_size = cache_shape[2]
        window = None if self.window is None else self.window.size
        built: dict[int, tuple[torch.Tensor, list[AttentionGroup]]] = {}
        for table in tables:
            if id(table) not in built:
                built[id(table)] = (
                    table[rows, positions // block_size],  # [T]
                    attention_groups(segments, positions, table, cache_shape, window),
                )
        return built

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
        slot_of_token = positions % kv_cache[0][0].shape[2]  # [T]
        window = self.window
        tables = page_table if isinstance(page_table, list) else [page_table] * self.dims.num_layers
        built = self._cache_addresses(segments, tables, positions, rows, kv_cache[0][0].shape)

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
