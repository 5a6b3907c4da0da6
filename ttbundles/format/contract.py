"""The generator contract, as TT-Metal ships it: one description, in code.

A bundle's main class is a TT-Metal *generator* (`models/tt_transformers/tt/generator.py`
and the `generator_vllm.py` adapters), not a vLLM `nn.Module`. This module says, once,
what the worker calls on it, with which keywords, and what each call returns; the model
runner binds its calls from it, the static adapter check and `validate --import` check
bundles against it, `ttbundle init` writes its template from it, and the tests' contract
twins follow it. Pure Python (no torch, no vLLM), so generators can import the data types
without pulling in the serving stack.

Two forms of the decode call exist (TT-Metal `models/common/decode_contract.py`):

- **legacy** (no `decode_input_update_contract`, or 0): `decode_forward(...,
  reset_batch=...)`; the generator decides itself what to restage.
- **decode input-update contract v1** (`decode_input_update_contract = 1`): four
  keyword commands on every decode (`reload_inputs`, `reload_page_table`,
  `reload_sampling_params`, `reset_sampling_state`) plus `slot_remap`; `reset_batch` is
  rejected by such classes.

Return forms the worker accepts (tuples are TT-Metal's current forms; bare tensors are
what older generators return):

- `prefill_forward`: logits `[B, 1, V]`; `(tokens [B, 1], log_probs)` when it sampled on
  the device; `(logits, rope_deltas)` for the Qwen vision-language classes.
- `decode_forward(read_from_device=True)` and `process_decode_output_host`:
  `(tokens_or_logits, log_probs)`, where `log_probs` is None, a flat `[B]` tensor (the
  sampled token's), or `(top_logprobs [B, K], top_token_ids [B, K])`.
- `read_decode_output(out, async_read=True)`: `(host_out, events)`; each event is waited
  on (`ttnn.event_synchronize`) before `process_decode_output_host`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from ttbundles.format import capabilities as catalogue

# --- versions of the decode call -----------------------------------------------------

CONTRACT_MARKER = "decode_input_update_contract"
"""Class attribute a v1 generator declares (`= 1`)."""
CONTRACT_V1 = 1
LEGACY_RESET_KEYWORD = "reset_batch"
DECODE_COMMANDS = (
    "reload_inputs",
    "reload_page_table",
    "reload_sampling_params",
    "reset_sampling_state",
)
"""The v1 commands, sent explicitly on every decode of a v1 generator."""
SLOT_REMAP_KEYWORD = "slot_remap"
STATE_INDICES_KEYWORD = "gdn_state_indices"
"""Each decode row's recurrent state among a layer's compact states (int32, row order),
sent where vLLM's KV manager owns the state (MambaSpec groups)."""
COPY_STATE_METHOD = "copy_recurrent_state"
"""`copy_recurrent_state(sources, targets)`: every recurrent layer's state at index
`sources[i]` copied into `targets[i]`, before the step that continues it. Called where
vLLM's KV manager owns the state in its "align" mode (the prefix cache), when a step
crosses a Mamba block boundary; a class declaring that form and prefix caching needs it."""


def contract_version(generator_cls: type) -> int:
    """0 (legacy `reset_batch`) or 1 (the decode input-update contract)."""
    value = getattr(generator_cls, CONTRACT_MARKER, 0)
    return CONTRACT_V1 if isinstance(value, int) and value >= CONTRACT_V1 else 0


# --- capabilities --------------------------------------------------------------------

CAPABILITIES_ATTRIBUTE = "model_capabilities"
CAPABILITY_KEYS: dict[str, str] = catalogue.TT_METAL_KEYS
"""TT-Metal `model_capabilities` keys that a bundle's `capabilities` mirror (from the
catalogue, `format.capabilities`). TT-Metal's rule: a subclass dict replaces the inherited
one, so an absent key means "not supported"."""
RECURRENT_STATE_KEY = catalogue.BY_NAME["recurrent_state"].class_key
"""ttbundles' own key (TT-Metal's Qwen3.5/3.6 classes keep GDN state without one): who
keeps the recurrent state of the class's recurrent layers, "generator" (a state slot per
request, sized by the batch) or "vllm" (MambaSpec groups in vLLM's KV manager), as the
bundle's capabilities.recurrent_state.owner says."""
TT_METAL_FLAGS: dict[str, str] = {
    key: name
    for key, name in CAPABILITY_KEYS.items()
    if catalogue.BY_NAME[name].key_from == "tt_metal"
}
"""TT-Metal's own flags among them (`supports_*`: True or False), which the template
lists and a legacy class's capabilities are read from; ttbundles' keys are no flags."""
DEVICE_PENALTIES_KEY = "supports_device_penalties"
"""The generator applies presence/frequency/repetition penalties on the device, from the
`prompt_tokens` / `output_tokens` history the worker passes. Absent means True (the
reference plugin's default, kept for classes that predate the key: vllm-tt-plugin
`docs/MODEL_CAPABILITIES.md`); the worker also needs decode to take that history."""
DEVICE_PENALTIES_DEFAULT = True
DEVICE_SAMPLING_PENALTIES_KEY = "supports_device_sampling_penalties"
"""The autoports' spelling of `supports_device_penalties` (the Gemma 4 31B autoport's):
read where that key is absent, with the same meaning."""
SAMPLE_POLICY_KEY = "sample_on_device_policy"
"""A `model_capabilities` key (and class attribute) of the autoports: "greedy_only" means
the device sampler draws greedy tokens only (a sampled request raises inside prefill and
decode), so a stochastic request samples on the host. No other value is used by a class
read (`format.contract_keys.SOURCES`)."""
GREEDY_ONLY_POLICY = "greedy_only"
MAX_DEVICE_TOP_K_KEY = "max_device_top_k"
"""The largest top-k the device sampler draws from (TT's sampler keeps a fixed top-32
candidate set; `format_sampling_params` clamps above it). A row with temperature > 0 and
`top_k < 1` (no cut) or `top_k > K` samples on the host; greedy rows are not bounded.
Absent (None): no bound (vllm-tt-plugin `check_perform_device_sampling`)."""
MAX_DEVICE_LOGPROBS_KEY = "max_device_logprobs"
"""ttbundles' own key (TT-Metal has none: the reference plugin keys top-K device log-probs
on the GPT-OSS class): how many top log-probabilities the device returns per row, as
`(top_logprobs [B, K], top_token_ids [B, K])`. Absent or 0: log-prob requests sample on
the host. The torch reference generator declares it."""
DEVICE_GRAMMAR_KEY = "supports_device_grammar"
SPLIT_SAMPLER_METHOD = "sample_decode_on_device"
"""TT-Metal's shared `Generator` samples apart from the forward; its device grammar takes
the bitmask there at run time (not driven yet: such classes' structured batches sample on
the host)."""
"""The device sampler applies vLLM's packed structured-output bitmask before it selects a
decode token (the reference plugin's key; its `docs/MODEL_CAPABILITIES.md`): the worker
sends it as `GRAMMAR_BITMASK_KEYWORD` to `decode_forward`, so a structured-output decode
samples on the device and keeps asynchronous decode. As the plugin's first contract it
covers decode only: a structured prefill, and a structured request that asks for
log-probabilities, sample on the host. Absent or False: structured batches sample on the
host."""
GRAMMAR_BITMASK_KEYWORD = "grammar_bitmask"
"""The `decode_forward` keyword of a class declaring `supports_device_grammar` (TT-Metal's
name for the packed mask): `[B, ceil(V / 32)]` int32, one row per batch slot, bit t of
word t // 32 set where token t is allowed; rows without a grammar are all ones (-1).
Sent only on a structured-output decode; absent on every other call."""
OUTPUT_TOKENS_PER_STEP_KEY = "output_tokens_per_step"
"""Block-output models return k > 1 tokens per row from one device-sampling decode
(`[B, k]`, log-probs `[B, k, K]`). Served (`serving.planning.block_output`): the block
reaches vLLM as one step's output, which cuts it at the first stop; synchronous decode on
the device sampler only (TTB275 otherwise). Default 1."""
REQUIRED_BLOCK_SIZE_KEY = "required_block_size"
"""The KV block size the class's cache layout needs (the executor-based Llama3 generator
in `models/common/models`); another `--block-size` is refused at load (TTB063)."""

# --- speculative decoding (the reference plugin's docs/SPEC_DECODE_CONTRACT.md) ---------

SPEC_DECODE_KEY = "supports_spec_decode"
"""The master gate: absent or False, the class serves no speculative configuration."""
ASYNC_SPEC_DECODE_KEY = "supports_async_spec_decode"
"""Verification output and any hidden handle stay valid through a deferred readback, so
speculation may run with asynchronous scheduling."""
SPEC_REQUIREMENTS_KEY = "spec_requirements"
SPEC_HIDDEN_HANDOFF_KEY = "spec_hidden_handoff"
SPEC_KEYS: dict[str, str] = catalogue.PLUGIN_KEYS
"""The plugin's speculative `model_capabilities` keys and the bundle capability mirroring
each (schema 3; from the catalogue). `spec_decode` is a list of methods where the class has
a flag, as `sample_on_device` lists modes where the class has `supports_sample_on_device`."""
SPEC_LIST_KEYS = (SPEC_REQUIREMENTS_KEY, SPEC_HIDDEN_HANDOFF_KEY)
SPEC_METHODS = catalogue.BY_NAME["spec_decode"].choices
"""vLLM's speculative methods a bundle may serve: `ngram` drafts on the host and asks the
model for nothing; `custom_class` is the model's own drafter (`propose_draft_tokens`),
selected by vLLM's custom-proposer method with the marker below as its `model`."""
SPEC_METHOD_REQUIREMENTS: dict[str, tuple[str, ...]] = {
    "ngram": (),
    "custom_class": ("device_propose",),
}
"""What each method needs of the model's `spec_requirements` (the plugin owns this map, so
a model never names a vLLM method in its class)."""
MODEL_OWNED_DRAFTER = "vllm_tt_plugin.model_owned_drafter"
"""The `speculative_config.model` of a `custom_class` launch: a marker, never imported."""
SPEC_REQUIREMENTS = ("device_propose", "hidden_feed", "drafter_scores", "paged_drafter_cache")
SPEC_HANDOFFS = ("on_device", "roundtrip")
SPEC_ACCEPT_MODES = ("argmax_ids", "logits", "fused_sample")
"""What a verify may return (`SpecPlan.accept_modes`); the reference runner executes
`argmax_ids` only, so a plan must include it."""
SPEC_DRAFTER_STATES = ("none", "dense", "paged")
"""Where a drafter's own state lives (`SpecPlan.drafter_state`); `paged` needs a
scheduler-owned drafter cache the reference plugin does not allocate."""
VERIFY_KEYWORDS = ("num_valid_drafts", "accepted_counts", "spec_mode")
"""What a verify adds to `decode_forward`: it is the same call with `tokens` and
`start_pos` `[B, 1+K]` wide and these three keywords, answered with a `VerifyOutput`."""

# --- prompt logprobs (ttbundles' own: TT-Metal's prefill returns the last position) ------

PROMPT_LOGITS_KEYWORD = "return_prompt_logits"
"""Passed as True to `prefill_forward` of a bundle declaring `prompt_logprobs`, on a step
where a request asks for prompt logprobs (with no `sampling_params`: that step samples
on the host). The call then returns logits of every position of each row's chunk,
`[B, L, V]` with L the longest chunk: column j of row b is the distribution after its
token `start_pos[b] + j` (the last real column predicts the next token, as `[B, 1, V]`
would); vLLM's prompt-logprobs processing does the rest on the host."""

# --- pooling (schema 5: vLLM's --runner pooling) -----------------------------------------

POOLING_TASKS = catalogue.POOLING_TASKS
"""vLLM 0.34's pooling tasks a bundle may serve (`vllm.tasks.PoolingTask`, less
token_classify), one record each in `format.capabilities.POOLING`."""
POOLING_FORMS = ("forward", "prefill_hidden")
"""The two pooling forms of the contract. `forward`: the reference plugin's
(`TTPoolingModelRunner`): `forward(input_ids, attention_mask)` on a right-padded batch,
one pooled row per prompt, no KV cache, no prefill or decode. `prefill_hidden`: the
generation contract whose `prefill_forward` returns hidden states when asked
(`HIDDEN_STATES_KEYWORD`), so vLLM's own pooler (last token, mean, CLS, normalisation,
the classifier head) finishes on the host."""
# Every key, keyword and class attribute with what the worker does with it (and
# `KNOWN_CAPABILITY_KEYS`, what `validate -v` calls known): `format.contract_keys`.

FALLBACK_MAX_TOKENS_ALL_USERS = 131_072
"""TT-Metal's KV budget when a generator has no model-specific one."""


# --- the methods ---------------------------------------------------------------------


@dataclass(frozen=True)
class Method:
    """One method of the contract and the keywords the worker may pass to it.

    `passes`: every keyword the worker can supply (it passes those the signature accepts,
    all of them to a `**kwargs` method, or what the method it forwards `**kwargs` to
    accepts: `format.forwarding`); `aliases`: other names TT-Metal classes use for
    the same value (the legacy Llama-2-70B generator names the mesh `t3k_mesh_device`).
    `group`: methods of one group are alternatives (one of them is required).
    `needs`: the declared capability that makes the method required.
    `leading`: how many leading arguments the worker passes by position (the device
    output handed back to the readback methods, whatever the class calls it).
    """

    name: str
    kind: Literal["classmethod", "method"]
    passes: tuple[str, ...]
    returns: str
    required: bool = True
    group: str | None = None
    needs: str | None = None
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)
    leading: int = 0


INITIALIZE = Method(
    "initialize_vllm_model",
    "classmethod",
    (
        "hf_config",
        "mesh_device",
        "max_batch_size",
        "max_seq_len",
        "tt_data_parallel",
        "optimizations",
    ),
    "the generator instance",
    aliases={"mesh_device": ("t3k_mesh_device",)},
)
MAX_TOKENS = Method(
    "get_max_tokens_all_users",
    "classmethod",
    ("model_name", "num_devices", "tt_data_parallel", "max_model_len", "max_num_seqs"),
    "the KV cache capacity in tokens, over all users",
    required=False,
)
ALLOCATE_KV_CACHE = Method(
    "allocate_kv_cache",
    "method",
    ("kv_cache_shape", "dtype", "num_layers"),
    "the KV cache; kv_cache_shape = (num_blocks, num_kv_heads, block_size, head_size)",
    group="kv_cache",
)
ALLOCATE_KV_CACHE_PER_LAYER = Method(
    "allocate_kv_cache_per_layer",
    "method",
    ("per_layer_specs",),
    "the KV cache; per_layer_specs = [(kv_cache_shape, dtype, tensor_idx), ...], one per "
    "layer; layers with the same tensor_idx share one allocation (vLLM's KV groups overlay "
    "one block pool)",
    group="kv_cache",
)
KV_CACHE_SPEC = Method(
    "get_kv_cache_spec",
    "classmethod",
    ("vllm_config",),
    "{'model.layers.<i>.self_attn': vLLM KVCacheSpec or None (full attention)}, or None "
    "(every layer full attention)",
    required=False,
    needs="kv_cache_spec",
)
"""`get_kv_cache_spec(vllm_config)`, asked by the worker before the KV cache is sized
(`serving.runner.kv.groups`): sliding-window layers answer vLLM's `SlidingWindowSpec`, and on
vLLM's hybrid KV-cache manager keep their window and the tokens in flight
(`serving.planning.kv_capacity`)."""
PREFILL = Method(
    "prefill_forward",
    "method",
    (
        "tokens",
        "page_table",
        "kv_cache",
        "prompt_lens",
        "empty_slots",
        "enable_trace",
        "sampling_params",
        "start_pos",
        "page_tables_per_layer",
    ),
    "logits [B, 1, V]; (tokens, log_probs) when sampling on the device; "
    "(logits, rope_deltas) for vision-language classes",
)
DECODE = Method(
    "decode_forward",
    "method",
    (
        "tokens",
        "start_pos",
        "page_table",
        "kv_cache",
        "enable_trace",
        "read_from_device",
        "sampling_params",
        "prompt_tokens",
        "output_tokens",
        SLOT_REMAP_KEYWORD,
        STATE_INDICES_KEYWORD,
        "rope_deltas_all_users",
        "page_tables_per_layer",
        LEGACY_RESET_KEYWORD,
        *DECODE_COMMANDS,
    ),
    "(tokens_or_logits, log_probs) with read_from_device=True, else a device output",
)
READ_DECODE_OUTPUT = Method(
    "read_decode_output",
    "method",
    ("async_read",),
    "(host_out, events) with async_read=True",
    needs="async_decode",
    leading=1,
)
PROCESS_DECODE_OUTPUT = Method(
    "process_decode_output_host",
    "method",
    ("is_tokens",),
    "(tokens_or_logits, log_probs)",
    needs="async_decode",
    leading=1,
)

SPEC_PLAN = Method(
    "spec_plan",
    "classmethod",
    (),
    "a SpecPlan (effective_k, accept_modes, extra_bytes_per_seq, extra_bytes_per_token, "
    "drafter_state, ...) or a SpecReject (reason, supported_k)",
    required=False,
    needs="spec_plan",
    leading=3,
)
"""`spec_plan(vllm_config, max_num_seqs, requested_k)`, called once per process at
configuration, positionally (the names are not part of the contract), before any instance
exists; it must not raise."""
PROPOSE_DRAFT_TOKENS = Method(
    "propose_draft_tokens",
    "method",
    ("hidden",),
    "a DraftOutput: draft_token_ids [B, K] int32, num_valid [B] int32 or None",
    required=False,
    needs="spec_drafter",
    leading=4,
)
"""`propose_draft_tokens(num_drafts, committed_tokens, committed_positions,
accepted_counts, hidden=None)`: the model's own drafter, after every commit."""
SPEC_METHODS_OF_CLASS = (SPEC_PLAN, PROPOSE_DRAFT_TOKENS)
"""Contract methods of speculative decoding: checked only where the bundle declares what
needs them (`Method.needs` names a `Capabilities` attribute); not in `METHODS`, which
the worker binds at load."""

METHODS: tuple[Method, ...] = (
    INITIALIZE,
    MAX_TOKENS,
    ALLOCATE_KV_CACHE,
    ALLOCATE_KV_CACHE_PER_LAYER,
    KV_CACHE_SPEC,
    PREFILL,
    DECODE,
    READ_DECODE_OUTPUT,
    PROCESS_DECODE_OUTPUT,
)
METHODS_BY_NAME = {m.name: m for m in METHODS}
REQUIRED_METHODS = tuple(m.name for m in METHODS if m.required and not m.group and not m.needs)
KV_CACHE_METHODS = tuple(m.name for m in METHODS if m.group == "kv_cache")
ASYNC_METHODS = tuple(m.name for m in METHODS if m.needs == "async_decode")


POOLING_FORWARD = Method(
    "forward",
    "method",
    ("input_ids", "attention_mask"),
    "the pooled output, one row per prompt: [B, hidden] for embed, [B, num_labels] for "
    "classify (before vLLM's normalisation and activation, which the host applies)",
    required=False,
    needs="pooling",
)
"""`forward(input_ids [B, L] int64, attention_mask [B, L] float 0/1)`, right-padded."""
HIDDEN_STATES_KEYWORD = "return_hidden_states"
"""Passed as True to `prefill_forward` of a `prefill_hidden` pooling bundle: the call
returns the final hidden states (after the last norm) of every position of each row's
prompt, `[B, L, hidden]`, L the longest prompt, instead of logits."""


def pooling_required_methods(form: str | None) -> tuple[tuple[str, ...], bool]:
    """The methods a class must have for its pooling form (None: a generation bundle), and
    whether it needs a KV-cache method: the `forward` form is only `initialize_vllm_model`
    and `forward` (no KV cache, no prefill or decode)."""
    if form == "forward":
        return (INITIALIZE.name, POOLING_FORWARD.name), False
    return REQUIRED_METHODS, True


def decode_keywords(version: int) -> frozenset[str]:
    """The keywords the worker may pass to `decode_forward` of a class of that version:
    v1 gets the four commands and never `reset_batch`; legacy the reverse."""
    base = set(DECODE.passes) - set(DECODE_COMMANDS) - {LEGACY_RESET_KEYWORD}
    base |= set(DECODE_COMMANDS) if version >= CONTRACT_V1 else {LEGACY_RESET_KEYWORD}
    return frozenset(base)


PREFILL_IMAGE_INPUTS = ("pixel_values", "image_grid_thw")
"""What prefill_forward gets for a bundle that serves images, as the reference plugin sends
them: per batch row None (a text-only row) or a list with one entry per image of that
request: the processed tensor, or None where vLLM dropped it (a prefix-cache hit covering
the image keeps `image_grid_thw`, which M-RoPE positions need, and drops `pixel_values`).
Prefill steps only; decode gets `rope_deltas_all_users` instead."""

MULTIMODAL_PARAMETERS = frozenset(
    {
        "images",
        "cross_page_table",
        "image_sizes",
        "prefill_cross_attention_masks",
        "prefill_full_text_row_masked_out_mask",
        "decode_cross_attention_masks",
        "decode_full_text_row_masked_out_mask",
    }
)
"""Multimodal inputs the worker does not supply (Mllama's cross-attention, the V0-era
`images`): a class that requires one cannot be served."""
MULTIMODAL_REFUSAL = (
    "the worker sends images only as pixel_values and image_grid_thw (as the reference "
    "plugin does), never these inputs"
)
MULTIMODAL_HINT = (
    "take images as pixel_values and image_grid_thw per row (see TT-Metal's Qwen2.5-VL "
    "class), or serve a text-only generator class for this architecture"
)

UNSERVABLE_ARCHITECTURES: dict[str, str] = {
    "MllamaForConditionalGeneration": (
        "Llama 3.2 Vision (Mllama) is an encoder-decoder model (cross-attention over the "
        "image), which vLLM removed in 0.10.2 with its V0 engine; no vLLM release of the "
        "tested window has Mllama, and TT-Metal's class requires images and "
        "cross_page_table in every prefill, which a text-only engine never has"
    ),
}
"""Architectures no vLLM of the tested window can serve whatever the generator, with the
reason. `validate`, `plan` and the platform's configuration refuse them (TTB202) before
any class is imported or weight loaded; `ttbundle list` shows each as a listing entry
(no bundle ships for one: it could never be served)."""


def unservable_reason(arch: str) -> str | None:
    """Why `arch` (bare, or with the `TT` prefix registration adds) cannot be served."""
    bare = arch[2:] if arch.startswith("TT") and arch[2:] in UNSERVABLE_ARCHITECTURES else arch
    return UNSERVABLE_ARCHITECTURES.get(bare)


# --- data the worker hands to generators ---------------------------------------------


@dataclass(frozen=True)
class HostMesh:
    """The mesh handed to a generator on the host mesh (MESH_DEVICE=HOST): no device.

    A generator that branches on `mesh_device.is_host` can run its torch reference path.
    With multi-process data parallelism each rank opens a host submesh of its own:
    `device_ids` are its chip ids (its TT_VISIBLE_DEVICES), as a TT submesh's are.
    """

    shape: tuple[int, int] = (1, 1)
    is_host: bool = True
    device_ids: tuple[int, ...] = (0,)

    def get_device_ids(self) -> list[int]:
        return list(self.device_ids)

    def get_num_devices(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass(frozen=True)
class SamplingParams:
    """TT-Metal's sampling parameters (`models/common/sampling/sampling_params.py`): each
    field a scalar for every row or a list with one entry per row.

    The worker always sends lists, one entry per row of the call (per batch row in
    prefill, per slot in decode; padding rows are greedy). temperature 0 means greedy;
    top_k < 1 or >= the vocabulary means no top-k cut; top_p 1.0 no nucleus cut. A seed
    makes a row reproducible; None draws from the device's own stream.
    `enable_log_probs` asks the device for the row's log-probabilities.
    """

    temperature: float | list[float]
    top_k: int | list[int]
    top_p: float | list[float]
    presence_penalty: float | list[float] = 0.0
    frequency_penalty: float | list[float] = 0.0
    repetition_penalty: float | list[float] = 1.0
    seed: int | list[int | None] | None = None
    enable_log_probs: bool | list[bool] = False

    def row(self, index: int) -> SamplingParams:
        """The parameters of one row, as scalars (a scalar field applies to every row)."""

        def pick(value):  # noqa: ANN001, ANN202 - scalars and lists of any field type
            if isinstance(value, list):
                return value[index] if index < len(value) else value[0] if value else None
            return value

        return SamplingParams(**{name: pick(getattr(self, name)) for name in SAMPLING_PARAM_FIELDS})


SAMPLING_PARAM_FIELDS = (
    "temperature",
    "top_k",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "seed",
    "enable_log_probs",
)


def seed_for_position(seed: int, position: int) -> int:
    """The generator seed a seeded request draws the token at `position` with: the same
    seed, the same token, whatever else is in the batch and however it is ordered. The
    worker's host sampler and the reference (`ttbundles.reference.sampling`) both draw
    with it, so both paths draw alike."""
    return (seed * 1000003 + position) % 2**63


# --- what the checks and the template need besides the above --------------------------
# (ttbundles.check reads these to judge a signature, ttbundles.scaffold to write one;
# the readback methods' positional device output is `Method.leading`.)

ESSENTIAL_KEYWORDS: dict[str, tuple[str, ...]] = {
    # The legacy Llama-2-70B generator takes only (hf_config, mesh_device, max_batch_size).
    INITIALIZE.name: INITIALIZE.passes[:3],
    ALLOCATE_KV_CACHE.name: ALLOCATE_KV_CACHE.passes,
    ALLOCATE_KV_CACHE_PER_LAYER.name: ALLOCATE_KV_CACHE_PER_LAYER.passes,
    PREFILL.name: PREFILL.passes[:4],  # tokens, page_table, kv_cache, prompt_lens
    DECODE.name: DECODE.passes[:4],  # tokens, start_pos, page_table, kv_cache
    POOLING_FORWARD.name: POOLING_FORWARD.passes,
}
"""Keywords a method must accept (by name, by an alias, or through `**kwargs`): the inputs
it cannot work without. The worker passes the rest of `Method.passes` only where the
signature accepts them."""

SAFE_COMMAND_DEFAULTS: dict[str, bool] = dict(zip(DECODE_COMMANDS, (True, False, False, False)))
"""The only safe defaults for the v1 commands, if a generator declares defaults at all
(`decode_contract.py`): a full reload, nothing else. The worker always sends all four."""

KEYWORD_DEFAULTS: dict[str, object] = {
    "tt_data_parallel": 1,
    "enable_trace": True,
    "read_from_device": True,
    "async_read": False,
    "is_tokens": False,
    LEGACY_RESET_KEYWORD: False,
    **SAFE_COMMAND_DEFAULTS,
}
"""Defaults TT-Metal's own signatures give these optional keywords; any other optional
keyword defaults to None."""
