"""Every name of the generator contract the worker meets on a TT-Metal class, and what it
does with each: one table.

TT-Metal's classes speak the contract through three kinds of names: class attributes
(methods, `decode_input_update_contract`, `requires_prefill_trace_warmup`), the keys of
`model_capabilities`, and the keywords of their calls (prefill, decode, warm-up). A name
the worker neither drives nor refuses would be ignored in silence: a class that needs it
would serve wrong. So each has one row here, with what ttbundles does:

- **driven**: the worker supplies, calls or honours it as the classes expect;
- **refused**: a class needing it (or a value of it the worker cannot serve) is refused at
  configuration or load, with the code given;
- **irrelevant**: it changes nothing for this worker, with why.

Read from TT-Metal's generators (`models/autoports/*/tt/generator_vllm.py`, the executor
generators of `models/common/models`, `models/tt_transformers/tt/generator_vllm.py`) and
the reference plugin (vllm-tt-plugin `model_runner.py`, `docs/MODEL_CAPABILITIES.md`);
`SOURCES` names the commits. `docs/reference/contract-keys.md` is generated from this
table, `KNOWN_CAPABILITY_KEYS` (what `validate -v` calls known, TTB064) is its capability
rows, and `tests/test_contract_keys.py` fails when a contract twin uses a name not here.
Pure Python, as `format.contract`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ttbundles.format import contract as c
from ttbundles.format import speculative as spec

Kind = Literal["class attribute", "method", "capability", "prefill", "decode", "warm-up"]
Handling = Literal["driven", "refused", "irrelevant"]

SOURCES: tuple[tuple[str, str, str], ...] = (
    (
        "tenstorrent/tt-metal @defe0da2",
        "models/autoports/aleph_alpha_kolibri_1_bf16/tt/generator_vllm.py",
        "KolibriForCausalLM, the Kolibri 1 autoport",
    ),
    (
        "tenstorrent/tt-metal @e07e4017",
        "models/autoports/google_gemma_4_31b/tt/generator_vllm.py",
        "Gemma4ForCausalLM, the Gemma 4 31B autoport",
    ),
    (
        "tenstorrent/tt-metal, the 2026 version with `_DPLlama3Generator`",
        "models/common/models/llama3_8b/generator.py",
        "Llama3Generator, the Llama 3 executor's adapter",
    ),
    (
        "tenstorrent/tt-metal @21a4db48",
        "models/tt_transformers/tt/generator_vllm.py",
        "the tt_transformers classes",
    ),
    (
        "tenstorrent/vllm-tt-plugin @e3fc8494",
        "src/vllm_tt_plugin/model_runner.py",
        "warmup_model; with docs/MODEL_CAPABILITIES.md",
    ),
)
"""Where the names were read: repository and commit, file, what in it."""

PREFILL_OUTPUT_MASK_KEY = "supports_intermediate_prefill_output_mask"
"""The class takes `prefill_output_mask`: a row whose chunk ends no prompt produces no
output (its sampler state is left alone)."""
PREFILL_OUTPUT_MASK_KEYWORD = "prefill_output_mask"
SAMPLING_ORIGINS_KEY = "supports_prefill_sampling_origins"
"""The class takes `original_prompt_lens`: a seeded row's draws count from the end of the
request's original prompt, so a request prefilled again (preempted, resumed with its
output as prompt) draws what it would have drawn."""
ORIGINAL_PROMPT_LENS_KEYWORD = "original_prompt_lens"
PREFILL_KEYWORDS_ASKED: dict[str, str] = {
    PREFILL_OUTPUT_MASK_KEYWORD: PREFILL_OUTPUT_MASK_KEY,
    ORIGINAL_PROMPT_LENS_KEYWORD: SAMPLING_ORIGINS_KEY,
}
"""Prefill keywords sent only to a class whose capability key (True) asks for them: a
`**kwargs` class that does not declare it may reject the keyword, as Kolibri's does."""
REUSE_DECODE_INPUTS_KEYWORD = "reuse_device_decode_inputs"
"""Passed True on a steady decode (the same requests in the same slots as the last
device-sampling decode, the device's own tokens fed back, no new KV block): the class may
skip inspecting its host inputs. False on every other decode."""
PREFILL_WARMUP_ATTRIBUTE = "requires_prefill_trace_warmup"
"""Class attribute (True): the class must have `warmup_model_prefill` called at start-up,
before any request, to capture its prefill traces."""
WARMUP_PREFILL = "warmup_model_prefill"
WARMUP_KEYWORDS = ("kv_cache", "enable_trace", "can_sample_on_device")
"""What the worker passes to `warmup_model_prefill`, by keyword (the reference plugin's)."""
WARMED_UP_ATTRIBUTE = "already_warmed_up_prefill"
RELEASE_CAPTURE = "release_persistent_capture"
"""Method: frees traces and buffers the class holds past a request; called at shutdown,
while the mesh is still open."""


@dataclass(frozen=True)
class ContractKey:
    """One name of the contract: `kind` says where it appears, `handling` what the worker
    does, `code` the code a class or value it refuses gets, `meaning` the detail."""

    name: str
    kind: Kind
    handling: Handling
    meaning: str
    code: str | None = None


def _rows() -> tuple[ContractKey, ...]:
    rows: list[ContractKey] = []

    def add(name: str, kind: Kind, handling: Handling, meaning: str, code: str | None = None):
        rows.append(ContractKey(name, kind, handling, meaning, code))

    # --- class attributes ----------------------------------------------------------------
    add(
        c.CONTRACT_MARKER,
        "class attribute",
        "driven",
        "1: the four decode commands and slot_remap on every decode; absent or 0: reset_batch",
    )
    add(
        c.CAPABILITIES_ATTRIBUTE,
        "class attribute",
        "driven",
        "read at load; each key has its own row below (a key not listed: TTB064, a note)",
    )
    add(
        PREFILL_WARMUP_ATTRIBUTE,
        "class attribute",
        "driven",
        f"True: {WARMUP_PREFILL} is called at start-up, once without and once with traces "
        f"(prefill traced); a class without {WARMUP_PREFILL} is refused at load",
        "TTB053",
    )
    add(
        WARMED_UP_ATTRIBUTE,
        "class attribute",
        "driven",
        "set False between the compile and the trace warm-up passes, as the reference "
        "plugin does, so that the second pass captures",
    )
    add(
        c.SAMPLE_POLICY_KEY,
        "class attribute",
        "driven",
        f"read as the capability {c.SAMPLE_POLICY_KEY} where model_capabilities lacks it",
    )
    add(
        "_HYBRID_KV_CACHE_GROUPS_ENABLED",
        "class attribute",
        "irrelevant",
        "the reference plugin's switch; here the bundle's capabilities.kv_cache_spec asks "
        "the class for its layers' KV specs (allocate_kv_cache_per_layer)",
    )

    # --- methods -----------------------------------------------------------------------
    for method in (*c.METHODS, *c.SPEC_METHODS_OF_CLASS, c.POOLING_FORWARD):
        when = f" (when the bundle declares {method.needs})" if method.needs else ""
        code = "TTB053" if method.required else None  # a required method missing
        add(method.name, "method", "driven", f"{method.returns}{when}", code)
    add(
        WARMUP_PREFILL,
        "method",
        "driven",
        f"called at start-up when the class declares {PREFILL_WARMUP_ATTRIBUTE}; otherwise "
        "prefill traces are captured on first use, as the tt_transformers classes do",
    )
    add(
        "warmup_model_decode",
        "method",
        "irrelevant",
        "not called: the classes capture their decode trace on the first decode (Kolibri's "
        "and the executor's warm-up only prepare what the first call prepares too)",
    )
    add(
        "reset_warmup_state",
        "method",
        "irrelevant",
        "the class's own, called by its warm-up methods (releasing its decode traces); "
        "the worker never calls it",
    )
    add(
        RELEASE_CAPTURE,
        "method",
        "driven",
        "called once at the worker's shutdown, while the mesh is open",
    )
    add(
        c.SPLIT_SAMPLER_METHOD,
        "method",
        "irrelevant",
        "not called: the worker samples on the device through decode_forward's "
        "sampling_params; its presence keeps structured batches on the host (the split "
        "sampler's run-time grammar route, with enable_device_grammar, is not driven yet)",
    )
    add(
        "enable_device_grammar",
        "method",
        "irrelevant",
        "not called: the split sampler's grammar route is not driven (see sample_decode_on_device)",
    )
    add(
        "prefill_forward_text",
        "method",
        "irrelevant",
        "the tt_transformers Generator's own, which its prefill_forward forwards to; the "
        "worker calls prefill_forward (and binds through the forwarding)",
    )
    add(
        "release_request",
        "method",
        "driven",
        "called with the slot when a request leaves it (state the class keeps per slot)",
    )
    add(
        c.COPY_STATE_METHOD,
        "method",
        "driven",
        "recurrent state vLLM's KV manager owns, prefix cache on (vLLM's \"align\" mode): "
        "called with (sources, targets) before a step whose rows cross a Mamba block "
        "boundary, so each cached block keeps the state after exactly its tokens",
    )
    for name in ("save_recurrent_prefix", "restore_recurrent_prefix", "free_recurrent_prefix"):
        add(name, "method", "driven", "recurrent-state snapshots (recurrent_prefix_snapshots)")
    for name in ("embed_input_ids", "forward", "compute_logits"):
        if name == c.POOLING_FORWARD.name:
            continue  # a pooling method too, listed above
        add(
            name,
            "method",
            "irrelevant",
            "vLLM's model-inspection protocol, which the autoports stub out; the worker "
            "never calls it",
        )

    # --- model_capabilities keys --------------------------------------------------------
    for key, name in c.CAPABILITY_KEYS.items():
        add(
            key,
            "capability",
            "driven",
            f"mirrored by the bundle's capabilities.{name}; a bundle declaring more is refused",
            "TTB056",
        )
    for key, name in c.SPEC_KEYS.items():
        add(
            key,
            "capability",
            "driven",
            f"mirrored by the bundle's capabilities.{name}; a bundle declaring more is refused",
            "TTB056",
        )
    add(
        c.DEVICE_PENALTIES_KEY,
        "capability",
        "driven",
        "penalties on the device (default True, as the reference plugin)",
    )
    add(
        c.DEVICE_SAMPLING_PENALTIES_KEY,
        "capability",
        "driven",
        f"the autoports' spelling of {c.DEVICE_PENALTIES_KEY}, read where that is absent",
    )
    add(
        c.SAMPLE_POLICY_KEY,
        "capability",
        "driven",
        f"{c.GREEDY_ONLY_POLICY!r}: only greedy rows sample on the device; a batch with a "
        "sampled request samples on the host (no other value is used by a class read)",
    )
    add(c.MAX_DEVICE_TOP_K_KEY, "capability", "driven", "the largest top-k sampled on the device")
    add(
        c.MAX_DEVICE_LOGPROBS_KEY,
        "capability",
        "driven",
        "top log-probs the device returns (ttbundles' own key)",
    )
    add(
        c.OUTPUT_TOKENS_PER_STEP_KEY,
        "capability",
        "driven",
        "above 1, block output: k tokens per row per decode reach vLLM as one step's "
        "output, cut where a one-token decoder stops; synchronous, device-sampled, no "
        "speculation, lanes or other scheduler (TTB275 otherwise)",
        "TTB275",
    )
    add(
        c.REQUIRED_BLOCK_SIZE_KEY,
        "capability",
        "driven",
        "another --block-size is refused at load",
        "TTB063",
    )
    add(
        PREFILL_OUTPUT_MASK_KEY,
        "capability",
        "driven",
        f"True: every prefill passes {PREFILL_OUTPUT_MASK_KEYWORD}",
    )
    add(
        SAMPLING_ORIGINS_KEY,
        "capability",
        "driven",
        f"True: every prefill passes {ORIGINAL_PROMPT_LENS_KEYWORD}",
    )
    add(
        "supports_device_grammar",
        "capability",
        "driven",
        "with a decode_forward taking grammar_bitmask: a structured-output decode sends "
        "vLLM's bitmask there and keeps async decode (structured prefills sample on the "
        "host); a class with TT-Metal's split sampler (sample_decode_on_device) samples "
        "structured batches on the host: its run-time grammar route is not driven yet",
    )
    add(
        "resumed_prefill_token_alignment",
        "capability",
        "irrelevant",
        "chunks resume where vLLM's scheduler ends them; a class needing an alignment "
        "declares no chunked prefill for ttbundles",
    )
    add(
        "accepts_trace_mode",
        "capability",
        "irrelevant",
        "the worker passes enable_trace on every call",
    )
    add(
        "supports_sliding_window",
        "capability",
        "driven",
        "the class masks the checkpoint's sliding window itself; without it a window "
        "shorter than max_model_len is refused (ttbundles' own key)",
    )
    add(
        "fabric_config",
        "capability",
        "irrelevant",
        "not applied: the worker opens the mesh with the device option tt.fabric_config "
        "(the class's ttnn.set_fabric_config keywords are not read); validate warns",
        "TTB064",
    )
    for key, why in (
        (
            "tt_adaptive_block_output",
            "a block is read as the decode returns it (k tokens a row); the reference "
            "plugin's adaptive solo-row switch is not driven",
        ),
        ("tt_adaptive_block_max_prompt_tokens", "the adaptive block switch is not driven"),
        (
            "tt_block_kv_extent_tokens",
            "KV is reserved for output_tokens_per_step - 1 positions past the scheduled "
            "token (a block writes no further)",
        ),
    ):
        add(key, "capability", "irrelevant", why)
    add(
        "supports_request_specific_rope",
        "capability",
        "irrelevant",
        "request-specific RoPE is recognised from prefill's (logits, rope_deltas)",
    )
    add(
        "recurrent_prefix_snapshots",
        "capability",
        "driven",
        "snapshots of recurrent state the class keeps (save/restore/free_recurrent_prefix): "
        "the prefix cache of a generator-owned state admits only hits a snapshot restores; "
        "without it prefix caching over recurrent state is refused",
    )
    for key in ("supports_async_decode_overlap", "tt_async_decode_allows_overlap"):
        add(key, "capability", "irrelevant", "async decode overlaps whenever it is declared")

    # --- prefill keywords ----------------------------------------------------------------
    prefill_meanings = {
        "tokens": "each row's tokens from position 0 up to the chunk's end",
        "page_table": "each row's KV blocks",
        "kv_cache": "the cache allocate_kv_cache(_per_layer) returned",
        "prompt_lens": "where each row's chunk ends (its tokens up to there are valid)",
        "empty_slots": "the slot each row fills",
        "enable_trace": "the trace mode (all: True)",
        "sampling_params": "per row, when the step samples on the device; else None",
        "start_pos": "where each row's chunk starts: positions below are in the cache "
        "(prefix-cache hits, earlier chunks)",
        "page_tables_per_layer": "each layer's page table, for a per-layer cache",
    }
    for name in c.PREFILL.passes:
        add(name, "prefill", "driven", prefill_meanings[name])
    add(
        PREFILL_OUTPUT_MASK_KEYWORD,
        "prefill",
        "driven",
        f"per row, True when its chunk ends its prompt (only those rows produce a token); "
        f"sent where the class declares {PREFILL_OUTPUT_MASK_KEY}",
    )
    add(
        ORIGINAL_PROMPT_LENS_KEYWORD,
        "prefill",
        "driven",
        f"per row, the length of its request's original prompt (the sampling origin); "
        f"sent where the class declares {SAMPLING_ORIGINS_KEY}",
    )
    for name in c.PREFILL_IMAGE_INPUTS:
        add(name, "prefill", "driven", "per row, the images of a bundle serving images")
    add(c.PROMPT_LOGITS_KEYWORD, "prefill", "driven", "True on a prompt-logprobs step")
    add(c.HIDDEN_STATES_KEYWORD, "prefill", "driven", "True for a prefill_hidden pooling bundle")
    for name, why in (
        ("model_id_warmup", "TT-Metal's own warm-up argument (defaulted), never sent"),
        ("warmup_prefill", "TT-Metal's own switch (default True: warm up on first use)"),
    ):
        add(name, "prefill", "irrelevant", why)
    for name in sorted(c.MULTIMODAL_PARAMETERS):
        add(name, "prefill", "refused", c.MULTIMODAL_REFUSAL, "TTB202")

    # --- decode keywords -----------------------------------------------------------------
    decode_meanings = {
        "tokens": "every slot's last token ([capacity, 1]; -1 where still on the device)",
        "start_pos": "every slot's position (-1: an empty slot)",
        "page_table": "every slot's KV blocks",
        "kv_cache": "the cache allocate_kv_cache(_per_layer) returned",
        "enable_trace": "the trace mode (all or decode_only: True)",
        "read_from_device": "False with async decode (the readback methods follow)",
        "sampling_params": "per slot, when the step samples on the device; else None",
        "prompt_tokens": "penalty history, when a row asks for a penalty on the device",
        "output_tokens": "penalty history, when a row asks for a penalty on the device",
        c.SLOT_REMAP_KEYWORD: "the identity (slots never move here)",
        c.STATE_INDICES_KEYWORD: (
            "recurrent state vLLM's KV manager owns: each row's state (int32, row order): "
            'the slot a request keeps for its life ("none" mode), or the Mamba block '
            'the step writes ("align" mode, the prefix cache; 0, vLLM\'s null block, for '
            "an empty slot)"
        ),
        "rope_deltas_all_users": "every slot's M-RoPE delta (vision-language classes)",
        "page_tables_per_layer": "each layer's page table, for a per-layer cache",
        c.LEGACY_RESET_KEYWORD: "legacy classes: True when the batch's layout changed",
        "reload_inputs": "v1: host tokens, positions and page table are authoritative",
        "reload_page_table": "v1: a steady step whose page table changed",
        "reload_sampling_params": "v1: the first device-sampling decode of a layout",
        "reset_sampling_state": "v1: the first device-sampling decode of a layout",
    }
    for name in c.DECODE.passes:
        add(name, "decode", "driven", decode_meanings[name])
    add(
        REUSE_DECODE_INPUTS_KEYWORD,
        "decode",
        "driven",
        "True on a steady decode of a class keeping its inputs resident (async decode "
        "declared, decode traced): same requests in the same slots as the last "
        "device-sampling decode, no new KV block; False otherwise",
    )
    add(
        "grammar_bitmask",
        "decode",
        "driven",
        "a structured-output decode of a class declaring supports_device_grammar (int32 "
        "[slots, ceil(vocab / 32)], all ones for rows without a grammar); not sent to a "
        "class with the split sampler (sample_decode_on_device)",
    )
    for name in spec.VERIFY_KEYWORDS:
        add(name, "decode", "driven", "a verify step (speculative decoding)")
    for name, why in (
        (
            "defer_device_sampling",
            "never sent (default False): the worker reads every device-sampled token",
        ),
        (
            "perform_device_sampling",
            "never sent: the classes taking it (the Gemma 4 31B autoport) decide device "
            "sampling from sampling_params, and ignore it",
        ),
        (
            "skip_trace_precompile",
            "never sent (default False): TT-Metal's own warm-up switch",
        ),
    ):
        add(name, "decode", "irrelevant", why)

    # --- warm-up keywords ----------------------------------------------------------------
    warmup_meanings = {
        "kv_cache": "the allocated cache",
        "enable_trace": "False on the compile pass, True on the capture pass",
        "can_sample_on_device": "the plan samples prefill on the device (mode all)",
    }
    for name in WARMUP_KEYWORDS:
        add(name, "warm-up", "driven", warmup_meanings[name])
    add(
        "greedy_only",
        "warm-up",
        "irrelevant",
        "never sent (the tt_transformers default): sampling programs are warmed as well",
    )
    return tuple(rows)


CONTRACT_KEYS: tuple[ContractKey, ...] = _rows()
KEYS_BY_KIND: dict[str, dict[str, ContractKey]] = {}
for _key in CONTRACT_KEYS:
    KEYS_BY_KIND.setdefault(_key.kind, {})[_key.name] = _key
del _key

KNOWN_CAPABILITY_KEYS: dict[str, str] = {
    name: f"{row.handling}: {row.meaning}" for name, row in KEYS_BY_KIND["capability"].items()
}
"""Every `model_capabilities` key ttbundles knows, with what the worker does with it. A key
a class carries that is not here is reported by `validate -v` (TTB064), never silently
dropped."""


def known(kind: Kind, name: str) -> bool:
    """Whether the table has `name` among names of that kind."""
    return name in KEYS_BY_KIND.get(kind, {})
