"""Each attention layer's KV shape where a model's layers have shapes of their own (Gemma
4: the global layers' head size and KV heads), read from its config (a transformers
object or a config.json dict) without torch or vLLM, so that the reference
(`reference.families.gemma4`) and the plan (`serving.planning.kv_capacity`) read the same
shapes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

FULL_LAYER_TYPE = "full_attention"
# Gemma4TextConfig's default when a config.json leaves `global_head_dim` out.
DEFAULT_GLOBAL_HEAD_DIM = 512
_OWN_SHAPES = ("gemma4", "gemma4_text")  # model types whose global layers have their own


def value_of(config: Any, key: str, default: Any = None) -> Any:
    """`key` of a config object or dict."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)


def text_config(hf_config: Any) -> Any:
    """The text model's config: the multimodal config's `text_config`, else the config."""
    text = value_of(hf_config, "text_config")
    return hf_config if text is None else text


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
    count = int(value_of(text, "num_hidden_layers"))
    types = list(value_of(text, "layer_types") or [])
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
    per_layer = value_of(text, "per_layer_config")
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
    k_eq_v = bool(value_of(text, "attention_k_eq_v", False))
    kinds = layer_types(text)
    per_layer = value_of(text, "per_layer_config")
    if per_layer is not None and not isinstance(per_layer, Mapping):
        return [
            LayerShape(
                int(per_layer[i].num_key_value_heads),
                int(per_layer[i].head_dim),
                values_from_keys=k_eq_v and kind == FULL_LAYER_TYPE,
            )
            for i, kind in enumerate(kinds)
        ]
    base = LayerShape(int(value_of(text, "num_key_value_heads")), int(value_of(text, "head_dim")))
    shapes = []
    for index, kind in enumerate(kinds):
        if kind != FULL_LAYER_TYPE:
            shapes.append(base)
            continue
        override = None
        if isinstance(per_layer, Mapping):
            override = per_layer.get(str(index), per_layer.get(index))
        if override is not None:
            heads = value_of(override, "num_key_value_heads") or base.num_kv_heads
            size = value_of(override, "head_dim") or base.head_dim
        else:
            size = value_of(text, "global_head_dim") or DEFAULT_GLOBAL_HEAD_DIM
            global_heads = value_of(text, "num_global_key_value_heads") if k_eq_v else None
            heads = global_heads or base.num_kv_heads
        shapes.append(LayerShape(int(heads), int(size), values_from_keys=k_eq_v))
    return shapes


def own_layer_shapes(hf_config: Any) -> list[LayerShape] | None:
    """Every layer's shape for a model whose layers have shapes of their own (Gemma 4),
    None for any other (every layer has the model's shape)."""
    text = text_config(hf_config)
    model_type = value_of(text, "model_type") or value_of(hf_config, "model_type") or ""
    if str(model_type) not in _OWN_SHAPES:
        return None
    return layer_shapes(hf_config)
