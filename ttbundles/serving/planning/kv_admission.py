"""Whether this launch serves the bundle's KV groups on vLLM's hybrid KV-cache manager,
decided at configuration from the bundle's metadata (`capabilities.kv_cache_spec`), the
checkpoint's layers and what the operator asked.

vLLM asks the platform (`support_hybrid_kv_cache`) while it builds its configuration,
right after the platform's hook planned the launch: the plan's `kv_groups` is the
answer. Off (not declared, `--disable-hybrid-kv-cache-manager`, or a feature that does
not follow several groups yet), vLLM turns sliding-window specs into full attention and
every layer keeps the whole context; the generator still masks its window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError
from ttbundles.format.attention_window import attention_window
from ttbundles.format.layer_kinds import layer_kinds as read_layer_kinds

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from ttbundles.serving.planning.plan import Plan


def layer_kinds(hf_config: Any) -> str:
    """`10 sliding-window layers (window 32), 2 full-attention`, or `12 full-attention`:
    the checkpoint's layers as the reference reads their windows; a checkpoint with
    recurrent layers as `format.layer_kinds` counts them (`6 linear-attention (gated
    delta net) layers with recurrent state, 2 full-attention layers`)."""
    kinds = read_layer_kinds(hf_config)
    if kinds.recurrent:  # never "full attention" for a Mamba or gated delta net layer
        return kinds.describe()
    layers = kinds.num_layers
    window = attention_window(hf_config)
    if window is None:
        return f"{layers} full-attention layers"
    sliding = len(window.layers)
    parts = [f"{sliding} sliding-window layers (window {window.size})"]
    if layers - sliding:
        parts.append(f"{layers - sliding} full-attention")
    return ", ".join(parts)


def plan_kv_groups(vllm_config: VllmConfig, plan: Plan, declared: bool) -> None:
    """Decide `plan.kv_groups` (after speculation and lanes were planned)."""
    plan.kv_groups = False
    sched = vllm_config.scheduler_config
    asked = sched.disable_hybrid_kv_cache_manager  # None: vLLM decides
    block = vllm_config.cache_config.block_size
    kinds = layer_kinds(vllm_config.model_config.hf_config)
    requested = "off" if asked else ("on" if asked is False else "auto")
    if plan.pooling is not None:
        plan.decide(
            "kv_cache",
            requested,
            "none",
            "a pooling server keeps no KV cache of vLLM's (the pooling runner: whole "
            "prompts, each pooled in the step it is scheduled)",
        )
        return
    if not declared:
        plan.decide(
            "kv_cache",
            requested,
            "one group",
            f"{kinds}, blocks of {block} tokens; the bundle does not declare "
            "capabilities.kv_cache_spec: every layer keeps the whole context",
        )
        return
    if asked:
        plan.decide(
            "kv_cache",
            requested,
            "one group",
            f"{kinds}, blocks of {block} tokens; --disable-hybrid-kv-cache-manager: every "
            "layer keeps the whole context (the generator still masks its window)",
        )
        return
    unserved = [
        name
        for name, on in (
            ("speculative decoding", plan.speculative is not None),
            ("in-process data-parallel lanes", plan.lanes > 1),
        )
        if on
    ]
    if unserved and asked is False:
        raise ConfigurationError.single(
            "TTB262",
            f"--enable-hybrid-kv-cache-manager with {' and '.join(unserved)}: the runner "
            "does not follow several KV groups there yet",
            hint="drop --enable-hybrid-kv-cache-manager (every layer then keeps the whole "
            "context), or serve without " + " and ".join(unserved),
        )
    if unserved:
        plan.decide(
            "kv_cache",
            requested,
            "one group",
            f"{kinds}, blocks of {block} tokens; hybrid KV groups do not serve "
            f"{' and '.join(unserved)} yet (TTB262): every layer keeps the whole context",
        )
        return
    plan.kv_groups = True
    plan.decide(
        "kv_cache",
        requested,
        "hybrid groups",
        f"{kinds}, blocks of {block} tokens; the bundle declares kv_cache_spec: vLLM's "
        "hybrid KV-cache manager gives sliding-window layers only their window's blocks "
        "(the groups and capacity are in the start-up log's KV cache line)",
    )
