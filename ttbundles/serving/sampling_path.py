"""Which sampler serves a batch: the generator's on-device sampler, or vLLM's on the host.

On-device sampling covers temperature, top-k, top-p and seeds. Any request that needs
more falls back to vLLM's `Sampler` on host logits, for that batch only; the next batch
that can go back to the device does. Users never pick a mode per request and no request
is refused because the fast path cannot express it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ttbundles.format.contract import SamplingParamsBatch


def host_reason(params: Any) -> str | None:
    """Why this request needs vLLM's host sampler, or None when the device can sample it."""
    if params is None:
        return None
    if params.logprobs is not None:
        return "logprobs"
    if (
        params.presence_penalty != 0.0
        or params.frequency_penalty != 0.0
        or params.repetition_penalty != 1.0
    ):
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
    if params.structured_outputs is not None:
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
    if structured:
        return "structured_output"
    for item in params:
        reason = host_reason(item)
        if reason is not None:
            return reason
    return None


def device_params(params: list[Any], vocab_size: int) -> SamplingParamsBatch:
    """The per-row parameters the generator's sampler takes."""
    temperature, top_k, top_p, seed = [], [], [], []
    for item in params:
        greedy = item.temperature < 1e-5
        temperature.append(0.0 if greedy else float(item.temperature))
        k = int(item.top_k)
        top_k.append(0 if k <= 0 or k >= vocab_size else k)
        top_p.append(float(item.top_p))
        seed.append(item.seed)
    return SamplingParamsBatch(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)
