"""The generator contract bound for one class: what the runner calls, each method bound
once (`serving.binding.bind`) with the keywords the runner can supply, and what the class
declares that cannot be driven as configured refused before any weight loads.

Two stages, as the class loads: the class methods (`initialize_vllm_model`,
`get_max_tokens_all_users`, and prefill and decode read on the class so that a parameter
the worker cannot supply is refused early), then, on the instance, every method a step
calls.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ttbundles.format import contract, contract_keys
from ttbundles.format import speculative as spec
from ttbundles.serving.binding import (
    BoundMethod,
    GeneratorContractError,
    bind,
    call_at_load,
    decode_offer,
)
from ttbundles.serving.runner.kv.cache import Allocator


def refuse_unsupported_keys(
    class_name: str,
    capabilities: dict[str, Any],
    block_size: int,
    *,
    declared_async: bool,
    planned_block: int = 1,
) -> None:
    """Keys that make a class impossible to drive as configured, refused before any
    weight loads (`format.contract_keys`: a block width the plan did not admit, a KV
    block size); and a bundle declaring async decode for a class that does not support
    it (what `validate --import` calls TTB056), which the plan would otherwise have
    switched on."""
    if declared_async and capabilities.get("supports_async_decode") is not True:
        raise GeneratorContractError.single(
            "TTB056",
            f"the bundle declares capabilities.async_decode, but {class_name}."
            f"{contract.CAPABILITIES_ATTRIBUTE} does not support it (supports_async_decode "
            f"is {capabilities.get('supports_async_decode')!r})",
            hint="declare async_decode: false in vllm_metadata.json, or serve a class "
            "that supports it (ttbundle validate --import compares the two)",
        )
    # Block output (`output_tokens_per_step` > 1) is admitted by the plan, which the
    # scheduler reads to count each block: a class that returns another width than the
    # plan's would be counted wrong, so the two must agree.
    steps = capabilities.get(contract.OUTPUT_TOKENS_PER_STEP_KEY, 1)
    if steps != planned_block:
        raise GeneratorContractError.single(
            "TTB275",
            f"{class_name} declares output_tokens_per_step={steps!r}, but the plan serves "
            f"{planned_block} token(s) per decode",
            hint="serve through the platform's plan (vllm serve, or a configuration made "
            "by the planner), which admits the class's block "
            "(docs/authors/generator-contract.md#block-output)",
        )
    required = capabilities.get(contract.REQUIRED_BLOCK_SIZE_KEY)
    if isinstance(required, int) and required != block_size:
        raise GeneratorContractError.single(
            "TTB063",
            f"{class_name} requires KV blocks of {required} tokens (required_block_size), "
            f"but the engine uses {block_size}",
            hint=f"serve with --block-size {required}",
        )


@dataclass(frozen=True)
class ClassMethods:
    initialize: BoundMethod
    max_tokens: BoundMethod | None

    def max_tokens_all_users(
        self, mesh_device: Any, model: str, *, tt_data_parallel: Any, **sizes: int
    ) -> int | None:
        """The generator's own KV capacity in tokens, when it declares one (`sizes`:
        max_model_len and max_num_seqs)."""
        if self.max_tokens is None:
            return None
        num_devices = getattr(mesh_device, "get_num_devices", lambda: 1)()
        return int(
            call_at_load(
                self.max_tokens,
                f"model {model!r} on {num_devices} device(s)",
                model_name=model,
                num_devices=num_devices,
                tt_data_parallel=tt_data_parallel,
                **sizes,
            )
        )


def bind_class(cls: type, class_name: str, version: int, *, optimizations: bool) -> ClassMethods:
    """Bind initialize_vllm_model and get_max_tokens_all_users; refuse at load what the
    class requires and the worker cannot supply. `optimizations`: the option is set
    (passed only then)."""
    offered = [k for k in contract.INITIALIZE.passes if k != "optimizations"]
    if optimizations:
        offered.append("optimizations")
    initialize = bind(cls, contract.INITIALIZE, offered, class_name=class_name)
    max_tokens = bind(cls, contract.MAX_TOKENS, contract.MAX_TOKENS.passes, class_name=class_name)
    # Prefill and decode read on the class too, so that a parameter the worker cannot
    # supply (Mllama's images) is refused before initialize_vllm_model loads weights;
    # bound again on the instance after it.
    bind(cls, contract.PREFILL, contract.PREFILL.passes, class_name=class_name, optional=True)
    bind(cls, contract.DECODE, decode_offer(version), class_name=class_name, optional=True)
    return ClassMethods(initialize, max_tokens)


@dataclass
class GeneratorMethods:
    """The instance's methods a step calls (None: not bound, the runner does without).
    Not frozen: a benchmark wraps them to time the generator apart from the runner."""

    prefill: BoundMethod
    decode: BoundMethod
    allocator: Allocator
    read: BoundMethod | None  # async decode: read_decode_output
    process: BoundMethod | None  # and process_decode_output_host
    propose: BoundMethod | None  # the generator's own drafter (`custom_class`)


def bind_instance(
    model: Any,
    class_name: str,
    version: int,
    *,
    image_inputs: bool,
    prompt_logits: bool,
    speculation_method: str | None,
    async_decode: bool,
    capabilities: dict[str, Any] | None = None,
) -> GeneratorMethods:
    """Bind what the steps call on the loaded generator, offering what this launch
    supplies (images, prompt logits, the verify keywords when speculating, the prefill
    keywords the class's `capabilities` ask for)."""
    prefill_offer = contract.PREFILL.passes
    if image_inputs:
        prefill_offer += contract.PREFILL_IMAGE_INPUTS
    if prompt_logits:
        prefill_offer += (contract.PROMPT_LOGITS_KEYWORD,)
    asked = declared_prefill_keywords(capabilities or {})
    prefill_offer += asked
    prefill = bind(model, contract.PREFILL, prefill_offer, class_name=class_name)
    missing = [k for k in asked if not prefill.accepts(k)]
    if missing:
        raise GeneratorContractError.single(
            "TTB062",
            f"{class_name}.prefill_forward takes no {', '.join(missing)}, though its "
            f"{contract.CAPABILITIES_ATTRIBUTE} declare"
            f" {', '.join(contract_keys.PREFILL_KEYWORDS_ASKED[k] for k in missing)}",
            hint="take the keyword in prefill_forward, or drop the capability key "
            "(docs/reference/contract-keys.md)",
        )
    offer = decode_offer(version) + (contract_keys.REUSE_DECODE_INPUTS_KEYWORD,)
    if speculation_method is not None:
        offer += spec.VERIFY_KEYWORDS
    decode = bind(model, contract.DECODE, offer, class_name=class_name)
    propose = None
    if speculation_method is not None:
        propose = _bind_speculation(model, decode, class_name, speculation_method)
    allocator = Allocator.bind(model, class_name)
    read = process = None
    if async_decode:
        read_m, process_m = contract.READ_DECODE_OUTPUT, contract.PROCESS_DECODE_OUTPUT
        read = bind(model, read_m, read_m.passes, class_name=class_name)
        process = bind(model, process_m, process_m.passes, class_name=class_name)
    return GeneratorMethods(prefill, decode, allocator, read, process, propose)


def declared_prefill_keywords(capabilities: dict[str, Any]) -> tuple[str, ...]:
    """The prefill keywords the class's `model_capabilities` ask for."""
    return tuple(
        kw
        for kw, key in contract_keys.PREFILL_KEYWORDS_ASKED.items()
        if capabilities.get(key) is True
    )


def _bind_speculation(
    model: Any, decode: BoundMethod, class_name: str, method: str
) -> BoundMethod | None:
    """A speculating launch needs a decode that takes the verify keywords and, for the
    generator's own drafter (`custom_class`), `propose_draft_tokens`."""
    missing = [k for k in spec.VERIFY_KEYWORDS if not decode.accepts(k)]
    if missing:
        raise GeneratorContractError.single(
            "TTB239",
            f"{class_name}.decode_forward takes no {', '.join(missing)}: it cannot verify "
            "drafts, though the class declares supports_spec_decode",
            hint="serve a verify in decode_forward (docs/authors/generator-contract.md"
            "#speculative-decoding), or drop --speculative-config",
        )
    if method != "custom_class":
        return None
    return bind(
        model,
        contract.PROPOSE_DRAFT_TOKENS,
        contract.PROPOSE_DRAFT_TOKENS.passes,
        class_name=class_name,
    )
