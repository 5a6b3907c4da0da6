"""The speculative-decoding contract between the worker and a generator: the value types
that cross it, in plain Python (no torch, no vLLM), so generators import them cheaply.

It follows the reference Tenstorrent plugin's contract (vllm-tt-plugin
`docs/SPEC_DECODE_CONTRACT.md`, `src/vllm_tt_plugin/spec_decode.py`): a generator that
speculates declares `supports_spec_decode` in `model_capabilities` and answers
`spec_plan(vllm_config, max_num_seqs, requested_k)` with a `SpecPlan` or a
`SpecReject` at configuration time; a verification step is its own `decode_forward`
over `[B, 1+K]` tokens and positions with three more keywords (`num_valid_drafts`,
`accepted_counts`, `spec_mode`), answered with a `VerifyOutput`; a generator that drafts
(vLLM's `custom_class` method) also implements `propose_draft_tokens`, answered with a
`DraftOutput`. Column j of a verify's return is the target's choice at candidate position
j: the token draft j must match, and column K (or `num_valid_drafts`) the bonus.

What ttbundles serves of it: the methods `ngram` (a host proposer) and `custom_class`
(the generator's drafter); the accept modes `argmax_ids` (greedy requests) and `logits`
(sampled requests too, accepted on the host by rejection sampling); `drafter_state`
"internal" or "shared_with_target"; in-process lanes; asynchronous scheduling for a
generator declaring `supports_async_spec_decode` (a verify submitted with
`read_from_device=False` answers a `VerifyOutput` holding the device block, which
`read_decode_output` copies). Refused, with a TTB code: every other method, a `paged`
drafter state, `fused_sample` alone, asynchronous scheduling without that declaration.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ttbundles.format import contract

SUPPORTS_SPEC_DECODE_KEY = contract.SPEC_DECODE_KEY
"""`model_capabilities` master gate (`capabilities.spec_decode` in the bundle)."""
SPEC_PLAN_METHOD = contract.SPEC_PLAN.name

ACCEPT_MODE_LOGITS = "logits"
"""The verify returns logits `[B, 1+K, V]`: the host accepts (greedy or by rejection
sampling), so sampled requests speculate too."""
ACCEPT_MODE_ARGMAX_IDS = "argmax_ids"
"""The verify returns the target's argmax ids `[B, 1+K]`: greedy requests only."""
ACCEPT_MODE_FUSED_SAMPLE = "fused_sample"
ACCEPT_MODES = frozenset({ACCEPT_MODE_LOGITS, ACCEPT_MODE_ARGMAX_IDS, ACCEPT_MODE_FUSED_SAMPLE})
SERVED_ACCEPT_MODES = frozenset({ACCEPT_MODE_LOGITS, ACCEPT_MODE_ARGMAX_IDS})

DRAFTER_STATES = frozenset({"internal", "shared_with_target", *contract.SPEC_DRAFTER_STATES})
"""Where a drafter's state lives: the reference plugin's names ("internal", "paged",
"shared_with_target"; earlier "none", "dense", "paged": both accepted). "paged" is
refused at admission (a scheduler-owned drafter cache is not allocated)."""
DRAFTER_TARGET_CACHE_REQUIREMENTS = frozenset({"named_layer_caches", "absolute_positions"})

METHOD_REQUIREMENTS = contract.SPEC_METHOD_REQUIREMENTS
"""vLLM's methods a bundle may serve, and what each needs of the generator."""

PLACEHOLDER_TOKEN_ID = -1
"""A draft column with no draft (and vLLM's placeholder for one)."""

VERIFY_KEYWORDS = contract.VERIFY_KEYWORDS
"""What a verify call adds to `decode_forward`'s keywords; all three or none."""


def _names(values: Any, allowed: frozenset[str], what: str) -> tuple[str, ...]:
    """A declared sequence of names, checked: a sequence (not one string), known, no
    repeats."""
    if isinstance(values, str) or not isinstance(values, Iterable):
        raise ValueError(f"{what} must be a sequence of names, got {values!r}")
    names = tuple(values)
    unknown = [v for v in names if v not in allowed]
    if unknown:
        raise ValueError(f"{what}: unknown {unknown}; known: {sorted(allowed)}")
    if len(set(names)) != len(names):
        raise ValueError(f"{what} repeats a value: {list(names)}")
    return names


@dataclass(frozen=True)
class SpecPlan:
    """What a generator can serve at one (max_num_seqs, requested_k) point.

    `effective_k` at most the requested draft length (the worker then uses it);
    `accept_modes` what the verify returns; `drafter_state` where the drafter's state
    lives; `supports_narrow_decode`: a step with nothing to verify may be the generator's
    ordinary `[B, 1]` decode. The row and byte fields are declared as the reference
    plugin asks, not yet budgeted against (neither does it)."""

    effective_k: int
    lanes_per_request: int
    extra_bytes_per_seq: int
    extra_bytes_per_token: int
    accept_modes: tuple[str, ...]
    drafter_state: str
    drafter_target_cache_requires: tuple[str, ...] = ()
    supports_narrow_decode: bool = False

    def __post_init__(self) -> None:
        if isinstance(self.effective_k, bool) or self.effective_k < 1:
            raise ValueError(f"SpecPlan.effective_k must be at least 1, got {self.effective_k}")
        if self.lanes_per_request < 1:
            raise ValueError(
                f"SpecPlan.lanes_per_request must be >= 1, got {self.lanes_per_request}"
            )
        for name in ("extra_bytes_per_seq", "extra_bytes_per_token"):
            if getattr(self, name) < 0:
                raise ValueError(f"SpecPlan.{name} must not be negative")
        modes = _names(self.accept_modes, ACCEPT_MODES, "SpecPlan.accept_modes")
        if not modes:
            raise ValueError("SpecPlan.accept_modes must name at least one mode")
        object.__setattr__(self, "accept_modes", modes)
        if self.drafter_state not in DRAFTER_STATES:
            raise ValueError(
                f"SpecPlan.drafter_state {self.drafter_state!r} is not one of "
                f"{sorted(DRAFTER_STATES)}"
            )
        requires = _names(
            self.drafter_target_cache_requires,
            DRAFTER_TARGET_CACHE_REQUIREMENTS,
            "SpecPlan.drafter_target_cache_requires",
        )
        if requires and self.drafter_state != "shared_with_target":
            raise ValueError(
                "SpecPlan.drafter_target_cache_requires applies only to drafter_state "
                "'shared_with_target'"
            )
        object.__setattr__(self, "drafter_target_cache_requires", requires)

    def to_dict(self) -> dict[str, Any]:
        return {
            "effective_k": self.effective_k,
            "lanes_per_request": self.lanes_per_request,
            "extra_bytes_per_seq": self.extra_bytes_per_seq,
            "extra_bytes_per_token": self.extra_bytes_per_token,
            "accept_modes": list(self.accept_modes),
            "drafter_state": self.drafter_state,
            "drafter_target_cache_requires": list(self.drafter_target_cache_requires),
            "supports_narrow_decode": self.supports_narrow_decode,
        }


@dataclass(frozen=True)
class SpecReject:
    """Why a generator cannot serve a (max_num_seqs, requested_k) point, and the draft
    lengths that would work there (quoted to the operator)."""

    reason: str
    supported_k: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not str(self.reason).strip():
            raise ValueError("SpecReject.reason must explain the refusal")
        supported = tuple(self.supported_k)
        if any(k < 1 for k in supported) or len(set(supported)) != len(supported):
            raise ValueError(f"SpecReject.supported_k must be distinct lengths >= 1: {supported}")
        object.__setattr__(self, "supported_k", supported)


@dataclass(frozen=True)
class VerifyOutput:
    """What a verify returns: `argmax_ids` `[B, 1+K]` for "argmax_ids", `logits`
    `[B, 1+K, V]` for "logits"; `hidden`, a handle the worker hands back to
    `propose_draft_tokens` uninterpreted."""

    spec_mode: str
    argmax_ids: Any = None
    logits: Any = None
    hidden: Any = None

    def __post_init__(self) -> None:
        needed = {ACCEPT_MODE_ARGMAX_IDS: "argmax_ids", ACCEPT_MODE_LOGITS: "logits"}.get(
            self.spec_mode
        )
        if needed is None:
            raise ValueError(
                f"VerifyOutput.spec_mode {self.spec_mode!r} is not one of "
                f"{sorted(SERVED_ACCEPT_MODES)}"
            )
        if getattr(self, needed) is None:
            raise ValueError(f"VerifyOutput for spec_mode {self.spec_mode!r} needs {needed}")


@dataclass(frozen=True)
class DraftOutput:
    """What `propose_draft_tokens` returns: `draft_token_ids` `[B, K]` (rows are the
    verify's rows, padding included) and `num_valid` `[B]`, how many of each row's K it
    offers (None: all K; 0 declines that row)."""

    draft_token_ids: Any
    num_valid: Any = None
