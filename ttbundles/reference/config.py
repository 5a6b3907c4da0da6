"""The sizes and RoPE settings the forward pass needs, read once from the Hugging Face config.

Which architectures the reference reads, and each family's differences from Llama, are
`reference.families`' table; this module reads what every family spells the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ttbundles.format.attention_window import SLIDING_LAYER_TYPE

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# The MLP activations the reference implements (gate activation of a gated MLP):
# SwiGLU for Llama/Mistral/Qwen, GeGLU with the tanh GELU for Gemma 3.
SUPPORTED_ACTIVATIONS = ("silu", "swish", "gelu_pytorch_tanh")


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
    hidden_act: str = "silu"

    @classmethod
    def from_hf_config(cls, hf_config: Any) -> ModelDims:
        """Llama, Mistral, Qwen2, Qwen3 and Gemma 3 configs all spell these the same way
        (Gemma names its activation `hidden_activation`)."""
        hidden_act = (
            getattr(hf_config, "hidden_activation", None)
            or getattr(hf_config, "hidden_act", None)
            or "silu"
        )
        if hidden_act not in SUPPORTED_ACTIVATIONS:
            raise NotImplementedError(
                f"hidden_act {hidden_act!r}: the reference MLP is gated with "
                f"{', '.join(SUPPORTED_ACTIVATIONS)} only"
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
            hidden_act=hidden_act,
        )


def rope_parameters(hf_config: Any, layer_type: str | None = None) -> dict[str, Any]:
    """The RoPE settings as one flat dict with at least `rope_type` and `rope_theta`.

    transformers 5.x keeps them in `hf_config.rope_parameters`; older configs (and
    hand-built ones) have `rope_theta` plus an optional `rope_scaling` dict whose type key
    may be spelled `type`. Both are accepted so the reference does not depend on which
    transformers wrote the config. Gemma 3 keeps one dict per layer type
    (`"sliding_attention"`, `"full_attention"`): `layer_type` picks one; older Gemma 3
    configs spell the sliding layers' base `rope_local_base_freq` (default RoPE, no
    scaling: the scaling is the global layers').
    """
    params = getattr(hf_config, "rope_parameters", None)
    per_type = isinstance(params, dict) and any(isinstance(v, dict) for v in params.values())
    if per_type:
        if layer_type is None or not isinstance(params.get(layer_type), dict):
            raise NotImplementedError(
                "per-layer-type rope_parameters (e.g. sliding/full attention) are read only "
                f"for Gemma 3 (no entry for {layer_type!r})"
            )
        params = dict(params[layer_type])
    elif isinstance(params, dict) and params:
        params = dict(params)
    elif layer_type == SLIDING_LAYER_TYPE and getattr(hf_config, "rope_local_base_freq", None):
        params = {"rope_type": "default", "rope_theta": hf_config.rope_local_base_freq}
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


def rope_frequencies(
    hf_config: Any, dims: ModelDims, layer_type: str | None = None
) -> tuple[torch.Tensor, float]:
    """RoPE inverse frequencies `[D / 2]` and the cos/sin scale ("attention factor"), of
    the layers of `layer_type` when the config has per-layer-type RoPE (Gemma 3).

    "default" is computed here (it is one line); the scaled types use transformers' own
    `ROPE_INIT_FUNCTIONS`, so the reference is exact against Hugging Face by construction.
    "dynamic" and "longrope" are refused: in transformers they change the frequencies with
    the current sequence length, which has no batch-independent meaning over a paged cache.
    """
    params = rope_parameters(hf_config, layer_type)
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


@dataclass(frozen=True)
class ModelStyle:
    """How a family's forward pass differs from Llama's, read once from the config by
    the config's family (`families.style_of`).

    Llama, Mistral and Qwen have the defaults. Gemma 3 (as transformers'
    `modeling_gemma3`): RMSNorm scales by `1 + weight` (`norm_offset`), the embedding is
    multiplied by `sqrt(hidden_size)`, queries are scaled by `query_pre_attn_scalar**-0.5`
    rather than `head_dim**-0.5`, each layer normalises the attention and MLP outputs
    too (`sandwich_norms`: post-attention, pre- and post-feed-forward norms), the sliding
    layers have their own RoPE (`local_rope`), and the final logits may be soft-capped
    (`cap * tanh(x / cap)`). Gemma 3's `attn_logit_softcapping` is read by neither
    transformers' `Gemma3Attention` nor vLLM's Gemma 3 (Gemma 2 used it), so it is not
    applied here either: the logits stay transformers'.
    """

    norm_offset: float = 0.0
    embed_scale: float | None = None
    query_scale: float | None = None  # None: head_dim ** -0.5
    sandwich_norms: bool = False
    local_rope: bool = False
    final_softcap: float | None = None


@dataclass(frozen=True)
class ModelRope:
    """The model's RoPE: the inverse frequencies `[D / 2]` and cos/sin scale of every
    layer, and for Gemma 3 those of its sliding layers (`local`: inv_freq, scale, which
    layers), which rotate with their own base."""

    inv_freq: torch.Tensor
    scaling: float
    local: tuple[torch.Tensor, float, frozenset[int]] | None = None

    @classmethod
    def from_hf_config(cls, hf_config: Any, dims: ModelDims, style: ModelStyle) -> ModelRope:
        """Read once; unsupported RoPE types raise NotImplementedError (`rope_frequencies`)."""
        if not style.local_rope:
            return cls(*rope_frequencies(hf_config, dims))
        # Per layer type: the global layers' RoPE (with its scaling) and the local one.
        inv_freq, scaling = rope_frequencies(hf_config, dims, "full_attention")
        local_freq, local_scaling = rope_frequencies(hf_config, dims, SLIDING_LAYER_TYPE)
        layer_types = list(getattr(hf_config, "layer_types", None) or [])
        local_layers = frozenset(
            i for i, kind in enumerate(layer_types) if kind == SLIDING_LAYER_TYPE
        )
        return cls(inv_freq, scaling, (local_freq, local_scaling, local_layers))
