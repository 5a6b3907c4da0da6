"""What the device sampler is told, and the log-probabilities it returns turned into
vLLM's: TT's `SamplingParams` per prefill row or per decode slot, and the top log-probs
of a device-sampled step as vLLM's `LogprobsTensors`. (Host sampling is the host batch's
own, vLLM's sampler: `serving.compat.host_batch()`.)"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.outputs import LogprobsTensors

from ttbundles.format.contract import SamplingParams
from ttbundles.serving.binding import GeneratorContractError
from ttbundles.serving.runner.sampling_path import DeviceSupport, batch_host_reason, device_params
from ttbundles.serving.runner.step import Layout, StepState, rows_of

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput

    from ttbundles.format.tt_options import TTOptions
    from ttbundles.serving.runner.prompt_logprobs import PromptLogprobs


def row_params(states: Sequence[Any], vocab_size: int) -> SamplingParams:
    """TT's SamplingParams, one entry per request row (prefill)."""
    return device_params([s.sampling_params for s in states], vocab_size)


def slot_params(layout: Layout, capacity: int, vocab_size: int) -> SamplingParams:
    """TT's SamplingParams, one entry per slot (decode); empty slots are greedy.
    Built once per layout: a request's parameters do not change."""
    if layout.slot_params is None:
        per_slot: list[Any] = [None] * capacity
        for params, slot in zip(layout.params, layout.slots.tolist()):
            per_slot[slot] = params
        layout.slot_params = device_params(per_slot, vocab_size)
    return layout.slot_params


def slot_bitmask(
    layout: Layout, capacity: int, grammar: GrammarOutput | None
) -> torch.Tensor | None:
    """vLLM's grammar bitmask as a device grammar takes it: one packed row per slot
    (`[capacity, ceil(V / 32)]` int32), each structured request's row in its slot, every
    other row all ones (any token). vLLM orders its rows by `structured_output_request_ids`,
    `rows / requests` per request (one without speculation: its first is this step's).
    None when vLLM sent no grammar (no structured request is constrained this step)."""
    if grammar is None or not grammar.structured_output_request_ids:
        return None
    packed = torch.from_numpy(grammar.grammar_bitmask)
    ids = grammar.structured_output_request_ids
    stride = packed.shape[0] // len(ids)
    out = torch.full((capacity, packed.shape[1]), -1, dtype=torch.int32)
    slot_of = {owner: slot for slot, owner in enumerate(layout.owners) if owner is not None}
    for i, req_id in enumerate(ids):
        slot = slot_of.get(req_id)
        if slot is not None:
            out[slot] = packed[i * stride]
    return out


def device_logprobs(
    step: StepState, tokens: list[int], requests: Mapping[str, Any], class_name: str
) -> LogprobsTensors | None:
    """vLLM's logprobs for the rows that asked, from the device's top log-probs.

    The device returns `(top_logprobs [B, K], top_ids [B, K])`; the sampling path sends a
    request here only when its token is sure to be among them (greedy, or top_k <= K), so
    the sampled token's log-prob and rank are read off that list.
    """
    if not step.layout.any_logprobs:
        return None
    wanted = [requests[r].sampling_params.logprobs for r in step.req_ids]
    raw = step.logprobs
    if step.readback is not None and step.rows is not None and isinstance(raw, tuple):
        raw = rows_of(raw, step.rows)
    if not isinstance(raw, tuple):
        raise GeneratorContractError.single(
            "TTB062",
            f"{class_name} returned no top log-probabilities for a request that "
            "asked for them (enable_log_probs)",
            hint="declare max_device_logprobs in model_capabilities only where the device "
            "returns (top_logprobs, top_token_ids)",
        )
    top_values, top_ids = (torch.as_tensor(t) for t in raw)
    count = max(w or 0 for w in wanted)
    n = len(step.req_ids)
    ids = torch.zeros((n, count + 1), dtype=torch.int64)
    values = torch.zeros((n, count + 1), dtype=torch.float32)
    ranks = torch.ones(n, dtype=torch.int64)
    for i, token in enumerate(tokens):
        if wanted[i] is None:
            continue
        row_ids = top_ids[i].long()
        row_values = top_values[i].float()
        where = (row_ids == token).nonzero()
        if len(where) == 0:
            raise GeneratorContractError.single(
                "TTB062",
                f"{class_name}: the sampled token {token} is not among the device's "
                f"top {len(row_ids)} log-probabilities",
                hint="return the top log-probabilities of the raw logits",
            )
        own = float(row_values[int(where[0])])
        ids[i, 0] = token
        values[i, 0] = own
        ids[i, 1:] = row_ids[:count]
        values[i, 1:] = row_values[:count]
        ranks[i] = int((row_values >= own).sum())
    return LogprobsTensors(ids, values, ranks)


def host_reason(
    step: StepState,
    is_decode: bool,
    options: TTOptions,
    support: DeviceSupport,
    *,
    custom_logits_processors: bool,
) -> str | None:
    """Why this step samples on the host (None: on the device), cached per layout."""
    layout = step.layout
    structured = bool(step.scheduler_output.has_structured_output_requests)
    key = (not is_decode, structured)
    if key not in layout.reasons:
        layout.reasons[key] = batch_host_reason(
            layout.params,
            is_prefill=not is_decode,
            mode=options.sample_on_device_mode,
            always_host=bool(options.always_compat_sampling),
            custom_logits_processors=custom_logits_processors,
            structured=structured,
            support=support,
        )
    return layout.reasons[key]


def prefill_logits(
    step: StepState,
    primary: torch.Tensor,
    extra: Any,
    scored: list[Any],
    computed: list[int],
    ends: list[int],
    *,
    prompt_logprobs: PromptLogprobs | None,
    requests: Mapping[str, Any],
    rope_deltas: dict[str, int],
    class_name: str,
) -> None:
    """A prefill that returned logits: on the step, each row's last new position's (it
    predicts the row's next token) and the prompt logprobs asked for (`scored` rows);
    the RoPE deltas a vision-language class returns beside them, by request."""
    rows = len(step.req_ids)
    if extra is not None and not isinstance(extra, tuple):
        # Vision-language classes: (logits, rope_deltas), one delta per row.
        deltas = torch.as_tensor(extra).reshape(-1).tolist()
        for req_id, delta in zip(step.req_ids, deltas):
            rope_deltas[req_id] = int(delta)
    every = primary.reshape(rows, -1, primary.shape[-1])
    if scored:
        assert prompt_logprobs is not None
        step.prompt_logprobs = prompt_logprobs.score(
            class_name, scored, every, computed, ends, step.req_ids, requests
        )
        # Each row's last new position predicts its next token.
        last = torch.tensor([e - c - 1 for c, e in zip(computed, ends)])
        logits = every[torch.arange(rows), last.clamp_min(0)]
    else:
        logits = every[:, -1, :]
    step.logits = logits.float()
