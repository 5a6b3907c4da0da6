"""The reference Qwen3.5 generator: a gated delta net hybrid, as transformers'
`modeling_qwen3_5` computes it, behind the same contract as the Llama-family one.

Three of every four layers (`layer_types`, or `full_attention_interval`) are gated delta
net linear attention (`reference.gdn`); the others are gated full attention: `q_proj`
emits each head's query and an output gate, q and k are RMS-normalised per head, RoPE
turns only the first `partial_rotary_factor` of each head, and the attention output is
multiplied by `sigmoid(gate)` before `o_proj`. Every decoder norm scales by `1 + w`.
`Qwen3_5ForCausalLM` and the text part of `Qwen3_5ForConditionalGeneration` (its config
under `text_config`, its weights under `model.language_model.`) are read.

The recurrent state is the generator's, as TT-Metal's Qwen classes keep it (the facts
doc's "Tenstorrent contract"): `allocate_kv_cache` holds only the attention layers' KV
(`get_kv_cache_spec` names only them to vLLM), the GDN state has one slot per user
(`max_batch_size`). Prefill continues the state of `empty_slots[i]` (a row whose chunk
starts at position 0 starts from zeros), decode the state of its row's slot after
`slot_remap` moved them (once), `release_request(slot)` zeroes a slot and
`note_state_slots_moved` settles (or makes) a move. Prefix caching is refused: a hit skips
tokens whose state was never kept. Speculative decoding is refused: the verify would
advance the state over drafts that are then rejected.

`ReferenceQwen3_5VllmStateGenerator` is the other form (the reference plugin's MambaSpec
route): vLLM's KV manager owns the state. Every layer is allocated per layer, the GDN
layers from their `{"type": "mamba", shapes, dtypes, tensor_idx, compact_slots}`
descriptor (`compact_slots` states in vLLM's layout: one per batch slot in vLLM's "none"
mode, one per Mamba block id in its "align" mode); prefill reads `empty_slots`, decode
row i the state `gdn_state_indices[i]`. With the prefix cache ("align" mode) the runner
has `copy_recurrent_state(sources, targets)` copy a state into the next block before a
step that crosses a block boundary, so every cached block keeps the state after exactly
its tokens, which a hit continues.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.reference.attention import Segment, apply_rope, rms_norm, rope_cos_sin
from ttbundles.reference.config import ModelDims, ModelStyle, rope_parameters
from ttbundles.reference.driver import DecodeStep, ResidentInputs
from ttbundles.reference.gdn import (
    GdnState,
    PerLayerGdnState,
    causal_conv,
    gated_delta_rule,
    l2norm,
)
from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.reference.sampling import MAX_DEVICE_TOP_K
from ttbundles.reference.weights import (
    GatedAttentionWeights,
    GdnWeights,
    LlamaWeights,
    checkpoint_dir,
    hybrid_layers,
    hybrid_state_dict,
    load_safetensors,
)

LINEAR_ATTENTION = "linear_attention"
FULL_ATTENTION = "full_attention"


def text_config(hf_config: Any) -> Any:
    """The language model's config: `text_config` of a `Qwen3_5Config`, else the config."""
    return getattr(hf_config, "text_config", None) or hf_config


def layer_types(config: Any) -> list[str]:
    """Each layer's kind; absent `layer_types` come from `full_attention_interval` (every
    n-th layer full attention), as `Qwen3_5TextConfig` fills them."""
    kinds = getattr(config, "layer_types", None)
    if kinds:
        return list(kinds)
    interval = getattr(config, "full_attention_interval", 4)
    return [
        FULL_ATTENTION if (i + 1) % interval == 0 else LINEAR_ATTENTION
        for i in range(config.num_hidden_layers)
    ]


@dataclasses.dataclass(frozen=True)
class GdnDims:
    """The GDN layers' sizes: key heads Hk of Dk, value heads Hv of Dv, conv kernel K."""

    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int
    kernel: int

    @classmethod
    def from_config(cls, config: Any) -> GdnDims:
        return cls(
            config.linear_num_key_heads,
            config.linear_num_value_heads,
            config.linear_key_head_dim,
            config.linear_value_head_dim,
            config.linear_conv_kernel_dim,
        )

    @property
    def conv_dim(self) -> int:
        """C = 2 * Hk * Dk + Hv * Dv: the conv runs over q | k | v."""
        return 2 * self.key_heads * self.key_dim + self.value_heads * self.value_dim


def partial_rope(config: Any, dims: ModelDims) -> tuple[torch.Tensor, int]:
    """The inverse frequencies `[R / 2]` of the rotated dims R = head_dim *
    partial_rotary_factor (transformers' default RoPE over R). Text positions are equal in
    the three multimodal sections, so `mrope_section` changes nothing here."""
    params = rope_parameters(config)
    if params["rope_type"] != "default":
        raise NotImplementedError(
            f"rope_type {params['rope_type']!r}: the reference Qwen3.5 reads default RoPE only"
        )
    factor = params.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 0.25))
    rotary = int(dims.head_dim * factor)
    exponents = torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary
    return 1.0 / (float(params["rope_theta"]) ** exponents), rotary


def gdn_runs(segments: list[Segment]) -> list[tuple[slice, list[Segment]]]:
    """How the GDN layers batch the rows: a decode (every row one token) in one run, a
    prefill a row at a time, so that no row is padded to another's length (a padded token
    would enter its state). Each run: its span of the flattened tokens, its rows."""
    if all(len(s.tokens) == 1 for s in segments):
        return [(slice(0, len(segments)), segments)]
    runs, offset = [], 0
    for segment in segments:
        runs.append((slice(offset, offset + len(segment.tokens)), [segment]))
        offset += len(segment.tokens)
    return runs


def gated_rms_norm(
    x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float
) -> torch.Tensor:
    """transformers' `Qwen3_5RMSNormGated`: RMSNorm over the head (plain weight), then
    times silu(gate)."""
    normed = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed * F.silu(gate)


class ReferenceQwen3_5Generator(ReferenceLlamaGenerator):  # noqa: N801 (Qwen3_5, as HF)
    """Qwen3.5 (text) on the host: the Llama generator's driver, cache and sampler, its own
    forward pass and the GDN state per slot (see the module docstring)."""

    model_capabilities = {
        # The class keeps each request's GDN state in its own slot (release_request).
        "recurrent_state": "generator",
        # A prefix-cache hit restores the state a snapshot kept after exactly its tokens
        # (the scheduler admits no other hit): up to this many snapshots, LRU.
        "supports_prefix_caching": True,
        "recurrent_prefix_snapshots": 64,
        # The state advances on the device queue in submission order, as the tokens do.
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": MAX_DEVICE_TOP_K,
        # A verify would advance the state over drafts that may be rejected.
        "supports_spec_decode": False,
        "supports_async_spec_decode": False,
        "supports_sliding_window": True,
    }

    def __init__(
        self,
        weights: LlamaWeights,
        dims: ModelDims,
        config: Any,
        kinds: list[str],
        max_batch_size: int = 32,
        max_seq_len: int = 2048,
        lanes: int = 1,
    ):
        inv_freq, self.rotary_dim = partial_rope(config, dims)
        super().__init__(
            weights, dims, inv_freq, 1.0, max_batch_size, max_seq_len, lanes, style=ModelStyle()
        )
        self.gdn = GdnDims.from_config(config)
        self.layer_kinds = kinds
        # Each layer's index among its kind: a KV pair of the cache, or a GDN state.
        self._kind_index = [kinds[:i].count(kind) for i, kind in enumerate(kinds)]
        gdn = self.gdn
        self.state = GdnState.zeros(
            kinds.count(LINEAR_ATTENTION),
            max_batch_size,
            (gdn.conv_dim, gdn.kernel - 1),
            (gdn.value_heads, gdn.key_dim, gdn.value_dim),
        )
        # The moves the last decode's slot_remap made ({old: new}): what
        # note_state_slots_moved settles rather than applies again.
        self._moved: dict[int, int] = {}
        # Snapshots of one slot's state by handle (save/restore/free_recurrent_prefix).
        self._snapshots: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._next_snapshot = 0

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
    ) -> ReferenceQwen3_5Generator:
        """Load the checkpoint named by `hf_config._name_or_path`, float32 (see the base)."""
        cls.check_config(hf_config)
        config = text_config(hf_config)
        dims = ModelDims.from_hf_config(config)
        kinds = layer_types(config)
        state = hybrid_state_dict(load_safetensors(checkpoint_dir(hf_config)))
        layers = hybrid_layers(state, kinds[: dims.num_layers])
        tied = bool(getattr(hf_config, "tie_word_embeddings", False))
        embed = state["model.embed_tokens.weight"]
        lm_head = embed if tied or "lm_head.weight" not in state else state["lm_head.weight"]
        weights = LlamaWeights(embed, layers, state["model.norm.weight"], lm_head)
        if n_layers is not None:
            weights.layers = weights.layers[:n_layers]
            kinds = kinds[:n_layers]
            dims = dataclasses.replace(dims, num_layers=len(weights.layers))
        return cls(
            weights, dims, config, kinds, max_batch_size, max_seq_len, lanes=tt_data_parallel
        )

    @classmethod
    def check_config(cls, hf_config: Any) -> None:
        """Refuse (NotImplementedError) a config this generator does not compute, before
        any weight is read: what `initialize_vllm_model` reads of it."""
        config = text_config(hf_config)
        partial_rope(config, ModelDims.from_hf_config(config))
        GdnDims.from_config(config)
        unknown = set(layer_types(config)) - {LINEAR_ATTENTION, FULL_ATTENTION}
        if unknown:
            raise NotImplementedError(f"layer_types {sorted(unknown)}: not a Qwen3.5 layer kind")

    # ---- the cache: attention layers only ---------------------------------------------

    def kv_layer_count(self) -> int:
        """Only the full-attention layers keep KV; the GDN layers keep `self.state`."""
        return self.layer_kinds.count(FULL_ATTENTION)

    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> dict[str, Any] | None:
        """A `FullAttentionSpec` for each full-attention layer (`model.layers.<i>.self_attn`)
        and no entry for a GDN layer: its state is this generator's, not vLLM's KV."""
        from vllm.v1.kv_cache_interface import FullAttentionSpec

        model_config = vllm_config.model_config
        config = text_config(model_config.hf_config)
        dims = ModelDims.from_hf_config(config)
        spec = FullAttentionSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=dims.num_kv_heads,
            head_size=dims.head_dim,
            dtype=model_config.dtype,
        )
        return {
            f"model.layers.{i}.self_attn": spec
            for i, kind in enumerate(layer_types(config))
            if kind == FULL_ATTENTION
        }

    # ---- the state's lifecycle ------------------------------------------------------

    def release_request(self, slot: int | None) -> None:
        """Zero a finished or preempted request's slot (on the device queue, after every
        step queued before). None: nothing is held for an unknown slot."""
        if slot is not None:
            self._device_queue.submit(self.state.clear, int(slot)).result()

    # ---- snapshots for the prefix cache (`serving.recurrent_prefix`) ---------------------

    def save_recurrent_prefix(self, slot: int) -> int:
        """Keep a copy of `slot`'s state (after every step queued before): its handle."""
        return self._device_queue.submit(self._save, int(slot)).result()

    def restore_recurrent_prefix(self, slot: int, handle: int) -> bool:
        """Put snapshot `handle` into `slot` (a prefix-cache hit continues from it);
        False when no such snapshot is kept."""
        return self._device_queue.submit(self._restore, int(slot), int(handle)).result()

    def free_recurrent_prefix(self, handle: int) -> None:
        self._device_queue.submit(self._snapshots.pop, int(handle), None).result()

    def _save(self, slot: int) -> int:
        self._next_snapshot += 1
        self._snapshots[self._next_snapshot] = self.state.snapshot(slot)
        return self._next_snapshot

    def _restore(self, slot: int, handle: int) -> bool:
        saved = self._snapshots.get(handle)
        if saved is None:
            return False
        self.state.restore(slot, saved)
        return True

    def note_state_slots_moved(self, moves: dict[int, int]) -> None:
        """`{old: new}`: the states now belong to the new slots. The moves the last
        decode's `slot_remap` already made are settled, not applied twice; others move
        the states here."""
        self._device_queue.submit(self._settle_moves, dict(moves)).result()

    def _settle_moves(self, moves: dict[int, int]) -> None:
        moves = {int(old): int(new) for old, new in moves.items() if int(old) != int(new)}
        if not moves:
            return
        if moves == self._moved:
            self._moved = {}
            return
        sources = list(range(self.state.slots))
        for old, new in moves.items():
            sources[new] = old
        self.state.gather(sources)

    def _stage_resident(self, step: DecodeStep) -> ResidentInputs:
        """The base's staging; a `slot_remap` also moves the GDN states (slot i takes
        slot remap[i]'s), once, before this decode reads them."""
        if step.remap is not None:
            self.state.gather(step.remap)
            self._moved = {old: new for new, old in enumerate(step.remap) if old != new}
        return super()._stage_resident(step)

    def _verify_forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(
            "speculative decoding on a GDN hybrid needs a recurrent state per draft "
            "position; the reference Qwen3.5 keeps one per request"
        )

    def propose_draft_tokens(self, *args: Any, **kwargs: Any) -> Any:
        return self._verify_forward()

    # ---- the forward pass ------------------------------------------------------------

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin `[T, R]` of the rotated dims only (partial rotary)."""
        return rope_cos_sin(positions, self.inv_freq, 1.0)

    def gated_attention(
        self,
        w: GatedAttentionWeights,
        h: torch.Tensor,
        rotation: tuple[torch.Tensor, torch.Tensor],
        cache: list[torch.Tensor],
        addresses: tuple[torch.Tensor, torch.Tensor, list[Any]],
    ) -> torch.Tensor:
        """A full-attention layer's output `[T, hidden]` for its normed input `h`: query
        and gate from `q_proj`, per-head q/k norms, RoPE on the first R dims, the new K/V
        written to the paged cache, attention over it, times sigmoid(gate), `o_proj`."""
        dims, r = self.dims, self.rotary_dim
        heads, kv_heads, d = dims.num_heads, dims.num_kv_heads, dims.head_dim
        query, gate = w.q_proj(h).view(-1, heads, 2 * d).chunk(2, dim=-1)  # [T, H, D] each
        q = rms_norm(query, w.q_norm, dims.rms_norm_eps)
        k = rms_norm(w.k_proj(h).view(-1, kv_heads, d), w.k_norm, dims.rms_norm_eps)
        v = w.v_proj(h).view(-1, kv_heads, d)
        cos, sin = rotation
        q = torch.cat([apply_rope(q[..., :r], cos, sin), q[..., r:]], dim=-1)
        k = torch.cat([apply_rope(k[..., :r], cos, sin), k[..., r:]], dim=-1)
        block_of_token, slot_of_token, groups = addresses
        k_cache, v_cache = cache
        k_cache[block_of_token, :, slot_of_token, :] = k
        v_cache[block_of_token, :, slot_of_token, :] = v
        attended = torch.cat([g.attend(q, k_cache, v_cache, self.scale) for g in groups])
        gated = attended.reshape(-1, heads * d) * torch.sigmoid(gate.reshape(-1, heads * d))
        return w.o_proj(gated)

    def gated_delta_net(
        self, w: GdnWeights, h: torch.Tensor, runs: list[tuple[slice, list[Segment]]], layer: int
    ) -> torch.Tensor:
        """A GDN layer's output `[T, hidden]` for its normed input `h`, each run continuing
        its rows' states (GDN layer `layer`'s) and writing them back."""
        gdn, eps = self.gdn, self.dims.rms_norm_eps
        keys, values = gdn.key_heads * gdn.key_dim, gdn.value_heads * gdn.value_dim
        repeat = gdn.value_heads // gdn.key_heads
        mixed = w.in_proj_qkv(h)  # [T, C]
        beta = w.in_proj_b(h).sigmoid()  # [T, Hv]
        decay = -w.A_log.exp() * F.softplus(w.in_proj_a(h) + w.dt_bias)  # [T, Hv]
        core = torch.empty(h.shape[0], gdn.value_heads, gdn.value_dim)
        for span, rows in runs:
            slots = [s.row if s.slot is None else s.slot for s in rows]
            conv, recurrent = self.state.read(layer, slots, [s.start == 0 for s in rows])
            shape = (len(rows), -1)  # [n, L, ...]
            out, conv = causal_conv(mixed[span].view(*shape, gdn.conv_dim), conv, w.conv)
            q, k, v = out.split([keys, keys, values], dim=-1)
            q = q.reshape(*shape, gdn.key_heads, gdn.key_dim).repeat_interleave(repeat, dim=2)
            k = k.reshape(*shape, gdn.key_heads, gdn.key_dim).repeat_interleave(repeat, dim=2)
            attended, recurrent = gated_delta_rule(
                l2norm(q) * gdn.key_dim**-0.5,
                l2norm(k),
                v.reshape(*shape, gdn.value_heads, gdn.value_dim),
                decay[span].view(*shape, gdn.value_heads),
                beta[span].view(*shape, gdn.value_heads),
                recurrent,
            )
            self.state.write(layer, slots, conv, recurrent)
            core[span] = attended.flatten(0, 1)
        z = w.in_proj_z(h).view(-1, gdn.value_heads, gdn.value_dim)
        return w.out_proj(gated_rms_norm(core, z, w.norm, eps).flatten(1))

    @torch.no_grad()
    def forward_segments(
        self,
        segments: list[Segment],
        page_table: Any,
        kv_cache: Any,
        *,
        all_positions: bool = False,
        hidden: bool = False,
    ) -> torch.Tensor:
        """As the base's (`reference.model`): last-token logits `[n, V]`, every token's
        (`all_positions`) or the final hidden states (`hidden`). `page_table` is the
        attention layers' (or a list, one per attention layer); `kv_cache` holds only
        them. The GDN layers continue each row's slot state (`Segment.slot`)."""
        lengths = torch.tensor([len(s.tokens) for s in segments])  # [n]
        positions = torch.cat([torch.arange(s.start, s.end) for s in segments])  # [T]
        rows = torch.tensor([s.row for s in segments]).repeat_interleave(lengths)  # [T]
        tables = page_table if isinstance(page_table, list) else [page_table] * len(kv_cache)
        addresses: dict[int, tuple[torch.Tensor, torch.Tensor, list[Any]]] = {}
        if kv_cache:
            shape = kv_cache[0][0].shape
            built = self._cache_addresses(segments, tables, positions, rows, shape)
            slot_of_token = positions % shape[2]
            addresses = {key: (b, slot_of_token, g) for key, (b, g) in built.items()}
        x = self.embed(torch.cat([s.tokens for s in segments]))  # [T, hidden]
        rotation = self.rope(positions)
        runs = gdn_runs(segments)
        eps = self.dims.rms_norm_eps
        for index, layer in enumerate(self.weights.layers):
            h = rms_norm(x, layer.input_norm, eps)
            kind_index = self._kind_index[index]
            if isinstance(layer.mixer, GdnWeights):
                x = x + self.gated_delta_net(layer.mixer, h, runs, kind_index)
            else:
                cache, table = kv_cache[kind_index], tables[kind_index]
                x = x + self.gated_attention(layer.mixer, h, rotation, cache, addresses[id(table)])
            x = x + self.mlp(layer, rms_norm(x, layer.post_attention_norm, eps))
        if hidden:
            return self.final_hidden(x)
        if not all_positions:
            x = x[lengths.cumsum(0) - 1]
        return self.lm_logits(x)


class ReferenceQwen3_5VllmStateGenerator(ReferenceQwen3_5Generator):  # noqa: N801
    """Qwen3.5 whose GDN state vLLM's KV manager owns (MambaSpec groups):
    `allocate_kv_cache_per_layer` gets every layer, the GDN layers' states allocated from
    their descriptors and read by the indices the runner gives (see the module
    docstring). The prefix cache is vLLM's "align" mode (`copy_recurrent_state`), one
    lane."""

    model_capabilities = {
        **ReferenceQwen3_5Generator.model_capabilities,
        "recurrent_state": "vllm",
        # A hit continues the state vLLM's block kept after exactly its tokens.
        "supports_prefix_caching": True,
    }
    model_capabilities.pop("recurrent_prefix_snapshots")

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        if self.lanes != 1:
            raise NotImplementedError("state owned by vLLM's KV manager is served on one lane")
        # Until `allocate_kv_cache_per_layer`: no state (the base's slots are not vLLM's).
        self.state = PerLayerGdnState([], [])  # type: ignore[assignment]
        self._attention = [i for i, k in enumerate(self.layer_kinds) if k == FULL_ATTENTION]
        self._indices: list[int] | None = None

    def kv_layer_count(self) -> int:
        """Every layer gets an entry: KV for attention, a state descriptor for GDN."""
        return len(self.layer_kinds)

    def allocate_kv_cache_per_layer(self, per_layer_specs: list[Any]) -> list[Any]:
        """One entry per layer: attention layers `[k_cache, v_cache]` shared by
        `tensor_idx` (float32, as the base), GDN layers `[conv, recurrent]` of
        `compact_slots` states each, zeroed, in the descriptor's shapes and dtypes."""
        if len(per_layer_specs) != len(self.layer_kinds):
            raise ValueError(
                f"per_layer_specs has {len(per_layer_specs)} layers; the model has "
                f"{len(self.layer_kinds)}"
            )
        shared: dict[int, list[torch.Tensor]] = {}
        cache: list[Any] = []
        conv, recurrent = [], []
        for kind, spec in zip(self.layer_kinds, per_layer_specs):
            if kind == LINEAR_ATTENTION:
                if not isinstance(spec, dict) or spec.get("type") != "mamba":
                    raise ValueError(f"a GDN layer needs a mamba state descriptor, not {spec!r}")
                slots = int(spec["compact_slots"])
                states = [
                    torch.zeros((slots, *shape), dtype=dtype)
                    for shape, dtype in zip(spec["shapes"], spec["dtypes"])
                ]
                conv.append(states[0])
                recurrent.append(states[1])
                cache.append(states)
            else:
                shape, _, index = spec
                cache.append(
                    shared.setdefault(
                        int(index),
                        [torch.zeros(tuple(shape)), torch.zeros(tuple(shape))],
                    )
                )
        self.state = PerLayerGdnState(conv, recurrent)  # type: ignore[assignment]
        return cache

    def copy_recurrent_state(self, sources: list[int], targets: list[int]) -> None:
        """Every GDN layer's state `sources[i]` copied into `targets[i]` (on the device
        queue, after every step queued before and before the next)."""
        self._device_queue.submit(
            self.state.copy, [int(i) for i in sources], [int(i) for i in targets]
        ).result()

    def decode_forward(self, *args: Any, gdn_state_indices: Any = None, **kwargs: Any) -> Any:
        """As the base's, row i continuing the state `gdn_state_indices[i]` (int32, row
        order; set on the device queue, before this decode's work)."""
        indices = None if gdn_state_indices is None else [int(i) for i in gdn_state_indices]
        self._device_queue.submit(setattr, self, "_indices", indices).result()
        return super().decode_forward(*args, **kwargs)

    def forward_segments(
        self,
        segments: list[Segment],
        page_table: Any,
        kv_cache: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The base's over the attention layers' entries (the cache and the per-layer
        tables hold every layer here); a decode row reads the state its index names."""
        if self._indices is not None:
            segments = [
                s if s.slot is not None else dataclasses.replace(s, slot=self._indices[s.row])
                for s in segments
            ]
        cache = [kv_cache[i] for i in self._attention]
        if isinstance(page_table, list):
            page_table = [page_table[i] for i in self._attention]
        return super().forward_segments(segments, page_table, cache, **kwargs)
