"""Which sampler serves a batch: the generator's on-device sampler, or vLLM's on the host.

On-device sampling covers temperature, top-k, top-p and seeds, with top-k bounded where the
generator declares `max_device_top_k` (a stochastic row with no top-k cut or a larger one
samples on the host, as the reference plugin decides); penalties too unless the generator
declares `supports_device_penalties: False` (and where it takes the prompt/output history),
and only greedy rows where it declares `sample_on_device_policy: "greedy_only"`,
and log-probabilities where it declares `max_device_logprobs` and the sampled token is sure
to be among the top ones it returns (greedy, or top_k no larger); structured output in
decode where it declares `supports_device_grammar` and its decode takes the bitmask (a
structured prefill, or a structured request asking for log-probabilities, stays on the
host, as the reference plugin's first device-grammar contract). Any request that needs
more falls back to vLLM's `Sampler` on host logits, for that batch only; the next batch
that can go back to the device does. Users never pick a mode per request and no request
is refused because the fast path cannot express it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ttbundles.format.contract import (
    DEVICE_GRAMMAR_KEY,
    DEVICE_PENALTIES_DEFAULT,
    DEVICE_PENALTIES_KEY,
    DEVICE_SAMPLING_PENALTIES_KEY,
    GREEDY_ONLY_POLICY,
    MAX_DEVICE_LOGPROBS_KEY,
    MAX_DEVICE_TOP_K_KEY,
    SAMPLE_POLICY_KEY,
    SamplingParams,
)


@dataclass(frozen=True)
class DeviceSupport:
    """What the generator's device sampler can do beyond temperature/top-k/top-p/seed."""

    penalties: bool = False
    top_logprobs: int = 0  # how many top log-probs the device returns per row
    top_k: int | None = None  # max_device_top_k: the largest stochastic top-k; None: any
    grammar: bool = False  # decode applies the structured-output bitmask
    greedy_only: bool = False  # sample_on_device_policy "greedy_only": no stochastic rows


def device_support(
    capabilities: Mapping[str, Any],
    *,
    takes_history: bool,
    takes_bitmask: bool = False,
    split_sampling: bool = False,
) -> DeviceSupport:
    """What a class's `model_capabilities` lets the device sample (`format.contract` says
    what each key means and its default when absent). Penalties need the class to take the
    `prompt_tokens` / `output_tokens` history too (`takes_history`), device grammar the
    `grammar_bitmask` keyword (`takes_bitmask`): a declaration the call cannot carry would
    sample structured rows unconstrained.

    A class with TT-Metal's split sampler (`split_sampling`: `sample_decode_on_device`,
    the shared `Generator`'s) takes the bitmask there at run time, after a decode that
    keeps its logits on the device, and `decode_forward`'s `grammar_bitmask` only for the
    trace warm-up: that route is not driven here, so such a class's structured batches
    sample on the host rather than receive the bitmask where it may not apply."""
    top_k = capabilities.get(MAX_DEVICE_TOP_K_KEY)
    penalties = capabilities.get(
        DEVICE_PENALTIES_KEY,
        capabilities.get(DEVICE_SAMPLING_PENALTIES_KEY, DEVICE_PENALTIES_DEFAULT),
    )
    return DeviceSupport(
        penalties=bool(penalties) and takes_history,
        top_logprobs=int(capabilities.get(MAX_DEVICE_LOGPROBS_KEY) or 0),
        top_k=None if top_k is None else int(top_k),
        grammar=bool(capabilities.get(DEVICE_GRAMMAR_KEY)) and takes_bitmask and not split_sampling,
        greedy_only=capabilities.get(SAMPLE_POLICY_KEY) == GREEDY_ONLY_POLICY,
    )


def describe_paths(support: DeviceSupport, mode: str | None, always_host: bool = False) -> str:
    """Which sampler serves structured output and log-probabilities (the start-up log's
    line, as the plan's `sampling.*` decisions say it before the class is imported)."""
    if mode is None or always_host:
        return "structured output and logprobs on the host (every batch samples there)"
    grammar = (
        "structured output: device grammar in decode (grammar_bitmask; async decode kept), "
        "prefill on the host"
        if support.grammar
        else "structured output: on the host (no device grammar: a structured batch drains "
        "async decode)"
    )
    top = support.top_logprobs
    logprobs = (
        f"logprobs: up to {top} from the device sampler (greedy or top_k <= {top}), "
        "more on the host"
        if top
        else "logprobs: on the host (the class returns no device log-probs)"
    )
    greedy_only = (
        "the device samples greedy rows only (sample_on_device_policy greedy_only): a "
        "sampled request takes its batch to the host; "
        if support.greedy_only
        else ""
    )
    return f"{greedy_only}{grammar}; {logprobs}"


def has_penalties(params: Any) -> bool:
    return (
        params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
    )


def host_reason(
    params: Any, support: DeviceSupport = DeviceSupport(), *, decode: bool = False
) -> str | None:
    """Why this request needs vLLM's host sampler, or None when the device can sample it
    (`decode`: in a decode step, where a device grammar applies)."""
    if params is None:
        return None
    greedy = params.temperature < 1e-5 or params.top_k == 1
    if support.greedy_only and not greedy:
        return "greedy_only"
    bound = support.top_k
    if bound is not None and not greedy and not 0 < params.top_k <= bound:
        return "top_k"
    if params.logprobs is not None:
        bounded = 0 < params.top_k <= support.top_logprobs
        returned = support.top_logprobs > 0 and params.logprobs <= support.top_logprobs
        if not (returned and (greedy or bounded)):
            return "logprobs"
    if has_penalties(params) and not support.penalties:
        return "penalties"
    if params.min_p > 0.0:
        return "min_p"
    if params.logit_bias:
        return "logit_bias"
    if params.allowed_token_ids:
        return "allowed_token_ids"
    if params.bad_words or getattr(params, "_bad_words_token_ids", None):
        return "bad_words"
    if params.min_tokens > 0:
        return "min_tokens"
    if params.structured_outputs is not None and not (
        decode and support.grammar and params.logprobs is None
    ):
        return "structured_output"
    return None


def batch_host_reason(
    params: Iterable[Any],
    *,
    is_prefill: bool,
    mode: str | None,
    always_host: bool,
    custom_logits_processors: bool,
    structured: bool,
    support: DeviceSupport = DeviceSupport(),
) -> str | None:
    """Why the whole batch samples on the host, or None for the device path."""
    if mode is None:
        return "host_mode"
    if always_host:
        return "always_compat_sampling"
    if is_prefill and mode == "decode_only":
        return "prefill_in_decode_only_mode"
    if custom_logits_processors:
        return "custom_logits_processors"
    if structured and (is_prefill or not support.grammar):
        return "structured_output"
    for item in params:
        reason = host_reason(item, support, decode=not is_prefill)
        if reason is not None:
            return reason
    return None


def device_params(params: list[Any], vocab_size: int) -> SamplingParams:
    """TT-Metal's SamplingParams for these rows, every field a per-row list.

    A None row (an empty decode slot) is greedy with no penalties. temperature 0 is
    greedy; top_k 0 or >= the vocabulary is "no cut" (sent as 0).
    """
    fields: dict[str, list[Any]] = {
        "temperature": [],
        "top_k": [],
        "top_p": [],
        "presence_penalty": [],
        "frequency_penalty": [],
        "repetition_penalty": [],
        "seed": [],
        "enable_log_probs": [],
    }
    for item in params:
        if item is None:
            values = (0.0, 0, 1.0, 0.0, 0.0, 1.0, None, False)
        else:
            greedy = item.temperature < 1e-5
            k = int(item.top_k)
            values = (
                0.0 if greedy else float(item.temperature),
                0 if k <= 0 or k >= vocab_size else k,
                float(item.top_p),
                float(item.presence_penalty),
                float(item.frequency_penalty),
                float(item.repetition_penalty),
                item.seed,
                item.logprobs is not None,
            )
        for name, value in zip(fields, values):
            fields[name].append(value)
    return SamplingParams(**fields)
