"""Admitting a checkpoint with sliding-window attention: served only where the generator
masks the window, or where no request can reach past it.

A window only matters past its length: with `max_model_len <= window` every query sees
its whole context, and any generator is right. Longer, the generator must mask the keys
older than the window itself (the KV cache vLLM gives it holds every position: one
full-attention spec per layer). Who does:

- a class whose `model_capabilities` says `supports_sliding_window` (ttbundles' own key,
  `format.attention_window.WINDOW_CAPABILITY_KEY`): the torch reference generator and
  every bundle built on it by `ttbundle init --reference` (it implements the window for
  Mistral, Qwen2 and Qwen3, the families it reads at all);
- TT-Metal's own generators (an environment class from TT-Metal's `models` package):
  they read `sliding_window` / `layer_types` from the config themselves (`ModelArgs`)
  and have no flag to say so; the reference plugin serves them as they are, and so does
  this one.

Anything else with a window shorter than `max_model_len` is refused here (TTB250), before
a request could be answered wrong: the checkpoint key and window, `max_model_len`, and
the two fixes. The class is read from source (`check.static_reader`), never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError
from ttbundles.format.attention_window import (
    WINDOW_CAPABILITY_KEY,
    WINDOW_KEY,
    AttentionWindow,
    attention_window,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from ttbundles.serving.planning.plan import Plan

TT_METAL_PACKAGE = "models"
"""The top-level package of TT-Metal's model code (`models.tt_transformers...`)."""


def window_handler(entry: Any) -> str | None:
    """Why the generator of registry `entry` handles a sliding window itself, or None."""
    meta = entry.metadata
    static = entry.class_source()
    caps = (static.model_capabilities or {}) if static is not None else {}
    if caps.get(WINDOW_CAPABILITY_KEY) is True:
        return f"{meta.main_class} declares model_capabilities[{WINDOW_CAPABILITY_KEY!r}]"
    if meta.main_class_source == "environment" and (meta.module.split(".")[0] == TT_METAL_PACKAGE):
        return f"{meta.main_class} is TT-Metal's: it reads {WINDOW_KEY} from the config itself"
    return None


def plan_window(vllm_config: VllmConfig, plan: Plan, entry: Any) -> AttentionWindow | None:
    """Decide (or refuse) the checkpoint's sliding window against `max_model_len`, after
    the lengths are planned. Returns the window, None when the checkpoint has none."""
    model_config = vllm_config.model_config
    window = attention_window(model_config.hf_text_config)
    if window is None:
        return None
    length = int(model_config.max_model_len)
    if window.size >= length:
        plan.decide(
            WINDOW_KEY,
            window.size,
            window.size,
            f"{window.describe()} >= max_model_len {length}: every query sees its whole context",
        )
        return window
    handler = window_handler(entry)
    if handler is not None:
        plan.decide(WINDOW_KEY, window.size, window.size, f"{window.describe()}: {handler}")
        return window
    meta = entry.metadata
    raise ConfigurationError.single(
        "TTB250",
        f"the checkpoint's config.json sets {window.describe()}, shorter than max_model_len "
        f"{length}, and the generator {meta.main_class} ({meta.name}) does not declare that "
        f"it masks keys older than the window: tokens past position {window.size} would "
        "differ from the model's",
        hint=f"serve with --max-model-len {window.size} (or lower), or with a generator "
        f"that implements the window and says so: model_capabilities"
        f"[{WINDOW_CAPABILITY_KEY!r}] = True (ttbundle init --reference writes one)",
    )
