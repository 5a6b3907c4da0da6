"""Gemma 4 text: what its checkpoints need of the reference, as transformers'
`modeling_gemma4` computes it; the forward pass is `reference.gemma4`'s generator.

It is Gemma 3's layer plan (sliding layers and global ones, sandwich norms, a GeGLU MLP,
the scaled embedding, the final soft cap) with differences the shared pass does not
have, so the family names its own generator: each global layer has its own head size
and KV heads (`global_head_dim`, `num_global_key_value_heads`; transformers keeps them
in `per_layer_config`), and may take its values from its key projection
(`attention_k_eq_v`); the global RoPE rotates a part of each head ("proportional");
values are RMS-normalised without a scale, queries are not scaled (the q/k norms do it),
norms scale by `w` (not Gemma 3's `1 + w`), and each layer's output is multiplied by its
`layer_scalar`.

What of the real models the reference does not compute is refused by name
(`unimplemented`): the mixture of experts of 26B-A4B (`enable_moe_block`), the per-layer
embeddings of the small models (`hidden_size_per_layer_input`), KV shared between layers
(`num_kv_shared_layers`), bidirectional attention. `Gemma4ForConditionalGeneration` is read
for its text part (`text_config`, the weights under `model.language_model.`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from ttbundles.format.kv_shapes import (
    FULL_LAYER_TYPE,
    LayerShape,
    dims_config,
    layer_shapes,
    layer_types,
    text_config,
    value_of,
)
from ttbundles.reference.config import ModelDims, ModelStyle
from ttbundles.reference.families.base import Family

GEMMA4_ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
GEMMA4_MODEL_TYPES = ("gemma4", "gemma4_text")
# The RoPE types a Gemma 4 config uses per layer type (transformers' defaults: "default"
# on sliding layers, "proportional" on global ones).
GEMMA4_ROPE_TYPES = ("default", "proportional")


def is_gemma4(hf_config: Any) -> bool:
    """A Gemma 4 config (`gemma4` multimodal or `gemma4_text`), or one naming its classes."""
    architectures = value_of(hf_config, "architectures") or []
    model_type = str(value_of(hf_config, "model_type") or "")
    return model_type in GEMMA4_MODEL_TYPES or any(a in GEMMA4_ARCHITECTURES for a in architectures)


def unimplemented(hf_config: Any) -> str | None:
    """What of this Gemma 4 text model the reference does not compute, None when nothing:
    each would be computed wrong rather than refused if it were ignored."""
    text = text_config(hf_config)
    if value_of(text, "enable_moe_block"):
        return (
            "enable_moe_block: the mixture-of-experts blocks (router and experts beside "
            "the dense MLP, as in gemma-4-26B-A4B) are not implemented; the reference "
            "computes Gemma 4's dense MLP only"
        )
    if value_of(text, "hidden_size_per_layer_input"):
        return (
            "hidden_size_per_layer_input: the per-layer embeddings (embed_tokens_per_layer "
            "and each layer's per-layer input gate, as in gemma-4-E2B/E4B) are not "
            "implemented; set it to 0 for a model without them"
        )
    if value_of(text, "num_kv_shared_layers"):
        return (
            "num_kv_shared_layers: layers that reuse an earlier layer's keys and values are "
            "not implemented; the reference keeps each layer's own KV"
        )
    if value_of(text, "use_bidirectional_attention"):
        return (
            "use_bidirectional_attention: the reference serves causal Gemma 4 text only "
            "(no bidirectional vision or all-token attention)"
        )
    params = value_of(text, "rope_parameters") or {}
    for kind, entry in params.items() if isinstance(params, Mapping) else ():
        rope_type = value_of(entry, "rope_type") if entry is not None else "default"
        if rope_type not in GEMMA4_ROPE_TYPES:
            return (
                f"rope_parameters[{kind!r}].rope_type {rope_type!r}: the reference reads "
                f"{', '.join(GEMMA4_ROPE_TYPES)} for Gemma 4"
            )
        if value_of(entry, "factor", 1.0) not in (None, 1.0):
            return f"rope_parameters[{kind!r}].factor: scaled Gemma 4 RoPE is not implemented"
    return None


def gemma4_style(hf_config: Any, dims: ModelDims) -> ModelStyle:
    """Gemma 4's differences the shared pass has words for (the rest is its generator's);
    what it does not compute is refused (`unimplemented`)."""
    missing = unimplemented(hf_config)
    if missing is not None:
        raise NotImplementedError(f"Gemma 4: {missing}")
    return ModelStyle(
        # transformers keeps the scale as a tensor of the weights' dtype (float32 here).
        embed_scale=float(torch.tensor(dims.hidden_size**0.5, dtype=torch.float32)),
        query_scale=1.0,  # Gemma4TextAttention.scaling: the q/k norms set the scale
        sandwich_norms=True,
        local_rope=True,
        final_softcap=value_of(text_config(hf_config), "final_logit_softcapping"),
    )


__all__ = [
    "FULL_LAYER_TYPE",
    "GEMMA4",
    "LayerShape",
    "dims_config",
    "gemma4_style",
    "is_gemma4",
    "layer_shapes",
    "layer_types",
    "text_config",
    "unimplemented",
]

GEMMA4 = Family(
    name="gemma4",
    architectures=GEMMA4_ARCHITECTURES,
    style=gemma4_style,
    claims=is_gemma4,
    generator="ttbundles.reference.gemma4:ReferenceGemma4Generator",
)
