"""Sliding-window attention: which layers of a checkpoint see only the last W keys.

A layer with window W lets the query at position p see the keys at positions
`p - W < c <= p` (transformers' `sliding_window_overlay`: `kv_idx > q_idx - W`, on top of
the causal mask), so a context no longer than W is attended in full and only longer ones
differ. Which layers slide is the checkpoint family's rule, read here exactly as
transformers' modeling code applies it:

- Mistral: every layer, whenever `sliding_window` is set (`modeling_mistral` builds the
  sliding mask from `config.sliding_window` alone; a `layer_types` key is ignored).
- Qwen2 and Qwen3: only with `use_sliding_window` true (their configs drop
  `sliding_window` otherwise); the layers `layer_types` names `"sliding_attention"`,
  which the config derives, when absent, as the layers at index `>= max_window_layers`.
- Gemma 3: the layers `layer_types` names sliding; in older configs without it, all
  but every `sliding_window_pattern`-th (default 6), as `Gemma3TextConfig` derives them.
- Llama: none (`LlamaConfig` has no window; a stray `sliding_window` key is not read).
- Any other family: the layers `layer_types` names sliding, else every layer when
  `sliding_window` is set. Only used to refuse (`serving.planning.window_admission`): a family the
  reference does not implement is never computed from this.

Pure Python over a config object or its `config.json` dict: the reference generator, the
configuration and `ttbundle test` all read it from here.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

WINDOW_KEY = "sliding_window"
SLIDING_LAYER_TYPE = "sliding_attention"
WINDOW_CAPABILITY_KEY = "supports_sliding_window"
"""ttbundles' own `model_capabilities` key: the generator masks keys older than the
checkpoint's window itself (in prefill, decode, the verify and prompt logprobs). A class
without it serves a windowed checkpoint only up to `max_model_len <= window`."""

# transformers' Qwen2/Qwen3 default, when a config.json leaves it out.
_DEFAULT_MAX_WINDOW_LAYERS = 28
_WINDOW_SWITCHED = ("qwen2", "qwen3")  # model types whose window needs use_sliding_window
_NO_WINDOW = ("llama",)
_PATTERNED = ("gemma3",)  # model types whose layer_types default to a pattern
_DEFAULT_SLIDING_PATTERN = 6  # Gemma3TextConfig's default


@dataclass(frozen=True)
class AttentionWindow:
    """A checkpoint's sliding window: `size` keys, for the layers in `layers`."""

    size: int
    layers: frozenset[int]
    num_layers: int

    def of_layer(self, index: int) -> int | None:
        """The window of layer `index`, None for a full-attention layer."""
        return self.size if index in self.layers else None

    def describe(self) -> str:
        """`sliding_window=8 (all 4 layers)`, or which layers slide."""
        if len(self.layers) == self.num_layers:
            which = f"all {self.num_layers} layers"
        else:
            which = f"layers {_ranges(sorted(self.layers))} of {self.num_layers}"
        return f"{WINDOW_KEY}={self.size} ({which})"


def _get(config: Any, key: str) -> Any:
    if isinstance(config, Mapping):
        return config.get(key)
    return getattr(config, key, None)


def _model_type(config: Any) -> str:
    model_type = str(_get(config, "model_type") or "").lower()
    if model_type:
        return model_type
    architectures = " ".join(_get(config, "architectures") or []).lower()
    for name in ("mistral", "qwen3", "qwen2", "gemma3", "llama"):
        if name in architectures:
            return name
    return ""


def attention_window(config: Any) -> AttentionWindow | None:
    """The window of a text model's config (object or dict), None when no layer slides.

    A multimodal config is read through its `text_config` when it has one.
    """
    text = _get(config, "text_config")
    if text is not None:
        config = text
    size = _get(config, WINDOW_KEY)
    if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
        return None  # vLLM reads 0 as "no window" too (ModelConfig)
    model_type = _model_type(config)
    if model_type in _NO_WINDOW:
        return None
    num_layers = int(_get(config, "num_hidden_layers") or 0)
    layer_types = _get(config, "layer_types")
    if model_type.startswith(_WINDOW_SWITCHED):
        if not _get(config, "use_sliding_window"):
            return None
        if isinstance(layer_types, list | tuple) and len(layer_types) == num_layers:
            sliding = {i for i, kind in enumerate(layer_types) if kind == SLIDING_LAYER_TYPE}
        else:
            first = _get(config, "max_window_layers")
            first = _DEFAULT_MAX_WINDOW_LAYERS if first is None else int(first)
            sliding = set(range(first, num_layers))
    elif model_type.startswith(_PATTERNED) and not isinstance(layer_types, list | tuple):
        # Older Gemma 3 configs: every `sliding_window_pattern`-th layer is global, as
        # Gemma3TextConfig derives `layer_types` when they are absent.
        pattern = int(_get(config, "sliding_window_pattern") or _DEFAULT_SLIDING_PATTERN)
        sliding = {i for i in range(num_layers) if (i + 1) % pattern}
    elif model_type == "mistral" or not isinstance(layer_types, list | tuple):
        sliding = set(range(num_layers))
    else:
        sliding = {i for i, kind in enumerate(layer_types) if kind == SLIDING_LAYER_TYPE}
    if not sliding:
        return None
    return AttentionWindow(size=size, layers=frozenset(sliding), num_layers=num_layers)


def _ranges(values: list[int]) -> str:
    """`0-3, 6, 8-9` for [0, 1, 2, 3, 6, 8, 9]."""
    out: list[str] = []
    start = prev = values[0]
    for value in values[1:] + [None]:  # type: ignore[list-item]
        if value is not None and value == prev + 1:
            prev = value
            continue
        out.append(str(start) if start == prev else f"{start}-{prev}")
        if value is not None:
            start = prev = value
    return ", ".join(out)
