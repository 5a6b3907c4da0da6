"""`ttbundle init --reference`: a bundle that runs on a CPU from the first command.

Its adapter builds on the project's torch reference generator for the architecture's
family (`ttbundles.reference.generator`), as the demo bundle's does, so the new bundle
validates strictly, packs, passes `ttbundle test` and serves with `vllm serve` on the host
mesh (MESH_DEVICE=HOST) before any TT-NN code exists. The author then replaces it method
by method: each method says what it must return, and the class docstring says in which
order to replace them. The plain template (`init.adapter_source`) stays for TT-NN work
started from nothing.

Every contract method is spelled out and forwards to the reference, because `ttbundle
validate` reads the adapter without importing it and cannot see into ttbundles: spelled
out, the whole contract and the capabilities are in the bundle's own source.

Pure text; neither torch nor vLLM is imported here (the family list is checked against
`ttbundles.reference.families.SUPPORTED_ARCHITECTURES` by a test).
"""

from __future__ import annotations

from ttbundles.check.reference_archs import (
    GEMMA4_ARCHITECTURES,
    QWEN3_5_ARCHITECTURES,
    TEXT_ARCHITECTURES,
)
from ttbundles.format import capabilities as catalogue

# The Hugging Face architectures whose checkpoints the reference generator reads, with
# the class an adapter builds on (module, class).
REFERENCE_BASES: dict[str, tuple[str, str]] = {
    **{
        arch: ("ttbundles.reference.generator", "ReferenceLlamaGenerator")
        for arch in TEXT_ARCHITECTURES
    },
    **{
        arch: ("ttbundles.reference.qwen3_5", "ReferenceQwen3_5Generator")
        for arch in QWEN3_5_ARCHITECTURES
    },
    **{
        arch: ("ttbundles.reference.gemma4", "ReferenceGemma4Generator")
        for arch in GEMMA4_ARCHITECTURES
    },
}

# Families whose layers keep a recurrent state: their reference bundles name only the
# attention layers to vLLM (get_kv_cache_spec). Owned by the generator (the default), the
# adapter spells out the state's lifecycle (a slot per request) and caches prefixes
# through snapshots of it; owned by vLLM's KV manager (MambaSpec groups), it builds on the
# reference's vLLM-owned class (`VLLM_OWNED_BASES`).
RECURRENT_FAMILIES = frozenset(QWEN3_5_ARCHITECTURES)
RECURRENT_OWNERS = ("generator", "vllm")
"""Who keeps a recurrent family's state in an `init --reference` bundle (`--recurrent-owner`):
the first is the default."""
VLLM_OWNED_BASES: dict[str, tuple[str, str]] = {
    arch: ("ttbundles.reference.qwen3_5", "ReferenceQwen3_5VllmStateGenerator")
    for arch in QWEN3_5_ARCHITECTURES
}
"""The reference class of each recurrent family whose state vLLM's KV manager owns."""

# Families whose every checkpoint has sliding-window layers beside global ones: their
# reference bundles declare KV groups even when init reads no config.json.
HYBRID_FAMILIES = frozenset({"Gemma3ForCausalLM", *GEMMA4_ARCHITECTURES})

# Families whose reference has no speculation: Gemma 4's verify and drafter would read
# one KV shape, and its layers have several.
UNSPECULATIVE_FAMILIES = frozenset(GEMMA4_ARCHITECTURES)

# What the reference generator implements (the catalogue's `reference` facts): the
# bundle declares all of it (the class's model_capabilities below say the same, so
# validate finds them in agreement).
REFERENCE_CAPABILITIES: dict = catalogue.REFERENCE


def reference_capabilities(arch: str, owner: str = RECURRENT_OWNERS[0]) -> dict:
    """What a reference bundle for `arch` declares: the reference's capabilities; a
    recurrent family has no speculation (a verify would advance the state over drafts
    that may be rejected), and its state is `owner`'s: the generator's class keeps a slot
    per request and caches prefixes through snapshots of it; vLLM's (MambaSpec groups)
    caches them in vLLM's "align" mode (the class copies a state between Mamba blocks:
    `copy_recurrent_state`). Gemma 4's has no speculation either."""
    if arch in RECURRENT_FAMILIES:
        dropped = _NOT_RECURRENT
        return {
            **{k: v for k, v in REFERENCE_CAPABILITIES.items() if k not in dropped},
            "recurrent_state": {"owner": owner, "layers": "from_config"},
        }
    if arch in UNSPECULATIVE_FAMILIES:
        return {k: v for k, v in REFERENCE_CAPABILITIES.items() if k not in _NOT_RECURRENT}
    return dict(REFERENCE_CAPABILITIES)


_NOT_RECURRENT = frozenset({"spec_decode", "async_spec_decode", "spec_plan"})


def _reference_keys(arch: str, owner: str = RECURRENT_OWNERS[0]) -> str:
    """The template's model_capabilities lines of `reference_capabilities(arch, owner)`."""
    on = reference_capabilities(arch, owner)
    snapshots = (
        '        "recurrent_prefix_snapshots": 64,  # prefix-cache snapshots of the state\n'
        if arch in RECURRENT_FAMILIES and owner == "generator"
        else ""
    )
    return snapshots + "".join(
        f'        "{c.class_key}": "{owner}",\n'
        if c.name == "recurrent_state"
        else f'        "{c.class_key}": True,\n'
        for c in catalogue.CAPABILITIES
        if c.class_key and c.name in on
    )


# The reference returns the final hidden states from prefill when asked (the pooling form
# `prefill_hidden`): vLLM's pooler finishes on the host. A decoder checkpoint serves
# embeddings (`--runner pooling --convert embed`, or a sentence-transformers one such as
# Qwen3-Embedding), a sequence-classification one its classifier (/classify, /score,
# /rerank). Pooling needs schema_version 5.


def reference_pooling(arch: str) -> dict:
    """What a reference bundle for `arch` declares of pooling."""
    tasks = ["classify"] if arch.endswith("ForSequenceClassification") else ["embed", "token_embed"]
    return {"tasks": tasks, "form": "prefill_hidden"}


# The host mesh's target without a checkpoint to read (`init --arch` alone): a small
# context keeps a CPU run quick. Add a target per Tenstorrent mesh as the TT-NN code comes.
REFERENCE_TARGETS: dict = {"HOST": {"max_model_len": 512, "max_num_seqs": 32}}


def reference_targets(config: dict) -> tuple[dict, str]:
    """The targets of a reference bundle for the checkpoint `config` (its config.json)
    and the note that says where the host mesh's `max_model_len` comes from: the
    checkpoint's own length (`max_position_embeddings`, of its text config where it
    nests one), since the reference computes any context the checkpoint has and a
    smaller cap would lower every longer `--max-model-len` (TTB246); 512 only when the
    checkpoint is not read or states no length, and the note says so."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else None
    length = (text or {}).get("max_position_embeddings") or config.get("max_position_embeddings")
    host = dict(REFERENCE_TARGETS["HOST"])
    if isinstance(length, int) and not isinstance(length, bool) and length > 0:
        host["max_model_len"] = length
        return {"HOST": host}, (
            f"targets.HOST.max_model_len is {length:,}, the checkpoint's own "
            "(max_position_embeddings); lower it in vllm_metadata.json to cap the host mesh"
        )
    why = "no checkpoint was read (--arch alone)" if not config else "config.json states none"
    return {"HOST": host}, (
        f"targets.HOST.max_model_len is {host['max_model_len']}: {why}; set it to the "
        "checkpoint's length in vllm_metadata.json"
    )


_TEMPLATE = '''"""{class_name}: {arch} for vLLM on Tenstorrent hardware, starting from the torch
reference generator ({base_module}.{base}).

As written, every method forwards to the reference, so this bundle runs on a CPU at once:

    ttbundle validate --strict {folder}
    ttbundle test {folder} --model CHECKPOINT
    MESH_DEVICE=HOST EXTRA_MODELS_DIR=<folder holding {folder}> vllm serve CHECKPOINT

Replace it with TT-NN code one method at a time, running `ttbundle test` after each (it
compares logits with the golden, per prompt and step). Each method marked "TT-NN:" says
what it must return. A good order: initialize_vllm_model (load weights to the mesh) and
allocate_kv_cache, then prefill_forward, then decode_forward with its readback
(read_decode_output, process_decode_output_host), then the warm-ups (compile and capture
traces). When no method calls `super()` any more, drop the base class. Turn a capability
off here and in vllm_metadata.json together while your code lacks it; add a target per
mesh in vllm_metadata.json ("targets") as it runs there.

The shapes and the contract: {base_module} and ttbundles/format/contract.py.
"""

from __future__ import annotations

from typing import Any

from {base_module} import {base}


class {class_name}({base}):
    """{arch} generator; today the torch reference, see the module docstring."""

    # TT-Metal reads this dict from the class; keep it equal to "capabilities" in
    # vllm_metadata.json (ttbundle validate compares them).
    model_capabilities = {{
{reference_keys}        "supports_device_penalties": True,
        "max_device_logprobs": 20,
        # The reference masks keys older than the checkpoint's sliding window (Mistral,
        # Qwen2/Qwen3 use_sliding_window, Gemma 3's local layers). Keep this only while
        # your code does too: without it a window shorter than max_model_len is refused
        # at configuration (TTB250).
        "supports_sliding_window": True,
    }}
    # The decode input-update contract v1: decode_forward takes the four keyword-only
    # commands (reload_inputs, ...), saying what to restage on the device.
    decode_input_update_contract = 1

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> {class_name}:
        """TT-NN: load the checkpoint (hf_config._name_or_path) onto mesh_device; return
        the generator."""
        return super().initialize_vllm_model(
            hf_config=hf_config,
            mesh_device=mesh_device,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            n_layers=n_layers,
            tt_data_parallel=tt_data_parallel,
            optimizations=optimizations,
        )

    @classmethod
    def spec_plan(cls, vllm_config: Any, max_num_seqs: int, requested_k: int) -> Any:
        """TT-NN: what speculative decoding with `requested_k` n-gram drafts costs and
        how the verify answers (ttbundles.format.speculative.SpecPlan), or a SpecReject
        saying why not; the reference verifies up to 8 drafts, greedily or by logits.
        While your decode_forward cannot verify, drop spec_decode, spec_plan and
        async_spec_decode from vllm_metadata.json and supports_spec_decode here."""
        return super().spec_plan(vllm_config, max_num_seqs, requested_k)

    def allocate_kv_cache(self, kv_cache_shape: Any, dtype: Any, num_layers: int) -> Any:
        """TT-NN: the paged KV cache on the device, per layer [k_cache, v_cache]."""
        return super().allocate_kv_cache(
            kv_cache_shape=kv_cache_shape, dtype=dtype, num_layers=num_layers
        )

    def allocate_kv_cache_per_layer(self, per_layer_specs: Any) -> Any:
        """TT-NN: the same, from one (kv_cache_shape, dtype, tensor_idx) per layer; layers
        with one tensor_idx share one allocation. The worker calls this one, not
        allocate_kv_cache, when the class has it.{per_layer_note}"""
        return super().allocate_kv_cache_per_layer(per_layer_specs=per_layer_specs)
{kv_spec}
    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Any,
        empty_slots: Any = None,
        enable_trace: bool = True,
        sampling_params: Any = None,
        start_pos: Any = None,
        return_prompt_logits: bool = False,
        **kwargs: Any,
    ) -> Any:
        """TT-NN: fill the KV cache for the prompts; return the last token's logits
        [B, 1, V] (or sampled tokens with sampling_params). With return_prompt_logits
        (a request's prompt_logprobs): the logits at every prompt position too. With
        return_hidden_states=True (in kwargs; a pooling server): the final hidden states
        after the last norm, [B, L, hidden], which vLLM's pooler finishes on the host."""
        return super().prefill_forward(
            tokens=tokens,
            page_table=page_table,
            kv_cache=kv_cache,
            prompt_lens=prompt_lens,
            empty_slots=empty_slots,
            enable_trace=enable_trace,
            sampling_params=sampling_params,
            start_pos=start_pos,
            return_prompt_logits=return_prompt_logits,
            **kwargs,
        )

    def decode_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any = None,
        kv_cache: Any = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: Any = None,
        prompt_tokens: Any = None,
        output_tokens: Any = None,
        slot_remap: Any = None,
{state_indices_param}        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        num_valid_drafts: Any = None,
        accepted_counts: Any = None,
        spec_mode: str | None = None,
        **kwargs: Any,
    ) -> Any:
        """TT-NN: one decode step for the batch; return the device output that
        read_decode_output reads back. With spec_mode (speculative decoding, n-gram
        drafts from vLLM): the verify of each row's drafts (num_valid_drafts), as
        spec_plan planned it; accepted_counts: what the last verify committed.{decode_note}"""
        return super().decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slot_remap=slot_remap,
{state_indices_pass}            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            num_valid_drafts=num_valid_drafts,
            accepted_counts=accepted_counts,
            spec_mode=spec_mode,
            **kwargs,
        )

    def read_decode_output(self, out: Any, async_read: bool = False) -> Any:
        """TT-NN: start copying decode_forward's output to the host."""
        return super().read_decode_output(out, async_read=async_read)

    def process_decode_output_host(self, host_out: Any, is_tokens: bool = False) -> Any:
        """TT-NN: the copied output as logits [B, 1, V] or tokens [B]."""
        return super().process_decode_output_host(host_out, is_tokens=is_tokens)

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        """TT-NN: compile and capture the prefill traces (nothing to do on the host)."""

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        """TT-NN: compile and capture the decode traces (nothing to do on the host)."""
'''


_KV_SPEC = '''
    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> Any:
        """Each layer's KV cache for vLLM, keyed model.layers.<i>.self_attn: a
        SlidingWindowSpec for the checkpoint's sliding layers (they keep their window
        and the tokens in flight), None (full attention) for the others. Keep it while your
        attention masks the window and reads each layer's page_tables_per_layer entry
        (its KV group's table); capabilities.kv_cache_spec in vllm_metadata.json says so."""
        return super().get_kv_cache_spec(vllm_config)
'''


_RECURRENT = '''
    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> Any:
        """The KV layers for vLLM, keyed model.layers.<i>.self_attn: a FullAttentionSpec
        for each full-attention layer and no entry for a gated delta net layer, whose
        recurrent state this class keeps itself (one slot per user, max_batch_size)."""
        return super().get_kv_cache_spec(vllm_config)

    def release_request(self, slot: int | None) -> None:
        """TT-NN: zero (free) a finished or preempted request's recurrent-state slot."""
        super().release_request(slot)

    def note_state_slots_moved(self, moves: Any) -> None:
        """TT-NN: {old: new} slots: settle the moves the last decode's slot_remap made,
        or move the recurrent states so."""
        super().note_state_slots_moved(moves)
'''


_VLLM_OWNED = '''
    @classmethod
    def get_kv_cache_spec(cls, vllm_config: Any) -> Any:
        """The attention layers for vLLM, keyed model.layers.<i>.self_attn: a
        FullAttentionSpec each; the worker adds a MambaSpec for each gated delta net
        layer, whose recurrent state vLLM's KV manager owns (capabilities.recurrent_state
        owner "vllm" in vllm_metadata.json)."""
        return super().get_kv_cache_spec(vllm_config)

    def copy_recurrent_state(self, sources: Any, targets: Any) -> None:
        """TT-NN: every gated delta net layer's state sources[i] copied into
        targets[i] (conv and recurrent, on the device, in order with the steps). With
        the prefix cache on (vLLM's "align" mode) the worker calls it before a step
        whose rows cross a Mamba block boundary, so each cached block keeps the state
        after exactly its tokens, which a prefix-cache hit continues."""
        return super().copy_recurrent_state(sources, targets)
'''

_VLLM_OWNED_PER_LAYER = """
        A gated delta net layer's entry is its state's descriptor, {"type": "mamba",
        "shapes", "dtypes", "tensor_idx", "compact_slots"}: allocate [conv, recurrent]
        with compact_slots states each, in those shapes and dtypes (one per batch slot;
        one per block id of vLLM's pool with the prefix cache on, its "align" mode)."""
_VLLM_OWNED_DECODE = """
        gdn_state_indices (int32, one per row; recurrent state vLLM's KV manager owns):
        the state among each gated delta net layer's compact_slots that row i continues
        (and writes: with the prefix cache on, the row's Mamba block for this step)."""


def reference_adapter_source(
    arch: str,
    class_name: str,
    folder: str,
    *,
    kv_groups: bool = False,
    recurrent_owner: str = RECURRENT_OWNERS[0],
) -> str:
    """The adapter of an `init --reference` bundle for `arch` (a key of REFERENCE_BASES);
    `kv_groups`: the checkpoint has a sliding window, and the adapter answers
    get_kv_cache_spec (its metadata declares capabilities.kv_cache_spec);
    `recurrent_owner`: who keeps a recurrent family's state (`RECURRENT_OWNERS`): vLLM's
    KV manager's builds on the reference's vLLM-owned class, whose decode reads each
    row's state by gdn_state_indices."""
    vllm_owned = arch in RECURRENT_FAMILIES and recurrent_owner == "vllm"
    base_module, base = (VLLM_OWNED_BASES if vllm_owned else REFERENCE_BASES)[arch]
    if vllm_owned:
        kv_spec = _VLLM_OWNED
    else:
        kv_spec = _RECURRENT if arch in RECURRENT_FAMILIES else _KV_SPEC if kv_groups else ""
    return _TEMPLATE.format(
        arch=arch,
        class_name=class_name,
        base_module=base_module,
        base=base,
        folder=folder,
        kv_spec=kv_spec,
        reference_keys=_reference_keys(arch, recurrent_owner),
        per_layer_note=_VLLM_OWNED_PER_LAYER if vllm_owned else "",
        decode_note=_VLLM_OWNED_DECODE if vllm_owned else "",
        state_indices_param="        gdn_state_indices: Any = None,\n" if vllm_owned else "",
        state_indices_pass=(
            "            gdn_state_indices=gdn_state_indices,\n" if vllm_owned else ""
        ),
    )
