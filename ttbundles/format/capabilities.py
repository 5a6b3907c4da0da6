"""The catalogue of capabilities and pooling tasks: one record each, with its facts.

Every list the library keeps about capabilities is derived from `CAPABILITIES` (in the
order of the `Capabilities` model's fields): the schema versions' additions
(`metadata.ADDED_IN`), the class keys the bundle mirrors (`contract.CAPABILITY_KEYS`,
`contract.SPEC_KEYS`), the `ttbundle test` paths (`metadata.PATH_CAPABILITY`), the
settings the plan turns off (`TURNED_OFF`), the reference bundle's declaration
(`scaffold.reference.REFERENCE_CAPABILITIES`), the summary of `list` and `inspect`
(`metadata.capability_flags`) and the support card's rows (`check.support`). Every
pooling table is derived from `POOLING`, one record per vLLM pooling task.

A new capability is then one record here, its field in `format.metadata.Capabilities`,
and the code that serves it (docs/contributors/layout.md, "To add a capability").
`tests/test_capability_catalogue.py` holds every field to its record.

The lowest module of `format`: it imports nothing of the project, nor vLLM nor torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# How `list`, `inspect` and the startup table summarise a capability
# (`metadata.capability_flags`): "flag" its name when on; "values" name=a+b; "single"
# `single-execute` for execution "single"; "inputs" the input modalities (multimodal and
# modalities together); "tasks" the pooling tasks; "owner" name=owner.
Summary = Literal["flag", "values", "single", "inputs", "tasks", "owner"]


@dataclass(frozen=True)
class Capability:
    """One field of the bundle's `capabilities`, with what the library does with it."""

    name: str
    """The field of `format.metadata.Capabilities`."""
    added_in: int = 1
    """The schema version that added it (a lower version using it is refused, TTB020)."""
    class_key: str | None = None
    """The generator's `model_capabilities` key it mirrors (None: not a class key)."""
    key_from: Literal["tt_metal", "ttbundles", "plugin"] | None = None
    """Who defines `class_key`: TT-Metal's classes or ttbundles itself (both in
    `contract.CAPABILITY_KEYS`, compared one to one by validate) or the reference
    plugin's speculative contract (`contract.SPEC_KEYS`)."""
    gates: str | None = None
    """The vLLM setting (`section.setting` of `VllmConfig`, or the request field) it
    gates: asked of a bundle without the capability, the plan refuses or turns it off."""
    refusal: str | None = None
    """The code given when it is asked of a bundle that does not declare it."""
    plan_note: str = ""
    """What the plan does then, as the support card words it ("" : no card row)."""
    card: str | None = None
    """The support card's feature (a list capability: one row per choice,
    "card: choice"); None: no row."""
    choices: tuple[str, ...] = ()
    """For a list capability: the values it may list, in the support card's order."""
    test_path: str | None = None
    """The `ttbundle test` path that proves it (each pooling task has its own path)."""
    reference: Any = None
    """What the torch reference generator declares of it (None: it does not)."""
    summary: Summary | None = None
    """How `metadata.capability_flags` shows it (None: not shown)."""


@dataclass(frozen=True)
class PoolingTask:
    """One of vLLM's pooling tasks a bundle may serve (`capabilities.pooling.tasks`)."""

    name: str
    """vLLM's task (`vllm.tasks.PoolingTask`)."""
    convert: str
    """The `--convert` that asks for it (`embed` also answers per-token embeddings)."""
    test_path: str | None = None
    """The `ttbundle test` path that checks it (None: none yet)."""
    vectors: tuple[str, ...] = ()
    """The vectors the test compares with the golden's, in order
    (`conformance.pooling.TOLERANCES` holds each one's tolerance)."""
    mismatch: str | None = None
    """The code of a served vector that differs from the golden's."""


POOLING: tuple[PoolingTask, ...] = (
    PoolingTask(
        "embed",
        convert="embed",
        test_path="pooling_embed",
        vectors=("embedding", "raw"),
        mismatch="TTB128",
    ),
    PoolingTask(
        "classify",
        convert="classify",
        test_path="pooling_classify",
        vectors=("probs", "logits"),
        mismatch="TTB129",
    ),
    PoolingTask("token_embed", convert="embed"),
)
"""vLLM 0.34's pooling tasks a bundle may serve, less token_classify: `score` was folded
into `classify` (/score and /rerank are classification of a pair), `embed` also answers
/pooling."""

POOLING_TASKS: tuple[str, ...] = tuple(t.name for t in POOLING)
POOLING_PATHS: dict[str, str] = {t.test_path: t.name for t in POOLING if t.test_path}
"""`ttbundle test`'s pooling paths -> the pooling task each checks."""
POOLING_VECTORS: dict[str, tuple[str, ...]] = {t.name: t.vectors for t in POOLING if t.vectors}
POOLING_MISMATCH: dict[str, str] = {t.name: t.mismatch for t in POOLING if t.mismatch}
CONVERT_TASKS: dict[str, tuple[str, ...]] = {}
"""The tasks each `--convert` asks for (`vllm.config.model`)."""
for _task in POOLING:
    CONVERT_TASKS[_task.convert] = (*CONVERT_TASKS.get(_task.convert, ()), _task.name)


CAPABILITIES: tuple[Capability, ...] = (
    Capability(
        "prefix_caching",
        class_key="supports_prefix_caching",
        key_from="tt_metal",
        gates="cache_config.enable_prefix_caching",
        refusal="TTB203",
        plan_note="turned off by the plan",
        card="prefix_caching",
        test_path="prefix_cache",
        reference=True,
        summary="flag",
    ),
    Capability(
        "async_decode",
        class_key="supports_async_decode",
        key_from="tt_metal",
        gates="scheduler_config.async_scheduling",
        refusal="TTB203",
        plan_note="turned off by the plan",
        card="async_decode",
        reference=True,
        summary="flag",
    ),
    Capability(
        "sample_on_device",
        class_key="supports_sample_on_device",
        key_from="tt_metal",
        gates="additional_config.tt.sample_on_device_mode",
        refusal="TTB204",
        plan_note="refused by the plan",
        card="sample_on_device",
        choices=("decode_only", "all"),
        test_path="device_sampling",
        reference=["decode_only", "all"],
        summary="values",
    ),
    Capability(
        "chunked_prefill",
        class_key="supports_chunked_prefill",
        key_from="tt_metal",
        gates="scheduler_config.enable_chunked_prefill",
        refusal="TTB203",
        plan_note="turned off by the plan",
        card="chunked_prefill",
        test_path="chunked_prefill",
        reference=True,
        summary="flag",
    ),
    Capability(
        "execution",
        gates="parallel_config.data_parallel_size",
        refusal="TTB202",
        plan_note="one engine per submesh",
        card="lanes",
        summary="single",
    ),
    Capability("multimodal", refusal="TTB215"),  # its row and summary: modalities'
    Capability(
        "modalities",
        added_in=2,
        gates="multimodal_config.limit_per_prompt",
        refusal="TTB215",
        plan_note="text only",
        card="images",
        summary="inputs",
    ),
    Capability(
        "spec_decode",
        added_in=3,
        class_key="supports_spec_decode",
        key_from="plugin",
        gates="speculative_config",
        refusal="TTB235",
        plan_note="refused by the plan",
        card="spec_decode",
        choices=("ngram", "custom_class"),
        # n-gram drafts on the host, verified by the reference (`reference.drafter`);
        # custom_class needs a drafter class of the bundle's own (the demo-drafter's).
        reference=["ngram"],
        summary="values",
    ),
    Capability(
        "async_spec_decode",
        added_in=3,
        class_key="supports_async_spec_decode",
        key_from="plugin",
        gates="scheduler_config.async_scheduling",
        refusal="TTB236",
        reference=True,
    ),
    Capability(
        "spec_requirements",
        added_in=3,
        class_key="spec_requirements",
        key_from="plugin",
        refusal="TTB235",
    ),
    Capability(
        "spec_hidden_handoff",
        added_in=3,
        class_key="spec_hidden_handoff",
        key_from="plugin",
        refusal="TTB235",
    ),
    Capability("spec_plan", added_in=3, refusal="TTB235", reference=True),
    Capability(
        "prompt_logprobs",
        added_in=3,
        gates="prompt_logprobs",  # a request's field
        refusal="TTB206",
        plan_note="refused per request",
        card="prompt_logprobs",
        reference=True,
        summary="flag",
    ),
    Capability(
        "kv_cache_spec",
        added_in=5,
        gates="scheduler_config.disable_hybrid_kv_cache_manager",
        refusal="TTB263",
    ),
    Capability(
        "pooling",
        added_in=5,
        gates="model_config.runner",
        refusal="TTB270",
        plan_note="refused by the plan",
        card="pooling",
        choices=POOLING_TASKS,
        summary="tasks",
    ),
    Capability(
        "recurrent_state",
        added_in=6,
        class_key="recurrent_state",
        key_from="ttbundles",
        refusal="TTB274",
        plan_note="served as the generator's slots or vLLM's MambaSpec groups (gated delta net)",
        summary="owner",
    ),
)
"""Every capability, in the order of the `Capabilities` model's fields."""

BY_NAME: dict[str, Capability] = {c.name: c for c in CAPABILITIES}

TT_METAL_KEYS: dict[str, str] = {
    c.class_key: c.name
    for c in CAPABILITIES
    if c.class_key and c.key_from in ("tt_metal", "ttbundles")
}
"""The class keys a bundle mirrors one to one: TT-Metal's, and ttbundles' own for what
TT-Metal's classes do without a key (`recurrent_state`: the owner of the state)."""
PLUGIN_KEYS: dict[str, str] = {
    c.class_key: c.name for c in CAPABILITIES if c.class_key and c.key_from == "plugin"
}
PATH_CAPABILITY: dict[str, str] = {c.test_path: c.name for c in CAPABILITIES if c.test_path}
"""The `ttbundle test` path -> the capability it exercises (pooling: `POOLING_PATHS`)."""
TURNED_OFF: tuple[tuple[str, str, str], ...] = tuple(
    (*c.gates.split(".", 1), c.name)  # type: ignore[misc]
    for c in CAPABILITIES
    if c.refusal == "TTB203" and c.gates
)
"""(`VllmConfig` section, setting, capability) for each vLLM setting the plan turns off
(TTB203) when the bundle does not declare the capability it needs."""
REFERENCE: dict[str, Any] = {c.name: c.reference for c in CAPABILITIES if c.reference is not None}
"""What the torch reference generator declares (pooling per architecture:
`scaffold.reference.reference_pooling`)."""


def added_in() -> dict[int, tuple[tuple[str, str], ...]]:
    """The capabilities each schema version after 1 added, as ("capabilities", name)."""
    out: dict[int, tuple[tuple[str, str], ...]] = {}
    for c in CAPABILITIES:
        if c.added_in > 1:
            out[c.added_in] = (*out.get(c.added_in, ()), ("capabilities", c.name))
    return out
