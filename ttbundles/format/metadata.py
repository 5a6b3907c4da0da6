"""The bundle format: `vllm_metadata.json`, schema versions 1 to 6, as a pydantic model.

This model is the single source of truth: `schemas/vllm_metadata.schema.json` is generated
from it (`ttbundle schema`), and a test fails when the checked-in file drifts. It imports
neither vLLM nor torch, so validation and registration stay cheap.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ttbundles.format import capabilities as catalogue
from ttbundles.format.contract import (
    POOLING_FORMS,
    POOLING_TASKS,
    SPEC_HANDOFFS,
    SPEC_METHOD_REQUIREMENTS,
    SPEC_METHODS,
    SPEC_REQUIREMENTS,
)
from ttbundles.format.meshes import MESH_NAMES
from ttbundles.format.selection import applies
from ttbundles.format.tt_options import SampleOnDeviceMode, TTOptions

METADATA_FILE = "vllm_metadata.json"
# The version `init` and `migrate` write: the lowest that expresses a text bundle, so
# every ttbundles release reads it. A document needs a higher one only for what that
# version added (see `needs_version`).
SCHEMA_VERSION = 1
LATEST_SCHEMA_VERSION = 6
# Every schema version this release reads, with what it changed.
SUPPORTED_SCHEMA_VERSIONS: dict[int, str] = {
    1: "first versioned format: identity, capabilities, targets, when, requires",
    2: "capabilities.modalities: the input modalities and their per-prompt limits; "
    "tests.image_prompts",
    3: "speculative decoding (capabilities.spec_decode, async_spec_decode, "
    "spec_requirements, spec_hidden_handoff, spec_plan) as the reference plugin's class "
    "keys; capabilities.prompt_logprobs",
    4: "serving: the bundle's serving defaults (tool-call parser, auto tool choice, "
    "reasoning parser, chat template), applied at vllm serve when the operator passes none",
    5: "performance: per target mesh, the figures ttbundle bench checks (TTFT, TPOT, "
    "output throughput) under a declared workload; capabilities.kv_cache_spec: the class "
    "answers get_kv_cache_spec (hybrid KV groups); capabilities.pooling: the pooling "
    "tasks (embed, classify, token_embed) and the contract form that serves them",
    6: "capabilities.recurrent_state: the layers that keep recurrent state (gated delta "
    "net, Mamba, short convolution) and who owns it, the generator or vLLM's KV manager",
}
# What each version added besides capabilities (those: `format.capabilities`), as
# (object, key) pairs; an owner "" is the document itself (the whole `serving` object is
# new in 4).
_ADDED_BESIDES_CAPABILITIES: dict[int, tuple[tuple[str, str], ...]] = {
    2: (("tests", "image_prompts"),),
    4: (("", "serving"),),
    5: (("", "performance"),),
}
# What each version added, as (object, key) pairs by owner (the document's own first): a
# document of a lower version using one is refused with the version it needs (TTB020),
# and the schema says the same.
ADDED_IN: dict[int, tuple[tuple[str, str], ...]] = {
    version: tuple(
        sorted(
            (*catalogue.added_in().get(version, ()), *_ADDED_BESIDES_CAPABILITIES.get(version, ())),
            key=lambda pair: pair[0],
        )
    )
    for version in range(2, LATEST_SCHEMA_VERSION + 1)
}
# Input modalities vLLM's multimodal processors know; a bundle lists those it serves.
Modality = Literal["image", "video", "audio"]
# What `multimodal: true` alone means (schema 1): one image per prompt, as TT-Metal's
# vision classes cap it (`get_supported_mm_limits`: {"image": 1, "video": 0}).
DEFAULT_MODALITIES: dict[str, int] = {"image": 1}
SCHEMA_ID = "https://ttbundles.dev/schemas/vllm_metadata/v1.schema.json"

EXTENSION_PREFIX = "x-"
NAME_PATTERN = r"^[a-z0-9][a-z0-9._-]*$"
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]*"
MAIN_CLASS_PATTERN = rf"^{IDENTIFIER}(\.{IDENTIFIER})*:{IDENTIFIER}$"
ARCH_PATTERN = rf"^{IDENTIFIER}$"
REPO_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
ENV_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*$"
SPDX_PATTERN = r"^[A-Za-z0-9.+-]+( (AND|OR|WITH) [A-Za-z0-9.+-]+)*$"

MeshName = Literal[MESH_NAMES]  # type: ignore[valid-type]
SpecMethod = Literal[SPEC_METHODS]  # type: ignore[valid-type]
SpecRequirement = Literal[SPEC_REQUIREMENTS]  # type: ignore[valid-type]
SpecHandoff = Literal[SPEC_HANDOFFS]  # type: ignore[valid-type]
PoolingTask = Literal[POOLING_TASKS]  # type: ignore[valid-type]
PoolingForm = Literal[POOLING_FORMS]  # type: ignore[valid-type]
EnvName = Annotated[str, Field(pattern=ENV_NAME_PATTERN)]
# pydantic renders a key pattern as patternProperties, which lets other keys through; the
# schema must reject them as the model does.
_ENV_NAMES_ONLY = {"propertyNames": {"pattern": ENV_NAME_PATTERN}}


def _check_specifier(value: str | None) -> str | None:
    """A version specifier as pip reads one: packaging's `SpecifierSet` alone is lenient
    (it accepts ">=0.33,,<0.34", an empty clause), so it must also parse as the version
    part of a PEP 508 requirement."""
    if value is None:
        return None
    try:
        SpecifierSet(value)
        Requirement(f"package{value}")
    except (InvalidSpecifier, InvalidRequirement):
        raise PydanticCustomError(
            "TTB034",
            "'{value}' is not a PEP 440 version specifier",
            {"value": value, "hint": "write e.g. '>=0.33,<0.34'"},
        ) from None
    return value


# Where an object's `x-*` keys are kept once validated: an alias no JSON key can take
# unnoticed (a document that uses it is refused as an unknown key).
EXTENSIONS_KEY = "\x00extensions"
LEGACY_KEY = "\x00legacy"
# Validation context flag: the caller knows the text has no "x-" key and no reserved one
# (registration checks the raw text), so the walk that sets extensions aside is skipped.
NO_EXTENSIONS = "no_extensions"
# Its value when the text's only "x-" keys are the document's own (top level): only the
# document is looked through, not every object in it.
TOP_EXTENSIONS = "top"
_RESERVED = (EXTENSIONS_KEY, LEGACY_KEY)


# Versions seen valid in this process: registration validates every bundle's, and most
# folders hold a few distinct ones (bounded, so a process validating many stays small).
_VALID_VERSIONS: set[str] = set()


def _aside(obj: Any, *, copy: bool = False) -> Any:
    """`obj` with its `x-*` keys moved under EXTENSIONS_KEY (a copy; input untouched):
    `obj` itself when it has none and no reserved key, unless `copy` (the caller changes
    the result)."""
    if not isinstance(obj, dict):
        return obj
    if not copy:
        for key in obj:
            if key.startswith(EXTENSION_PREFIX) or key in _RESERVED:
                break
        else:
            return obj
    out: dict[str, Any] = {}
    extensions: dict[str, Any] | None = None
    for key, value in obj.items():
        if key.startswith(EXTENSION_PREFIX):
            if extensions is None:
                extensions = {}
            extensions[key] = value
        elif key in _RESERVED:
            out[repr(key)] = value  # reported as an unknown key
        else:
            out[key] = value
    if extensions is not None:
        out[EXTENSIONS_KEY] = extensions
    return out


def _version_gates() -> list[dict[str, Any]]:
    """JSON Schema `if`/`then` pairs: a document of version v has none of the keys a
    later version added (`ADDED_IN`), as `needs_version` refuses them in the model."""
    gates = []
    for version in range(1, LATEST_SCHEMA_VERSION):
        later: dict[str, dict[str, bool]] = {}
        for added, keys in ADDED_IN.items():
            if added > version:
                for owner, key in keys:
                    later.setdefault(owner, {})[key] = False
        top = later.pop("", {})
        properties: dict[str, Any] = {
            owner: {"properties": keys} for owner, keys in sorted(later.items())
        }
        properties.update(top)
        gates.append(
            {
                "if": {"properties": {"schema_version": {"const": version}}},
                "then": {"properties": properties},
            }
        )
    return gates


class _Strict(BaseModel):
    """Objects of the format: unknown keys are errors, `x-*` keys are free extensions.

    Extensions are set aside once per document by `BundleMetadata` (one Python call, not
    one per object: registration validates every bundle in every vLLM process).
    """

    # strict: JSON's own types only ("yes" is not a boolean, "1" is not a number).
    model_config = ConfigDict(
        extra="forbid",
        strict=True,
        json_schema_extra={"patternProperties": {"^x-": {}}},
    )
    extensions_: SkipJsonSchema[dict[str, Any] | None] = Field(
        None, alias=EXTENSIONS_KEY, exclude=True, repr=False
    )

    @property
    def extensions(self) -> dict[str, Any]:
        """The `x-*` keys of this object, kept verbatim."""
        return dict(self.extensions_ or {})


class ModelRef(_Strict):
    """A checkpoint the bundle serves."""

    repo: str = Field(
        pattern=REPO_PATTERN,
        description="Hugging Face repository, 'org/name'.",
    )
    revision: str | None = Field(
        None,
        min_length=1,
        description="Commit or tag of the checkpoint; pin it so the bundle is reproducible.",
    )


class Pooling(_Strict):
    """The pooling a generator serves (schema 5): what vLLM's pooling runner
    (`--runner pooling`, `--convert embed|classify`) may ask of it, and in which form of
    the contract (`format.contract`, pooling)."""

    tasks: list[PoolingTask] = Field(
        min_length=1,
        description="vLLM's pooling tasks served: 'embed' (/v1/embeddings, /pooling), "
        "'classify' (/classify, /score, /rerank), 'token_embed' (per-token vectors, "
        "/pooling; the prefill_hidden form only).",
        json_schema_extra={"uniqueItems": True},
    )
    form: PoolingForm = Field(
        "forward",
        description="'forward': forward(input_ids, attention_mask) returns one pooled row "
        "per prompt (the reference plugin's form: no KV cache); 'prefill_hidden': "
        "prefill_forward(..., return_hidden_states=True) returns every position's hidden "
        "state and vLLM's pooler finishes on the host (the checkpoint's pooling config and "
        "--convert mean what they mean in vLLM).",
    )

    @field_validator("tasks")
    @classmethod
    def _unique_tasks(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise PydanticCustomError(
                "TTB033", "pooling.tasks lists a task twice", {"hint": "list each once"}
            )
        return value

    @model_validator(mode="after")
    def _token_tasks_need_hidden_states(self) -> Pooling:
        if "token_embed" in self.tasks and self.form != "prefill_hidden":
            raise PydanticCustomError(
                "TTB033",
                "pooling.tasks has token_embed, which needs every position's hidden state, "
                "but the form is {form!r}: forward returns one pooled row per prompt",
                {"form": self.form, "hint": 'use "form": "prefill_hidden", or drop token_embed'},
            )
        return self


RECURRENT_STATE_OWNERS = ("generator", "vllm")
LAYERS_FROM_CONFIG = "from_config"


class RecurrentState(_Strict):
    """Which layers keep recurrent state, and who owns it (schema 6).

    A gated delta net, Mamba or short-convolution layer remembers the context as a
    fixed-size state per request (a convolution's last K-1 inputs, a recurrent matrix)
    rather than a KV cache that grows with it: its memory is counted per request, not per
    token, and a prefix-cache hit can only skip tokens whose state was saved.
    """

    owner: Literal[RECURRENT_STATE_OWNERS] = Field(  # type: ignore[valid-type]
        description="Who keeps the state. 'generator': the class (TT-Metal's Qwen3.5/3.6 "
        "classes today): vLLM is given the attention layers' KV specs only, and the class "
        "sizes a state slot per request by the batch (prefill writes empty_slots, decode "
        "applies slot_remap, release_request frees a slot). 'vllm': vLLM's KV manager holds "
        "it as MambaSpec groups beside the attention groups, and the class is handed each "
        "row's state indices. Mirrors the class's model_capabilities['recurrent_state'] "
        "(ttbundles' own key), which names the same owner.",
    )
    layers: Literal["from_config"] | list[Annotated[int, Field(ge=0)]] = Field(  # type: ignore[valid-type]
        LAYERS_FROM_CONFIG,
        description="The layers that keep recurrent state: 'from_config' (the checkpoint's "
        "config says, e.g. layer_types 'linear_attention', as transformers derives them) or "
        "their indices, which validate and the plan check against the checkpoint's config.",
    )

    @field_validator("layers", mode="before")
    @classmethod
    def _layers_are_indices_or_from_config(cls, value: Any) -> Any:
        """One message for what the union's two branches would each refuse."""
        if value == LAYERS_FROM_CONFIG:
            return value
        hint = 'list the layer indices (each once, from 0), or write "from_config"'
        if not isinstance(value, list) or not all(
            isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in value
        ):
            raise PydanticCustomError(
                "TTB033",
                'recurrent_state.layers {shown} is not "from_config" nor a list of layer indices',
                {"shown": repr(value), "hint": hint},
            )
        if not value:
            raise PydanticCustomError("TTB033", "recurrent_state.layers is empty", {"hint": hint})
        if len(set(value)) != len(value):
            raise PydanticCustomError(
                "TTB033", "recurrent_state.layers lists a layer twice", {"hint": hint}
            )
        return value


class Capabilities(_Strict):
    """What the generator can do; every flag defaults to off.

    The platform decides prefix caching, async decode, the sampling mode and chunked
    prefill from these at configuration time, without importing the adapter.
    """

    prefix_caching: bool = Field(False, description="Generator honours cached KV blocks.")
    async_decode: bool = Field(
        False,
        description="Generator offers read_decode_output/process_decode_output_host, "
        "so decode readback may overlap scheduling of the next step.",
    )
    sample_on_device: list[SampleOnDeviceMode] = Field(
        default_factory=list,
        description="Sampling modes the generator runs on the device: 'decode_only', 'all'.",
        json_schema_extra={"uniqueItems": True},
    )
    chunked_prefill: bool = Field(
        False, description="prefill_forward accepts a prompt in chunks (start_pos > 0)."
    )
    execution: Literal["submesh", "single"] = Field(
        "submesh",
        description="'single': one execution over the whole mesh, data parallelism runs as "
        "in-process lanes; 'submesh': one generator per submesh.",
    )
    multimodal: bool = Field(
        False,
        description="Generator takes image inputs (one per prompt unless 'modalities' says more).",
    )
    modalities: dict[Modality, Annotated[int, Field(gt=0, le=64)]] = Field(
        default_factory=dict,
        description="Schema 2: the input modalities prefill_forward takes besides text, "
        'each with the most items one prompt may carry, e.g. {"image": 2}. Modalities not '
        "listed are refused by the API server (HTTP 400). Implies multimodal.",
    )

    spec_decode: list[SpecMethod] = Field(
        default_factory=list,
        description="Schema 3: the speculative methods the bundle serves, 'ngram' (drafts "
        "proposed on the host) and 'custom_class' (the model's own drafter, "
        "propose_draft_tokens); mirrors supports_spec_decode (the master gate: empty means "
        "speculative decoding is refused). The target verifies drafts in decode_forward.",
        json_schema_extra={"uniqueItems": True},
    )
    async_spec_decode: bool = Field(
        False,
        description="Schema 3: mirrors supports_async_spec_decode: verification output and "
        "any hidden handle stay valid through the deferred readback, so speculation may run "
        "with asynchronous scheduling (needs async_decode and spec_decode).",
    )
    spec_requirements: list[SpecRequirement] = Field(
        default_factory=list,
        description="Schema 3: mirrors spec_requirements, what the drafter can serve: "
        "'device_propose', 'hidden_feed', 'drafter_scores', 'paged_drafter_cache' "
        "('custom_class' needs 'device_propose').",
        json_schema_extra={"uniqueItems": True},
    )
    spec_hidden_handoff: list[SpecHandoff] = Field(
        default_factory=list,
        description="Schema 3: mirrors spec_hidden_handoff, how the target's hidden state "
        "reaches a device drafter: 'on_device', 'roundtrip' (required with 'hidden_feed').",
        json_schema_extra={"uniqueItems": True},
    )
    spec_plan: bool = Field(
        False,
        description="Schema 3: the class answers the classmethod spec_plan(vllm_config, "
        "max_num_seqs, requested_k) with a plan (effective k, accept modes, extra bytes per "
        "sequence and per token, drafter state) or a refusal (with the k that would work).",
    )
    prompt_logprobs: bool = Field(
        False,
        description="Schema 3: prefill_forward returns logits for every prompt position "
        "when the worker passes return_prompt_logits=True, so requests may ask for prompt "
        "logprobs (completions' echo with logprobs); undeclared, they are refused (HTTP 400).",
    )
    kv_cache_spec: bool = Field(
        False,
        description="Schema 5: the class answers the classmethod get_kv_cache_spec(vllm_config) "
        "with each layer's KV cache spec, keyed model.layers.<i>.self_attn (None: full "
        "attention), and allocates through allocate_kv_cache_per_layer; served on vLLM's "
        "hybrid KV-cache manager, sliding-window layers keep their window and the tokens in "
        "flight (a step budget well under max_model_len makes that pay), and "
        "each prefill and decode gets page_tables_per_layer (each layer its KV group's).",
    )
    pooling: Pooling | None = Field(
        None,
        description="Schema 5: the pooling tasks the generator serves under vLLM's pooling "
        "runner, and the contract form; absent: it only generates (--runner pooling is "
        "refused, TTB270).",
    )
    recurrent_state: RecurrentState | None = Field(
        None,
        description="Schema 6: the layers that keep recurrent state and who owns it "
        "(RecurrentState); absent: every layer is attention. A checkpoint with recurrent "
        "layers (Qwen3.5's gated delta net, Mamba, Jamba, Falcon-H1, ...) is refused at "
        "configuration until a release of ttbundles serves its owner (TTB274); plan says "
        "the state per request and the capacity.",
    )

    @property
    def spec_drafter(self) -> bool:
        """The model owns the drafter (`custom_class`): the class has propose_draft_tokens."""
        return "custom_class" in self.spec_decode

    def input_limits(self) -> dict[str, int]:
        """Items per prompt for each modality the generator takes; {} for text only."""
        return input_limits(self.model_dump(include={"multimodal", "modalities"}))

    @model_validator(mode="after")
    def _modalities_imply_multimodal(self) -> Capabilities:
        if self.modalities and "multimodal" in self.model_fields_set and not self.multimodal:
            raise PydanticCustomError(
                "TTB033",
                "modalities are listed but multimodal is false",
                {"hint": "drop 'multimodal: false' (modalities imply it) or the modalities"},
            )
        return self

    @model_validator(mode="after")
    def _speculation_is_consistent(self) -> Capabilities:
        problem = speculation_problem(self)
        if problem is not None:
            message, hint = problem
            raise PydanticCustomError("TTB234", message, {"hint": hint})
        return self

    @field_validator("sample_on_device", "spec_decode", "spec_requirements", "spec_hidden_handoff")
    @classmethod
    def _unique_modes(cls, value: list[str], info: ValidationInfo) -> list[str]:
        if len(set(value)) != len(value):
            raise PydanticCustomError(
                "TTB033",
                "{name} lists a value twice",
                {"name": info.field_name, "hint": "list each once"},
            )
        return value


def speculation_problem(caps: Capabilities) -> tuple[str, str] | None:
    """What makes a speculative declaration contradict itself, as (message, hint); None
    when it holds together. The reference plugin refuses the same launches at
    configuration (`resolve_speculative_plan`); the format refuses the file first."""
    others = [
        name
        for name in ("async_spec_decode", "spec_requirements", "spec_hidden_handoff", "spec_plan")
        if getattr(caps, name)
    ]
    if not caps.spec_decode:
        if others:
            return (
                f"{', '.join(others)} declared without spec_decode (the master gate)",
                'list the methods served in spec_decode, e.g. ["ngram"], or drop '
                + ", ".join(others),
            )
        return None
    for method in caps.spec_decode:
        missing = [r for r in SPEC_METHOD_REQUIREMENTS[method] if r not in caps.spec_requirements]
        if missing:
            return (
                f"spec_decode lists {method!r}, which needs {', '.join(missing)} in "
                "spec_requirements",
                f"add {', '.join(repr(m) for m in missing)} to spec_requirements (the model's "
                f"drafter proposes on the device), or drop {method!r}",
            )
    if "hidden_feed" in caps.spec_requirements and not caps.spec_hidden_handoff:
        return (
            "spec_requirements has 'hidden_feed' but spec_hidden_handoff is empty",
            "say how the hidden state reaches the drafter: spec_hidden_handoff "
            '["on_device"] or ["roundtrip"]',
        )
    return None


class Target(_Strict):
    """Settings for one mesh."""

    max_model_len: int | None = Field(
        None, gt=0, description="Longest context the generator supports on this mesh."
    )
    max_num_seqs: int | None = Field(
        None, gt=0, description="Largest batch the generator supports on this mesh."
    )
    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Environment variables the generator needs.",
        json_schema_extra=_ENV_NAMES_ONLY,
    )
    additional_config: TTOptions = Field(
        default_factory=TTOptions,
        description="Defaults for the Tenstorrent device options (additional_config.tt); "
        "the user's values win.",
    )


class When(_Strict):
    """Conditions under which the bundle applies."""

    env: dict[EnvName, str] = Field(
        default_factory=dict,
        description="The bundle applies only when each variable has exactly this value.",
        json_schema_extra=_ENV_NAMES_ONLY,
    )
    default_for: dict[EnvName, str] = Field(
        default_factory=dict,
        description="Selector variables this bundle is the default variant of, with the "
        "variant's name: it serves with the variable unset, and setting the variable to "
        "this name selects it too (e.g. TT_LLAMA_TEXT_VER: tt_transformers). Not a "
        "condition: a bundle whose 'env' matches still wins.",
        json_schema_extra=_ENV_NAMES_ONLY,
    )

    @model_validator(mode="after")
    def _selector_or_condition(self) -> When:
        both = sorted(set(self.env) & set(self.default_for))
        if both:
            raise PydanticCustomError(
                "TTB033",
                "{names} in both when.env and when.default_for",
                {
                    "names": ", ".join(both),
                    "hint": "a bundle is a variant or the default, not both",
                },
            )
        return self


class Requires(_Strict):
    """What the serving environment must provide."""

    python: str | None = Field(None, description="PEP 440 specifier for Python.")
    vllm: str | None = Field(None, description="PEP 440 specifier for vLLM.")
    ttnn: str | None = Field(None, description="PEP 440 specifier for TT-NN.")
    packages: list[str] = Field(
        default_factory=list, description="PEP 508 requirements on other packages."
    )

    _spec = field_validator("python", "vllm", "ttnn")(_check_specifier)

    @field_validator("packages")
    @classmethod
    def _requirements(cls, value: list[str]) -> list[str]:
        for item in value:
            try:
                Requirement(item)
            except InvalidRequirement:
                raise PydanticCustomError(
                    "TTB034",
                    "'{value}' is not a PEP 508 requirement",
                    {"value": item, "hint": "write e.g. 'safetensors>=0.4'"},
                ) from None
        return value


# --- tests: what `ttbundle test` runs ---------------------------------------------------

TestPath = Literal["prefill", "decode", "chunked_prefill", "prefix_cache", "device_sampling"]
TEST_PATHS: tuple[str, ...] = (
    "prefill",
    "decode",
    "chunked_prefill",
    "prefix_cache",
    "device_sampling",
)
# The capability a path exercises; a path the bundle does not declare cannot run.
PATH_CAPABILITY: dict[str, str] = catalogue.PATH_CAPABILITY
DEFAULT_PERPLEXITY_TEXT = (
    "The quick brown fox jumps over the lazy dog. The capital of France is Paris, "
    "and the sky is blue."
)


def _relative_file(value: str | None) -> str | None:
    """A path inside the bundle: relative, POSIX, never leaving the bundle."""
    if value is None:
        return None
    parts = value.split("/")
    if (
        not value
        or value.startswith("/")
        or "\\" in value
        or "\x00" in value
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise PydanticCustomError(
            "TTB033",
            "'{value}' is not a relative path inside the bundle",
            {
                "value": value,
                "hint": "write a path relative to the bundle folder, e.g. "
                "'tests/golden.json.gz' (no leading '/', no '..')",
            },
        )
    return value


class SeededSampling(_Strict):
    """The sampling parameters of the `device_sampling` path (seeded, on the device)."""

    seed: int = Field(0, ge=0, description="Seed of the first prompt; prompt i uses seed + i.")
    temperature: float = Field(0.8, gt=0, description="Sampling temperature (> 0).")
    top_k: int = Field(20, ge=0, description="Top-k cut; 0: none.")
    top_p: float = Field(1.0, gt=0, le=1, description="Top-p (nucleus) cut; 1: none.")


class Thresholds(_Strict):
    """What `ttbundle test` requires of every prompt and path (per step where it says so)."""

    pcc: float = Field(
        0.99, ge=-1, le=1, description="Minimum Pearson correlation of the logits, every step."
    )
    top1: float = Field(
        0.95,
        ge=0,
        le=1,
        description="Minimum share of steps whose top-1 token is the golden's top-1.",
    )
    top5: float = Field(
        0.99,
        ge=0,
        le=1,
        description="Minimum share of steps whose top-5 tokens include the golden's top-1.",
    )
    max_abs_diff: float | None = Field(
        None,
        gt=0,
        description="Maximum absolute difference of the logits, every step; "
        "unset: reported, not checked.",
    )
    perplexity_ratio: float | None = Field(
        1.05,
        ge=1,
        description="Largest ratio (either way) of the bundle's perplexity to the golden's "
        "on perplexity_text; unset: reported, not checked.",
    )


class TestImage(_Strict):
    """One image of an image prompt: a file in the bundle, or a picture the harness draws
    from a seed (the same pixels on every machine)."""

    __test__ = False  # not a pytest class

    file: str | None = Field(
        None, description="An image file in the bundle (PNG, JPEG, ...), e.g. 'tests/cat.png'."
    )
    seed: int | None = Field(
        None, ge=0, description="Draw the image: random pixels from this seed (no file)."
    )
    width: int = Field(64, ge=1, le=4096, description="Width of a drawn image in pixels.")
    height: int = Field(64, ge=1, le=4096, description="Height of a drawn image in pixels.")

    _file = field_validator("file")(_relative_file)

    @model_validator(mode="after")
    def _one_source(self) -> TestImage:
        if (self.file is None) == (self.seed is None):
            raise PydanticCustomError(
                "TTB033",
                "an image names a file or a seed (exactly one of them)",
                {
                    "hint": 'write {"file": "tests/cat.png"} or {"seed": 0, "width": 64, '
                    '"height": 64}'
                },
            )
        return self


class ImagePrompt(_Strict):
    """A prompt with images: the user message of the checkpoint's chat template, the
    images first, then the text (as a chat request with image parts is rendered)."""

    text: str = Field(min_length=1, description="The text after the images.")
    images: list[TestImage] = Field(
        min_length=1, description="The images, in order (at most the bundle's image limit)."
    )


class BundleTests(_Strict):
    """What `ttbundle test` runs against a golden; every field has a default."""

    prompts: list[Annotated[str, Field(min_length=1)]] = Field(
        default_factory=list,
        description="Prompts as text (tokenized by the checkpoint's tokenizer, as vLLM does). "
        "Neither prompts nor prompt_file: three short default prompts.",
    )
    prompt_file: str | None = Field(
        None,
        description="A JSON file in the bundle with prompts as token ids: "
        '[[1, 2, 3], ...] or {"name": [1, 2, 3], ...}; used after prompts.',
    )
    image_prompts: list[ImagePrompt] = Field(
        default_factory=list,
        description="Prompts with images (schema_version 2), named i0, i1, ...; run on the "
        "prefill and decode paths and compared with transformers' class on the same token "
        "ids and pixels.",
    )
    max_tokens: int = Field(16, gt=0, le=4096, description="Tokens generated per prompt.")
    paths: list[TestPath] | None = Field(
        None,
        description="Serving paths to exercise: prefill (the prompt only), decode, "
        "chunked_prefill, prefix_cache (a prefix-cache hit), device_sampling (seeded, on the "
        "device). Unset: every path the capabilities declare.",
        json_schema_extra={"uniqueItems": True},
    )
    chunk_size: int | None = Field(
        None,
        gt=0,
        description="Prompt tokens per step in the chunked_prefill path; unset: half the "
        "shortest prompt (rounded up), so that every prompt is split.",
    )
    sampling: SeededSampling = Field(default_factory=SeededSampling)
    thresholds: Thresholds = Field(default_factory=Thresholds)
    perplexity_text: str | None = Field(
        DEFAULT_PERPLEXITY_TEXT,
        min_length=1,
        description="A short text whose perplexity both the bundle and the golden report; "
        "null: skipped.",
    )
    golden: str | None = Field(
        None,
        description="A recorded golden in the bundle (ttbundle test --record); the default "
        "golden when set.",
    )

    _files = field_validator("prompt_file", "golden")(_relative_file)

    @field_validator("paths")
    @classmethod
    def _unique_paths(cls, value: list[str] | None) -> list[str] | None:
        if value is not None and len(set(value)) != len(value):
            raise PydanticCustomError(
                "TTB033", "tests.paths lists a path twice", {"hint": "list each once"}
            )
        return value

    @field_validator("prompts")
    @classmethod
    def _unique_prompts(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise PydanticCustomError(
                "TTB033",
                "tests.prompts lists a prompt twice",
                {"hint": "list each prompt once (results are matched by prompt)"},
            )
        return value


class ServingDefaults(_Strict):
    """What `vllm serve` needs to serve the bundle's models as chat models with tools or
    reasoning, which the operator would otherwise have to know per model: each one applies
    when the operator does not pass its flag (the operator's flags win)."""

    tool_call_parser: str | None = Field(
        None,
        min_length=1,
        description="vLLM's tool-call parser (--tool-call-parser), e.g. 'hermes'; one the "
        "installed vLLM has (ttbundle validate checks).",
    )
    enable_auto_tool_choice: bool | None = Field(
        None,
        description="--enable-auto-tool-choice: requests may send tool_choice 'auto'; "
        "unset: on when tool_call_parser is set.",
    )
    reasoning_parser: str | None = Field(
        None,
        min_length=1,
        description="vLLM's reasoning parser (--reasoning-parser), e.g. 'deepseek_r1'.",
    )
    chat_template: str | None = Field(
        None,
        description="A Jinja chat template file in the bundle (--chat-template), e.g. "
        "'chat_template.jinja'; unset: the checkpoint's own.",
    )

    _file = field_validator("chat_template")(_relative_file)

    @model_validator(mode="after")
    def _auto_needs_a_parser(self) -> ServingDefaults:
        if self.enable_auto_tool_choice and self.tool_call_parser is None:
            raise PydanticCustomError(
                "TTB033",
                "serving.enable_auto_tool_choice needs serving.tool_call_parser",
                {"hint": 'name the parser, e.g. "tool_call_parser": "hermes"'},
            )
        return self

    @property
    def auto_tool_choice(self) -> bool:
        """Whether the bundle turns auto tool choice on (its default: with a parser)."""
        if self.enable_auto_tool_choice is not None:
            return self.enable_auto_tool_choice
        return self.tool_call_parser is not None


class LatencyLimits(_Strict):
    """Upper bounds of one latency in milliseconds, by statistic over the requests."""

    mean: float | None = Field(None, gt=0, description="Mean at most this (ms).")
    p50: float | None = Field(None, gt=0, description="Median at most this (ms).")
    p90: float | None = Field(None, gt=0, description="90th percentile at most this (ms).")
    p99: float | None = Field(None, gt=0, description="99th percentile at most this (ms).")


class BenchWorkload(_Strict):
    """The load `ttbundle bench` offers: vLLM's `random` and `prefix_repetition` datasets
    (`vllm bench serve`) with these lengths; the figures mean nothing without it."""

    input_len: int = Field(128, gt=0, description="Prompt tokens per request.")
    output_len: int = Field(32, gt=0, description="Tokens generated per request (EOS ignored).")
    num_prompts: int = Field(16, gt=0, description="Requests per workload and round.")
    max_concurrency: int = Field(4, gt=0, description="Requests in flight at most.")
    prefix_len: int | None = Field(
        None,
        gt=0,
        description="The shared-prefix workload's prefix tokens (of input_len); unset: half "
        "of input_len.",
    )

    @model_validator(mode="after")
    def _prefix_inside(self) -> BenchWorkload:
        if self.prefix_len is not None and self.prefix_len >= self.input_len:
            raise PydanticCustomError(
                "TTB033",
                "workload.prefix_len ({prefix}) must be below input_len ({total})",
                {
                    "prefix": self.prefix_len,
                    "total": self.input_len,
                    "hint": "the prompt is the shared prefix plus a suffix of its own",
                },
            )
        return self

    @property
    def shared_prefix_len(self) -> int:
        """Tokens of the shared-prefix workload's prefix."""
        return self.prefix_len if self.prefix_len is not None else self.input_len // 2


class PerformanceTarget(_Strict):
    """What the bundle promises on one mesh: each limit holds on every workload of
    `ttbundle bench` (random prompts, and prompts sharing a prefix)."""

    workload: BenchWorkload = Field(default_factory=BenchWorkload)
    ttft_ms: LatencyLimits | None = Field(
        None, description="Time to first token, per request (ms): upper bounds."
    )
    tpot_ms: LatencyLimits | None = Field(
        None,
        description="Time per output token after the first, per request (ms): upper bounds.",
    )
    output_throughput: float | None = Field(
        None, gt=0, description="Generated tokens per second over the run: at least this."
    )


class BundleMetadata(_Strict):
    """`vllm_metadata.json`, schema versions 1 to 6 (`SUPPORTED_SCHEMA_VERSIONS`)."""

    model_config = ConfigDict(
        title="ttbundles vllm_metadata.json",
        json_schema_extra={
            "patternProperties": {"^x-": {}},
            # What a later version added is refused in an earlier document
            # (`needs_version`).
            "allOf": _version_gates(),
        },
    )

    schema_uri: str | None = Field(
        None, alias="$schema", description="Schema URI, so editors can validate the file."
    )
    schema_version: Literal[1, 2, 3, 4, 5, 6] = Field(description="Version of this format.")
    name: str = Field(
        pattern=NAME_PATTERN, max_length=64, description="Bundle name, unique in a folder."
    )
    version: str = Field(description="Bundle version (PEP 440).")
    description: str | None = Field(None, description="One line on what the bundle serves.")
    license: str | None = Field(None, pattern=SPDX_PATTERN, description="SPDX license id.")
    arch: str = Field(
        pattern=ARCH_PATTERN,
        description="Hugging Face architecture, e.g. LlamaForCausalLM; registered as "
        "TT<arch> (kept as is when it already starts with TT).",
    )
    main_class: str = Field(
        pattern=MAIN_CLASS_PATTERN,
        description="'module:Class' of the generator, e.g. 'adapter:Generator'.",
    )
    main_class_source: Literal["bundle", "environment"] = Field(
        "bundle",
        description="'bundle': the module ships in the bundle; 'environment': it comes from "
        "the serving environment (e.g. a TT-Metal generator).",
    )
    models: list[ModelRef] = Field(default_factory=list, description="Checkpoints served.")
    capabilities: Capabilities = Field(default_factory=Capabilities)
    targets: dict[MeshName, Target] = Field(
        default_factory=dict,
        description="Meshes supported, with their settings; absent means any mesh.",
    )
    when: When = Field(default_factory=When)
    requires: Requires = Field(default_factory=Requires)
    tests: BundleTests | None = Field(
        None, description="What `ttbundle test` runs against a golden; absent: the defaults."
    )
    serving: ServingDefaults | None = Field(
        None,
        description="vllm serve's chat settings the bundle was made for (schema_version 4), "
        "applied when the operator passes none; absent: vLLM's defaults.",
    )
    performance: dict[MeshName, PerformanceTarget] = Field(
        default_factory=dict,
        description="Schema 5: per target mesh, the figures `ttbundle bench` must reach "
        "under the declared workload; absent: bench reports without checking.",
    )

    # Set by the parser for metadata of the reference plugin's two-key form.
    legacy_: SkipJsonSchema[bool] = Field(False, alias=LEGACY_KEY, exclude=True, repr=False)

    @model_validator(mode="before")
    @classmethod
    def _set_extensions_aside(cls, data: Any, info: ValidationInfo) -> Any:
        if not isinstance(data, dict):
            return data
        known = (info.context or {}).get(NO_EXTENSIONS)
        if known == TOP_EXTENSIONS:
            data = _aside(data, copy=True)
        elif known:
            data = dict(data)
        else:
            data = _aside(data, copy=True)
            for key in ("capabilities", "when", "requires", "serving"):
                if key in data:
                    data[key] = _aside(data[key])
            if isinstance(data.get("models"), list):
                data["models"] = [_aside(m) for m in data["models"]]
            if isinstance(data.get("targets"), dict):
                data["targets"] = {k: _aside(v) for k, v in data["targets"].items()}
            if isinstance(data.get("performance"), dict):
                data["performance"] = {
                    k: _aside_performance(v) for k, v in data["performance"].items()
                }
            if isinstance(data.get("tests"), dict):
                tests = data["tests"] = _aside(data["tests"], copy=True)
                for key in ("sampling", "thresholds"):
                    if key in tests:
                        tests[key] = _aside(tests[key])
                if isinstance(tests.get("image_prompts"), list):
                    tests["image_prompts"] = [_aside_prompt(p) for p in tests["image_prompts"]]
        # Absent objects validate from {} natively: a default_factory would build each
        # through Python, and registration runs this for every bundle in every process.
        for key in ("capabilities", "when", "requires"):
            data.setdefault(key, {})
        return data

    @field_validator("schema_version", mode="before")
    @classmethod
    def _not_a_boolean(cls, value: Any) -> Any:
        # JSON's true is not the number 1, though Python's True == 1 passes Literal[1].
        if isinstance(value, bool):
            raise PydanticCustomError(
                "TTB032",
                "schema_version must be a number (1 to 6), not a boolean",
                {"hint": f'write "schema_version": {SCHEMA_VERSION}'},
            )
        return value

    @model_validator(mode="after")
    def _version_has_the_keys(self) -> BundleMetadata:
        needed = needs_version(self)
        if needed > self.schema_version:
            raise PydanticCustomError(
                "TTB020",
                "{what} needs schema_version {needed} (the file says {version})",
                {
                    "what": added_keys(self)[needed][0],
                    "needed": needed,
                    "version": self.schema_version,
                    "hint": f'write "schema_version": {needed}; ttbundles releases before '
                    "it refuse the file by its version instead of misreading it",
                },
            )
        return self

    @model_validator(mode="after")
    def _performance_on_targets(self) -> BundleMetadata:
        # A figure for a mesh the bundle does not serve could never be checked.
        stray = [m for m in self.performance if self.targets and m not in self.targets]
        if stray:
            raise PydanticCustomError(
                "TTB033",
                "performance names mesh {mesh}, which is not among the targets",
                {
                    "mesh": stray[0],
                    "hint": f"add {stray[0]} to targets or drop its performance entry",
                },
            )
        return self

    @field_validator("version")
    @classmethod
    def _pep440(cls, value: str) -> str:
        if value in _VALID_VERSIONS:
            return value
        try:
            Version(value)
        except InvalidVersion:
            raise PydanticCustomError(
                "TTB034",
                "'{value}' is not a PEP 440 version",
                {"value": value, "hint": "write e.g. '1.0.0'"},
            ) from None
        if len(_VALID_VERSIONS) < 1024:
            _VALID_VERSIONS.add(value)
        return value

    @property
    def tt_arch(self) -> str:
        """The architecture name registered in vLLM."""
        return tt_arch_name(self.arch)

    @property
    def module(self) -> str:
        return self.main_class.partition(":")[0]

    @property
    def class_name(self) -> str:
        return self.main_class.partition(":")[2]

    @property
    def legacy(self) -> bool:
        return self.legacy_

    def applies_to(self, mesh: str | None, environ: Mapping[str, str]) -> bool:
        """Whether the bundle applies on `mesh` (None: no mesh set) under `environ`: the
        selection rule (`format.selection`)."""
        return applies(self, mesh, environ)

    def target(self, mesh: str | None) -> Target | None:
        return self.targets.get(mesh) if mesh is not None else None


def input_limits(capabilities: dict[str, Any]) -> dict[str, int]:
    """`Capabilities.input_limits` of capabilities in their JSON form (index, `list`)."""
    if capabilities.get("modalities"):
        return dict(capabilities["modalities"])
    return dict(DEFAULT_MODALITIES) if capabilities.get("multimodal") else {}


def capability_flags(capabilities: dict[str, Any] | None) -> list[str]:
    """Capabilities in a few words, for the startup table, `list` and `inspect`: each as
    its catalogue entry says (`format.capabilities.Capability.summary`)."""
    if not capabilities:
        return []
    flags = []
    for entry in catalogue.CAPABILITIES:
        value = capabilities.get(entry.name)
        if entry.summary == "inputs":
            limits = input_limits(capabilities)
            if limits:
                flags.append("inputs=text+" + "+".join(f"{m}:{n}" for m, n in limits.items()))
        elif not value:
            continue
        elif entry.summary == "flag":
            flags.append(entry.name)
        elif entry.summary == "values":
            flags.append(f"{entry.name}=" + "+".join(value))
        elif entry.summary == "tasks":
            flags.append(f"{entry.name}=" + "+".join(value["tasks"]))
        elif entry.summary == "owner":
            flags.append(f"{entry.name}={value['owner']}")
        elif entry.summary == "single" and value == "single":
            flags.append("single-execute")
    return flags


def added_keys(metadata: BundleMetadata) -> dict[int, list[str]]:
    """The keys `metadata` uses that a later schema version added, by that version."""
    used: dict[int, list[str]] = {}
    for version, keys in ADDED_IN.items():
        for owner, key in keys:
            value = getattr(metadata, owner) if owner else metadata
            if value is not None and getattr(value, key):
                used.setdefault(version, []).append(f"{owner}.{key}" if owner else key)
    return used


def needs_version(metadata: BundleMetadata) -> int:
    """The lowest schema version that expresses `metadata` (what `init` would write)."""
    return max(added_keys(metadata), default=1)


def _aside_performance(entry: Any) -> Any:
    """A mesh's performance entry with its and its objects' `x-*` keys set aside."""
    entry = _aside(entry, copy=True)
    if isinstance(entry, dict):
        for key in ("workload", "ttft_ms", "tpot_ms"):
            if key in entry:
                entry[key] = _aside(entry[key])
    return entry


def _aside_prompt(prompt: Any) -> Any:
    """An image prompt with its and its images' `x-*` keys set aside."""
    prompt = _aside(prompt, copy=True)
    if isinstance(prompt, dict) and isinstance(prompt.get("images"), list):
        prompt["images"] = [_aside(i) for i in prompt["images"]]
    return prompt


def tt_arch_name(arch: str) -> str:
    return arch if arch.startswith("TT") else f"TT{arch}"


def slug(text: str) -> str:
    """A valid bundle name derived from free text (a legacy bundle's folder name)."""
    name = re.sub(r"[^a-z0-9._-]+", "-", text.lower()).strip("-._")[:64]
    return name or "bundle"
