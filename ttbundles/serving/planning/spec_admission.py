"""Admitting `--speculative-config` at configuration time, as the reference Tenstorrent
plugin does (`spec_admission.py` there; `format.speculative` is the contract).

In order: the method must be one ttbundles serves (`ngram`, or `custom_class` with the
reference plugin's marker as its `model`: the generator's own drafter) and
one the bundle declares (`capabilities.spec_decode`, schema 3, which `ttbundle validate`
holds to the class's `supports_spec_decode`); asynchronous scheduling, where it is still
on (the plan turned it off for a bundle without `async_decode`, the reference plugin's
first check), needs `capabilities.async_spec_decode` (the class's
`supports_async_spec_decode`: its readback serves a verify block and its hidden handle
outlives the step), else TTB236 with the fix, `--no-async-scheduling`; in-process lanes
speculate too (drafts per request in its lane, one verify over every lane's rows); the
bundle must declare `capabilities.spec_plan`, and the class answers
`spec_plan(vllm_config, max_num_seqs, requested_k)`.
Its answer is a plan decision: a `SpecPlan` (its effective draft length replaces the
requested one; its accept modes say which requests may speculate) or a `SpecReject`,
refused with its reason and the draft lengths it would take. The admitted plan travels
in `Plan.speculative` to the runner and to `validate_request`.

This is the one place the configuration imports the bundle's class: only a launch that
speculates, because only the class can answer `spec_plan`.
"""

from __future__ import annotations

import json
import re
from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError
from ttbundles.format import contract
from ttbundles.format import speculative as spec
from ttbundles.serving.planning.plan import SpeculativePlan

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from ttbundles.format.metadata import BundleMetadata
    from ttbundles.serving.planning.plan import Plan


def _refuse(code: str, message: str, hint: str) -> ConfigurationError:
    return ConfigurationError.single(code, message, hint=hint)


def plan_speculative(vllm_config: VllmConfig, plan: Plan, meta: BundleMetadata) -> None:
    """Admit the speculative configuration into `plan`, or refuse it (TTB235,
    TTB236)."""
    config = vllm_config.speculative_config
    if config is None:
        return
    from ttbundles.serving import compat

    method = compat.speculative_method(config)
    requested = int(config.num_speculative_tokens or 0)
    served = ", ".join(sorted(spec.METHOD_REQUIREMENTS))
    if method not in spec.METHOD_REQUIREMENTS:
        raise _refuse(
            "TTB235",
            f"speculative method {method!r} is not supported yet on Tenstorrent (served: {served})",
            'use --speculative-config \'{"method": "ngram", ...}\', or drop it',
        )
    bundle = plan.bundle.label
    caps = meta.capabilities
    if method not in caps.spec_decode:
        declared = ", ".join(caps.spec_decode) or "none"
        raise _refuse(
            "TTB235",
            f"{bundle} does not declare speculative method {method!r} "
            f"(capabilities.spec_decode: {declared})",
            "serve a bundle that declares it (schema 3), or drop --speculative-config",
        )
    if method == compat.MODEL_OWNED_DRAFTER_METHOD and config.model != contract.MODEL_OWNED_DRAFTER:
        # vLLM's GPU runner would import `model` as a proposer class; the TT runner asks
        # the bundle's generator instead, and says so rather than ignore another class.
        raise _refuse(
            "TTB235",
            f"speculative method 'custom_class' drafts with the generator's own "
            f"propose_draft_tokens on Tenstorrent; its 'model' must be the marker "
            f"{contract.MODEL_OWNED_DRAFTER!r}, not {config.model!r}",
            f'use --speculative-config \'{{"method": "custom_class", "model": '
            f'"{contract.MODEL_OWNED_DRAFTER}", "num_speculative_tokens": K}}\'',
        )
    asynchronous = bool(vllm_config.scheduler_config.async_scheduling)
    if asynchronous and not caps.async_spec_decode:
        raise _refuse(
            "TTB236",
            "speculative decoding with asynchronous scheduling needs a bundle declaring "
            f"capabilities.async_spec_decode; {bundle} does not (vLLM turns asynchronous "
            "scheduling on by default)",
            "add --no-async-scheduling, or serve a bundle whose class declares "
            "supports_async_spec_decode, or drop --speculative-config",
        )
    if not caps.spec_plan:
        raise _refuse(
            "TTB235",
            f"{bundle} declares spec_decode but not capabilities.spec_plan: the draft "
            "length is the generator's to admit",
            "declare capabilities.spec_plan and give the class spec_plan(vllm_config, "
            "max_num_seqs, requested_k)",
        )
    cls = _generator_class(plan)
    name = plan.bundle.declared_class or cls.__qualname__
    capabilities = dict(getattr(cls, contract.CAPABILITIES_ATTRIBUTE, None) or {})
    if not capabilities.get(spec.SUPPORTS_SPEC_DECODE_KEY):
        raise _refuse(
            "TTB235",
            f"{bundle}: {name} does not declare {spec.SUPPORTS_SPEC_DECODE_KEY}: it cannot "
            "verify drafts",
            "serve a generator that speculates, or drop --speculative-config",
        )
    if asynchronous and not capabilities.get(contract.ASYNC_SPEC_DECODE_KEY):
        raise _refuse(
            "TTB236",
            f"{bundle} declares async_spec_decode, but {name}'s model_capabilities has no "
            f"{contract.ASYNC_SPEC_DECODE_KEY}: a deferred verify is not the class's promise",
            "add --no-async-scheduling, or declare it in the class (ttbundle validate "
            "holds the two together)",
        )
    declared = set(capabilities.get(contract.SPEC_REQUIREMENTS_KEY) or ())
    missing = [r for r in spec.METHOD_REQUIREMENTS[method] if r not in declared]
    if missing:
        raise _refuse(
            "TTB235",
            f"{bundle}: speculative method {method!r} needs {', '.join(missing)} in "
            f"{name}'s {contract.SPEC_REQUIREMENTS_KEY}",
            'use --speculative-config \'{"method": "ngram", ...}\'',
        )
    planner = getattr(cls, spec.SPEC_PLAN_METHOD, None)
    if not callable(planner):
        raise _refuse(
            "TTB235",
            f"{bundle}: {name} declares {spec.SUPPORTS_SPEC_DECODE_KEY} but has no "
            f"{spec.SPEC_PLAN_METHOD} classmethod",
            "implement spec_plan(vllm_config, max_num_seqs, requested_k) "
            "(docs/authors/generator-contract.md#speculative-decoding)",
        )
    seqs = vllm_config.scheduler_config.max_num_seqs
    try:
        answer = planner(vllm_config, seqs, requested)
    except Exception as exc:  # noqa: BLE001 - the class's own code; said as the class's
        raise _refuse(
            "TTB235",
            f"{bundle}: {name}.spec_plan raised {type(exc).__name__}: {exc}",
            "spec_plan must return a SpecPlan or a SpecReject, never raise",
        ) from exc
    asked = f"max_num_seqs={seqs}, num_speculative_tokens={requested}"
    if isinstance(answer, spec.SpecReject):
        supported = (
            f"; it would take num_speculative_tokens in {list(answer.supported_k)}"
            if answer.supported_k
            else ""
        )
        plan.decide("speculative", f"{method}, k={requested}", "refused", answer.reason)
        raise _refuse(
            "TTB235",
            f"{bundle}: {name}.spec_plan refused {asked}: {answer.reason}{supported}",
            "ask for a draft length it takes, or drop --speculative-config",
        )
    if not isinstance(answer, spec.SpecPlan):
        raise _refuse(
            "TTB235",
            f"{bundle}: {name}.spec_plan returned {type(answer).__name__}, not a SpecPlan "
            "or a SpecReject",
            "return format.speculative.SpecPlan or SpecReject",
        )
    _check_plan(answer, requested, f"{bundle}: {name}.spec_plan")
    if answer.effective_k != requested:
        config.num_speculative_tokens = answer.effective_k
    modes = [m for m in answer.accept_modes if m in spec.SERVED_ACCEPT_MODES]
    sampled = spec.ACCEPT_MODE_LOGITS in modes
    plan.speculative = SpeculativePlan(
        method=method,
        k=answer.effective_k,
        accept_modes=tuple(modes),
        narrow=answer.supports_narrow_decode,
        prompt_lookup_min=getattr(config, "prompt_lookup_min", None),
        prompt_lookup_max=getattr(config, "prompt_lookup_max", None),
        generator_plan=answer.to_dict(),
        asynchronous=asynchronous,
    )
    how = []
    if asynchronous:
        how.append(
            "asynchronous scheduling: each verify is read back (read_decode_output) and "
            "accepted before the next step is built"
        )
    if plan.lanes > 1:
        how.append(f"{plan.lanes} lanes: drafts per request in its lane, one verify per step")
    plan.decide(
        "speculative",
        f"{method}, k={requested}",
        f"{method}, k={answer.effective_k}",
        f"{name}.spec_plan admitted it; "
        + "".join(f"{h}; " for h in how)
        + (
            "greedy and sampled requests speculate, with logprobs"
            if sampled
            else "greedy requests only, without logprobs (the plan offers no logits)"
        )
        + " (structured output, bad words, min_tokens, penalties, logit bias, "
        "allowed tokens and min_p are refused while speculating)",
    )


def _check_plan(plan: spec.SpecPlan, requested: int, who: str) -> None:
    """What a well-formed SpecPlan must also satisfy here (the reference's rules)."""
    problems = []
    if plan.effective_k > requested:
        problems.append(f"effective_k={plan.effective_k} exceeds the requested {requested}")
    if plan.drafter_state == "paged":
        problems.append("drafter_state 'paged' needs a drafter cache ttbundles does not allocate")
    if not set(plan.accept_modes) & spec.SERVED_ACCEPT_MODES:
        problems.append(
            f"accept_modes {list(plan.accept_modes)} offer neither 'argmax_ids' nor 'logits'"
        )
    if problems:
        raise _refuse(
            "TTB235",
            f"{who} returned a plan that cannot be served: {'; '.join(problems)}",
            "return a SpecPlan within the request, with argmax_ids or logits",
        )


def _generator_class(plan: Plan) -> type:
    """The bundle's class, imported as the worker imports it."""
    from ttbundles.serving.planning.generator_class import load_generator_class

    return load_generator_class(plan.bundle)


_NO_LOGITS = "the generator's plan offers no 'logits' accept mode"


def request_refusal(speculative: SpeculativePlan, params: Any) -> tuple[str, str, Any, str] | None:
    """Why a request cannot be served while speculating: `(code, parameter, value,
    why)`, or None. Drafts are accepted against temperature, top-k and top-p only, so
    every other processor would be skipped on speculated tokens: refused rather than
    ignored. Logprobs are read off the verify's logits and sampled requests accepted by
    rejection sampling on them, so both need the `logits` accept mode."""
    logits = spec.ACCEPT_MODE_LOGITS in speculative.accept_modes
    if getattr(params, "logprobs", None) is not None and not logits:
        why = f"{_NO_LOGITS}, and logprobs are read off the verify's logits"
        return "TTB238", "logprobs", params.logprobs, why
    checks: list[tuple[str, Any, bool]] = [
        ("structured_outputs", _structured(params), _structured(params) is not None),
        ("bad_words", getattr(params, "bad_words", None), bool(getattr(params, "bad_words", None))),
        ("min_tokens", getattr(params, "min_tokens", 0), bool(getattr(params, "min_tokens", 0))),
        (
            "logit_bias",
            getattr(params, "logit_bias", None),
            bool(getattr(params, "logit_bias", None)),
        ),
        (
            "allowed_token_ids",
            getattr(params, "allowed_token_ids", None),
            bool(getattr(params, "allowed_token_ids", None)),
        ),
        ("min_p", getattr(params, "min_p", 0.0), float(getattr(params, "min_p", 0.0) or 0) > 0),
    ]
    for name, default in (
        ("presence_penalty", 0.0),
        ("frequency_penalty", 0.0),
        ("repetition_penalty", 1.0),
    ):
        value = getattr(params, name, default)
        checks.append((name, value, value is not None and float(value) != default))
    for name, value, present in checks:
        if present:
            why = "drafts are accepted against temperature, top-k and top-p only"
            return "TTB237", name, value, why
    temperature = float(getattr(params, "temperature", 0.0) or 0.0)
    if temperature >= 1e-5 and not logits:
        why = f"{_NO_LOGITS}, which rejection sampling of a sampled request needs"
        return "TTB237", "temperature", temperature, why
    return None


def client_field(parameter: str, value: Any) -> str:
    """The request field the client sent, in a few words, for a refused `parameter`.

    vLLM turns `response_format` and a forced `tool_choice` into `structured_outputs`
    before the platform sees the request, so a refusal naming `structured_outputs` (or
    printing its repr) points at a field the client never wrote. The constraint's kind
    still tells which field it came from: `json_object` only from `response_format`, a
    JSON array of tool calls only from `tool_choice: "required"`, and a JSON schema from
    `response_format` json_schema or a named tool (the two cannot be told apart here).
    """
    if parameter != "structured_outputs":
        return f"{parameter}={_short(value)}"
    if getattr(value, "json_object", None):
        return 'response_format {"type": "json_object"}'
    schema = getattr(value, "json", None)
    if schema is not None:
        if _is_tool_call_array(schema):
            return 'tool_choice "required"'
        return "response_format json_schema (or a named tool_choice)"
    if getattr(value, "structural_tag", None) is not None:
        return "response_format structural_tag"
    for kind in ("choice", "regex", "grammar"):
        if getattr(value, kind, None) is not None:
            if kind == "grammar" and _CHOICE_GRAMMAR.match(value.grammar):
                return "structured_outputs.choice"
            return f"structured_outputs.{kind}"
    return "structured_outputs"


_CHOICE_GRAMMAR = re.compile(r'root ::= "(?:[^"\\]|\\.)*"(?: \| "(?:[^"\\]|\\.)*")*\Z')
"""The grammar vLLM's xgrammar check makes of `choice` (`choice_as_grammar`: `root ::=
"a" | "b"`), replacing the choice before the platform sees the request: that shape
names `choice`, the field the client sent (a grammar written as that exact list of
literals is the same constraint)."""


def _is_tool_call_array(schema: Any) -> bool:
    """The schema vLLM builds for `tool_choice: "required"` (an array of tool calls)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except ValueError:
            return False
    return (
        isinstance(schema, dict)
        and schema.get("type") == "array"
        and isinstance(schema.get("items"), dict)
        and "anyOf" in schema["items"]
    )


def _short(value: Any, limit: int = 40) -> str:
    """A value as the client would write it, cut to one short phrase."""
    text = json.dumps(value) if isinstance(value, (list, dict, str)) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def refusal_message(speculative: SpeculativePlan, refusal: tuple[str, str, Any, str]) -> str:
    """The one line a refused request gets back while speculating."""
    code, parameter, value, why = refusal
    return (
        f"{code}: {client_field(parameter, value)} is not served while speculating "
        f"({speculative.method}, k={speculative.k}) on Tenstorrent: {why}; "
        "drop it from the request, or serve without --speculative-config"
    )


def _structured(params: Any) -> Any:
    for name in ("structured_outputs", "guided_decoding"):
        value = getattr(params, name, None)
        if value is not None:
            return value
    return None
