"""Drive a TT generator from vLLM's scheduler output, step by step, through the real
generator contract (`ttbundles.format.contract`).

The runner keeps the request rows in a host batch (`serving.compat.host_batch()`: vLLM's
V1 `InputBatch` and `Sampler` where the release ships them, ours on the release's parts
otherwise), so that host sampling keeps vLLM's semantics; the generator owns the model
and attention over the paged KV cache the runner allocates through it. Each step is
prefill-only or decode-only (the phase-based scheduler guarantees it), which maps onto
`prefill_forward` and `decode_forward`.

Device rows are *slots*: a request holds one slot from its first prefill until it
finishes or is preempted, so the generator's per-slot state (resident decode inputs,
sampler seeds, penalty history, RoPE deltas) stays attached to it. Decode calls carry
every slot (empty ones at position -1, as TT-Metal's traces need a fixed batch); prefill
calls carry the requests being filled and their slots in `empty_slots`. Rows never move,
so the `slot_remap` sent with every decode is the identity.

What each decode tells the generator follows TT-Metal's decode input-update contract v1
(`models/common/decode_contract.py`) for classes that declare it, and `reset_batch` for
the others: see `DecodeCommands`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.sampling_params import SamplingType
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    DraftTokenIds,
    LogprobsTensors,
    ModelRunnerOutput,
)

from ttbundles.format import contract
from ttbundles.format import speculative as spec
from ttbundles.format.contract import SamplingParams
from ttbundles.serving import compat
from ttbundles.serving.binding import (
    BoundMethod,
    GeneratorContractError,
    bind,
    call_at_load,
    decode_offer,
    split_output,
)
from ttbundles.serving.configuration import effective_options, served_plan
from ttbundles.serving.lanes import lane_of
from ttbundles.serving.pixel_store import PixelStore
from ttbundles.serving.runner.commands import DecodeCommands
from ttbundles.serving.runner.families import tt_data_parallel
from ttbundles.serving.runner.history import PenaltyHistory
from ttbundles.serving.runner.prompt_logprobs import PromptLogprobs
from ttbundles.serving.runner.readback import TTAsyncOutput
from ttbundles.serving.runner.speculation import Speculation, check_verify_output
from ttbundles.serving.runner.step import (
    EMPTY_POSITION,
    Layout,
    StepObserver,
    StepState,
    rows_of,
)
from ttbundles.serving.sampling_path import (
    batch_host_reason,
    device_params,
    device_support,
)
from ttbundles.serving.stats import STATS

if TYPE_CHECKING:  # vLLM's config and scheduler types are only needed for annotations
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

logger = logging.getLogger("vllm.ttbundles")


class TTModelRunner:
    def __init__(self, vllm_config: VllmConfig, generator_cls: type, mesh_device: Any):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.generator_cls = generator_cls
        self.class_name = f"{generator_cls.__module__}.{generator_cls.__qualname__}"
        self.mesh_device = mesh_device
        self.device = torch.device("cpu")
        sched = vllm_config.scheduler_config
        self.max_num_reqs = sched.max_num_seqs
        self.max_model_len = self.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        plan = served_plan(vllm_config)
        # In-process data-parallel lanes (single-execute generators): device rows are
        # lane x per_lane + slot, each lane's requests in its own rows and KV cache.
        self.lanes = plan.lanes if plan is not None else 1
        # The bundle serves images (the plan allowed some per prompt): prefill gets them.
        self.image_inputs = bool(plan is not None and plan.inputs.get("image"))
        # The bundle declares prompt logprobs: prefill returns every position's logits when
        # asked (`contract.PROMPT_LOGITS_KEYWORD`), and this runner computes them.
        self.prompt_logprobs = (
            PromptLogprobs() if plan is not None and plan.prompt_logprobs else None
        )
        self.pixels = PixelStore()
        self.per_lane = self.max_num_reqs // self.lanes
        # Speculative decoding as the plan admitted it (None: not speculating).
        self.speculation: Speculation | None = None
        if plan is not None and plan.speculative:
            self.speculation = Speculation.from_plan(
                plan.speculative,
                capacity=self.max_num_reqs,
                vocab_size=self.model_config.get_vocab_size(),
                max_model_len=self.max_model_len,
            )
        self.options = effective_options(vllm_config)
        self.version = contract.contract_version(generator_cls)
        self.capabilities: dict[str, Any] = dict(
            getattr(generator_cls, contract.CAPABILITIES_ATTRIBUTE, None) or {}
        )
        trace_mode = self.options.trace_mode or "all"
        self.prefill_trace = trace_mode == "all"
        self.decode_trace = trace_mode in ("all", "decode_only")
        # A generator keeps its decode inputs resident (token feedback, one position
        # advance per step) only where it declares async decode and traces decode.
        self.resident_inputs = bool(self.capabilities.get("supports_async_decode")) and (
            self.decode_trace
        )
        self._refuse_unsupported_keys()
        self._bind_class_methods()
        self.generator: Any = None
        self.kv_cache: Any = None
        self.cache_layers = 0  # layers of a per-layer cache: page_tables_per_layer is sent
        self.requests: dict[str, Any] = {}  # compat.request_state(...) by request id
        # The request rows and the host sampler: vLLM's V1 parts where the release ships
        # them, ours on the release's parts otherwise (see `serving.compat`).
        self.input_batch = compat.host_batch(vllm_config, self.device)
        self._step: StepState | None = None
        # Asynchronous decode: the bundle declares it and async scheduling stayed on.
        self.async_decode = bool(sched.async_scheduling)
        self._inflight: list[TTAsyncOutput] = []
        self._async_req_ids: list[str] | None = None
        self._async_layout: Layout | None = None  # the layout of those rows
        # Slots: which request holds which device row, for its whole life (its lane's
        # rows; a preempted request keeps its lane and takes a row there on resuming).
        self.slot_of: dict[str, int] = {}
        self.lane_of: dict[str, int] = {}
        self._free_slots = [
            list(range(lane * self.per_lane, (lane + 1) * self.per_lane))
            for lane in range(self.lanes)
        ]
        # The slot layout and page table of the last device-sampling decode: a decode
        # with the same layout right after it is "steady" (nothing to reload).
        self._device_layout: tuple[str | None, ...] | None = None
        self._device_page_table: torch.Tensor | None = None
        self.rope_deltas: dict[str, Any] = {}
        # Per-slot decode inputs kept between steps and updated per changed row (numpy
        # views share their memory): the page table row of each slot, how many of its
        # columns are live, and the penalty history (built only for batches that ask).
        width = -(-self.max_model_len // self.block_size)
        self._slot_table = torch.zeros((self.max_num_reqs, width), dtype=torch.int32)
        self._slot_table_np = self._slot_table.numpy()
        self._slot_blocks = np.zeros(self.max_num_reqs, dtype=np.int64)
        self._history = PenaltyHistory(self.max_num_reqs)
        # Bumped whenever a slot changes hands: a cached Layout is valid while it holds.
        self._slot_epoch = 0
        self._layout: Layout | None = None
        # Bumped whenever a slot's page-table row changes: a layout's cut table is valid
        # (and is sent again, the same tensor) while it holds.
        self._table_version = 0
        # The scheduler's order of a steady step's requests and their batch rows, valid
        # until the general bookkeeping path moves rows (see `_update_steady`).
        self._steady_ids: list[str] | None = None
        self._steady_index = np.zeros(0, dtype=np.int64)
        # Requests whose last chunk left their prompt incomplete: the scheduler's
        # `is_prefill_chunk`, which does not cross the process boundary, kept here.
        self._mid_prefill: set[str] = set()
        self.observer: StepObserver | None = None

    # --- set-up -----------------------------------------------------------------------

    def _refuse_unsupported_keys(self) -> None:
        """Keys that make a class impossible to drive as configured, refused before any
        weight loads (`format.contract.KNOWN_CAPABILITY_KEYS`)."""
        name, caps = self.class_name, self.capabilities
        steps = caps.get(contract.OUTPUT_TOKENS_PER_STEP_KEY, 1)
        if isinstance(steps, int) and not isinstance(steps, bool) and steps > 1:
            raise GeneratorContractError.single(
                "TTB202",
                f"{name} declares output_tokens_per_step={steps}: block-output decode is "
                "not supported yet (the worker commits one token per step)",
                hint="serve a one-token-per-step generator for this architecture",
            )
        required = caps.get(contract.REQUIRED_BLOCK_SIZE_KEY)
        if isinstance(required, int) and required != self.block_size:
            raise GeneratorContractError.single(
                "TTB063",
                f"{name} requires KV blocks of {required} tokens (required_block_size), "
                f"but the engine uses {self.block_size}",
                hint=f"serve with --block-size {required}",
            )

    def _bind_class_methods(self) -> None:
        """Bind initialize_vllm_model and get_max_tokens_all_users; refuse at load what
        the class requires and the worker cannot supply."""
        cls, name = self.generator_cls, self.class_name
        offered = [k for k in contract.INITIALIZE.passes if k != "optimizations"]
        if self.options.optimizations is not None:  # passed only when set
            offered.append("optimizations")
        self._initialize = bind(cls, contract.INITIALIZE, offered, class_name=name)
        self._max_tokens = bind(
            cls, contract.MAX_TOKENS, contract.MAX_TOKENS.passes, class_name=name
        )
        # Prefill and decode read on the class too, so that a parameter the worker cannot
        # supply (Mllama's images) is refused before initialize_vllm_model loads weights;
        # bound again on the instance after it.
        bind(cls, contract.PREFILL, contract.PREFILL.passes, class_name=name, optional=True)
        bind(cls, contract.DECODE, decode_offer(self.version), class_name=name, optional=True)

    def _bind_instance_methods(self) -> None:
        model, name = self.generator, self.class_name
        prefill_offer = contract.PREFILL.passes
        if self.image_inputs:
            prefill_offer += contract.PREFILL_IMAGE_INPUTS
        if self.prompt_logprobs is not None:
            prefill_offer += (contract.PROMPT_LOGITS_KEYWORD,)
        self._prefill = bind(model, contract.PREFILL, prefill_offer, class_name=name)
        decode = decode_offer(self.version)
        if self.speculation is not None:
            decode += spec.VERIFY_KEYWORDS
        self._decode = bind(model, contract.DECODE, decode, class_name=name)
        self._propose: BoundMethod | None = None
        if self.speculation is not None:
            self._bind_speculation()
        per_layer = bind(
            model,
            contract.ALLOCATE_KV_CACHE_PER_LAYER,
            contract.ALLOCATE_KV_CACHE_PER_LAYER.passes,
            class_name=name,
            optional=True,
        )
        whole = bind(
            model,
            contract.ALLOCATE_KV_CACHE,
            contract.ALLOCATE_KV_CACHE.passes,
            class_name=name,
            optional=True,
        )
        if per_layer is None and whole is None:
            raise GeneratorContractError.single(
                "TTB053",
                f"{name} has neither allocate_kv_cache nor allocate_kv_cache_per_layer",
                hint="implement one of them",
            )
        self._allocate_per_layer, self._allocate = per_layer, whole
        self._read: BoundMethod | None = None
        self._process: BoundMethod | None = None
        if self.async_decode:
            read, process = contract.READ_DECODE_OUTPUT, contract.PROCESS_DECODE_OUTPUT
            self._read = bind(model, read, read.passes, class_name=name)
            self._process = bind(model, process, process.passes, class_name=name)
        self.device_support = device_support(
            self.capabilities,
            takes_history=self._decode.accepts("prompt_tokens")
            and self._decode.accepts("output_tokens"),
        )

    def _bind_speculation(self) -> None:
        """A speculating launch needs a decode that takes the verify keywords and, for
        the generator's own drafter (`custom_class`), `propose_draft_tokens`."""
        name = self.class_name
        missing = [k for k in spec.VERIFY_KEYWORDS if not self._decode.accepts(k)]
        if missing:
            raise GeneratorContractError.single(
                "TTB239",
                f"{name}.decode_forward takes no {', '.join(missing)}: it cannot verify "
                "drafts, though the class declares supports_spec_decode",
                hint="serve a verify in decode_forward (docs/authors/generator-contract.md"
                "#speculative-decoding), or drop --speculative-config",
            )
        assert self.speculation is not None
        if self.speculation.method == "custom_class":
            self._propose = bind(
                self.generator,
                contract.PROPOSE_DRAFT_TOKENS,
                contract.PROPOSE_DRAFT_TOKENS.passes,
                class_name=name,
            )

    def load_model(self) -> None:
        self.generator = self._initialize(
            hf_config=self.model_config.hf_config,
            mesh_device=self.mesh_device,
            max_batch_size=self.max_num_reqs,
            max_seq_len=self.max_model_len,
            tt_data_parallel=tt_data_parallel(self.generator_cls, self.lanes, self.mesh_device),
            optimizations=self.options.optimizations,
        )
        self._bind_instance_methods()

    def max_tokens_all_users(self) -> int | None:
        """The generator's own KV capacity in tokens, when it declares one."""
        if self._max_tokens is None:
            return None
        num_devices = getattr(self.mesh_device, "get_num_devices", lambda: 1)()
        model = str(self.model_config.model)
        return int(
            call_at_load(
                self._max_tokens,
                f"model {model!r} on {num_devices} device(s)",
                model_name=model,
                num_devices=num_devices,
                tt_data_parallel=tt_data_parallel(self.generator_cls, self.lanes, self.mesh_device),
                max_model_len=self.max_model_len,
                max_num_seqs=self.max_num_reqs,
            )
        )

    def allocate_kv_cache(
        self,
        num_blocks: int,
        num_kv_heads: int,
        head_size: int,
        num_layers: int,
        dtype: torch.dtype,
    ) -> None:
        # With lanes the engine's blocks are every lane's: each lane's scheduler owns an
        # equal share with lane-local ids, and the generator allocates one cache of that
        # size per lane (TT-Metal's `kv_cache[lane][layer]`).
        shape = (num_blocks // self.lanes, num_kv_heads, self.block_size, head_size)
        if self._allocate_per_layer is not None:
            # Newer generators (hybrid attention) take one (shape, dtype, index) per layer,
            # and are preferred through it where they offer it.
            specs = [(shape, dtype, layer) for layer in range(num_layers)]
            self.kv_cache = self._allocate_per_layer(per_layer_specs=specs)
            self.cache_layers = num_layers
        else:
            assert self._allocate is not None
            self.kv_cache = self._allocate(kv_cache_shape=shape, dtype=dtype, num_layers=num_layers)

    # --- device helpers -----------------------------------------------------------------

    def synchronize(self, event: Any) -> None:
        """Wait for a readback event: `ttnn.event_synchronize` on a card; the host mesh's
        events wait for themselves."""
        if getattr(self.mesh_device, "is_host", False):
            event.wait()
            return
        import ttnn  # only on machines with the TT-Metal stack

        ttnn.event_synchronize(event)

    def process_output(self, *, host_out: Any, is_tokens: bool) -> Any:
        assert self._process is not None
        return self._process(host_out, is_tokens=is_tokens)

    # --- a step -------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        steady = self._is_steady(scheduler_output)
        if not steady:
            self.drain(self._drain_reason(scheduler_output))
        self._update_states(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0 or self.input_batch.num_reqs == 0:
            STATS.count("step.empty")
            self._async_req_ids = None
            return EMPTY_MODEL_RUNNER_OUTPUT
        batch = self.input_batch
        req_ids = list(batch.req_ids)
        n = len(req_ids)
        layout = self._layout_of(req_ids)
        num_sched = scheduler_output.num_scheduled_tokens
        # The batch's arrays mirror the request states (see _update_states and
        # _append_sampled): computed and total tokens per row, without a loop over rows.
        computed = batch.num_computed_tokens_cpu[:n].astype(np.int64)
        totals = batch.num_tokens_no_spec[:n].astype(np.int64)
        counts = np.fromiter(map(num_sched.__getitem__, req_ids), dtype=np.int64, count=n)
        # Speculative decoding: a row's scheduled tokens include its drafts (vLLM's
        # `scheduled_spec_decode_tokens`), which only a verify computes.
        scheduled_drafts = scheduler_output.scheduled_spec_decode_tokens
        drafts: list[list[int]] = []
        if scheduled_drafts:
            counts = counts - np.fromiter(
                (len(scheduled_drafts.get(r, ())) for r in req_ids), dtype=np.int64, count=n
            )
            assert self.speculation is not None
            if self.async_decode:
                drafts = self.speculation.own_drafts(scheduled_drafts, req_ids)
            else:
                drafts = self.speculation.valid_drafts(scheduled_drafts, req_ids)
        if self.speculation is not None and self.async_decode:
            computed = self._speculative_computed(computed, totals)
        # A row is decoding when it computes one token, its newest (known or in flight),
        # and is not in prefill as the scheduler sees it: admitted (new or resumed) in
        # this step, or continuing a prompt, however few of its tokens are left (a final
        # chunk can be one token; a resumed request recomputes its output too).
        admitted = {new.req_id for new in scheduler_output.scheduled_new_reqs}
        admitted |= compat.resumed_req_ids(scheduler_output)
        is_decode = (
            bool((counts == 1).all() and (computed >= totals - 1).all())
            and admitted.isdisjoint(req_ids)
            and self._mid_prefill.isdisjoint(req_ids)
        )
        ends = computed + counts
        step = StepState(scheduler_output, req_ids, ends < totals, ends, layout)
        if self._mid_prefill:
            self._mid_prefill.difference_update(req_ids)
        for i in np.flatnonzero(step.discard):
            self._mid_prefill.add(req_ids[int(i)])
        structured = bool(scheduler_output.has_structured_output_requests)
        cached_reason = (not is_decode, structured)
        if cached_reason not in layout.reasons:
            layout.reasons[cached_reason] = batch_host_reason(
                layout.params,
                is_prefill=not is_decode,
                mode=self.options.sample_on_device_mode,
                always_host=bool(self.options.always_compat_sampling),
                custom_logits_processors=bool(self.model_config.logits_processors),
                structured=structured,
                support=self.device_support,
            )
        reason = layout.reasons[cached_reason]
        speculation = self.speculation
        if is_decode and speculation is not None:
            if not drafts:
                drafts = [[] for _ in req_ids]
            if speculation.verifies(req_ids, drafts):
                # Drafts are accepted on the host, against the verify's ids or logits.
                STATS.count("sampling.host")
                STATS.count("sampling.host.speculative")
                self._run_verify(step, computed, drafts)
                self._step = step
                self._async_req_ids = None
                return None
        if reason is None and not is_decode and layout.any_prompt_logprobs:
            reason = "prompt_logprobs"  # the logits of every position come to the host
        if reason is None:
            STATS.count("sampling.device")
        else:
            STATS.count("sampling.host")
            STATS.count(f"sampling.host.{reason}")
        if is_decode:
            self._run_decode(step, computed, totals, device=reason is None)
        else:
            if speculation is not None:  # a prefill drops a row's count back to 1
                for req_id in req_ids:
                    speculation.reset(req_id)
            self._run_prefill(step, ends.tolist(), computed.tolist(), device=reason is None)
        if step.readback is None:
            self._async_req_ids = None
        self._step = step
        return None

    def _run_decode(
        self,
        step: StepState,
        computed: np.ndarray,
        totals: np.ndarray,
        *,
        device: bool,
    ) -> None:
        """One token per slot, every slot in the call (empty ones at position -1).
        Sampling on the device with async decode: submit without blocking and start the
        readback; the host learns the tokens when vLLM asks.

        The inputs are whole-batch array operations over the layout's slots, and the page
        table the persistent per-slot one: nothing here loops over rows."""
        STATS.count("step.decode")
        batch = self.input_batch
        capacity = self.max_num_reqs
        slots = step.layout.slots
        step.rows = step.layout.rows
        n = len(slots)
        # A token still in flight is unknown here (-1): the generator has it resident.
        column = np.minimum(computed, batch.token_ids_cpu.shape[1] - 1)
        known = batch.token_ids_cpu[np.arange(n), column].astype(np.int64)
        tokens_np = np.zeros(capacity, dtype=np.int64)
        tokens_np[slots] = np.where(computed < totals, known, -1)
        positions_np = np.full(capacity, EMPTY_POSITION, dtype=np.int64)
        positions_np[slots] = computed
        tokens = torch.from_numpy(tokens_np).view(capacity, 1)
        positions = torch.from_numpy(positions_np)
        page_table = self._decode_page_table(step.layout)
        layout = step.layout.owners
        commands = self._decode_commands(layout, page_table, device)
        use_async = self.async_decode and device and self.resident_inputs and self._read is not None
        values: dict[str, Any] = dict(
            tokens=tokens,
            start_pos=positions,
            page_table=page_table,
            kv_cache=self.kv_cache,
            enable_trace=self.decode_trace,
            read_from_device=not use_async,
            sampling_params=None,
            slot_remap=list(range(capacity)),
            **self._per_layer(page_table),
        )
        if device:
            values["sampling_params"] = self._slot_params(step.layout)
            # As the reference plugin does: the history goes with a decode only when a
            # request of the batch asks for a penalty (and the device applies them).
            if self.device_support.penalties and step.layout.penalised:
                values.update(self._penalty_history(step.layout))
        if self.rope_deltas and self._decode.accepts("rope_deltas_all_users"):
            values["rope_deltas_all_users"] = [
                self.rope_deltas.get(owner, 0) if owner is not None else 0 for owner in layout
            ]
        if self.version >= contract.CONTRACT_V1:
            values.update(
                reload_inputs=commands.reload_inputs,
                reload_page_table=commands.reload_page_table,
                reload_sampling_params=commands.reload_sampling_params,
                reset_sampling_state=commands.reset_sampling_state,
            )
        elif device:
            values["reset_batch"] = commands.transition
        STATS.count("commands.reload_inputs" if commands.reload_inputs else "commands.resident")
        if commands.reload_page_table:
            STATS.count("commands.reload_page_table")
        if commands.reset_sampling_state:
            STATS.count("commands.reset_sampling_state")
        out = self._decode(**values)
        # The generator accepted the submission: only now does the layout count as staged.
        if device:
            self._device_layout = layout
            self._device_page_table = page_table
        else:
            self._device_layout = None
        if use_async:
            step.readback = self._read(out, async_read=True)
            STATS.count("decode.async")
            if self._inflight:
                STATS.count("decode.overlapped")  # submitted while a step is in flight
            self._async_req_ids = step.req_ids
            self._async_layout = step.layout
            if self.observer is not None:
                starts = computed.tolist()
                self.observer("decode", step.req_ids, starts, [c + 1 for c in starts], None)
            return
        primary, logprobs = split_output(out)
        if device and not primary.is_floating_point():
            step.tokens = primary.reshape(-1)[step.rows]
            step.logprobs = rows_of(logprobs, step.rows)
        else:
            step.logits = primary.reshape(capacity, -1)[step.rows].float()
        if self.observer is not None:
            starts = computed.tolist()
            self.observer("decode", step.req_ids, starts, [c + 1 for c in starts], step.logits)

    def _run_verify(self, step: StepState, computed: np.ndarray, drafts: list[list[int]]) -> None:
        """A verify: every slot's last committed token and its drafts in one
        `decode_forward` over `[capacity, 1+K]` (`runner.speculation`); the host
        inputs are authoritative (reload_inputs), the host accepts."""
        STATS.count("step.verify")
        assert self.speculation is not None
        batch = self.input_batch
        layout = step.layout
        step.rows = layout.rows
        n = len(step.req_ids)
        last = batch.token_ids_cpu[np.arange(n), computed].astype(np.int64)
        verify = self.speculation.verify_inputs(
            step.req_ids, layout.slots, last, computed, drafts, layout.params
        )
        STATS.count("speculative.draft_tokens", sum(len(d) for d in verify.drafts))
        capacity = self.max_num_reqs
        page_table = self._decode_page_table(layout)
        commands = self._decode_commands(layout.owners, page_table, False)
        values: dict[str, Any] = dict(
            tokens=verify.tokens,
            start_pos=verify.positions,
            page_table=page_table,
            kv_cache=self.kv_cache,
            enable_trace=self.decode_trace,
            read_from_device=True,
            sampling_params=None,
            slot_remap=list(range(capacity)),
            num_valid_drafts=verify.num_valid,
            accepted_counts=verify.accepted_counts,
            spec_mode=verify.spec_mode,
            **self._per_layer(page_table),
        )
        if self.rope_deltas and self._decode.accepts("rope_deltas_all_users"):
            values["rope_deltas_all_users"] = [
                self.rope_deltas.get(owner, 0) if owner is not None else 0
                for owner in layout.owners
            ]
        if self.version >= contract.CONTRACT_V1:
            values.update(
                reload_inputs=commands.reload_inputs,
                reload_page_table=commands.reload_page_table,
                reload_sampling_params=commands.reload_sampling_params,
                reset_sampling_state=commands.reset_sampling_state,
            )
        # Asynchronous scheduling (the bundle declares async_spec_decode): submitted
        # without reading back; read_decode_output copies the verify block, accepted when
        # vLLM (or the next step, which drains it first) asks for the output.
        deferred = self.async_decode and self._read is not None
        values["read_from_device"] = not deferred
        step.verify = verify
        step.verify_out = self._decode(**values)
        self._device_layout = None  # the next decode reloads everything
        if deferred:
            out = step.verify_out
            block = self._verify_block(out, verify.spec_mode)
            step.readback = self._read(block, async_read=True)
            STATS.count("step.verify.async")

    def _verify_block(self, out: Any, mode: str) -> Any:
        """The device tensor of a deferred verify's `VerifyOutput` (its `argmax_ids` or
        `logits`), the one `read_decode_output` is handed."""
        check_verify_output(out, mode, self.class_name, deferred=True)
        return out.argmax_ids if mode == spec.ACCEPT_MODE_ARGMAX_IDS else out.logits

    def _finish_verify_readback(self, step: StepState, block: torch.Tensor) -> ModelRunnerOutput:
        """A deferred verify read back: its host block (`[B, 1+K]` ids or `[B, 1+K, V]`
        logits, in whatever shape `process_decode_output_host` gave it) in a host
        `VerifyOutput` with the hidden handle the verify returned, then accepted and
        committed as a synchronous verify is (the next drafts proposed with it)."""
        verify = step.verify
        width = int(verify.tokens.shape[1])
        hidden = getattr(step.verify_out, "hidden", None)
        host = torch.as_tensor(block)
        if verify.spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS:
            out = spec.VerifyOutput(
                verify.spec_mode, argmax_ids=host.reshape(self.max_num_reqs, width), hidden=hidden
            )
        else:
            out = spec.VerifyOutput(
                verify.spec_mode,
                logits=host.reshape(self.max_num_reqs, width, -1),
                hidden=hidden,
            )
        step.verify_out = out
        step.readback = None
        return self._sample(step, None)

    def _after_commit(self, step: StepState, sampled: list[list[int]]) -> None:
        """Speculating: record what each row committed and propose its next drafts."""
        speculation = self.speculation
        if speculation is None:
            return
        speculation.committed(step.req_ids, sampled)
        if speculation.method == "ngram":
            speculation.propose_ngram(step.req_ids, sampled, self.input_batch)
        else:
            speculation.propose_model(
                self._propose,
                step.req_ids,
                step.layout.slots,
                sampled,
                step.positions,
                self.class_name,
            )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step, once (vLLM's engine core asks after
        every step and stores them on the requests)."""
        pending = self.speculation.take() if self.speculation is not None else None
        return DraftTokenIds(*pending) if pending is not None else None

    def _per_layer(self, page_table: torch.Tensor) -> dict[str, Any]:
        """`page_tables_per_layer` for a generator whose cache was allocated per layer:
        one KV group here, so every layer's table is the step's one (the reference plugin
        sends one per layer too; Gemma-4 26B-A4B's autoport raises without it)."""
        if not self.cache_layers:
            return {}
        return {"page_tables_per_layer": [page_table] * self.cache_layers}

    def _decode_commands(
        self, layout: tuple[str | None, ...], page_table: torch.Tensor, device: bool
    ) -> DecodeCommands:
        return DecodeCommands.decide(
            device=device,
            resident=self.resident_inputs,
            layout=layout,
            previous_layout=self._device_layout,
            page_table=page_table,
            previous_page_table=self._device_page_table,
        )

    def _run_prefill(
        self, step: StepState, ends: list[int], computed: list[int], *, device: bool
    ) -> None:
        """One chunk per request row, each row holding its tokens from position 0
        (TT-Metal's convention); positions below `computed` are already in the cache.
        `empty_slots` says which slot each row fills."""
        STATS.count("step.prefill")
        rows = len(step.req_ids)
        tokens = torch.from_numpy(self.input_batch.token_ids_cpu[:rows, : max(ends)].copy())
        slots = [self.slot_of[r] for r in step.req_ids]
        params = self._row_params(step.req_ids) if device else None
        inputs = self._image_inputs(step.req_ids, computed) if self.image_inputs else {}
        page_table = self._page_table(step.req_ids, None, rows)
        scored = (
            self.prompt_logprobs.rows(step.req_ids, self.requests, computed)
            if self.prompt_logprobs is not None and step.layout.any_prompt_logprobs
            else []
        )
        if scored:
            inputs[contract.PROMPT_LOGITS_KEYWORD] = True
        out = self._prefill(
            **inputs,
            **self._per_layer(page_table),
            tokens=tokens.long(),
            page_table=page_table,
            kv_cache=self.kv_cache,
            prompt_lens=torch.tensor(ends),
            empty_slots=slots,
            enable_trace=self.prefill_trace,
            sampling_params=params,
            start_pos=torch.tensor(computed),
        )
        self._device_layout = None  # the next decode reloads everything
        primary, extra = split_output(out)
        if primary.is_floating_point():
            if extra is not None and not isinstance(extra, tuple):
                # Vision-language classes: (logits, rope_deltas), one delta per row.
                deltas = torch.as_tensor(extra).reshape(-1).tolist()
                for req_id, delta in zip(step.req_ids, deltas):
                    self.rope_deltas[req_id] = int(delta)
            every = primary.reshape(rows, -1, primary.shape[-1])
            if scored:
                assert self.prompt_logprobs is not None
                step.prompt_logprobs = self.prompt_logprobs.score(
                    self.class_name,
                    scored,
                    every,
                    computed,
                    ends,
                    step.req_ids,
                    self.requests,
                )
                # Each row's last new position predicts its next token.
                last = torch.tensor([e - c - 1 for c, e in zip(computed, ends)])
                logits = every[torch.arange(rows), last.clamp_min(0)]
            else:
                logits = every[:, -1, :]
            step.logits = logits.float()
            if device:
                STATS.count("sampling.device_returned_logits")  # e.g. Mistral3's prefill
        else:
            step.tokens = primary.reshape(-1)[:rows]
            step.logprobs = rows_of(extra, list(range(rows)))
        if self.observer is not None:
            self.observer("prefill", step.req_ids, computed, ends, step.logits)

    def _image_inputs(self, req_ids: list[str], computed: list[int]) -> dict[str, list[Any]]:
        """`contract.PREFILL_IMAGE_INPUTS` for these prefill rows, from each request's
        processed multimodal features (vLLM's processor ran in the API server).

        An image whose placeholders lie in the row's computed prefix is sent as vLLM sends
        it (pixels dropped on a prefix hit, grid kept); one the prefill computes now gets
        its pixels, from the request or, when vLLM dropped them and the prefix is gone
        again (preempted, evicted), from the pixel store (`serving.pixel_store`)."""
        inputs: dict[str, list[Any]] = {name: [] for name in contract.PREFILL_IMAGE_INPUTS}
        for req_id, start in zip(req_ids, computed):
            features = self.requests[req_id].mm_features
            if not features:
                for rows in inputs.values():
                    rows.append(None)
                continue
            row: dict[str, list[Any]] = {name: [] for name in inputs}
            for feature in features:
                if feature.modality != "image":  # the API server refuses these
                    raise ValueError(
                        f"request {req_id} carries a {feature.modality} input; "
                        "this bundle serves images only"
                    )
                data = feature.data or {}
                for name in inputs:
                    element = data.get(name)
                    row[name].append(None if element is None else element.data)
                pixels = row["pixel_values"][-1]
                position = feature.mm_position
                if pixels is not None:
                    self.pixels.put(feature.identifier, pixels)
                elif position.offset + position.length > start:  # computed now: needed
                    row["pixel_values"][-1] = self.pixels.get(feature.identifier)
            for name, rows in inputs.items():
                rows.append(row[name])
        return inputs

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | TTAsyncOutput:
        step, self._step = self._step, None
        if step is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        return self._sample(step, grammar_output)

    def _sample(
        self, step: StepState, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | TTAsyncOutput:
        if step.readback is not None:
            verify = step.verify is not None
            pending = TTAsyncOutput(
                step,
                synchronize=self.synchronize,
                process_output=self.process_output,
                finish=self._finish_verify_readback if verify else self._finish_with_tokens,
                resolved=self._inflight.remove,
                is_tokens=not verify or step.verify.spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS,
            )
            self._inflight.append(pending)
            STATS.record_max("decode.max_in_flight", len(self._inflight))
            return pending
        if step.tokens is not None:
            return self._finish_with_tokens(step, step.tokens)
        batch = self.input_batch
        if step.verify is not None:
            assert self.speculation is not None
            committed = self.speculation.accept(
                step.verify_out,
                step.verify,
                step.layout.slots,
                step.layout.params,
                step.positions,
                self.class_name,
            )
            STATS.count("speculative.committed_tokens", sum(len(c) for c in committed))
            logprobs = None
            if step.layout.any_logprobs:  # a logits-mode verify (`Speculation.spec_mode`)
                logprobs = self.speculation.logprobs(
                    step.verify_out,
                    step.layout.slots,
                    committed,
                    step.layout.params,
                    batch.logprobs,
                    processed=self.model_config.logprobs_mode.startswith("processed"),
                )
            self._append_sampled(step.req_ids, committed)
            self._after_commit(step, committed)
            return compat.model_runner_output(
                list(step.req_ids), step.layout.index, committed, logprobs
            )
        logits = step.logits
        assert logits is not None
        if grammar_output is not None:
            batch.apply_grammar(step.scheduler_output, grammar_output, logits)
        # A seeded row draws the token at position p from a generator seeded for (seed,
        # p), as the reference generator's device sampler does: the same tokens whatever
        # the batch, its order, or which path sampled the steps before. (It also makes a
        # discarded draw of an incomplete prompt harmless: nothing carries over.)
        sampled, logprobs = batch.sample(logits, step.positions, step.layout.params)
        for i in np.nonzero(step.discard)[0]:
            sampled[int(i)] = []
        self._append_sampled(step.req_ids, sampled)
        self._after_commit(step, sampled)
        return compat.model_runner_output(
            list(step.req_ids),
            step.layout.index,
            sampled,
            logprobs.tolists() if logprobs is not None else None,
            step.prompt_logprobs,
        )

    def _finish_with_tokens(self, step: StepState, tokens: torch.Tensor) -> ModelRunnerOutput:
        """The output of a step whose tokens the device sampled: whole-tensor conversions
        and the layout's cached index, no per-row Python beyond the output lists vLLM
        takes."""
        n = len(step.req_ids)
        flat = tokens.reshape(-1)
        if step.rows is not None and flat.numel() == self.max_num_reqs and step.readback:
            # An asynchronous decode read back every slot: each row's slot, in row order.
            flat = flat[:n] if step.layout.in_order else flat[step.rows]
        flat = flat[:n].long()
        values = flat.tolist()
        sampled = flat.reshape(n, 1).tolist()
        discarded = np.flatnonzero(step.discard)
        for i in discarded:
            sampled[int(i)] = []
        if len(discarded) or not self._append_rows(step, values, flat.numpy()):
            self._append_sampled(step.req_ids, sampled)
        logprobs = self._device_logprobs(step, values)
        self._after_commit(step, sampled)
        return compat.model_runner_output(
            list(step.req_ids),
            step.layout.index,
            sampled,
            logprobs.tolists() if logprobs is not None else None,
        )

    def _device_logprobs(self, step: StepState, tokens: list[int]) -> LogprobsTensors | None:
        """vLLM's logprobs for the rows that asked, from the device's top log-probs.

        The device returns `(top_logprobs [B, K], top_ids [B, K])`; the sampling path
        sends a request here only when its token is sure to be among them (greedy, or
        top_k <= K), so the sampled token's log-prob and rank are read off that list.
        """
        if not step.layout.any_logprobs:
            return None
        wanted = [self.requests[r].sampling_params.logprobs for r in step.req_ids]
        raw = step.logprobs
        if step.readback is not None and step.rows is not None and isinstance(raw, tuple):
            raw = rows_of(raw, step.rows)
        if not isinstance(raw, tuple):
            raise GeneratorContractError.single(
                "TTB062",
                f"{self.class_name} returned no top log-probabilities for a request that "
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
                    f"{self.class_name}: the sampled token {token} is not among the device's "
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

    # --- what the generator is told -----------------------------------------------------

    def _row_params(self, req_ids: list[str]) -> SamplingParams:
        """TT's SamplingParams, one entry per request row (prefill)."""
        return device_params(
            [self.requests[r].sampling_params for r in req_ids], self.input_batch.vocab_size
        )

    def _slot_params(self, layout: Layout) -> SamplingParams:
        """TT's SamplingParams, one entry per slot (decode); empty slots are greedy.
        Built once per layout: a request's parameters do not change."""
        if layout.slot_params is None:
            per_slot: list[Any] = [None] * self.max_num_reqs
            for params, slot in zip(layout.params, layout.slots.tolist()):
                per_slot[slot] = params
            layout.slot_params = device_params(per_slot, self.input_batch.vocab_size)
        return layout.slot_params

    def _penalty_history(self, layout: Layout) -> dict[str, torch.Tensor]:
        """`prompt_tokens` / `output_tokens` `[capacity, L]` by slot, -1 padded: what a
        device applying penalties rebuilds its per-slot history from (see
        `_PenaltyHistory`: kept per slot, appended to, copied out)."""
        return self._history.tensors(layout)

    def _decode_page_table(self, layout: Layout) -> torch.Tensor:
        """`[capacity, W]` int32 by slot: the persistent per-slot table, cut to the widest
        row of this batch, rows of slots outside it zero. A copy: the generator may read
        it after the host has moved on. Cut again only when a row changed since this
        layout's last cut; otherwise the same tensor (never written after it was sent),
        which `DecodeCommands.decide` also takes as unchanged without comparing."""
        if layout.table is not None and layout.table[0] == self._table_version:
            return layout.table[1]
        slots = layout.slots
        width = max(int(self._slot_blocks[slots].max()) if len(slots) else 0, 1)
        table = self._slot_table[:, :width].clone()
        if len(layout.idle_rows):
            table.index_fill_(0, layout.idle_rows, 0)
        layout.table = (self._table_version, table)
        return table

    def _stage_blocks(self, req_id: str) -> None:
        """Write a request's block ids into its slot's persistent page-table row."""
        slot = self.slot_of.get(req_id)
        if slot is None:
            return
        blocks = self.requests[req_id].block_ids[0]
        count = len(blocks)
        row = self._slot_table_np[slot]
        row[:count] = blocks
        if count < self._slot_blocks[slot]:
            row[count:] = 0
        self._slot_blocks[slot] = count
        self._table_version += 1

    def _layout_of(self, req_ids: list[str]) -> Layout:
        """The cached layout of these rows, rebuilt when the rows or any slot changed."""
        key = (self._slot_epoch, tuple(req_ids))
        if self._layout is None or self._layout.key != key:
            self._layout = Layout(
                key, [self.requests[r] for r in key[1]], self.slot_of, self.max_num_reqs
            )
        return self._layout

    def _speculative_computed(self, computed: np.ndarray, totals: np.ndarray) -> np.ndarray:
        """Each row's computed tokens as this runner knows them, under asynchronous
        scheduling with speculation. vLLM's scheduler builds a step before it has the
        previous one's acceptance: it counts that step's drafts (placeholders) as
        computed and rolls the rejected ones back only when the output arrives. The step
        before was drained (a verify is never overlapped), so a decoding row's
        committed tokens are all on the host and every one but the last is computed;
        a row in prefill has the scheduler's exact count (no drafts). Written back into
        the batch, where the rest of the step reads it."""
        known = np.minimum(computed, totals - 1)
        if (known != computed).any():
            STATS.count("speculative.async_rollback")
            self.input_batch.num_computed_tokens_cpu[: len(known)] = known
        return known

    # --- asynchronous decode ------------------------------------------------------------

    def _is_steady(self, so: SchedulerOutput) -> bool:
        """The same decode batch as the last asynchronous step: keep overlapping."""
        previous = self._async_req_ids
        if previous is None or so.scheduled_new_reqs or so.has_structured_output_requests:
            return False
        if self.speculation is not None:
            return False  # a step's committed tokens are the next step's drafts' source
        if compat.resumed_req_ids(so):
            return False
        scheduled = so.num_scheduled_tokens
        # One token each (every scheduled request has at least one), the same requests.
        if len(scheduled) != len(previous) or so.total_num_scheduled_tokens != len(scheduled):
            return False
        previous_set = self._async_layout.id_set  # type: ignore[union-attr]
        return previous_set.isdisjoint(so.finished_req_ids) and scheduled.keys() >= previous_set

    def _drain_reason(self, so: SchedulerOutput) -> str:
        if self.speculation is not None:
            return "speculative"
        if so.has_structured_output_requests:
            return "structured_output"
        if so.scheduled_new_reqs or any(n > 1 for n in so.num_scheduled_tokens.values()):
            return "prefill"
        return "batch_change"

    def drain(self, reason: str = "batch_change") -> None:
        """Read back every step in flight so the host knows all tokens."""
        if not self._inflight:
            return
        STATS.count(f"decode.drain.{reason}")
        for pending in list(self._inflight):
            pending.get_output()

    # --- bookkeeping --------------------------------------------------------------------

    def _append_rows(self, step: StepState, values: list[int], array: np.ndarray) -> bool:
        """One token for every row of a step whose rows are still the batch's first rows
        in the same order (a steady decode): the batch's arrays written in one operation
        per array, each request's output list appended to (`values` and `array` hold the
        same tokens). False when that does not hold (then `_append_sampled` does it)."""
        batch = self.input_batch
        n = len(values)
        if batch.req_ids[:n] != step.req_ids:
            return False
        for output, token in zip(step.layout.outputs, values):
            output.append(token)
        rows = np.arange(n)
        ends = batch.num_tokens_no_spec[:n]
        batch.token_ids_cpu[rows, ends] = array
        batch.num_tokens_no_spec[:n] = ends + 1
        return True

    def _append_sampled(self, req_ids: list[str], sampled: list[list[int]]) -> None:
        """Record sampled tokens in the request states and, where present, the batch."""
        batch = self.input_batch
        for req_id, token_ids in zip(req_ids, sampled):
            state = self.requests.get(req_id)
            if not token_ids or state is None:
                continue
            state.output_token_ids.extend(token_ids)
            index = batch.req_id_to_index.get(req_id)
            if index is None:
                continue
            start = int(batch.num_tokens_no_spec[index])
            end = start + len(token_ids)
            batch.token_ids_cpu[index, start:end] = token_ids
            batch.num_tokens_no_spec[index] = end

    def _page_table(self, req_ids: list[str], slots: list[int] | None, rows: int) -> torch.Tensor:
        """`[rows, W]` int32 block ids; row r is request r (prefill) or slot r (decode)."""
        blocks = [self.requests[r].block_ids[0] for r in req_ids]
        width = max(len(b) for b in blocks)
        table = torch.zeros((rows, width), dtype=torch.int32)
        for i, row in enumerate(blocks):
            table[slots[i] if slots is not None else i, : len(row)] = torch.tensor(
                row, dtype=torch.int32
            )
        return table

    def _take_slot(self, req_id: str) -> None:
        """The lowest free row of the request's lane (its lane's first row upward)."""
        if req_id in self.slot_of:
            return
        lane = self.lane_of.get(req_id, 0)
        free = self._free_slots[lane]
        if not free:
            raise RuntimeError(
                f"no free decode slot for {req_id} in lane {lane} "
                f"({self.per_lane} per lane: max_num_seqs reached)"
            )
        free.sort()
        self.slot_of[req_id] = free.pop(0)
        self._slot_epoch += 1

    def _release_slot(self, req_id: str) -> None:
        slot = self.slot_of.pop(req_id, None)
        if slot is not None:
            self._free_slots[slot // self.per_lane].append(slot)
            self._slot_table_np[slot] = 0
            self._slot_blocks[slot] = 0
            self._slot_epoch += 1
            self._table_version += 1
        self.rope_deltas.pop(req_id, None)

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Mirror the scheduler's view: finished, new, resumed and continuing requests.

        Requests not scheduled this step leave the persistent batch (the phase-based
        scheduler leaves decodes out of prefill steps) and rejoin when scheduled again;
        their slot stays theirs. A finished or preempted request gives its slot back; a
        resumed one takes a slot again (it prefills into it).
        """
        if self._update_steady(scheduler_output):
            return
        self._steady_ids = None  # rows may move below
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            if self.prompt_logprobs is not None:
                self.prompt_logprobs.forget(req_id)
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
            self._release_slot(req_id)
            self.lane_of.pop(req_id, None)
            self._mid_prefill.discard(req_id)
            if self.speculation is not None:
                self.speculation.reset(req_id)
        placed = lane_of(scheduler_output)
        if placed:
            self.lane_of.update(placed)
        for req_id in scheduler_output.preempted_req_ids or ():
            self._release_slot(req_id)
            self._mid_prefill.discard(req_id)
            if not compat.RESUMED_IN_CACHED:
                # It will be re-sent in full, as a new request: its state goes now.
                self.requests.pop(req_id, None)
                batch.remove_request(req_id)
        scheduled = scheduler_output.num_scheduled_tokens.keys()
        cached = scheduler_output.scheduled_cached_reqs
        resumed = compat.resumed_req_ids(scheduler_output)
        for req_id in resumed:
            self._release_slot(req_id)  # preempted earlier: its old slot is gone
        for req_id in list(batch.req_id_to_index.keys() - (scheduled - resumed)):
            batch.remove_request(req_id)

        to_add: list[Any] = []
        staged: list[str] = []  # requests whose block ids changed: their table rows
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            state = compat.request_state(
                req_id=new.req_id,
                prompt_token_ids=new.prompt_token_ids,
                mm_features=new.mm_features,
                sampling_params=params,
                generator=generator,
                block_ids=tuple(list(ids) for ids in new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                output_token_ids=compat.new_request_outputs(new),
                lora_request=new.lora_request,
            )
            self.requests[new.req_id] = state
            to_add.append(state)
            staged.append(new.req_id)

        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            num_output = cached.num_output_tokens[i]
            index = batch.req_id_to_index.get(req_id)
            if num_output < len(state.output_token_ids):
                del state.output_token_ids[num_output:]
                if index is not None:  # the batch's token count follows the state's
                    batch.num_tokens_no_spec[index] = state.num_tokens
            new_blocks = cached.new_block_ids[i]
            if req_id in resumed:
                assert new_blocks is not None
                state.block_ids = tuple(list(ids) for ids in new_blocks)
            elif new_blocks is not None:
                for ids, extra in zip(state.block_ids, new_blocks):
                    ids.extend(extra)
            if new_blocks is not None:
                staged.append(req_id)
            if index is None:
                to_add.append(state)
                continue
            batch.num_computed_tokens_cpu[index] = state.num_computed_tokens
        for state in to_add:
            batch.add_request(state)
        for req_id in scheduled:
            if req_id not in self.slot_of:
                self._take_slot(req_id)
        for req_id in staged:
            self._stage_blocks(req_id)
        batch.condense()
        batch.refresh_metadata()

    def _update_steady(self, so: SchedulerOutput) -> bool:
        """The bookkeeping of a step that only continues the batch's requests (none
        finished, admitted, resumed, preempted or left out, no output taken back): the
        scheduler's cached data written as whole arrays, and row-level work only for the
        rows that got new KV blocks. Returns False, having changed nothing, for any other
        step; then the general path of `_update_states` runs.

        While a request is in the persistent batch its row is authoritative for its
        computed tokens; its state's count is written by the general path, the only one
        that (re-)adds a request to the batch and so the only reader of it."""
        cached = so.scheduled_cached_reqs
        batch = self.input_batch
        req_ids = cached.req_ids
        n = len(req_ids)
        if (
            n == 0
            or so.finished_req_ids
            or so.scheduled_new_reqs
            or compat.resumed_req_ids(so)
            or so.preempted_req_ids
            or n != batch.num_reqs
            or n != len(so.num_scheduled_tokens)
        ):
            return False
        if req_ids != self._steady_ids:
            get = batch.req_id_to_index.get
            rows = [get(r) for r in req_ids]
            if None in rows:
                return False
            self._steady_ids = list(req_ids)
            self._steady_index = np.asarray(rows, dtype=np.int64)
        index = self._steady_index
        # A batch row holds its prompt and the outputs its request state holds.
        held = batch.num_tokens_no_spec[index] - batch.num_prompt_tokens[index]
        if (np.asarray(cached.num_output_tokens, dtype=np.int64) < held).any():
            return False  # the scheduler took tokens back: the general path trims them
        batch.num_computed_tokens_cpu[index] = cached.num_computed_tokens
        new_blocks = cached.new_block_ids
        if new_blocks.count(None) != n:
            grown = [i for i, blocks in enumerate(new_blocks) if blocks is not None]
            if not self._append_one_block_each(req_ids, index, new_blocks, grown):
                for i in grown:
                    blocks = new_blocks[i]
                    req_id = req_ids[i]
                    for ids, extra in zip(self.requests[req_id].block_ids, blocks):
                        ids.extend(extra)
                    self._stage_blocks(req_id)
        batch.refresh_metadata()
        STATS.count("bookkeeping.steady")
        return True

    def _append_one_block_each(
        self, req_ids: list[str], index: np.ndarray, new_blocks: list[Any], grown: list[int]
    ) -> bool:
        """The common case of new KV blocks in a steady decode, as whole-array writes: one
        KV cache group, and each grown row (`grown`, positions in `req_ids`) got exactly
        one block and holds a decode slot whose page-table row is staged up to its
        request's blocks. With prompts of one length every row grows in the same step
        (every 16 tokens), so this is where a per-row loop would cost most. The same
        writes as `_stage_blocks` per row. False, having changed nothing, when the case
        does not hold."""
        block_ids, slots = [], []
        for i in grown:
            blocks = new_blocks[i]
            if len(blocks) != 1 or len(blocks[0]) != 1:
                return False
            req_id = req_ids[i]
            slot = self.slot_of.get(req_id)
            owned = self.requests[req_id].block_ids[0]
            if slot is None or self._slot_blocks[slot] != len(owned):
                return False
            block_ids.append(blocks[0][0])
            slots.append(slot)
        for i, block in zip(grown, block_ids):
            self.requests[req_ids[i]].block_ids[0].append(block)
        new_ids = np.asarray(block_ids, dtype=np.int64)
        at = np.asarray(slots, dtype=np.int64)
        # Each slot's row is staged up to its request's blocks (checked above): the new
        # block goes at its count.
        self._slot_table_np[at, self._slot_blocks[at]] = new_ids
        self._slot_blocks[at] += 1
        self._table_version += 1
        STATS.count("bookkeeping.blocks_whole")
        return True
