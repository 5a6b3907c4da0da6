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
from dataclasses import dataclass
from typing import Any

import torch

from ttbundles.reference.config import ModelDims, ModelStyle
from ttbundles.reference.families.base import Family

GEMMA4_ARCHITECTURES = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")
GEMMA4_MODEL_TYPES = ("gemma4", "gemma4_text")
FULL_LAYER_TYPE = "full_attention"
# Gemma4TextConfig's default when a config.json leaves `global_head_dim` out.
DEFAULT_GLOBAL_HEAD_DIM = 512
# The RoPE types a Gemma 4 config uses per layer type (transformers' defaults: "default"
# on sliding layers, "proportional" on global ones).
GEMMA4_ROPE_TYPES = ("default", "proportional")


def _get(config: Any, key: str, default: Any = None) -> Any:
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def is_gemma4(hf_config: Any) -> bool:
    """A Gemma 4 config (`gemma4` multimodal or `gemma4_text`), or one naming its classes."""
    architectures = _get(hf_config, "architectures") or []
    model_type = str(_get(hf_config, "model_type") or "")
    return model_type in GEMMA4_MODEL_TYPES or any(a in GEMMA4_ARCHITECTURES for a in architectures)


def text_config(hf_config: Any) -> Any:
    """The text model's config: the multimodal config's `text_config`, else the config."""
    text = _get(hf_config, "text_config")
    return hf_config if text is None else text


def unimplemented(hf_config: Any) -> str | None:
    """What of this Gemma 4 text model the reference does not compute, None when nothing:
    each would be computed wrong rather than refused if it were ignored."""
    text = text_config(hf_config)
    if _get(text, "enable_moe_block"):
        return (
            "enable_moe_block: the mixture-of-experts blocks (router and experts beside "
            "the dense MLP, as in gemma-4-26B-A4B) are not implemented; the reference "
            "computes Gemma 4's dense MLP only"
        )
    if _get(text, "hidden_size_per_layer_input"):
        return (
            "hidden_size_per_layer_input: the per-layer embeddings (embed_tokens_per_layer "
            "and each layer's per-layer input gate, as in gemma-4-E2B/E4B) are not "
            "implemented; set it to 0 for a model without them"
        )
    if _get(text, "num_kv_shared_layers"):
        return (
            "num_kv_shared_layers: layers that reuse an earlier layer's keys and values are "
            "not implemented; the reference keeps each layer's own KV"
        )
    if _get(text, "use_bidirectional_attention"):
        return (
            "use_bidirectional_attention: the reference serves causal Gemma 4 text only "
            "(no bidirectional vision or all-token attention)"
        )
    params = _get(text, "rope_parameters") or {}
    for kind, entry in params.items() if isinstance(params, Mapping) else ():
        rope_type = _get(entry, "rope_type") if entry is not None else "default"
        if rope_type not in GEMMA4_ROPE_TYPES:
            return (
                f"rope_parameters[{kind!r}].rope_type {rope_type!r}: the reference reads "
                f"{', '.join(GEMMA4_ROPE_TYPES)} for Gemma 4"
            )
        if _get(entry, "factor", 1.0) not in (None, 1.0):
            return f"rope_parameters[{kind!r}].factor: scaled Gemma 4 RoPE is not implemented"
    return None


@dataclass(frozen=True)
class LayerShape:
    """One attention layer's shape: its KV heads and head size (queries: the model's
    heads of that size), and whether its values are its keys' projection."""

    num_kv_heads: int
    head_dim: int
    values_from_keys: bool = False


def layer_types(hf_config: Any) -> list[str]:
    """Each layer's type, as Gemma4TextConfig derives it when absent (every sixth layer
    global, the last one always)."""
    text = text_config(hf_config)
    count = int(_get(text, "num_hidden_layers"))
    types = list(_get(text, "layer_types") or [])
    if len(types) != count:
        types = ["sliding_attention" if (i + 1) % 6 else FULL_LAYER_TYPE for i in range(count)]
    if types:
        types[-1] = FULL_LAYER_TYPE
    return types


def dims_config(hf_config: Any) -> Any:
    """The config the model-wide sizes are read from: a sliding layer's. transformers'
    loaded Gemma 4 config refuses to answer `head_dim` or `num_key_value_heads` for the
    whole model (they vary by layer); its `per_layer_config` answers per layer type. A
    config.json read as a dict answers for the sliding layers itself."""
    text = text_config(hf_config)
    per_layer = _get(text, "per_layer_config")
    if per_layer is None or isinstance(per_layer, Mapping):
        return text
    kinds = layer_types(text)
    kind = next((k for k in kinds if k != FULL_LAYER_TYPE), FULL_LAYER_TYPE)
    return per_layer[kind]


def layer_shapes(hf_config: Any) -> list[LayerShape]:
    """Every layer's `LayerShape`, as `Gemma4TextAttention` reads it: transformers' loaded
    config answers per layer (`per_layer_config[i]`); a config.json has the sliding
    layers' `head_dim` and KV heads, and for the global ones `global_head_dim` (default
    512) and, where `attention_k_eq_v` is set, `num_global_key_value_heads`."""
    text = text_config(hf_config)
    k_eq_v = bool(_get(text, "attention_k_eq_v", False))
    kinds = layer_types(text)
    per_layer = _get(text, "per_layer_config")
    if per_layer is not None and not isinstance(per_layer, Mapping):
        return [
            LayerShape(
                int(per_layer[i].num_key_value_heads),
                int(per_layer[i].head_dim),
                values_from_keys=k_eq_v and kind == FULL_LAYER_TYPE,
            )
            for i, kind in enumerate(kinds)
        ]
    base = LayerShape(int(_get(text, "num_key_value_heads")), int(_get(text, "head_dim")))
    shapes = []
    for index, kind in enumerate(kinds):
        if kind != FULL_LAYER_TYPE:
            shapes.append(base)
            continue
        override = None
        if isinstance(per_layer, Mapping):
            override = per_layer.get(str(index), per_layer.get(index))
        if override is not None:
            heads = _get(override, "num_key_value_heads") or base.num_kv_heads
            size = _get(override, "head_dim") or base.head_dim
        else:
            size = _get(text, "global_head_dim") or DEFAULT_GLOBAL_HEAD_DIM
            global_heads = _get(text, "num_global_key_value_heads") if k_eq_v else None
            heads = global_heads or base.num_kv_heads
        shapes.append(LayerShape(int(heads), int(size), values_from_keys=k_eq_v))
    return shapes


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
        final_softcap=_get(text_config(hf_config), "final_logit_softcapping"),
    )


GEMMA4 = Family(
    name="gemma4",
    architectures=GEMMA4_ARCHITECTURES,
    style=gemma4_style,
    claims=is_gemma4,
    generator="ttbundles.reference.gemma4:ReferenceGemma4Generator",
)
