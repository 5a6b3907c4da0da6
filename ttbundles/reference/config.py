"""The sizes and RoPE settings the forward pass needs, read once from the Hugging Face config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_ROPE_TYPES = ("default", "linear", "llama3", "yarn")
# The Hugging Face architectures whose checkpoints the reference generator reads.
SUPPORTED_ARCHITECTURES = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
)


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
