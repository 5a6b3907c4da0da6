"""The phase-based scheduler: every step is prefill-only, decode-only or empty.

A TT generator runs a step as one `prefill_forward` or one `decode_forward` (section 4 of
the serving contract); it has no kernel for a batch that mixes prompt chunks with
decode tokens, which vLLM's scheduler produces freely. `TTScheduler` keeps vLLM's
scheduling (budgets, chunking, prefix caching, preemption, resume, priority) by calling
the base `schedule()` with the requests of the other phase hidden for that call:

- prefill step: running requests in decode are taken out of `self.running`;
- decode step: running requests mid-prefill are taken out of `self.running`, and the
  waiting queues are swapped for empty ones so nothing is admitted.

Afterwards the hidden requests are put back where they were, keeping whatever the base
changed (preempted requests leave `running` and join the front of `waiting`; admitted
ones are appended). When the chosen phase schedules nothing (a prompt that does not fit
in the KV cache while decodes hold it), the other phase is tried in the same call, and
the per-step state the discarded attempt consumed is carried into the returned output.

A request is in prefill while vLLM says so (`Request.is_prefill_chunk`: its prompt, or for
a resumed request its prompt and earlier output, is not fully computed), whatever number
of tokens is left. Prefill work is pending while such a request runs or any request waits,
including one parked in `waiting` while its grammar compiles.

Prefill goes first unless one of two cadences holds it:

- vLLM's own prefill deferral, kept as vLLM decides it: `schedule(throttle_prefills=True)`
  (the DP engine core off its cadence) and the local prefill cadence
  (`--prefill-schedule-interval N`: prefill at most once every N executed steps while a
  decode runs), both lifted once a release step leaves the queue undrained. A held step
  is a decode step. (vLLM would still admit a prompt cached to its last token into a
  held step beside the decodes; here an admission is a prefill step, so it waits.)
- decode interleaving (`additional_config["tt"]`: `decode_interleave_enabled`, default
  true; `decode_interleave_prefill_steps` N, default 2; `decode_interleave_decode_steps`
  M, default 1): after N consecutive prefill steps with a decode running, M decode steps
  run (P P D P P D ... by default), so a long chunked prompt does not stall generation. A
  decode turn spends its allowance even if it schedules nothing; a step with no prefill
  pending, or a prefill step with no decode running, clears the counters.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.request_queue import RequestQueue, create_request_queue
from vllm.v1.core.sched.scheduler import Scheduler

from ttbundles.errors import ConfigurationError
from ttbundles.serving import compat
from ttbundles.serving.compat import steady_decode, steady_slots
from ttbundles.serving.planning.plan import effective_options, served_plan
from ttbundles.serving.recurrent_prefix import RecurrentPrefixMixin

if TYPE_CHECKING:  # annotations only: these modules are loaded by the base classes
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

logger = logging.getLogger("vllm.ttbundles.scheduler")

StepKind = Literal["prefill", "decode", "empty"]
PREFILL: StepKind = "prefill"
DECODE: StepKind = "decode"
EMPTY: StepKind = "empty"


def is_in_prefill(request: Request) -> bool:
    """True while a running request's prompt is not fully computed: vLLM's own notion.

    `Request.is_prefill_chunk`, which the base sets for every request it schedules
    (`Scheduler._update_after_schedule`: `num_computed_tokens < num_tokens +
    num_output_placeholders` once the step's tokens are counted), so it describes the
    request as the next step finds it: True after an intermediate chunk, False once the
    last chunk is scheduled (under async scheduling, while that chunk is still in
    flight). Not a count of the tokens left: a final prompt chunk can be one token, and
    it is still a prefill. A resumed (preempted) request recomputes its prompt and the
    output tokens it had, and is in prefill until all of them are computed, exactly as
    vLLM treats it (`num_tokens` includes them). Every request in `running` has been
    scheduled since it was (re)admitted, so the flag is never stale there.
    """
    return request.is_prefill_chunk


@dataclass(frozen=True)
class PhaseDemand:
    """What a scheduler's requests ask of the next step.

    `has_prefill`: a running request is in prefill; `has_decode`: one is decoding;
    `waiting`: a request waits (prefill work); `can_admit`: one waits and a running slot
    is free, so a prefill step could admit it.
    """

    has_prefill: bool
    has_decode: bool
    waiting: bool
    can_admit: bool

    @property
    def pending(self) -> bool:
        """Prefill work exists (a prompt chunk to run, or a request waiting)."""
        return self.has_prefill or self.waiting

    @property
    def wants_prefill(self) -> bool:
        """A prefill step would do something: a chunk to run, or a prompt to admit."""
        return self.has_prefill or self.can_admit

    @staticmethod
    def union(demands: list[PhaseDemand]) -> PhaseDemand:
        """The demand of several schedulers run as one step (lanes)."""
        return PhaseDemand(
            any(d.has_prefill for d in demands),
            any(d.has_decode for d in demands),
            any(d.waiting for d in demands),
            any(d.can_admit for d in demands),
        )


def choose_phases(demand: PhaseDemand, *, held: bool, decode_owed: bool) -> tuple[StepKind, ...]:
    """The phases to try, in order: the second runs only if the first schedules nothing.

    Decode alone when no prefill would do anything, or a prefill cadence holds it
    (`held`: vLLM's prefill deferral, with a decode running); prefill alone when nothing
    decodes; otherwise prefill first, unless the decode interleave owes running decodes a
    step (`decode_owed`). The same rule serves one scheduler and a step over all lanes.
    """
    if not demand.wants_prefill or held:
        return (DECODE,)
    if not demand.has_decode:
        return (PREFILL,)
    if decode_owed:
        return (DECODE, PREFILL)
    return (PREFILL, DECODE)


class DecodeInterleave:
    """The decode-interleave cadence (`additional_config["tt"]`:
    `decode_interleave_enabled`, `decode_interleave_prefill_steps` N,
    `decode_interleave_decode_steps` M): after N consecutive prefill steps that kept a
    running decode waiting, M decode steps are owed. Owned by whoever chooses the step's
    phase: a scheduler, or the lane coordinator for all its lanes at once."""

    def __init__(self, enabled: bool, prefill_steps: int, decode_steps: int):
        self.enabled = enabled
        self.prefill_steps = prefill_steps
        self.decode_steps = decode_steps
        # Prefill steps taken in a row while decodes were running, and decode steps
        # still owed to them before the next prefill step.
        self.prefill_run = 0
        self.owed = 0

    @classmethod
    def from_options(cls, options: Any) -> DecodeInterleave:
        return cls(
            bool(options.decode_interleave_enabled),
            options.decode_interleave_prefill_steps,
            options.decode_interleave_decode_steps,
        )

    @property
    def owes_decode(self) -> bool:
        return self.enabled and self.owed > 0

    def record(self, kind: StepKind, decode_turn: bool, pending: bool, had_decodes: bool) -> None:
        """Advance the cadence after a step.

        `decode_turn`: a decode attempt was made this step. It spends one step of the
        decode allowance whatever it scheduled: running decodes can have nothing to
        schedule (under async scheduling, a request whose last token is in flight), and
        an allowance kept for them would put a futile decode attempt before every later
        step. `pending`: prefill work existed when the step was chosen. A step taken
        with none is not part of an insertion and clears both counters, and so does a
        prefill step with no decode running: a prompt arriving later is not made to
        wait for decode steps it never delayed.
        """
        if not pending:
            self.prefill_run = 0
            self.owed = 0
            return
        if decode_turn:
            self.prefill_run = 0
            if self.owed:
                self.owed -= 1
        if kind == PREFILL and not had_decodes:
            # Nothing was kept waiting: no run, and nothing owed to decodes that are
            # gone (they finished or were preempted).
            self.prefill_run = 0
            self.owed = 0
        elif kind == PREFILL:
            # Only prefill steps that made running decodes wait count towards the run.
            self.prefill_run += 1
            if self.enabled and self.prefill_run >= self.prefill_steps:
                self.prefill_run = 0
                self.owed = self.decode_steps


class PhaseSchedulingMixin:
    """Phase selection and request hiding around vLLM's `Scheduler.schedule`.

    Mixed in before `Scheduler` or `AsyncScheduler`; every vLLM behaviour that is not
    about which requests may share a step is the base class's, untouched. (vLLM's prefill
    deferral is decided here, on the base's state, because the base cannot see the
    running decodes in a prefill step: see `_prefill_held`.)
    """

    # Declared for type checkers; the base scheduler sets these.
    running: list[Request]
    waiting: RequestQueue
    kv_holding_waiting: RequestQueue

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reject_unsupported()
        # A steady decode row's slots answered before vLLM's allocation path, where
        # that is vLLM's own answer (`steady_slots`).
        steady_slots.install(self.kv_cache_manager)
        # A steady decode step without vLLM's per-row loop, where that is vLLM's step
        # (`steady_decode`); None where it is not.
        self.steady_decode = (
            steady_decode.SteadyDecode(self) if steady_decode.why_not(self) is None else None
        )
        self.interleave = DecodeInterleave.from_options(effective_options(self.vllm_config))
        # How many steps of each kind were returned: cheap to keep, and the first thing
        # to look at when latency looks wrong (are decodes starved by prefills?).
        self.step_kinds: Counter[str] = Counter({PREFILL: 0, DECODE: 0, EMPTY: 0})
        self.last_step_kind: StepKind | None = None

    @property
    def decode_steps_owed(self) -> int:
        """Decode steps the interleave cadence still owes running decodes: while it is
        above zero (and prefill work is pending), decode goes first."""
        return self.interleave.owed

    def _reject_unsupported(self) -> None:
        """Refuse what a discarded attempt would corrupt.

        A schedule() call that is discarded (see `_carry_over`) has already drained
        connector metadata, and encoder-decoder cache bookkeeping advances a stage per
        call; neither can be merged back, and none of them is served on Tenstorrent.
        """
        unsupported = [
            name
            for name, present in (
                ("a KV connector (kv_transfer_config)", self.connector is not None),
                ("an encoder-cache connector (ec_transfer_config)", self.ec_connector is not None),
                (
                    "auxiliary output connectors (aux_output_config)",
                    self.aux_output_connector is not None,
                ),
                ("encoder-decoder models", self.is_encoder_decoder),
            )
            if present
        ]
        if unsupported:
            raise ConfigurationError.single(
                "TTB202",
                f"the phase-based Tenstorrent scheduler does not support {', '.join(unsupported)}",
                hint="drop those options (the platform refuses the flags before this; "
                "the scheduler keeps the check for configurations built otherwise)",
            )

    def demand(self) -> PhaseDemand:
        """What this scheduler's requests ask of the next step (one pass over `running`)."""
        # is_in_prefill for every running request, read inline: this runs every step
        # over every running request, so no call per request.
        in_prefill = [request.is_prefill_chunk for request in self.running]
        has_prefill = True in in_prefill
        has_decode = False in in_prefill
        # Prefill work exists: a prompt chunk to run, or a request waiting, including one
        # the base parks in `waiting` while its grammar compiles (its status is
        # WAITING_FOR_STRUCTURED_OUTPUT_GRAMMAR and it is in `deferred_waiting`): a
        # decode step hides it with the rest of `waiting`.
        waiting = bool(self.waiting or self.kv_holding_waiting)
        # Admission is possible only with a free running slot; without that check a full
        # batch with a queue would pay for a futile prefill attempt on every step.
        can_admit = waiting and (
            len(self.running) + self.num_waiting_for_streaming_input < self.max_num_active_reqs
        )
        return PhaseDemand(has_prefill, has_decode, waiting, can_admit)

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        """Schedule one step of a single phase.

        On a steady decode batch (nothing mid-prefill, nothing waiting) this is the base
        schedule() plus one pass over `running`: nothing is hidden or copied.
        """
        demand = self.demand()
        has_prefill, has_decode = demand.has_prefill, demand.has_decode
        phases = choose_phases(
            demand,
            held=has_decode and self._prefill_held(throttle_prefills),
            decode_owed=self.interleave.owes_decode,
        )

        # A discarded attempt clears this set in place (MRV1 bookkeeping of the previous
        # step); keep a copy only when a second attempt is possible.
        previous_step_ids = compat.previous_step_ids(self) if len(phases) > 1 else None
        # Preemptions made before this step (reset_prefix_cache) are already here.
        num_preempted_before = len(self.reset_preempted_req_ids)
        phase = phases[0]
        decode_turn = phase == DECODE
        output = self._schedule_phase(phase, has_prefill, throttle_prefills)
        if (
            output.total_num_scheduled_tokens == 0
            and len(phases) > 1
            and not (
                # Like the base, admit nothing in a step that preempted: a request just
                # preempted by the decode attempt must not be resumed in the same step.
                phases[1] == PREFILL and len(output.preempted_req_ids or ()) > num_preempted_before
            )
        ):
            self._carry_over(output, previous_step_ids)
            phase = phases[1]
            decode_turn |= phase == DECODE
            output = self.merge_discarded(
                output, self._schedule_phase(phase, has_prefill, throttle_prefills)
            )

        kind = phase if output.total_num_scheduled_tokens > 0 else EMPTY
        self.record_step(kind)
        self.interleave.record(kind, decode_turn, demand.pending, has_decode)
        return output

    def schedule_phase(
        self, phase: StepKind, demand: PhaseDemand, throttle_prefills: bool = False
    ) -> SchedulerOutput:
        """One attempt at `phase` with nothing else decided here: the lane coordinator
        chooses the phase for every lane at once (`serving.lanes`). `demand` is this
        scheduler's `demand()` taken before the step."""
        return self._schedule_phase(phase, demand.has_prefill, throttle_prefills)

    def discard_attempt(
        self, discarded: SchedulerOutput, previous_step_ids: set[str] | None
    ) -> None:
        """Give back what an empty attempt consumed, before the other phase is tried."""
        self._carry_over(discarded, previous_step_ids)

    def previous_step_ids(self) -> set[str] | None:
        """A copy of the previous step's scheduled ids, which a discarded attempt would
        clear (MRV1 bookkeeping), or None where nothing needs keeping."""
        return compat.previous_step_ids(self)

    def record_step(self, kind: StepKind) -> None:
        self.step_kinds[kind] += 1
        self.last_step_kind = kind
        logger.debug("ttbundles scheduler: %s step (%d running)", kind, len(self.running))

    def _prefill_held(self, throttle_prefills: bool) -> bool:
        """vLLM's prefill deferral, decided before the phase is chosen (the caller has
        checked that a decode is running, vLLM's own condition).

        `Scheduler.schedule` defers all prefill compute, new admissions and the next
        chunk of a running prompt alike, when `throttle_prefills` is passed (the DP
        engine core does, off its cadence) or when the local prefill cadence
        (`prefill_schedule_interval` > 1, no DP coordinator) says fewer than that many
        executed steps (steps that scheduled tokens) have passed since the last one that
        carried prefill; either way not once a release step left the queue
        undrained (`prefill_capacity_bound`). The base cannot see a running decode in a
        prefill step (they are hidden), so it would never defer there: the decision is
        taken here, on the same state, and a held step is a decode step. The base keeps
        the state itself: it stamps `last_prefill_step` in the prefill steps and counts
        `num_executed_steps`; a discarded attempt scheduled nothing and counts for
        neither.
        """
        if self.prefill_capacity_bound:
            return False
        if throttle_prefills:
            return True
        return (
            self.local_prefill_interval > 1
            and (self.num_executed_steps + 1) - self.last_prefill_step < self.local_prefill_interval
        )

    def _schedule_phase(
        self, phase: StepKind, has_prefill: bool, throttle_prefills: bool
    ) -> SchedulerOutput:
        """Run the base schedule() with only `phase`'s requests visible."""
        running = self.running
        if phase == PREFILL:
            visible = [r for r in running if is_in_prefill(r)]
        elif has_prefill:
            visible = [r for r in running if not is_in_prefill(r)]
        else:
            visible = running
        num_hidden = len(running) - len(visible)

        hidden_queues = None
        capacity_bound = self.prefill_capacity_bound
        if phase == DECODE and (self.waiting or self.kv_holding_waiting):
            hidden_queues = (self.waiting, self.kv_holding_waiting)
            self.waiting = create_request_queue(self.policy)
            self.kv_holding_waiting = create_request_queue(self.policy)

        if num_hidden:
            # A copy: the base edits `running` in place, and the restore needs `visible`.
            self.running = list(visible)
            # Hidden requests still hold run slots: admission must count them.
            self.max_num_active_reqs -= num_hidden
        try:
            if phase == DECODE and not num_hidden and self.steady_decode is not None:
                base = functools.partial(super().schedule, throttle_prefills)  # type: ignore[misc]
                output = self.steady_decode.schedule(self, base, running)
                if output is not None:
                    return output
            return super().schedule(throttle_prefills)  # type: ignore[misc]
        finally:
            if num_hidden:
                self.max_num_active_reqs += num_hidden
                self.running = _restore_running(running, visible, self.running)
            if phase == DECODE:
                # The decode attempt looked at no waiting request: the base's verdict
                # on prefill capacity is not one.
                self.prefill_capacity_bound = capacity_bound
            if hidden_queues is not None:
                preempted, self.waiting = self.waiting, hidden_queues[0]
                held, self.kv_holding_waiting = self.kv_holding_waiting, hidden_queues[1]
                # Preempted requests go to the front, in the order the base put them.
                if preempted:
                    self.waiting.prepend_requests(reversed(list(preempted)))
                if held:
                    self.kv_holding_waiting.prepend_requests(reversed(list(held)))

    def _carry_over(self, discarded: SchedulerOutput, previous_step_ids: set[str] | None) -> None:
        """Give back to the scheduler what a discarded (empty) attempt consumed.

        schedule() hands `finished_req_ids` and the preempted ids to its output and
        starts new sets, counts a step, and overwrites the previous step's scheduled
        ids: the next attempt must report the former and see the latter unchanged.
        """
        discarded.finished_req_ids |= self.finished_req_ids
        self.finished_req_ids = discarded.finished_req_ids
        if discarded.preempted_req_ids is not None:
            discarded.preempted_req_ids |= self.reset_preempted_req_ids
            self.reset_preempted_req_ids = discarded.preempted_req_ids
        self.current_step -= 1
        if previous_step_ids is not None:
            compat.restore_previous_step_ids(self, previous_step_ids)

    @staticmethod
    def merge_discarded(discarded: SchedulerOutput, output: SchedulerOutput) -> SchedulerOutput:
        """Carry the drained, step-scoped fields of a discarded attempt into `output`.

        Drained from managers by every schedule() call: freed encoder-cache entries,
        encoder input updates, blocks to zero and copy-on-write copies. The id sets were
        given back by `_carry_over` and are already in `output`.
        """
        if discarded.free_encoder_mm_hashes:
            output.free_encoder_mm_hashes = (
                discarded.free_encoder_mm_hashes + output.free_encoder_mm_hashes
            )
        for req_id, updates in discarded.encoder_input_updates.items():
            output.encoder_input_updates.setdefault(req_id, {}).update(updates)
        if discarded.new_block_ids_to_zero:
            output.new_block_ids_to_zero = discarded.new_block_ids_to_zero + (
                output.new_block_ids_to_zero or []
            )
        if discarded.kv_cache_block_copies:
            output.kv_cache_block_copies = discarded.kv_cache_block_copies + (
                output.kv_cache_block_copies or []
            )
        output.has_sync_kv_loads |= discarded.has_sync_kv_loads
        return output


def _restore_running(
    original: list[Request], visible: list[Request], after: list[Request]
) -> list[Request]:
    """`original` in its order, minus what the base removed from `visible`, plus what it
    appended.

    The base only removes requests from `running` (preemption) and appends admitted
    ones, keeping the relative order of the rest: `after` is `visible` minus removals,
    then the new requests.
    """
    visible_ids = {id(r) for r in visible}
    kept = 0
    for request in after:
        if id(request) not in visible_ids:
            break
        kept += 1
    appended = after[kept:]
    if kept == len(visible):
        return original + appended
    remaining = {id(r) for r in after[:kept]}
    removed = visible_ids - remaining
    return [r for r in original if id(r) not in removed] + appended


class BlockOutputMixin:
    """A block-output class's decode (`output_tokens_per_step` k > 1, the plan's
    `output_tokens_per_step`): one scheduled token a row, k tokens back.

    vLLM appends a step's tokens one by one and cuts at the first stop, trimming the rest
    (`Scheduler._update_request_with_output`), as for accepted drafts; what it does not
    know is that the block's first k - 1 tokens already have their KV on the device (the
    generator decoded through them). Here they count as computed before the base appends
    them, so `num_computed_tokens` covers every token but the last, as after a verify, and
    the next step schedules one token per row (no re-prefill of the block); a stop inside
    the block trims the count with the tokens (the base's own rule). The KV blocks a
    block writes are reserved as vLLM's lookahead (k - 1 slots past the scheduled token).
    """

    vllm_config: Any
    num_lookahead_tokens: int

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        plan = served_plan(self.vllm_config)
        self.block_tokens = plan.output_tokens_per_step if plan is not None else 1
        if self.block_tokens > 1:
            self.num_lookahead_tokens = max(self.num_lookahead_tokens, self.block_tokens - 1)

    def _update_request_with_output(
        self, request: Request, new_token_ids: list[int], is_stale: bool = False
    ) -> tuple[list[int], bool]:
        if self.block_tokens > 1 and len(new_token_ids) > 1 and not is_stale:
            request.num_computed_tokens += len(new_token_ids) - 1
        return super()._update_request_with_output(  # type: ignore[misc]
            request, new_token_ids, is_stale
        )


class TTScheduler(BlockOutputMixin, RecurrentPrefixMixin, PhaseSchedulingMixin, Scheduler):
    """vLLM's `Scheduler` with one phase per step (see the module docstring)."""


class TTAsyncScheduler(RecurrentPrefixMixin, PhaseSchedulingMixin, AsyncScheduler):
    """vLLM's `AsyncScheduler` with one phase per step.

    Only `_update_after_schedule` differs in the base (output placeholders, added after
    `is_prefill_chunk` is set), so the phase logic is shared as is.
    """
