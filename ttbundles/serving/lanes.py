"""In-process data-parallel lanes: one engine, N schedulers, one device step.

A single-execute generator (`capabilities.execution: "single"`: Galaxy-scale models)
runs one program over the whole mesh with one copy of the weights and N independent KV
caches, one per data-parallel submesh. There is nothing to give a second engine process,
but there are N things to schedule: vLLM's `--data-parallel-size N` becomes N lanes in
the one engine (the plan decides it, `configuration._plan_lanes`).

`TTLaneCoordinator` is the engine's scheduler. It owns one phase scheduler per lane,
each built from a per-lane copy of the configuration (`max_num_seqs` per lane) with its
own KV cache manager over its own share of the blocks (block ids are lane-local and
repeat across lanes: each lane's page table addresses its own submesh's cache). Every
step it

- chooses one phase for all lanes (the device runs them together and cannot mix): the
  same rule as one scheduler (`scheduler.choose_phases`) over the union of the lanes'
  demand, with the decode interleave and the prefill cadence owned here, once;
- schedules every lane in that phase, idle ones too, so their finished ids drain;
- applies the retry rule: a forced prefill that admits nothing while some lane has
  running decodes is re-run as decode, carrying each lane's discarded-pass bookkeeping
  (finished and preempted ids, drained step fields) into the decode pass; without it KV
  pressure loops (prefill chosen, nothing fits, the decode that would free blocks never
  runs);
- merges the lanes' outputs into one `SchedulerOutput` for the worker (lists in lane
  order, dicts merged, sets unioned, `num_common_prefix_blocks` element-wise max) and
  keeps each lane's own output on it, so `update_from_output` hands every lane its slice.

A new request goes to the least-loaded lane (4 x waiting + running, ties to the lowest
lane: vLLM's own DP load-balancing score) and stays there for life, through preemption
and resumption. The worker learns each request's lane from `lane_of(output)` and places
it in a stable device row `lane x per_lane + slot` (`model_runner`).
"""

from __future__ import annotations

import copy
import logging
from collections import ChainMap, Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from vllm.multimodal import MULTIMODAL_REGISTRY
from vllm.v1.core.sched.interface import PauseState, SchedulerInterface
from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.metrics.stats import PrefixCacheStats, SchedulerStats
from vllm.v1.spec_decode.metrics import SpecDecodingStats

from ttbundles.errors import ConfigurationError
from ttbundles.serving import compat
from ttbundles.serving.api_server.lane_metrics import encode_lane_stats
from ttbundles.serving.lane_output import lane_outputs, mark_lanes
from ttbundles.serving.planning.plan import effective_options, served_plan
from ttbundles.serving.scheduler import (
    DECODE,
    EMPTY,
    PREFILL,
    DecodeInterleave,
    PhaseDemand,
    PhaseSchedulingMixin,
    StepKind,
    TTAsyncScheduler,
    TTScheduler,
    choose_phases,
)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.multimodal import MultiModalRegistry
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request, RequestStatus
    from vllm.v1.structured_output import StructuredOutputManager

logger = logging.getLogger("vllm.ttbundles.lanes")


def pick_lane(loads: list[tuple[int, int]]) -> int:
    """The least-loaded lane for a new request: lowest 4 x waiting + running, ties to the
    lowest lane. `loads[i]` is lane i's (waiting, running)."""
    scores = [4 * waiting + running for waiting, running in loads]
    return scores.index(min(scores))


def merge_outputs(outputs: list[SchedulerOutput]) -> SchedulerOutput:
    """The lanes' outputs as one step: lists in lane order, dicts merged (request ids are
    unique across lanes), sets unioned, flags or-ed, `num_common_prefix_blocks` the
    element-wise max (the merged batch must reserve what its most demanding lane needs).
    Block ids stay lane-local."""
    merged = SchedulerOutput.make_empty()
    merged.scheduled_cached_reqs = compat.merge_cached_request_data(
        [out.scheduled_cached_reqs for out in outputs]
    )
    preempted: set[str] | None = None
    for out in outputs:
        merged.scheduled_new_reqs.extend(out.scheduled_new_reqs)
        merged.num_scheduled_tokens.update(out.num_scheduled_tokens)
        merged.total_num_scheduled_tokens += out.total_num_scheduled_tokens
        merged.scheduled_spec_decode_tokens.update(out.scheduled_spec_decode_tokens)
        merged.scheduled_encoder_inputs.update(out.scheduled_encoder_inputs)
        for req_id, updates in out.encoder_input_updates.items():
            merged.encoder_input_updates.setdefault(req_id, {}).update(updates)
        compat.merge_common_prefix_blocks(merged, out)
        merged.finished_req_ids |= out.finished_req_ids
        merged.free_encoder_mm_hashes.extend(out.free_encoder_mm_hashes)
        if out.preempted_req_ids is not None:
            preempted = (preempted or set()) | out.preempted_req_ids
        merged.has_structured_output_requests |= out.has_structured_output_requests
        merged.pending_structured_output_tokens |= out.pending_structured_output_tokens
        merged.has_sync_kv_loads |= out.has_sync_kv_loads
        if out.num_invalid_spec_tokens:
            merged.num_invalid_spec_tokens = {
                **(merged.num_invalid_spec_tokens or {}),
                **out.num_invalid_spec_tokens,
            }
        if out.new_block_ids_to_zero:
            merged.new_block_ids_to_zero = (merged.new_block_ids_to_zero or []) + list(
                out.new_block_ids_to_zero
            )
        if out.kv_cache_block_copies:
            merged.kv_cache_block_copies = (merged.kv_cache_block_copies or []) + list(
                out.kv_cache_block_copies
            )
    merged.preempted_req_ids = preempted
    return merged


class TTLaneCoordinator(SchedulerInterface):
    """The engine's scheduler when the plan has lanes (see the module docstring)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        kv_cache_config: KVCacheConfig,
        structured_output_manager: StructuredOutputManager,
        block_size: int,
        hash_block_size: int | None = None,
        mm_registry: MultiModalRegistry = MULTIMODAL_REGISTRY,
        include_finished_set: bool = False,
        log_stats: bool = False,
    ) -> None:
        self.vllm_config = vllm_config
        self.structured_output_manager = structured_output_manager
        self.log_stats = log_stats
        plan = served_plan(vllm_config)
        self.num_lanes = plan.lanes if plan is not None else 1
        sched = vllm_config.scheduler_config
        self.max_num_seqs = sched.max_num_seqs
        if self.num_lanes < 1 or self.max_num_seqs % self.num_lanes:
            raise ConfigurationError.single(
                "TTB205",
                f"{self.num_lanes} lanes cannot share max_num_seqs={self.max_num_seqs} evenly",
                hint=f"use a max_num_seqs that is a multiple of {self.num_lanes}",
            )
        self.per_lane = self.max_num_seqs // self.num_lanes
        self.lane_kv_cache_config = _lane_kv_cache_config(
            kv_cache_config, self.num_lanes, vllm_config.model_config.max_model_len, block_size
        )
        lane_config = copy.copy(vllm_config)
        lane_config.scheduler_config = copy.copy(sched)
        lane_config.scheduler_config.max_num_seqs = self.per_lane
        lane_config.cache_config = copy.copy(vllm_config.cache_config)
        lane_config.cache_config.num_gpu_blocks = self.lane_kv_cache_config.num_blocks
        lane_cls: type[PhaseSchedulingMixin] = (
            TTAsyncScheduler if sched.async_scheduling else TTScheduler
        )
        self.lanes: list[Any] = [
            lane_cls(
                vllm_config=lane_config,
                kv_cache_config=self.lane_kv_cache_config,
                structured_output_manager=structured_output_manager,
                block_size=block_size,
                hash_block_size=hash_block_size,
                mm_registry=mm_registry,
                include_finished_set=include_finished_set,
                log_stats=log_stats,
            )
            for _ in range(self.num_lanes)
        ]
        # The decode interleave and the prefill cadence are the step's, decided here
        # once for all lanes; the lanes' own copies are never consulted.
        self.interleave = DecodeInterleave.from_options(effective_options(vllm_config))
        first = self.lanes[0]
        self.local_prefill_interval: int = first.local_prefill_interval
        self.num_executed_steps = 0
        self.last_prefill_step = -self.local_prefill_interval
        self.step_kinds: Counter[str] = Counter({PREFILL: 0, DECODE: 0, EMPTY: 0})
        self.last_step_kind: StepKind | None = None
        self.retries = 0  # forced prefills re-run as decode (the retry rule)
        self._lane_of: dict[str, int] = {}
        self.assigned = [0] * self.num_lanes  # requests bound to each lane, ever
        # Engine-core attribute reads; connectors are refused by the lanes themselves.
        self.connector = None
        self.ec_connector = None
        logger.info(
            "ttbundles: %d in-process lanes, max_num_seqs %d per lane (%d in all), "
            "%d KV blocks per lane",
            self.num_lanes,
            self.per_lane,
            self.max_num_seqs,
            self.lane_kv_cache_config.num_blocks,
        )

    # --- lanes ----------------------------------------------------------------------

    def lane_of_request(self, req_id: str) -> int | None:
        return self._lane_of.get(req_id)

    def _prefill_held(self, throttle_prefills: bool) -> bool:
        """vLLM's prefill deferral for the step (see `PhaseSchedulingMixin._prefill_held`),
        on the coordinator's own count of executed steps: the lanes run every step
        together, so the cadence is the step's, not a lane's."""
        if any(lane.prefill_capacity_bound for lane in self.lanes):
            return False
        if throttle_prefills:
            return True
        return (
            self.local_prefill_interval > 1
            and (self.num_executed_steps + 1) - self.last_prefill_step < self.local_prefill_interval
        )

    # --- scheduling -------------------------------------------------------------------

    def schedule(self, throttle_prefills: bool = False) -> SchedulerOutput:
        lanes = self.lanes
        demands = [lane.demand() for lane in lanes]
        demand = PhaseDemand.union(demands)
        phases = choose_phases(
            demand,
            held=demand.has_decode and self._prefill_held(throttle_prefills),
            decode_owed=self.interleave.owes_decode,
        )
        retry_possible = len(phases) > 1
        previous_ids = [lane.previous_step_ids() if retry_possible else None for lane in lanes]
        preempted_before = [len(lane.reset_preempted_req_ids) for lane in lanes]
        phase = phases[0]
        decode_turn = phase == DECODE
        outputs = [
            lane.schedule_phase(phase, d, throttle_prefills)
            for lane, d in zip(lanes, demands, strict=True)
        ]
        if (
            retry_possible
            and sum(o.total_num_scheduled_tokens for o in outputs) == 0
            and not (
                # As one scheduler: nothing is admitted in a step that preempted.
                phases[1] == PREFILL
                and any(
                    len(o.preempted_req_ids or ()) > before
                    for o, before in zip(outputs, preempted_before, strict=True)
                )
            )
        ):
            if phases[1] == DECODE:
                self.retries += 1
            for lane, out, ids in zip(lanes, outputs, previous_ids, strict=True):
                lane.discard_attempt(out, ids)
            phase = phases[1]
            decode_turn |= phase == DECODE
            outputs = [
                lane.merge_discarded(out, lane.schedule_phase(phase, d, throttle_prefills))
                for lane, out, d in zip(lanes, outputs, demands, strict=True)
            ]

        merged = merge_outputs(outputs)
        scheduled = merged.total_num_scheduled_tokens > 0
        kind = phase if scheduled else EMPTY
        for lane, out in zip(lanes, outputs, strict=True):
            lane.record_step(phase if out.total_num_scheduled_tokens else EMPTY)
        self.step_kinds[kind] += 1
        self.last_step_kind = kind
        self.interleave.record(kind, decode_turn, demand.pending, demand.has_decode)
        if scheduled:
            self.num_executed_steps += 1
            if kind == PREFILL and self.local_prefill_interval > 1:
                self.last_prefill_step = self.num_executed_steps

        for req_id in merged.finished_req_ids:
            self._lane_of.pop(req_id, None)
        placed: dict[str, int] = {}
        for index, out in enumerate(outputs):
            placed.update(dict.fromkeys(out.num_scheduled_tokens, index))
        mark_lanes(merged, outputs, placed)
        return merged

    def get_grammar_bitmask(self, scheduler_output: SchedulerOutput) -> GrammarOutput | None:
        """The base's bitmask over all lanes' requests (ids are unique across lanes)."""
        if not scheduler_output.has_structured_output_requests:
            return None
        requests = ChainMap(*(lane.requests for lane in self.lanes))
        ids = [
            req_id
            for req_id in scheduler_output.num_scheduled_tokens
            if (req := requests.get(req_id))
            and req.use_structured_output
            and not req.is_prefill_chunk
        ]
        if not ids:
            return None
        bitmask = self.structured_output_manager.grammar_bitmask(
            requests, ids, scheduler_output.scheduled_spec_decode_tokens
        )
        return GrammarOutput(ids, bitmask, [0] * len(ids))

    def update_from_output(
        self, scheduler_output: SchedulerOutput, model_runner_output: ModelRunnerOutput
    ) -> dict[int, EngineCoreOutputs]:
        """Each lane reads its own slice of the step; the runner's output (keyed by
        request id) is shared. The lanes' statistics become one, with each lane's
        numbers alongside (`lane_metrics`)."""
        slices = lane_outputs(scheduler_output)
        if slices is None:  # not a coordinator's step (nothing was scheduled through us)
            return {}
        merged: dict[int, EngineCoreOutputs] = {}
        lane_stats: list[SchedulerStats | None] = []
        for lane, out in zip(self.lanes, slices, strict=True):
            stats = None
            for client, eco in lane.update_from_output(out, model_runner_output).items():
                if eco.scheduler_stats is not None:
                    stats, eco.scheduler_stats = eco.scheduler_stats, None
                into = merged.get(client)
                if into is None:
                    merged[client] = eco
                    continue
                if eco.outputs:
                    into.outputs = into.outputs + eco.outputs
                if eco.finished_requests:
                    into.finished_requests = (into.finished_requests or set()) | set(
                        eco.finished_requests
                    )
            lane_stats.append(stats)
        if self.log_stats:
            total = self._merge_stats(lane_stats)
            eco = next(iter(merged.values()), None)
            if eco is None:
                merged[0] = eco = EngineCoreOutputs()
            eco.scheduler_stats = total
        return merged

    def _merge_stats(self, lane_stats: list[SchedulerStats | None]) -> SchedulerStats:
        """One SchedulerStats for the engine: counts summed, KV usage the mean over
        lanes (each lane has an equal share of the blocks), prefix-cache counters
        summed; the per-lane numbers travel along for `/metrics`."""
        stats = [
            s if s is not None else lane.make_stats() or SchedulerStats()
            for s, lane in zip(lane_stats, self.lanes, strict=True)
        ]
        total = SchedulerStats(
            num_running_reqs=sum(s.num_running_reqs for s in stats),
            num_waiting_reqs=sum(s.num_waiting_reqs for s in stats),
            num_skipped_waiting_reqs=sum(s.num_skipped_waiting_reqs for s in stats),
            kv_cache_usage=sum(s.kv_cache_usage for s in stats) / len(stats),
            prefix_cache_stats=_sum_prefix_stats([s.prefix_cache_stats for s in stats]),
            spec_decoding_stats=_sum_spec_stats([s.spec_decoding_stats for s in stats]),
        )
        total.num_kv_fetch_reqs_by_stage = encode_lane_stats(
            [
                (s.num_running_reqs, s.num_waiting_reqs, s.kv_cache_usage, assigned)
                for s, assigned in zip(stats, self.assigned, strict=True)
            ]
        )
        return total

    def update_draft_token_ids(self, draft_token_ids: DraftTokenIds) -> None:
        for lane in self.lanes:
            lane.update_draft_token_ids(draft_token_ids)

    def update_draft_token_ids_in_output(
        self, draft_token_ids: DraftTokenIds, scheduler_output: SchedulerOutput
    ) -> None:
        for lane, out in zip(self.lanes, lane_outputs(scheduler_output) or (), strict=False):
            lane.update_draft_token_ids_in_output(draft_token_ids, out)

    # --- requests ---------------------------------------------------------------------

    def add_request(self, request: Request) -> None:
        lane = self._lane_of.get(request.request_id)
        if lane is None:
            lane = pick_lane([lane.get_request_counts()[::-1] for lane in self.lanes])
            self._lane_of[request.request_id] = lane
            self.assigned[lane] += 1
        self.lanes[lane].add_request(request)

    def has_request(self, request_id: str) -> bool:
        lane = self._lane_of.get(request_id)
        return lane is not None and self.lanes[lane].has_request(request_id)

    def finish_requests(
        self, request_ids: str | Iterable[str] | None, finished_status: RequestStatus
    ) -> list[Request]:
        if request_ids is None:
            return [r for lane in self.lanes for r in lane.finish_requests(None, finished_status)]
        ids = (request_ids,) if isinstance(request_ids, str) else tuple(request_ids)
        by_lane: dict[int, list[str]] = {}
        for req_id in ids:
            lane = self._lane_of.get(req_id)
            if lane is not None:
                by_lane.setdefault(lane, []).append(req_id)
        finished: list[Request] = []
        for lane, lane_ids in sorted(by_lane.items()):
            finished += self.lanes[lane].finish_requests(lane_ids, finished_status)
        return finished

    def get_num_unfinished_requests(self) -> int:
        return sum(lane.get_num_unfinished_requests() for lane in self.lanes)

    def has_finished_requests(self) -> bool:
        return any(lane.has_finished_requests() for lane in self.lanes)

    def has_requests(self) -> bool:
        return any(lane.has_requests() for lane in self.lanes)

    def get_request_counts(self) -> tuple[int, int]:
        counts = [lane.get_request_counts() for lane in self.lanes]
        return sum(c[0] for c in counts), sum(c[1] for c in counts)

    def get_kv_cache_usage(self) -> float:
        return sum(lane.get_kv_cache_usage() for lane in self.lanes) / self.num_lanes

    @property
    def pause_state(self) -> PauseState:
        # The lanes step together and are paused together.
        return self.lanes[0].pause_state

    def set_pause_state(self, pause_state: PauseState) -> None:
        for lane in self.lanes:
            lane.set_pause_state(pause_state)

    def reset_prefix_cache(
        self, reset_running_requests: bool = False, reset_connector: bool = False
    ) -> bool:
        results = [
            lane.reset_prefix_cache(reset_running_requests, reset_connector) for lane in self.lanes
        ]
        return all(results)

    def reset_encoder_cache(self) -> None:
        for lane in self.lanes:
            lane.reset_encoder_cache()

    def make_stats(self) -> SchedulerStats | None:
        if not self.log_stats:
            return None
        return self._merge_stats([lane.make_stats() for lane in self.lanes])

    def shutdown(self) -> None:
        for lane in self.lanes:
            lane.shutdown()


def _lane_kv_cache_config(
    kv_cache_config: KVCacheConfig, lanes: int, max_model_len: int, block_size: int
) -> KVCacheConfig:
    """Each lane's share of the KV blocks: the engine sized the cache for all lanes (the
    worker reports every lane's memory), and each lane's manager gets an equal part."""
    per_lane = kv_cache_config.num_blocks // lanes
    needed = -(-max_model_len // block_size)
    if per_lane < needed:
        raise ConfigurationError.single(
            "TTB214",
            f"a KV cache of {kv_cache_config.num_blocks} blocks over {lanes} lanes leaves "
            f"{per_lane} blocks per lane; one sequence of max_model_len={max_model_len} "
            f"needs {needed} blocks of {block_size} tokens",
            hint="give the KV cache more memory (--kv-cache-memory-bytes, "
            "--num-gpu-blocks-override), or lower --max-model-len",
        )
    lane = copy.deepcopy(kv_cache_config)
    lane.num_blocks = per_lane
    return lane


def _sum_spec_stats(stats: list[SpecDecodingStats | None]) -> SpecDecodingStats | None:
    """The lanes' speculative-decoding counts of a step as one (vLLM's
    `vllm:spec_decode_*` metrics): drafts, draft and accepted tokens summed, and per
    position; None when no lane verified drafts."""
    present = [s for s in stats if s is not None]
    if not present:
        return None
    total = SpecDecodingStats.new(max(s.num_spec_tokens for s in present))
    for s in present:
        total.num_drafts += s.num_drafts
        total.num_draft_tokens += s.num_draft_tokens
        total.num_accepted_tokens += s.num_accepted_tokens
        for into, values in (
            (total.num_accepted_tokens_per_pos, s.num_accepted_tokens_per_pos),
            (total.num_draft_tokens_per_pos, s.num_draft_tokens_per_pos),
        ):
            for i, value in enumerate(values):
                into[i] += value
    return total


def _sum_prefix_stats(stats: list[PrefixCacheStats]) -> PrefixCacheStats:
    total = PrefixCacheStats()
    for s in stats:
        total.reset |= s.reset
        total.requests += s.requests
        total.queries += s.queries
        total.hits += s.hits
        total.preempted_requests += s.preempted_requests
        total.preempted_queries += s.preempted_queries
        total.preempted_hits += s.preempted_hits
        for source, hits in s.hits_by_source.items():
            total.hits_by_source[source] = total.hits_by_source.get(source, 0) + hits
    return total
