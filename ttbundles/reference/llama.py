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
(q/k/v biases) and Qwen3 (per-head RMSNorm on q and k). RoPE types: "default", "linear",
"llama3" and "yarn" (see `rope_frequencies`). Sliding-window attention is not modelled.

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
    kv_cache      list over layers of [k_cache, v_cache], each [N, KV, Bs, D] float32
    logits        [B, 1, V] float32 (last token of each row)
    sampled       [B] int64
"""

from __future__ import annotations

import json
import warnings
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.format.contract import SamplingParamsBatch

KVCache = list[list[torch.Tensor]]
"""Per layer `[k_cache, v_cache]`, each `[N, KV, Bs, D]`."""

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")

# --------------------------------------------------------------------------------------
# Configuration
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelDims:
    """The sizes the forward pass needs, read once from the Hugging Face config."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> ModelDims:
        """Llama, Mistral, Qwen2 and Qwen3 configs all spell these the same way."""
        hidden_act = getattr(hf_config, "hidden_act", "silu")
        if hidden_act not in ("silu", "swish"):
            raise NotImplementedError(
                f"hidden_act {hidden_act!r}: the reference MLP is SwiGLU (silu) only"
            )
        num_heads = hf_config.num_attention_heads
        return cls(
            vocab_size=hf_config.vocab_size,
            hidden_size=hf_config.hidden_size,
            num_layers=hf_config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(hf_config, "num_key_value_heads", None) or num_heads,
            # Qwen3 and some Mistral checkpoints set head_dim != hidden_size / heads.
            head_dim=getattr(hf_config, "head_dim", None) or hf_config.hidden_size // num_heads,
            rms_norm_eps=getattr(hf_config, "rms_norm_eps", 1e-6),
        )


def rope_parameters(hf_config: Any) -> dict[str, Any]:
    """The RoPE settings as one flat dict with at least `rope_type` and `rope_theta`.

    transformers 5.x keeps them in `hf_config.rope_parameters`; older configs (and
    hand-built ones) have `rope_theta` plus an optional `rope_scaling` dict whose type key
    may be spelled `type`. Both are accepted so the reference does not depend on which
    transformers wrote the config.
    """
    params = getattr(hf_config, "rope_parameters", None)
    if isinstance(params, dict) and params:
        if any(isinstance(value, dict) for value in params.values()):
            raise NotImplementedError(
                "per-layer-type rope_parameters (e.g. sliding/full attention) are not "
                "supported by the reference Llama generator"
            )
        params = dict(params)
    else:
        params = dict(getattr(hf_config, "rope_scaling", None) or {})
    params["rope_type"] = params.get("rope_type") or params.get("type") or "default"
    if params.get("rope_theta") is None:
        params["rope_theta"] = getattr(hf_config, "rope_theta", None) or 10000.0
    if params["rope_type"] in ("llama3", "yarn"):
        # The same precedence transformers' standardize_rope_params applies.
        original = getattr(hf_config, "original_max_position_embeddings", None)
        if original is not None:
            params["original_max_position_embeddings"] = original
        else:
            params.setdefault("original_max_position_embeddings", hf_config.max_position_embeddings)
    return params


class _RopeConfigView:
    """Exactly what transformers' `ROPE_INIT_FUNCTIONS` read from a config, nothing more.

    Handing them this view (rather than the real config) keeps the result independent of
    the config class and of whether its rope fields were already standardised.
    """

    def __init__(self, params: dict[str, Any], dims: ModelDims, max_position_embeddings: int):
        self.rope_parameters = params
        self.head_dim = dims.head_dim
        self.hidden_size = dims.hidden_size
        self.num_attention_heads = dims.num_heads
        self.max_position_embeddings = max_position_embeddings

    def standardize_rope_params(self) -> None:
        """Already standard: `rope_parameters` built it."""


def rope_frequencies(hf_config: Any, dims: ModelDims) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies `[D / 2]` and the cos/sin scale ("attention factor").

    "default" is computed here (it is one line); the scaled types use transformers' own
    `ROPE_INIT_FUNCTIONS`, so the reference is exact against Hugging Face by construction.
    "dynamic" and "longrope" are refused: in transformers they change the frequencies with
    the current sequence length, which has no batch-independent meaning over a paged cache.
    """
    params = rope_parameters(hf_config)
    rope_type = params["rope_type"]
    if rope_type not in SUPPORTED_ROPE_TYPES:
        raise NotImplementedError(
            f"rope_type {rope_type!r} is not supported by the reference Llama generator "
            f"(supported: {', '.join(SUPPORTED_ROPE_TYPES)})"
        )
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        raise NotImplementedError("partial_rotary_factor != 1 is not supported")
    dim = dims.head_dim
    if rope_type == "default":
        exponents = torch.arange(0, dim, 2, dtype=torch.int64).float() / dim
        return 1.0 / (float(params["rope_theta"]) ** exponents), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    view = _RopeConfigView(params, dims, getattr(hf_config, "max_position_embeddings", 0))
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](view)
    return inv_freq.float(), float(attention_scaling)


# --------------------------------------------------------------------------------------
# Weights
# --------------------------------------------------------------------------------------


@dataclass
class Linear:
    """`y = x @ weight.T + bias`; weight `[out, in]`, bias `[out]` or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass
class LayerWeights:
    """One decoder layer. Optional parts: q/k/v biases (Qwen2), q/k norms (Qwen3)."""

    input_norm: torch.Tensor  # [hidden]
    q_proj: Linear  # [H * D, hidden]
    k_proj: Linear  # [KV * D, hidden]
    v_proj: Linear  # [KV * D, hidden]
    o_proj: Linear  # [hidden, H * D]
    post_attention_norm: torch.Tensor  # [hidden]
    gate_proj: Linear  # [intermediate, hidden]
    up_proj: Linear  # [intermediate, hidden]
    down_proj: Linear  # [hidden, intermediate]
    q_norm: torch.Tensor | None = None  # [D], applied per head before RoPE
    k_norm: torch.Tensor | None = None  # [D]


@dataclass
class LlamaWeights:
    """All weights, float32, named after their role rather than the checkpoint keys."""

    embed_tokens: torch.Tensor  # [V, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [V, hidden]; the embedding itself when tied

    @classmethod
    def from_state_dict(
        cls, state: dict[str, torch.Tensor], dims: ModelDims, tie_word_embeddings: bool
    ) -> LlamaWeights:
        """Map Hugging Face `LlamaForCausalLM`-style keys (also Mistral/Qwen2/Qwen3)."""
        state = {name: tensor.float() for name, tensor in state.items()}

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint lacks {name}")
            return state[name]

        def linear(name: str) -> Linear:
            return Linear(take(f"{name}.weight"), state.get(f"{name}.bias"))

        layers = []
        for i in range(dims.num_layers):
            prefix = f"model.layers.{i}"
            layers.append(
                LayerWeights(
                    input_norm=take(f"{prefix}.input_layernorm.weight"),
                    q_proj=linear(f"{prefix}.self_attn.q_proj"),
                    k_proj=linear(f"{prefix}.self_attn.k_proj"),
                    v_proj=linear(f"{prefix}.self_attn.v_proj"),
                    o_proj=linear(f"{prefix}.self_attn.o_proj"),
                    post_attention_norm=take(f"{prefix}.post_attention_layernorm.weight"),
                    gate_proj=linear(f"{prefix}.mlp.gate_proj"),
                    up_proj=linear(f"{prefix}.mlp.up_proj"),
                    down_proj=linear(f"{prefix}.mlp.down_proj"),
                    q_norm=state.get(f"{prefix}.self_attn.q_norm.weight"),
                    k_norm=state.get(f"{prefix}.self_attn.k_norm.weight"),
                )
            )
        embed = take("model.embed_tokens.weight")
        # Tied checkpoints usually omit lm_head.weight; trust the config when both exist.
        lm_head = (
            embed
            if tie_word_embeddings or "lm_head.weight" not in state
            else state["lm_head.weight"]
        )
        return cls(embed, layers, take("model.norm.weight"), lm_head)


def checkpoint_dir(hf_config: Any) -> Path:
    """The local folder of the checkpoint the config was loaded from.

    vLLM passes the config it loaded, whose `_name_or_path` is the model argument: a
    folder, or a hub id that vLLM has already downloaded (found in the local hub cache).
    """
    name = getattr(hf_config, "_name_or_path", None) or getattr(hf_config, "name_or_path", None)
    if not name:
        raise ValueError("hf_config has no _name_or_path: cannot find the checkpoint")
    path = Path(str(name)).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name), local_files_only=True))
    except Exception as exc:  # any hub failure means the same thing here
        raise FileNotFoundError(
            f"checkpoint {name!r} is neither a folder nor in the local Hugging Face cache"
        ) from exc


def load_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: `model.safetensors`, sharded via its index, or any
    `*.safetensors` files in the folder."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


# --------------------------------------------------------------------------------------
# Building blocks
# --------------------------------------------------------------------------------------


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension (as transformers: normalise, then scale)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[T, D]` for absolute positions `[T]` (the two halves repeat)."""
    freqs = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * scaling, angles.sin() * scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [T, heads, D]` by its positions' angles (the "rotate half" layout HF uses)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def context_blocks(
    block_table: torch.Tensor, last_positions: torch.Tensor, cache_shape: torch.Size
) -> torch.Tensor:
    """Where n sequences' contexts live in a paged cache, for `gather_context`.

    The cache `[N, KV, Bs, D]` is viewed as `[N * KV, Bs * D]`: entry `block * KV + head`
    holds one head's K (or V) for the Bs positions of one block. Returns those entries
    `[n, KV, nb]` for the blocks holding positions 0 .. nb * Bs - 1, where nb blocks
    cover the longest context (the largest last position).

    block_table `[n, >= nb]`: the rows' page-table rows (position p of row i is in block
    `block_table[i, p // Bs]`, slot `p % Bs`); last_positions `[n]`: each row's last
    context position. A row with fewer blocks repeats its last block up to nb, so only
    blocks the row owns are read (a padded page table may hold anything past them);
    attention masks every position past the row's last out.
    """
    _, kv_heads, block_size, _ = cache_shape
    last_block = last_positions // block_size  # [n]
    num_blocks = int(last_block.max()) + 1
    block_index = torch.arange(num_blocks)[None, :].minimum(last_block[:, None])  # [n, nb]
    blocks = block_table.gather(1, block_index)  # [n, nb]
    heads = torch.arange(kv_heads)[None, :, None]  # [1, KV, 1]
    return blocks[:, None, :] * kv_heads + heads  # [n, KV, nb]


def gather_context(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """K or V of n sequences' contexts, `[n, KV, C, D]` with C = nb * Bs (key c at
    position c), read from a paged cache `[N, KV, Bs, D]` in one index_select of the
    `[n, KV, nb]` entries from `context_blocks`."""
    _, _, block_size, head_dim = cache.shape
    n, kv_heads, num_blocks = blocks.shape
    picked = cache.view(-1, block_size * head_dim).index_select(0, blocks.reshape(-1))
    return picked.view(n, kv_heads, num_blocks * block_size, head_dim)


def causal_mask(query_positions: torch.Tensor, length: int) -> torch.Tensor:
    """Which keys each query sees, `[n, L, C]` bool with C = length: the key at position c
    is visible to a query at position p iff c <= p. query_positions `[n, L]` (absolute)."""
    key_positions = torch.arange(length)  # [C]
    return key_positions[None, None, :] <= query_positions[:, :, None]


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of n sequences' new tokens over their contexts, in one call.

    q `[n, L, H, D]`; k, v `[n, KV, C, D]`, key c at position c; visible `[n, L, C]` from
    `causal_mask`. Per row and head: `softmax(q @ k.T * scale, masked to visible) @ v`.
    Grouped-query attention: KV head j serves query heads j*H/KV .. (j+1)*H/KV - 1
    (`enable_gqa` repeats K/V heads exactly like `repeat_interleave(H // KV, dim=1)`).
    Returns `[n, L, H, D]`.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=visible[:, None], scale=scale, enable_gqa=True
    )  # [n, H, L, D]
    return out.transpose(1, 2)


# --------------------------------------------------------------------------------------
# Sampling
# --------------------------------------------------------------------------------------


def seeded_generator(seed: int, position: int) -> torch.Generator:
    """A generator that depends only on (seed, position): same seed, same token, whatever
    else is in the batch and however the batch is ordered."""
    return torch.Generator().manual_seed((seed * 1000003 + position) % 2**63)


def filtered_probs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """Sampling distribution `[V]` of one row: temperature, then top-k, then top-p.

    top_k 0 or >= V: no cut. top_p >= 1: no cut; otherwise keep the most likely tokens
    until their mass reaches top_p (the token that crosses it is kept, and always at
    least one token).
    """
    scaled = logits / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth_largest = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParamsBatch,
    positions: list[int],
    active: list[bool],
    unseeded: torch.Generator,
) -> torch.Tensor:
    """One token per row `[B]` int64 from logits `[B, V]`.

    `positions[i]` is the position the drawn token will occupy (it keys seeded rows).
    Inactive (padding) rows get token 0. A SamplingParamsBatch of one entry applies to
    every row.
    """
    greedy = torch.argmax(logits, dim=-1).tolist()  # every row's argmax, in one call
    out = [0] * logits.shape[0]
    for i in range(logits.shape[0]):
        if not active[i]:
            continue
        j = 0 if len(params) == 1 else i
        temperature = float(params.temperature[j])
        if temperature <= 0.0:
            out[i] = greedy[i]
            continue
        probs = filtered_probs(logits[i], temperature, int(params.top_k[j]), float(params.top_p[j]))
        seed = params.seed[j] if j < len(params.seed) else None
        generator = unseeded if seed is None else seeded_generator(int(seed), positions[i])
        out[i] = int(torch.multinomial(probs, 1, generator=generator)[0])
    return torch.tensor(out, dtype=torch.int64)


# --------------------------------------------------------------------------------------
# Asynchronous readback
# --------------------------------------------------------------------------------------


class DeviceOutput:
    """A decode result "still on the device": what `decode_forward(read_from_device=False)`
    returns. Opaque to the worker, which hands it back to `read_decode_output`. The work
    behind it runs on the generator's device queue; `tensor` waits for it."""

    def __init__(self, future: Future, is_tokens: bool, shape: tuple[int, ...]):
        self._future = future
        self.is_tokens = is_tokens
        self.shape = shape  # known at submission, so the host buffer can be allocated
        self.dtype = torch.int64 if is_tokens else torch.float32

    @property
    def tensor(self) -> torch.Tensor:
        """logits [B, 1, V] or tokens [B], once the queued work is done."""
        return self._future.result()


class ReadEvent:
    """Completion of one readback; `wait()` blocks until the host copy is filled."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self) -> None:
        self._future.result()

    def done(self) -> bool:
        return self._future.done()


# --------------------------------------------------------------------------------------
# The generator
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Segment:
    """One row's consecutive new tokens: positions start .. start + len(tokens) - 1."""

    row: int
    tokens: torch.Tensor  # [L] int64
    start: int

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class AttentionGroup:
    """Rows whose new tokens attend in one batched call: n rows of L tokens each, stored
    row after row as `span` of the flattened `[T]` tokens. Built once per forward pass
    (the page table and positions do not change between layers), used by every layer."""

    span: slice  # the group's n * L tokens in the flattened batch
    blocks: torch.Tensor  # [n, KV, nb] where the contexts are (`context_blocks`)
    visible: torch.Tensor  # [n, L, C] bool; C = nb * Bs covers the longest context

    @classmethod
    def build(
        cls,
        span: slice,
        query_positions: torch.Tensor,
        block_table: torch.Tensor,
        cache_shape: torch.Size,
    ) -> AttentionGroup:
        """query_positions `[n, L]` (ascending per row, the last one ends the row's
        context); block_table `[n, max_blocks]`, the rows' page-table rows."""
        blocks = context_blocks(block_table, query_positions[:, -1], cache_shape)
        length = blocks.shape[-1] * cache_shape[2]  # C = nb * Bs
        return cls(span, blocks, causal_mask(query_positions, length))

    def attend(
        self, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, scale: float
    ) -> torch.Tensor:
        """The group's attention output `[n * L, H, D]`; q `[T, H, D]` is the whole
        batch's, the caches `[N, KV, Bs, D]` already hold this layer's new K/V."""
        n, length, _ = self.visible.shape
        out = causal_attention(
            q[self.span].unflatten(0, (n, length)),  # [n, L, H, D]
            gather_context(k_cache, self.blocks),  # [n, KV, C, D]
            gather_context(v_cache, self.blocks),
            self.visible,
            scale,
        )
        return out.flatten(0, 1)


def attention_groups(
    segments: list[Segment],
    positions: torch.Tensor,
    page_table: torch.Tensor,
    cache_shape: torch.Size,
) -> list[AttentionGroup]:
    """How the segments' attention is batched; the groups' spans tile the flattened tokens.

    Decode (every segment one token): all rows in one group, one attention call for the
    batch, contexts padded to the longest. Prefill: one group per row, a per-row loop on
    purpose: chunks differ in length (1 .. thousands of tokens), and a padded batch would
    make every row pay for the longest chunk and the longest context, with scores of
    `[n, H, L_max, C_max]`; one row at a time they stay `[H, L, C]` of that row.
    positions `[T]` are the flattened tokens' positions.
    """
    if all(len(s.tokens) == 1 for s in segments):
        span = slice(0, len(segments))
        rows = [s.row for s in segments]
        return [AttentionGroup.build(span, positions[span, None], page_table[rows], cache_shape)]
    groups, offset = [], 0
    for segment in segments:
        span = slice(offset, offset + len(segment.tokens))
        groups.append(
            AttentionGroup.build(
                span, positions[None, span], page_table[segment.row][None], cache_shape
            )
        )
        offset = span.stop
    return groups


def _int_list(values: Any, count: int, name: str) -> list[int]:
    """A list/tensor of `count` ints (positions, lengths) as Python ints."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    values = [int(v) for v in values]
    if len(values) < count:
        raise ValueError(f"{name} has {len(values)} entries for {count} rows")
    return values[:count]


class ReferenceLlamaGenerator:
    """The generator contract for Llama-family checkpoints, in torch, on the host.

    Stateless between calls apart from the KV cache the worker owns: every position's
    K/V lives in the paged cache, so chunked prefill, prefix caching and preemption need
    no bookkeeping here (`empty_slots`, `reset_batch`, `enable_trace` are accepted and
    ignored for that reason).
    """

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
    }

    def __init__(
        self,
        weights: LlamaWeights,
        dims: ModelDims,
        inv_freq: torch.Tensor,
        attention_scaling: float = 1.0,
        max_batch_size: int = 32,
        max_seq_len: int = 2048,
    ):
        self.weights = weights
        self.dims = dims
        self.inv_freq = inv_freq  # [D / 2]
        self.attention_scaling = attention_scaling  # cos/sin scale (yarn), else 1
        self.max_batch_size = max_batch_size
        self.max_seq_len = max_seq_len
        self.scale = dims.head_dim**-0.5
        # Rows without a seed draw from one stream per generator, seeded unpredictably.
        self.unseeded_generator = torch.Generator()
        self.unseeded_generator.seed()
        # One worker thread stands in for the device's command queue: every forward and
        # readback runs there in submission order, so the host can schedule the next step
        # while a decode computes, as it would with a card.
        self._device_queue = ThreadPoolExecutor(
            max_workers=1, thread_name_prefix="reference-device"
        )
        # The last decode's on-device sampled tokens: the next step's input when the batch
        # is unchanged (`reset_batch=False`), so the host need not read them back first.
        self._last_tokens: DeviceOutput | None = None

    # ---- construction ----------------------------------------------------------------

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> ReferenceLlamaGenerator:
        """Load the checkpoint named by `hf_config._name_or_path`, float32.

        `mesh_device` (a HostMesh), `tt_data_parallel` and `optimizations` change nothing
        here: rows are independent, and float32 torch has no accuracy/speed trade-off.
        """
        dims = ModelDims.from_hf_config(hf_config)
        window = getattr(hf_config, "sliding_window", None)
        if (
            getattr(hf_config, "use_sliding_window", window is not None)
            and window
            and (window < max_seq_len)
        ):
            warnings.warn(
                f"sliding_window={window} < max_seq_len={max_seq_len}: the reference "
                "generator attends over the full context, so results past the window "
                "differ from the model's",
                stacklevel=2,
            )
        inv_freq, attention_scaling = rope_frequencies(hf_config, dims)
        state = load_safetensors(checkpoint_dir(hf_config))
        weights = LlamaWeights.from_state_dict(
            state, dims, bool(getattr(hf_config, "tie_word_embeddings", False))
        )
        return cls(weights, dims, inv_freq, attention_scaling, max_batch_size, max_seq_len)

    def allocate_kv_cache(
        self, kv_cache_shape: tuple[int, int, int, int], dtype: Any, num_layers: int
    ) -> KVCache:
        """Zeroed paged cache: per layer `[k_cache, v_cache]`, each `kv_cache_shape`
        = `(N, KV, Bs, D)`. Always float32, whatever `dtype` asks: the reference keeps
        full precision so differences from it are the TT generator's own."""
        num_blocks, kv_heads, block_size, head_size = kv_cache_shape
        if (kv_heads, head_size) != (self.dims.num_kv_heads, self.dims.head_dim):
            raise ValueError(
                f"kv_cache_shape {tuple(kv_cache_shape)} does not fit the model "
                f"({self.dims.num_kv_heads} KV heads of size {self.dims.head_dim})"
            )
        if num_layers != self.dims.num_layers:
            raise ValueError(f"num_layers {num_layers} != the model's {self.dims.num_layers}")
        shape = (num_blocks, kv_heads, block_size, head_size)
        return [
            [torch.zeros(shape, dtype=torch.float32), torch.zeros(shape, dtype=torch.float32)]
            for _ in range(num_layers)
        ]

    # ---- the forward pass ------------------------------------------------------------

    @torch.no_grad()
    def forward_segments(
        self, segments: list[Segment], page_table: torch.Tensor, kv_cache: KVCache
    ) -> torch.Tensor:
        """Run the model over new tokens of several sequences; last-token logits `[n, V]`.

        All rows' tokens are flattened into one `[T, hidden]` activation so projections
        and the MLP run once per layer. Each layer first writes the new K/V of every token
        into the paged cache (one indexed write), then attends over each row's context
        read back from it, so earlier chunks and prefix-cached blocks are seen exactly like
        new ones. Attention is batched per `AttentionGroup` (see `attention_groups`).
        """
        dims = self.dims
        lengths = torch.tensor([len(s.tokens) for s in segments])  # [n]
        token_ids = torch.cat([s.tokens for s in segments])  # [T]
        positions = torch.cat([torch.arange(s.start, s.end) for s in segments])  # [T]
        rows = torch.tensor([s.row for s in segments]).repeat_interleave(lengths)  # [T]
        block_size = kv_cache[0][0].shape[2]
        block_of_token = page_table[rows, positions // block_size]  # [T]
        slot_of_token = positions % block_size  # [T]
        cos, sin = rope_cos_sin(positions, self.inv_freq, self.attention_scaling)
        groups = attention_groups(segments, positions, page_table, kv_cache[0][0].shape)

        x = self.weights.embed_tokens[token_ids]  # [T, hidden]
        for layer, (k_cache, v_cache) in zip(self.weights.layers, kv_cache, strict=True):
            h = rms_norm(x, layer.input_norm, dims.rms_norm_eps)
            q = layer.q_proj(h).view(-1, dims.num_heads, dims.head_dim)  # [T, H, D]
            k = layer.k_proj(h).view(-1, dims.num_kv_heads, dims.head_dim)  # [T, KV, D]
            v = layer.v_proj(h).view(-1, dims.num_kv_heads, dims.head_dim)
            if layer.q_norm is not None:  # Qwen3: RMSNorm of each head, before RoPE
                q = rms_norm(q, layer.q_norm, dims.rms_norm_eps)
                k = rms_norm(k, layer.k_norm, dims.rms_norm_eps)
            q = apply_rope(q, cos, sin)
            k = apply_rope(k, cos, sin)

            # cache[block, :, slot, :] for each token t gets k[t] ([KV, D]).
            k_cache[block_of_token, :, slot_of_token, :] = k
            v_cache[block_of_token, :, slot_of_token, :] = v

            # [T, H, D]: the groups' spans tile the flattened tokens in order.
            attended = torch.cat([g.attend(q, k_cache, v_cache, self.scale) for g in groups])
            x = x + layer.o_proj(attended.view(-1, dims.num_heads * dims.head_dim))

            h = rms_norm(x, layer.post_attention_norm, dims.rms_norm_eps)
            x = x + layer.down_proj(F.silu(layer.gate_proj(h)) * layer.up_proj(h))

        last = lengths.cumsum(0) - 1  # [n] each segment's last token
        final = rms_norm(x[last], self.weights.final_norm, dims.rms_norm_eps)
        return F.linear(final, self.weights.lm_head)  # [n, V]

    def _run(
        self, segments: list[Segment], batch: int, page_table: Any, kv_cache: KVCache
    ) -> torch.Tensor:
        """Logits `[B, V]` for a batch where only `segments`' rows are real (others 0)."""
        if page_table is None:
            raise ValueError("the reference generator needs a page_table (paged KV cache only)")
        logits = torch.zeros(batch, self.dims.vocab_size, dtype=torch.float32)
        if segments:
            table = torch.as_tensor(page_table).long()
            rows = torch.tensor([s.row for s in segments])
            logits[rows] = self.forward_segments(segments, table, kv_cache)
        return logits

    # ---- the contract ----------------------------------------------------------------

    def prefill_forward(
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        prompt_lens: Any,
        start_pos: Any = None,
        enable_trace: bool = False,
        sampling_params: SamplingParamsBatch | None = None,
        empty_slots: Any = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        """Prefill one chunk per row; last-token logits `[B, 1, V]`, or tokens `[B]`.

        Row i computes positions `start_pos[i] .. prompt_lens[i] - 1` (start_pos None: 0).
        As in TT-Metal's generators, `tokens[i]` holds the row's tokens from position 0:
        the chunk is `tokens[i, start_pos[i]:prompt_lens[i]]`, and what lies before it is
        not read (the rest of the row is padding). Positions below start_pos[i] must
        already be in the cache: an earlier chunk, or blocks shared through prefix
        caching. Rows with nothing
        to compute (prompt_lens <= start_pos) are padding: logits 0, cache untouched.
        With `sampling_params`, the token drawn for row i is the one at position
        prompt_lens[i] (seeded rows are keyed on that position).
        """
        batch = tokens.shape[0]
        ends = _int_list(prompt_lens, batch, "prompt_lens")
        starts = [0] * batch if start_pos is None else _int_list(start_pos, batch, "start_pos")
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
        self._last_tokens = None  # a prefill changes the batch: the next decode resets it

        def compute() -> torch.Tensor:
            logits = self._run(segments, batch, page_table, kv_cache)
            if sampling_params is None:
                return logits.unsqueeze(1)
            active = [ends[row] > starts[row] for row in range(batch)]
            return sample_tokens(logits, sampling_params, ends, active, self.unseeded_generator)

        return self._device_queue.submit(compute).result()

    def decode_forward(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        enable_trace: bool = False,
        read_from_device: bool = True,
        sampling_params: SamplingParamsBatch | None = None,
        prompt_tokens: Any = None,
        output_tokens: Any = None,
        reset_batch: bool = False,
        **kwargs: Any,
    ) -> torch.Tensor | DeviceOutput:
        """One token per row: `tokens[i, 0]` at position `start_pos[i]`.

        Writes its K/V and attends over positions <= start_pos[i]. Rows with start_pos -1
        are padding: skipped, cache untouched, logits 0 / token 0. Returns logits
        `[B, 1, V]`, or with `sampling_params` tokens `[B]` (drawn for position
        start_pos[i] + 1). With `read_from_device=False` the result is a DeviceOutput for
        `read_decode_output`. prompt_tokens/output_tokens (penalties on device) are not
        used: SamplingParamsBatch carries no penalties.
        """
        batch = tokens.shape[0]
        positions = _int_list(start_pos, batch, "start_pos")
        host_tokens = tokens.reshape(batch, -1)[:, 0].long().clone()
        previous = None if reset_batch else self._last_tokens
        if previous is None and bool((host_tokens < 0).any()):
            raise ValueError(
                "tokens has unknown (-1) entries but there is no previous decode "
                "on the device to take them from (pass reset_batch=True)"
            )

        def compute() -> torch.Tensor:
            token_ids = host_tokens
            if previous is not None:
                # Same batch as the last decode: its sampled tokens, still on the device,
                # are this step's input wherever the host did not know them yet.
                on_device = previous.tensor.reshape(-1)
                if on_device.shape == token_ids.shape:
                    token_ids = torch.where(token_ids < 0, on_device, token_ids)
            segments = [
                Segment(row, token_ids[row : row + 1], positions[row])
                for row in range(batch)
                if positions[row] >= 0
            ]
            logits = self._run(segments, batch, page_table, kv_cache)
            if sampling_params is None:
                return logits.unsqueeze(1)
            active = [p >= 0 for p in positions]
            next_positions = [p + 1 for p in positions]
            return sample_tokens(
                logits, sampling_params, next_positions, active, self.unseeded_generator
            )

        is_tokens = sampling_params is not None
        out = DeviceOutput(
            self._device_queue.submit(compute),
            is_tokens=is_tokens,
            shape=(batch,) if is_tokens else (batch, 1, self.dims.vocab_size),
        )
        self._last_tokens = out if sampling_params is not None else None
        if read_from_device:
            return out.tensor
        return out

    def read_decode_output(
        self, out: DeviceOutput | torch.Tensor, async_read: bool = False
    ) -> torch.Tensor | tuple[torch.Tensor, list[ReadEvent]]:
        """Copy a decode result to the host.

        `async_read=False`: the host tensor. `async_read=True`: `(host_out, events)`; the
        copy runs on the readback thread, and host_out is valid once every event's
        `wait()` has returned. A tensor already on the host passes through (no events).
        """
        if isinstance(out, torch.Tensor):
            return (out, []) if async_read else out
        if not async_read:
            return out.tensor.clone()
        host = torch.empty(out.shape, dtype=out.dtype)
        future = self._device_queue.submit(lambda: host.copy_(out.tensor))
        return host, [ReadEvent(future)]

    def process_decode_output_host(
        self, host_out: torch.Tensor | DeviceOutput, is_tokens: bool = False
    ) -> torch.Tensor:
        """The final host result: tokens `[B]` int64 when `is_tokens`, else logits
        `[B, 1, V]` float32. Call it only after the read's events were waited on."""
        if isinstance(host_out, DeviceOutput):  # tolerate a skipped read: read it now
            host_out = self.read_decode_output(host_out, async_read=False)
        if is_tokens:
            if host_out.is_floating_point():
                raise ValueError("is_tokens=True but the decode output is logits")
            return host_out.reshape(-1).long()
        if not host_out.is_floating_point():
            raise ValueError("is_tokens=False but the decode output is sampled tokens")
        return host_out.reshape(host_out.shape[0], 1, -1)

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up: no traces or kernels to compile on the host."""
