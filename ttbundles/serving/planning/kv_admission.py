"""Whether this launch serves the bundle's KV groups on vLLM's hybrid KV-cache manager,
decided at configuration from the bundle's metadata (`capabilities.kv_cache_spec`), the
checkpoint's layers and what the operator asked.

vLLM asks the platform (`support_hybrid_kv_cache`) while it builds its configuration,
right after the platform's hook planned the launch: the plan's `kv_groups` is the
answer. On, a sliding layer holds its window plus the tokens in flight
(`planning.kv_capacity`): the plan says what a request holds with and without the
groups, and picks the step budget at which they pay where it may. Off (not declared,
`--disable-hybrid-kv-cache-manager`, or a feature that does not follow several groups
yet), vLLM turns sliding-window specs into full attention and every layer keeps the
whole context; the generator still masks its window.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.attention_window import attention_window
from ttbundles.format.layer_kinds import layer_kinds as read_layer_kinds
from ttbundles.format.meshes import is_host
from ttbundles.serving.planning import command_line
from ttbundles.serving.planning.kv_capacity import RequestBlocks, paying_budget, request_blocks

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
    if plan.recurrent_owner == "vllm":
        # MambaSpec groups live in the hybrid manager only (`planning.recurrent` refused
        # what they cannot serve, --disable-hybrid-kv-cache-manager included).
        plan.kv_groups = True
        plan.decide(
            "kv_cache",
            requested,
            "hybrid groups",
            f"{kinds}, blocks of {block} tokens; the recurrent state is vLLM's: its "
            "hybrid KV-cache manager keeps the attention layers' blocks and the gated "
            "delta net layers' Mamba blocks in one pool",
        )
        return
    if not declared:
        plan.decide(
            "kv_cache",
            requested,
            "one group",
            f"{kinds}, blocks of {block} tokens; the bundle does not declare "
            "capabilities.kv_cache_spec: every attention layer keeps the whole context",
        )
        return
    if asked:
        plan.decide(
            "kv_cache",
            requested,
            "one group",
            f"{kinds}, blocks of {block} tokens; --disable-hybrid-kv-cache-manager: every "
            "attention layer keeps the whole context (the generator still masks its window)",
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
            f"{' and '.join(unserved)} yet (TTB262): every attention layer keeps the whole context",
        )
        return
    plan.kv_groups = True
    sizes = _plan_budget(vllm_config, plan)
    plan.decide(
        "kv_cache",
        requested,
        "hybrid groups",
        f"{kinds}, blocks of {block} tokens; the bundle declares kv_cache_spec: vLLM's "
        "hybrid KV-cache manager keeps each group's blocks"
        + (
            " (a sliding-window layer its window and the tokens in flight); " + sizes.describe()
            if sizes
            else ""
        )
        + " (the groups and capacity are in the start-up log's KV cache line)",
    )


def _plan_budget(vllm_config: VllmConfig, plan: Plan) -> RequestBlocks | None:
    """What a request holds with the groups at the step budget served (None: no sliding
    layer), after choosing a budget at which they pay where the budget is the plan's to
    choose: on the host mesh (the reference prefills in chunks at any budget), with
    chunked prefill on and no --max-num-batched-tokens given. Elsewhere a budget at
    which the groups cost capacity is a warning (TTB264) naming the flag that pays."""
    model = vllm_config.model_config
    sched = vllm_config.scheduler_config
    window = attention_window(model.hf_config)
    if window is None:
        return None
    sliding = len(window.layers)
    sizes = request_blocks(vllm_config, window.size, sliding, sched.max_num_batched_tokens)
    if sizes.pays or not sizes.full_layers:
        return sizes
    budget = (
        paying_budget(vllm_config, window.size, sliding, sched.max_num_batched_tokens)
        if sched.enable_chunked_prefill
        else None
    )
    chosen = (
        budget is not None
        and is_host(plan.mesh)
        and "max_num_batched_tokens" not in command_line.COMMAND_LINE
        and sched.max_num_scheduled_tokens is None
    )
    if chosen:
        old, sizes = sizes, request_blocks(vllm_config, window.size, sliding, budget)
        sched.max_num_batched_tokens = plan.decide(
            "max_num_batched_tokens",
            old.budget,
            budget,
            f"hybrid KV groups on {plan.mesh}: at {old.budget} tokens a step a sliding layer "
            f"holds {old.sliding} blocks a request against a full layer's {old.full} "
            f"({old.gain():.2f}x the requests of one group), at {budget} it holds "
            f"{sizes.sliding} ({sizes.gain():.2f}x); the reference prefills longer prompts "
            "in chunks",
        )
        return sizes
    if budget is not None:
        at = request_blocks(vllm_config, window.size, sliding, budget)
        fix = (
            f"serve with --max-num-batched-tokens {budget} ({at.gain():.2f}x the requests), "
            "or with --disable-hybrid-kv-cache-manager"
        )
    elif sched.enable_chunked_prefill:
        fix = (
            "serve with --disable-hybrid-kv-cache-manager: no step budget makes a sliding "
            "layer hold less than a full one here"
        )
    else:
        fix = (
            "serve with --disable-hybrid-kv-cache-manager (prompts prefill whole here: the "
            "step budget holds the longest prompt)"
        )
    plan.warnings.append(
        Diagnostic(
            "TTB264",
            Severity.WARNING,
            f"hybrid KV groups hold more per request than one group at a step budget of "
            f"{sizes.budget} tokens: {sizes.describe()}",
            hint=fix,
        )
    )
    return sizes
