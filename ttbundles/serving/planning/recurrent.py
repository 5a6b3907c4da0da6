"""Recurrent state at configuration: what a checkpoint's recurrent layers hold, and
whether this release serves them.

A gated delta net, Mamba or short-convolution layer keeps a fixed-size state per request
(`format.layer_kinds`). vLLM plans such a model as a hybrid (its hook has already set
the Mamba cache mode and block size when the platform's hook runs).

The generator-owned form is served (TT-Metal's Qwen3.5/3.6 classes): the class keeps a
state slot per user; vLLM's KV manager sees the attention layers only; the runner keeps
one slot per request for its life and calls `release_request(slot)` when it is given
back. The plan says the layers, the state per request and the capacity. What a state
slot cannot follow is refused here with a code (TTB274): pooling (the pooling runner
hands out no slots), speculation (a verify would advance the state over drafts that may
be rejected), prefix caching (a hit would skip tokens whose state was never saved; a
bundle that declares it is refused, one that does not has it turned off).

vLLM's KV manager owning the state (`owner: vllm`, the reference plugin's MambaSpec
route) is served in vLLM's "none" mode: each gated delta net layer gets a `MambaSpec`
(vLLM's shapes for the family), vLLM's hybrid manager gives each request one block per
Mamba group for its life, the generator allocates the state per layer from the
`{"type": "mamba", ...}` descriptor and reads it by the indices the runner sends. vLLM's
own aligner (`Platform.update_block_size_for_backend`) skips a plugin's model, so the
plan does what it would: the attention block grown until its page holds a Mamba page,
the Mamba page padded to it. With the prefix cache on (the bundle declares it and the
operator left it on) it is vLLM's "align" mode, as vLLM's hybrid hook and aligner set it
for their own hybrids: the Mamba block is the grown attention block, chunked prefill ends
chunks on its boundaries, a request's Mamba row is position-indexed (block c holds the
state after (c+1) x block tokens). The runner copies the state into the next block
before a step that crosses a boundary (`copy_recurrent_state`, which the class must have:
TTB274 otherwise, never a hit whose state cannot be restored), so a hit continues the
state the cached block kept after exactly its tokens.

A checkpoint whose bundle declares no state is refused with TTB274, with its layers,
state and capacity in the one line, by `ttbundle plan` and `vllm serve` alike. Never a
plan that calls a Mamba layer full attention, never vLLM's traceback.

`settle_mamba_cache` undoes what vLLM's hybrid hook set for prefix caching when the plan
turns prefix caching off (vLLM's own rule for caching off, `vllm/model_executor/models/
config.py`, `HybridAttentionMambaModelConfig`; the same three fields in 0.33 and 0.34).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError
from ttbundles.format.contract import COPY_STATE_METHOD
from ttbundles.format.layer_kinds import GDN, LayerKinds, layer_kinds
from ttbundles.format.meshes import is_host
from ttbundles.format.metadata import LAYERS_FROM_CONFIG, BundleMetadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from ttbundles.serving.planning.plan import Plan

SERVED_OWNERS: frozenset[str] = frozenset({"generator", "vllm"})
"""The owners of recurrent state this release serves: the generator's own slots, and
vLLM's KV manager (MambaSpec groups, gated delta net layers)."""

_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "fp32": 4, "bf16": 2, "fp16": 2}


def settle_mamba_cache(vllm_config: VllmConfig) -> None:
    """Prefix caching was turned off after vLLM's hybrid hook chose "align" mode and a
    Mamba block of one KV block: set what vLLM sets for caching off ("none", a block of
    the whole context, no page padding), or its config check refuses the pair
    ("--mamba-block-size can only be set with --enable-prefix-caching")."""
    cache = vllm_config.cache_config
    model = vllm_config.model_config
    if model is None or getattr(cache, "mamba_block_size", None) is None:
        return
    cache.mamba_cache_mode = "none"
    cache.mamba_block_size = model.max_model_len
    cache.mamba_page_size_padded = None


def plan_recurrent_state(vllm_config: VllmConfig, plan: Plan, meta: BundleMetadata) -> None:
    """Refuse a checkpoint with recurrent layers (TTB274), saying its layers, its state
    per request and the capacity; refuse a declaration that names other layers than the
    checkpoint's (TTB043). Nothing to do for a checkpoint of attention layers only."""
    kinds = layer_kinds(vllm_config.model_config.hf_config)
    declared = meta.capabilities.recurrent_state
    bundle = f"{meta.name}@{meta.version}"
    if declared is not None:
        _check_declared_layers(kinds, declared.layers, bundle)
    if not kinds.recurrent:
        return
    capacity = _state_and_capacity(vllm_config, plan, kinds)
    summary = f"{bundle} serves {meta.arch}: {kinds.describe()}; {capacity}"
    if declared is None:
        why = "the bundle does not declare capabilities.recurrent_state, and"
        fix = (
            "serve a checkpoint whose layers are all attention; to ready this bundle for a "
            "release that serves it, declare capabilities.recurrent_state (schema_version 6: "
            "its owner, 'generator' or 'vllm')"
        )
    elif declared.owner == "vllm" and _gated_delta_net_only(kinds):
        _plan_vllm_owned(vllm_config, plan, kinds, summary, capacity)
        return
    elif declared.owner == "generator":
        # vLLM holds none of the state: its Mamba cache mode is "none" whatever the
        # prefix cache (vLLM's hybrid hook chose "align" for caching on).
        settle_mamba_cache(vllm_config)
        snapshots = _plan_snapshots(vllm_config, plan, summary)
        plan.recurrent_snapshots = snapshots
        _refuse_what_a_slot_cannot_follow(vllm_config, plan, summary)
        plan.decide(
            "recurrent_state",
            declared.owner,
            "the generator's slots",
            f"{kinds.describe()}; {capacity}; a slot per request for its life, given "
            "back with release_request on finish and preemption",
        )
        plan.recurrent_owner = "generator"
        if snapshots:
            plan.decide(
                "prefix_caching",
                True,
                f"snapshots ({snapshots})",
                f"the class keeps up to {snapshots} snapshots of a slot's state "
                "(recurrent_prefix_snapshots): a hit is admitted only where a snapshot "
                "restores the state after exactly its tokens",
            )
        return
    elif declared.owner == "vllm":
        why = (
            "the bundle declares capabilities.recurrent_state owned by vLLM (MambaSpec "
            "groups), which this release serves for gated delta net layers only, and"
        )
        fix = (
            "declare owner 'generator' (the class keeps a state slot per request), or serve "
            "a gated delta net hybrid (Qwen3.5, Qwen3-Next)"
        )
    else:
        why = f"the bundle declares capabilities.recurrent_state (owner {declared.owner}), but"
        fix = (
            "serve a checkpoint whose layers are all attention; this bundle is served once "
            f"a release of ttbundles serves state owned by the {declared.owner}"
        )
    raise ConfigurationError.single(
        "TTB274",
        f"{summary}; {why} recurrent state is not served yet on this release of "
        "ttbundles: the generator contract passes the KV caches of attention layers only "
        "(no state slot, remap or release per request)",
        hint=fix + " (docs/authors/generator-contract.md#recurrent-state)",
    )


def _gated_delta_net_only(kinds: LayerKinds) -> bool:
    """Every recurrent layer is a gated delta net whose state shape is known: the layers
    vLLM's MambaSpec route serves here (`mamba_type` GDN)."""
    return kinds.state is not None and {kinds.kinds[i] for i in kinds.recurrent_layers} == {GDN}


def _plan_vllm_owned(
    vllm_config: VllmConfig, plan: Plan, kinds: LayerKinds, summary: str, capacity: str
) -> None:
    """The MambaSpec route in vLLM's "none" mode: what it cannot serve refused (TTB274),
    the attention block grown to hold a Mamba page and the Mamba page padded to it (what
    vLLM's aligner does for its own models), the hybrid manager required."""
    cache = vllm_config.cache_config
    unserved = [
        (what, fix)
        for what, on, fix in (
            (
                'prefix caching without chunked prefill (vLLM\'s "align" mode ends prefill '
                "chunks on Mamba block boundaries)",
                bool(cache.enable_prefix_caching)
                and not vllm_config.scheduler_config.enable_chunked_prefill,
                "serve with --enable-chunked-prefill, or with --no-enable-prefix-caching",
            ),
            (
                "--disable-hybrid-kv-cache-manager (MambaSpec groups live in vLLM's hybrid "
                "KV-cache manager only)",
                bool(vllm_config.scheduler_config.disable_hybrid_kv_cache_manager),
                "drop --disable-hybrid-kv-cache-manager",
            ),
            (
                "pooling",
                plan.pooling is not None,
                "serve it for generation (drop --runner pooling / --convert)",
            ),
            (
                "speculative decoding (a verify would advance the state over drafts that "
                "may be rejected; no state is kept per draft position)",
                vllm_config.speculative_config is not None,
                "drop --speculative-config",
            ),
            (
                "in-process data-parallel lanes (one block pool split by lane)",
                plan.lanes > 1,
                "serve without lanes",
            ),
        )
        if on
    ]
    if unserved:
        what, fix = unserved[0]
        raise ConfigurationError.single(
            "TTB274",
            f"{summary}; {what} is not served yet with recurrent state vLLM's KV manager "
            "owns (MambaSpec groups)",
            hint=fix + " (docs/authors/generator-contract.md#recurrent-state)",
        )
    align = bool(cache.enable_prefix_caching)
    if align:
        _refuse_without_copy(plan, summary)
    block, page, mamba_page = align_state_pages(vllm_config, plan, kinds, align=align)
    groups = mamba_groups(len(kinds.recurrent_layers), len(kinds.attention_layers))
    plan.recurrent_owner = "vllm"
    blocks = (
        f'position-indexed blocks of {block} tokens each per request ("align" mode: '
        "block c holds the state after (c+1) x block tokens, copied on to the next block "
        "when a step crosses a boundary)"
        if align
        else 'one block each per request for its life ("none" mode)'
    )
    plan.decide(
        "recurrent_state",
        "vllm",
        "vLLM's MambaSpec groups",
        f"{kinds.describe()}; {capacity}; {groups} Mamba groups, {blocks}, a page of "
        f"{page:,} B (the state {mamba_page:,} B, padded to the attention block of {block} "
        "tokens); the generator reads each row's state by gdn_state_indices (decode) and "
        "empty_slots (prefill)",
    )
    if align:
        plan.decide(
            "prefix_caching",
            True,
            '"align"',
            f'vLLM\'s Mamba cache mode "align" (Mamba block {block} tokens, chunked '
            "prefill ending on block boundaries): a hit lands on a block boundary and "
            "restores the attention KV from vLLM's blocks and the gated delta net state "
            f"its cached Mamba block kept after exactly the hit's tokens ({COPY_STATE_METHOD} "
            "into the request's next block)",
        )


def _refuse_without_copy(plan: Plan, summary: str) -> None:
    """TTB274: prefix caching in "align" mode, but the class cannot copy a state from one
    Mamba block into another (a hit would continue a state never restored)."""
    from ttbundles.serving.planning.generator_class import load_generator_class

    cls = load_generator_class(plan.bundle)
    if callable(getattr(cls, COPY_STATE_METHOD, None)):
        return
    raise ConfigurationError.single(
        "TTB274",
        f"{summary}; prefix caching with recurrent state vLLM's KV manager owns (vLLM's "
        f'"align" mode) needs {plan.bundle.main_class}.{COPY_STATE_METHOD}(sources, '
        "targets), which it lacks: a prefix-cache hit would continue a state never "
        "restored",
        hint=f"give the class {COPY_STATE_METHOD}(sources, targets) (every recurrent "
        "layer's state sources[i] copied into targets[i]), or serve with "
        "--no-enable-prefix-caching, or drop capabilities.prefix_caching from the bundle "
        "(docs/authors/generator-contract.md#recurrent-state)",
    )


def align_state_pages(
    vllm_config: VllmConfig, plan: Plan, kinds: LayerKinds, *, align: bool = False
) -> tuple[int, int, int]:
    """vLLM's "none" mode (a Mamba block of the whole context) or, `align`, its "align"
    mode (a Mamba block of one attention block: the prefix cache), the attention block
    grown until its page holds one GDN layer's state, and the Mamba page padded to it,
    as vLLM's `update_block_size_for_backend` does for its own hybrids (it skips a
    plugin's model): `(block_size, page, mamba_page)`, the block's growth a decision."""
    assert kinds.state is not None
    cache = vllm_config.cache_config
    if align:
        cache.mamba_cache_mode = "align"
    else:
        settle_mamba_cache(vllm_config)
    conv, ssm = _state_dtype_bytes(vllm_config, plan)
    mamba_page = kinds.state.bytes_per_layer(conv, ssm)
    per_token = _attention_bytes_per_token(vllm_config, plan, kinds) // max(
        len(kinds.attention_layers), 1
    )
    old_block = cache.block_size
    block = aligned_block_size(old_block, mamba_page, per_token)
    if block != old_block:
        cache.block_size = plan.decide(
            "block_size",
            old_block,
            block,
            f"an attention page ({per_token:,} B a token) must hold a gated delta net "
            f"layer's state ({mamba_page:,} B), as vLLM's aligner grows it for its own "
            "hybrids",
        )
    if align:
        # vLLM's rule in "align" mode: the Mamba block is the (grown) attention block.
        cache.mamba_block_size = block
    page = block * per_token
    cache.mamba_page_size_padded = page if page != mamba_page else None
    return block, page, mamba_page


def aligned_block_size(block_size: int, mamba_page: int, attention_per_token: int) -> int:
    """The attention block (tokens) whose page holds a Mamba page: vLLM's
    `_align_hybrid_block_size` rule with the block asked as the alignment (no backend
    of vLLM's sets another here): the smallest multiple of it at least the state."""
    if attention_per_token <= 0:
        return block_size
    needed = -(-mamba_page // (block_size * attention_per_token)) * block_size
    return max(block_size, needed)


def mamba_groups(recurrent: int, attention: int) -> int:
    """How many Mamba groups vLLM's `get_kv_cache_groups` makes: layers bucketed by kind,
    a group the size of the smallest bucket (the largest where that is within 1.5x of
    it), each bucket dealt into groups of that size."""
    buckets = [n for n in (recurrent, attention) if n]
    size = min(buckets)
    if max(buckets) < 1.5 * size:
        size = max(buckets)
    return -(-recurrent // size)


def _plan_snapshots(vllm_config: VllmConfig, plan: Plan, summary: str) -> int:
    """How many snapshots back the prefix cache: the class's
    `recurrent_prefix_snapshots`, when prefix caching is on (the bundle declares it) and
    the class has the three methods; 0 otherwise (the refusal below says why)."""
    if not vllm_config.cache_config.enable_prefix_caching:
        return 0
    from ttbundles.serving.planning.generator_class import load_generator_class
    from ttbundles.serving.recurrent_prefix import SNAPSHOT_METHODS, SNAPSHOTS_KEY

    cls = load_generator_class(plan.bundle)
    capacity = (getattr(cls, "model_capabilities", None) or {}).get(SNAPSHOTS_KEY)
    if not isinstance(capacity, int) or isinstance(capacity, bool) or capacity <= 0:
        return 0
    missing = [m for m in SNAPSHOT_METHODS if not callable(getattr(cls, m, None))]
    if missing:
        raise ConfigurationError.single(
            "TTB274",
            f"{summary}; {plan.bundle.main_class} declares {SNAPSHOTS_KEY} but has no "
            f"{', '.join(missing)}",
            hint="give the class save_recurrent_prefix(slot) -> handle, "
            "restore_recurrent_prefix(slot, handle) -> bool and free_recurrent_prefix"
            "(handle), or drop the key (docs/authors/generator-contract.md#recurrent-state)",
        )
    return capacity


def _refuse_what_a_slot_cannot_follow(vllm_config: VllmConfig, plan: Plan, summary: str) -> None:
    """TTB274 for what the generator's state slots cannot serve yet: pooling,
    speculation, a prefix cache (asked for: the plan has turned it off otherwise)."""
    unserved = [
        (what, fix)
        for what, on, fix in (
            (
                "pooling",
                plan.pooling is not None,
                "serve it for generation (drop --runner pooling / --convert)",
            ),
            (
                "speculative decoding (a verify would advance the state over drafts that "
                "may be rejected)",
                vllm_config.speculative_config is not None,
                "drop --speculative-config",
            ),
            (
                "prefix caching without snapshots of the state (a hit would skip tokens "
                "whose state was never saved)",
                bool(vllm_config.cache_config.enable_prefix_caching)
                and not plan.recurrent_snapshots,
                "give the class recurrent_prefix_snapshots and save/restore/"
                "free_recurrent_prefix, or drop capabilities.prefix_caching from the "
                "bundle, or serve with --no-enable-prefix-caching",
            ),
            (
                "in-process data-parallel lanes (a lane's rows in the class's state slots "
                "are not driven or tested yet; one engine per submesh is)",
                plan.lanes > 1,
                "serve without lanes: a bundle of execution 'submesh' runs an engine per "
                "submesh with --data-parallel-size",
            ),
        )
        if on
    ]
    if unserved:
        what, fix = unserved[0]
        raise ConfigurationError.single(
            "TTB274",
            f"{summary}; {what} is not served yet with recurrent state the generator owns",
            hint=fix + " (docs/authors/generator-contract.md#recurrent-state)",
        )


def _check_declared_layers(kinds: LayerKinds, layers: Any, bundle: str) -> None:
    """TTB043: the declared layers are not the checkpoint's recurrent ones."""
    actual = kinds.recurrent_layers
    if layers == LAYERS_FROM_CONFIG:
        if actual:
            return
        listed = "from_config"
    elif tuple(sorted(layers)) == actual:
        return
    else:
        listed = ", ".join(str(i) for i in sorted(layers))
    found = ", ".join(str(i) for i in actual) or "none (every layer is attention)"
    raise ConfigurationError.single(
        "TTB043",
        f"{bundle} declares capabilities.recurrent_state.layers {listed}, but the "
        f"checkpoint's config gives recurrent state to layers {found} ({kinds.describe()})",
        hint='list the checkpoint\'s recurrent layers, or write "layers": "from_config"'
        if actual
        else "drop capabilities.recurrent_state: this checkpoint keeps no recurrent state",
    )


def _state_and_capacity(vllm_config: VllmConfig, plan: Plan, kinds: LayerKinds) -> str:
    """`state 10,752 B per request (1,344 B per recurrent layer); 8 requests hold 86,016 B;
    capacity 8 requests, 12,000 tokens of attention KV in 1,000,000 B`."""
    conv, ssm = _state_dtype_bytes(vllm_config, plan)
    per_request = kinds.state_bytes_per_request(conv, ssm)
    requests = vllm_config.scheduler_config.max_num_seqs
    if per_request is None:
        state = "state per request not computed for this family"
        held = None
    else:
        per_layer = per_request // len(kinds.recurrent_layers)
        held = requests * per_request
        state = (
            f"state {per_request:,} B per request ({per_layer:,} B per recurrent layer); "
            f"{requests} requests (max_num_seqs) hold {held:,} B"
        )
    per_token = _attention_bytes_per_token(vllm_config, plan, kinds)
    memory = getattr(vllm_config.cache_config, "kv_cache_memory_bytes", None)
    if per_token == 0:
        tokens = "no attention KV cache: the context is bounded by max_model_len only"
    elif memory and held is not None:
        left = max(memory - held, 0)
        tokens = (
            f"{left // per_token:,} tokens of attention KV in {memory:,} B "
            f"({per_token:,} B a token)"
        )
    else:
        tokens = f"tokens: the attention KV pool sized at start-up ({per_token:,} B a token)"
    return f"{state}; capacity {requests} requests, {tokens}"


def _state_dtype_bytes(vllm_config: VllmConfig, plan: Plan) -> tuple[int, int]:
    """The element sizes of the conv and the recurrent state: the host mesh computes in
    float32; elsewhere vLLM's rule (the model dtype, a set `mamba_ssm_cache_dtype` or the
    checkpoint's `mamba_ssm_dtype` for the recurrent part)."""
    if is_host(plan.mesh):
        return 4, 4
    model = vllm_config.model_config
    conv = _DTYPE_BYTES.get(str(model.dtype).removeprefix("torch."), 2)
    cache = vllm_config.cache_config
    ssm_name = getattr(cache, "mamba_ssm_cache_dtype", "auto")
    if ssm_name == "auto":
        ssm_name = str(getattr(model.hf_config, "mamba_ssm_dtype", None) or "auto")
    return conv, _DTYPE_BYTES.get(ssm_name, conv)


def _attention_bytes_per_token(vllm_config: VllmConfig, plan: Plan, kinds: LayerKinds) -> int:
    """K and V of every attention layer for one token, as vLLM's KV spec counts them."""
    config = vllm_config.model_config.hf_config
    config = getattr(config, "text_config", None) or config
    heads = int(getattr(config, "num_attention_heads", 0) or 0)
    kv_heads = int(getattr(config, "num_key_value_heads", 0) or heads)
    head_dim = getattr(config, "head_dim", None) or (
        int(getattr(config, "hidden_size", 0) or 0) // heads if heads else 0
    )
    # vLLM sizes its pool by the spec's dtype (the model's), on the host mesh too (the
    # reference keeps float32 beside it): the tokens said are the ones vLLM will admit.
    element = _DTYPE_BYTES.get(str(vllm_config.model_config.dtype).removeprefix("torch."), 2)
    return len(kinds.attention_layers) * 2 * kv_heads * int(head_dim) * element
