"""Drive a TT generator from vLLM's scheduler output, step by step, through the real
generator contract (`ttbundles.format.contract`): the orchestration of each step.

Each step is prefill-only or decode-only (the phase-based scheduler guarantees it),
which maps onto `prefill_forward` and `decode_forward`. Decode calls carry every slot
(`runner.slots`; empty ones at position -1, as TT-Metal's traces need a fixed batch) and
the persistent page tables (`runner.kv.tables`); prefill calls carry the requests being
filled and their slots in `empty_slots`. Rows never move, so the `slot_remap` sent with
every decode is the identity. Host sampling is the host batch's
(`serving.compat.host_batch()`: vLLM's V1 `InputBatch` and `Sampler` where the release
ships them), so it keeps vLLM's semantics. What each decode tells the generator follows
TT-Metal's decode input-update contract v1 for classes that declare it, and
`reset_batch` for the others: see `DecodeCommands`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, ModelRunnerOutput

from ttbundles.format import contract, contract_keys
from ttbundles.format import speculative as spec
from ttbundles.format.layer_kinds import layer_kinds
from ttbundles.format.meshes import is_host
from ttbundles.serving import compat
from ttbundles.serving.binding import GeneratorContractError, split_output
from ttbundles.serving.planning.plan import Plan, effective_options
from ttbundles.serving.recurrent_prefix import SNAPSHOT_FREE, SNAPSHOT_RESTORE, SNAPSHOT_SAVED
from ttbundles.serving.runner.commands import DecodeCommands
from ttbundles.serving.runner.compact_rows import RowOrder, row_order
from ttbundles.serving.runner.contract_binding import (
    GeneratorMethods,
    bind_class,
    bind_instance,
    declared_prefill_keywords,
    refuse_unsupported_keys,
)
from ttbundles.serving.runner.families import tt_data_parallel
from ttbundles.serving.runner.history import PenaltyHistory
from ttbundles.serving.runner.images import prefill_image_inputs
from ttbundles.serving.runner.kv import kinds
from ttbundles.serving.runner.kv.cache import allocate_cache, refuse_unserved_groups
from ttbundles.serving.runner.kv.groups import (
    STATE_LAYER_NAME,
    LayerGroups,
    layer_index,
    layer_specs,
    own_shape,
)
from ttbundles.serving.runner.kv.sizing import block_bytes, capacity, pool_bytes
from ttbundles.serving.runner.kv.tables import BlockTables
from ttbundles.serving.runner.outputs import StepOutputs
from ttbundles.serving.runner.pixel_store import PixelStore
from ttbundles.serving.runner.prompt_logprobs import PromptLogprobs
from ttbundles.serving.runner.readback import TTAsyncOutput, drain_reason, is_steady, synchronize
from ttbundles.serving.runner.sample import (
    host_reason,
    prefill_logits,
    row_params,
    slot_bitmask,
    slot_params,
)
from ttbundles.serving.runner.sampling_path import describe_paths, device_support
from ttbundles.serving.runner.slots import SlotStates
from ttbundles.serving.runner.speculation import Speculation, read_back_verify, verify_block
from ttbundles.serving.runner.states import RequestStates
from ttbundles.serving.runner.step import EMPTY_POSITION, Layout, StepObserver, StepState, rows_of
from ttbundles.serving.stats import STATS
from ttbundles.units import byte_size

if TYPE_CHECKING:  # vLLM's config and scheduler types are only needed for annotations
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

logger = logging.getLogger("vllm.ttbundles")


class TTModelRunner:
    """The orchestration of each step; the state it keeps is in objects it owns: the
    request states and host batch (`states`), the slots (`slots`), the page tables
    (`tables`), the bound contract (`methods`), speculation (`speculation`)."""

    def __init__(
        self,
        vllm_config: VllmConfig,
        generator_cls: type,
        mesh_device: Any,
        plan: Plan | None = None,
    ):
        """`plan`: the served plan, as the worker read it (None: a runner built without
        the platform's hook, as in unit tests: plain text decode, the user's options)."""
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
        self._apply_plan(plan)
        self.options = plan.tt_options if plan is not None else effective_options(vllm_config)
        self.version = contract.contract_version(generator_cls)
        self.capabilities: dict[str, Any] = dict(
            getattr(generator_cls, contract.CAPABILITIES_ATTRIBUTE, None) or {}
        )
        # The autoports state their sampling policy as a class attribute too.
        policy = getattr(generator_cls, contract.SAMPLE_POLICY_KEY, None)
        if policy is not None:
            self.capabilities.setdefault(contract.SAMPLE_POLICY_KEY, policy)
        trace_mode = self.options.trace_mode or "all"
        self.prefill_trace = trace_mode == "all"
        self.decode_trace = trace_mode in ("all", "decode_only")
        # The bundle's declaration (the plan's), checked against the class below: a
        # generator keeps its decode inputs resident (token feedback, one position advance
        # per step) only where async decode is declared and decode is traced.
        declared_async = plan is not None and plan.async_decode
        self.resident_inputs = declared_async and self.decode_trace
        # Asynchronous decode: the bundle declares it and async scheduling stayed on.
        self.async_decode = bool(sched.async_scheduling)
        refuse_unsupported_keys(
            self.class_name,
            self.capabilities,
            self.block_size,
            declared_async=declared_async,
            planned_block=plan.output_tokens_per_step if plan is not None else 1,
        )
        self.class_methods = bind_class(
            generator_cls,
            self.class_name,
            self.version,
            optimizations=self.options.optimizations is not None,
        )
        self.methods: GeneratorMethods | None = None  # bound on the loaded generator
        self.prefill_keywords: tuple[str, ...] = ()  # asked by the class's capabilities
        self.reuse_keyword = False  # decode names reuse_device_decode_inputs
        self.generator: Any = None
        self.kv_cache: Any = None
        self.cache_layers = 0  # layers of a per-layer cache: page_tables_per_layer is sent
        # vLLM's KV groups by layer (one group, every layer its own tensor, until the
        # worker learns the engine's `KVCacheConfig`).
        self.kv_groups: LayerGroups | None = None
        # The request rows and the host sampler: vLLM's V1 parts where the release ships
        # them, ours on the release's parts otherwise (see `serving.compat`).
        self.input_batch = compat.host_batch(vllm_config, self.device)
        self.slots = SlotStates(self.max_num_reqs, self.lanes)
        self.tables = BlockTables(self.max_num_reqs, self.max_model_len, self.block_size)
        self.states = RequestStates(
            self.input_batch,
            self.slots,
            self.tables,
            device=self.device,
            on_finish=self._forget,
            on_release=self._release_slot_state,
        )
        self.requests = self.states.requests  # compat.request_state(...) by request id
        self.outputs = StepOutputs(
            self.states,
            capacity=self.max_num_reqs,
            class_name=self.class_name,
            processed_logprobs=self.model_config.logprobs_mode.startswith("processed"),
            speculation=self.speculation,
            after_commit=self._after_commit,
        )
        self.history = PenaltyHistory(self.max_num_reqs)
        self._step: StepState | None = None
        self._inflight: list[TTAsyncOutput] = []
        self._async_req_ids: list[str] | None = None
        self._async_layout: Layout | None = None  # the layout of those rows
        # The compacted row order of the last decode's layout (legacy-form classes).
        self._order_layout: Layout | None = None
        self._order: RowOrder | None = None
        # The slot layout and page table of the last device-sampling decode: a decode
        # with the same layout right after it is "steady" (nothing to reload).
        self._device_layout: tuple[str | None, ...] | None = None
        self._device_page_table: torch.Tensor | None = None
        self.observer: StepObserver | None = None

    def _apply_plan(self, plan: Plan | None) -> None:
        """What the served plan says this runner does beyond plain text decode."""
        # In-process data-parallel lanes (single-execute generators): device rows are
        # lane x per_lane + slot, each lane's requests in its own rows and KV cache.
        self.lanes = plan.lanes if plan is not None else 1
        # The plan serves the class's KV groups: the class is asked for its layers' specs.
        self.kv_groups_served = bool(plan is not None and plan.kv_groups)
        # A model whose other layers keep recurrent state the generator owns (a slot per
        # request, `release_request`): only its attention layers keep vLLM's KV cache.
        kinds_of_layers = layer_kinds(self.model_config.hf_config)
        self.kv_layers: tuple[int, ...] | None = (
            kinds_of_layers.attention_layers if kinds_of_layers.recurrent else None
        )
        # Recurrent state vLLM's KV manager owns (MambaSpec groups): every layer gets a
        # spec, the gated delta net layers a Mamba one (`kv.kinds.gated_delta_net`); the
        # generator allocates the state per layer and decode says each row's state
        # (`gdn_state_indices`).
        self.state_layers: tuple[int, ...] = ()
        self.host_mesh = plan is not None and is_host(plan.mesh)
        if plan is not None and plan.recurrent_owner == "vllm":
            self.state_layers = kinds_of_layers.recurrent_layers
            self.attention_layers = kinds_of_layers.attention_layers
            self.kv_layers = None
        # vLLM's "align" mode (the prefix cache over Mamba blocks): a state per Mamba block
        # id, a request's Mamba row position-indexed (`_state_blocks`).
        cache = self.vllm_config.cache_config
        self.align_state = bool(self.state_layers) and cache.mamba_cache_mode == "align"
        self.mamba_block = int(cache.mamba_block_size or 0) if self.align_state else 0
        self.mamba_group = 0
        # Snapshots of recurrent state back the prefix cache (`serving.recurrent_prefix`):
        # restored into a hit's slot before its prefill, taken when a prompt chunk ends
        # on a block boundary, reported to the scheduler with the step's output.
        self.snapshots = bool(plan is not None and plan.recurrent_snapshots)
        self._saved: list[tuple[str, int, int]] = []
        # The bundle serves images (the plan allowed some per prompt): prefill gets them.
        self.image_inputs = bool(plan is not None and plan.inputs.get("image"))
        self.pixels = PixelStore()
        # The bundle declares prompt logprobs: prefill returns every position's logits when
        # asked (`contract.PROMPT_LOGITS_KEYWORD`), and this runner computes them.
        self.prompt_logprobs = (
            PromptLogprobs() if plan is not None and plan.prompt_logprobs else None
        )
        # Speculative decoding as the plan admitted it (None: not speculating).
        self.speculation: Speculation | None = None
        if plan is not None and plan.speculative is not None:
            self.speculation = Speculation.from_plan(
                plan.speculative,
                capacity=self.max_num_reqs,
                vocab_size=self.model_config.get_vocab_size(),
                max_model_len=self.max_model_len,
            )

    def _release_slot_state(self, slot: int) -> None:
        """A slot given back (its request finished or was preempted): a generator that keeps
        state per slot (recurrent layers: TT-Metal's Qwen classes) releases it there, so
        the next request in the slot starts from nothing (`release_request(slot)`)."""
        if self.align_state:
            # The state is in vLLM's Mamba blocks, not in the slot: a block the request
            # leaves may hold a cached state, and a first chunk starts from zero anyway.
            return
        release = getattr(self.generator, "release_request", None)
        if callable(release):
            release(slot)

    def _forget(self, req_id: str) -> None:
        """A finished request: what prompt logprobs and speculation keep for it."""
        if self.prompt_logprobs is not None:
            self.prompt_logprobs.forget(req_id)
        if self.speculation is not None:
            self.speculation.reset(req_id)

    # --- set-up -----------------------------------------------------------------------

    def load_model(self) -> None:
        self.generator = self.class_methods.initialize(
            hf_config=self.model_config.hf_config,
            mesh_device=self.mesh_device,
            max_batch_size=self.max_num_reqs,
            max_seq_len=self.max_model_len,
            tt_data_parallel=tt_data_parallel(self.generator_cls, self.lanes, self.mesh_device),
            optimizations=self.options.optimizations,
        )
        self.methods = bind_instance(
            self.generator,
            self.class_name,
            self.version,
            image_inputs=self.image_inputs,
            prompt_logits=self.prompt_logprobs is not None,
            speculation_method=self.speculation.method if self.speculation else None,
            async_decode=self.async_decode,
            capabilities=self.capabilities,
        )
        self.prefill_keywords = declared_prefill_keywords(self.capabilities)
        # Sent only to a decode that names it: a `**kwargs` decode may not know it.
        self.reuse_keyword = contract_keys.REUSE_DECODE_INPUTS_KEYWORD in self.methods.decode.names
        decode = self.methods.decode
        if self.state_layers and not decode.accepts(contract.STATE_INDICES_KEYWORD):
            raise GeneratorContractError.single(
                "TTB053",
                f"{self.class_name}.decode_forward takes no gdn_state_indices, which "
                "recurrent state vLLM's KV manager owns needs (each decode row's state)",
                hint="give decode_forward a gdn_state_indices parameter (int32, one per "
                "row), or declare capabilities.recurrent_state owner 'generator'",
            )
        self._state_indices = torch.arange(self.max_num_reqs, dtype=torch.int32)
        self.device_support = device_support(
            self.capabilities,
            takes_history=decode.accepts("prompt_tokens") and decode.accepts("output_tokens"),
            takes_bitmask=decode.accepts(contract.GRAMMAR_BITMASK_KEYWORD),
            split_sampling=callable(getattr(self.generator, contract.SPLIT_SAMPLER_METHOD, None)),
        )
        logger.info(
            "ttbundles: sampling: %s",
            describe_paths(
                self.device_support,
                self.options.sample_on_device_mode,
                bool(self.options.always_compat_sampling),
            ),
        )

    def max_tokens_all_users(self) -> int | None:
        """The generator's own KV capacity in tokens, when it declares one."""
        return self.class_methods.max_tokens_all_users(
            self.mesh_device,
            str(self.model_config.model),
            tt_data_parallel=tt_data_parallel(self.generator_cls, self.lanes, self.mesh_device),
            max_model_len=self.max_model_len,
            max_num_seqs=self.max_num_reqs,
        )

    def describe(self) -> str:
        """What the start-up log says this runner serves."""
        return "decode contract " + ("v1" if self.version else "legacy (reset_batch)")

    def supported_tasks(self) -> tuple[str, ...]:
        return ("generate",)

    # --- KV cache (`runner.kv`) -----------------------------------------------------------

    def _layer_shape(self) -> tuple[int, int, int]:
        """The model's layers, KV heads and head size, as vLLM's config reads them."""
        config, parallel = self.model_config, self.vllm_config.parallel_config
        num_layers = config.get_num_layers(parallel)
        return num_layers, config.get_num_kv_heads(parallel), config.get_head_size()

    def _kv_layer_count(self, num_layers: int) -> int:
        """The layers the generator allocates a KV cache for: every layer, or only the
        attention layers of a model whose other layers keep recurrent state."""
        return num_layers if self.kv_layers is None else len(self.kv_layers)

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """Each layer's cache: what the generator class declares (`get_kv_cache_spec`,
        `runner.kv.groups`) when the plan serves its KV groups, full attention with the
        model's shape otherwise."""
        num_layers = self._layer_shape()[0]
        default = self._default_spec()
        # Groups only where the plan serves the class's groups (it declares them, and
        # the hybrid manager is on): otherwise every layer keeps the whole context, in
        # its own shape where the class gives layers shapes of their own.
        if self.state_layers:
            return self._state_layer_specs(num_layers, default)
        return layer_specs(
            self.generator_cls,
            self.vllm_config,
            num_layers,
            default,
            ask=self.kv_groups_served,
            kv_layers=self.kv_layers,
        )

    def _default_spec(self) -> KVCacheSpec:
        """Full attention with the model's shape, as vLLM's config reads it."""
        _, kv_heads, head_size = self._layer_shape()
        return kinds.full_attention(self.block_size, kv_heads, head_size, self.model_config.dtype)

    def _state_layer_specs(self, num_layers: int, default: KVCacheSpec) -> dict[str, KVCacheSpec]:
        """The attention layers' specs (the class's, or `default`) and a `MambaSpec` for
        each gated delta net layer (`model.layers.<i>.linear_attn`), in layer order,
        its page padded to the attention page as the plan aligned them."""
        cache = self.vllm_config.cache_config
        attention = layer_specs(
            self.generator_cls,
            self.vllm_config,
            num_layers,
            default,
            ask=self.kv_groups_served,
            kv_layers=self.attention_layers,
        )
        state = kinds.gated_delta_net(
            self.vllm_config,
            cache.mamba_block_size or self.max_model_len,
            cache.mamba_page_size_padded,
            host=self.host_mesh,
        )
        named = {layer_index(name): (name, spec) for name, spec in attention.items()}
        for layer in self.state_layers:
            named[layer] = (STATE_LAYER_NAME.format(layer), state)
        return dict(named[i] for i in sorted(named))  # type: ignore[type-var]

    def cache_block_size_bytes(self) -> int:
        return block_bytes(self.get_kv_cache_spec())

    def determine_available_memory(self) -> int:
        """Bytes for the KV cache: `--kv-cache-memory-bytes` when given, else the
        generator's own capacity when it declares one (get_max_tokens_all_users), else
        room for every sequence at full length.

        The tokens become blocks as the reference plugin turns them (a block per user of
        headroom, and with KV groups the blocks each bounded group holds per request at
        most: every group draws its block ids from one pool), and the blocks bytes as
        vLLM will divide them back (`runner.kv.sizing`).

        With in-process lanes the generator's capacity is per lane (TT-Metal sizes each
        DP submesh's cache), and the engine's blocks are every lane's: the coordinator
        and the runner give each lane an equal share."""
        explicit = self.vllm_config.cache_config.kv_cache_memory_bytes
        if explicit is not None:
            return int(explicit)
        tokens = self.max_tokens_all_users()
        if tokens is None:
            tokens = self.slots.per_lane * self.max_model_len
        specs = self.get_kv_cache_spec()
        return pool_bytes(self.vllm_config, specs, tokens, self.slots.per_lane) * self.lanes

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None:
        """The engine's KV groups taken on and the cache allocated, before any request."""
        num_layers, kv_heads, head_size = self._layer_shape()
        groups = LayerGroups.from_config(kv_cache_config, num_layers, self.kv_layers)
        self.use_kv_groups(groups)
        self.allocate_kv_cache(
            kv_cache_config.num_blocks,
            kv_heads,
            head_size,
            self._kv_layer_count(num_layers),
            self.model_config.dtype,
        )
        lanes = self.lanes
        held = capacity(self.vllm_config, kv_cache_config, num_layers)
        logger.info(
            "ttbundles: KV cache of %d blocks x %d tokens (%s), %s%s; %s",
            kv_cache_config.num_blocks,
            self.block_size,
            byte_size(held.bytes),
            groups.describe(),
            f" ({kv_cache_config.num_blocks // lanes} per lane, {lanes} lanes)"
            if lanes > 1
            else "",
            held.describe(),
        )

    def use_kv_groups(self, groups: LayerGroups) -> None:
        """The engine's KV groups (`runner.kv.groups`): a block table per group, each as
        wide as its spec asks, each layer's `page_tables_per_layer` entry its group's.
        Before any request."""
        refuse_unserved_groups(groups, speculating=self.speculation is not None, lanes=self.lanes)
        self.kv_groups = groups
        if self.align_state:
            self.mamba_group = next(
                g for g, spec in enumerate(groups.specs) if kinds.holds_state(spec)
            )
        self.tables = BlockTables(
            self.max_num_reqs,
            self.max_model_len,
            self.block_size,
            groups=groups,
            widths=groups.table_widths(self.vllm_config, self.max_model_len),
        )
        self.states.tables = self.tables

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
        assert self.methods is not None
        shape = (num_blocks // self.lanes, num_kv_heads, self.block_size, head_size)
        self.kv_cache, self.cache_layers = allocate_cache(
            self.methods.allocator,
            self.class_name,
            self.kv_groups,
            shape,
            dtype,
            num_layers,
            self._layer_cache_shapes(num_blocks // self.lanes),
            # "align": the state of every Mamba block id (the indices are vLLM's block
            # ids); "none": a state per batch slot.
            state_slots=num_blocks if self.align_state else self.max_num_reqs,
        )

    def _layer_cache_shapes(self, num_blocks: int) -> list[tuple[int, int, int, int]] | None:
        """Each KV layer's cache shape where a layer's spec gives it its own KV heads or
        head size (Gemma 4's global layers), with its group's block size (the engine's,
        or one vLLM grew to unify page sizes); None where every layer has the model's."""
        specs = list(self.get_kv_cache_spec().values())
        default = self._default_spec()
        # A layer keeping recurrent state has no KV shape (its state descriptor is
        # allocated instead): it stands in with the model's.
        specs = [default if kinds.holds_state(spec) else spec for spec in specs]
        if not any(own_shape(spec, default) for spec in specs):
            return None
        groups = self.kv_groups
        shapes = []
        for i, layer in enumerate(specs):
            block = groups.specs[groups.group[i]].block_size if groups else layer.block_size
            shapes.append((num_blocks, layer.num_kv_heads, block, layer.head_size))
        return shapes

    # --- device helpers -----------------------------------------------------------------

    def synchronize(self, event: Any) -> None:
        """Wait for a readback event (`readback.synchronize`)."""
        synchronize(self.mesh_device, event)

    def process_output(self, *, host_out: Any, is_tokens: bool) -> Any:
        assert self.methods is not None and self.methods.process is not None
        return self.methods.process(host_out, is_tokens=is_tokens)

    # --- a step -------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        speculating = self.speculation is not None
        grammar = self.device_support.grammar
        if not is_steady(
            scheduler_output, self._async_req_ids, self._async_layout, speculating, grammar
        ):
            self.drain(drain_reason(scheduler_output, speculating, grammar))
        self.states.update(scheduler_output)
        if self.snapshots:
            self._restore_snapshots(scheduler_output)
        if scheduler_output.total_num_scheduled_tokens == 0 or self.input_batch.num_reqs == 0:
            STATS.count("step.empty")
            self._async_req_ids = None
            return EMPTY_MODEL_RUNNER_OUTPUT
        step, computed, totals, drafts, is_decode = self.states.prepare_step(
            scheduler_output, self.speculation, async_decode=self.async_decode
        )
        reason = host_reason(
            step,
            is_decode,
            self.options,
            self.device_support,
            custom_logits_processors=bool(self.model_config.logits_processors),
        )
        speculation = self.speculation
        if is_decode and speculation is not None:
            if not drafts:
                drafts = [[] for _ in step.req_ids]
            if speculation.verifies(step.req_ids, drafts):
                # Drafts are accepted on the host, against the verify's ids or logits.
                STATS.count("sampling.host")
                STATS.count("sampling.host.speculative")
                self._run_verify(step, computed, drafts)
                self._step = step
                self._async_req_ids = None
                return None
        if reason is None and not is_decode and step.layout.any_prompt_logprobs:
            reason = "prompt_logprobs"  # the logits of every position come to the host
        if reason is None:
            STATS.count("sampling.device")
        else:
            STATS.count("sampling.host")
            STATS.count(f"sampling.host.{reason}")
        if is_decode:
            # A structured decode on a device grammar waits for its bitmask, which vLLM
            # hands to sample_tokens: the call is made there (still without a readback).
            defer = reason is None and bool(scheduler_output.has_structured_output_requests)
            self._run_decode(step, computed, totals, device=reason is None, defer=defer)
        else:
            if speculation is not None:  # a prefill drops a row's count back to 1
                for req_id in step.req_ids:
                    speculation.reset(req_id)
            ends = step.positions.tolist()
            self._run_prefill(step, ends, computed.tolist(), device=reason is None)
        if step.readback is None:
            self._async_req_ids = None
        self._step = step
        return None

    def _decode_values(
        self, layout: Layout, tables: list[torch.Tensor], commands: DecodeCommands
    ) -> dict[str, Any]:
        """What every decode and verify call passes besides its tokens and positions."""
        capacity = self.max_num_reqs
        values: dict[str, Any] = dict(
            page_table=self.tables.main(tables),
            kv_cache=self.kv_cache,
            enable_trace=self.decode_trace,
            sampling_params=None,
            slot_remap=list(range(capacity)),
            **self.tables.per_layer(tables, self.cache_layers),
        )
        if self.state_layers:
            # Row i is slot i (rows never move): its state is the i-th of every GDN
            # layer's compact states, as long as its request lives ("none" mode), or the
            # Mamba block this step writes ("align": `_run_decode` sets them).
            values[contract.STATE_INDICES_KEYWORD] = self._state_indices
        assert self.methods is not None
        rope_deltas = self.states.rope_deltas
        if rope_deltas and self.methods.decode.accepts("rope_deltas_all_users"):
            values["rope_deltas_all_users"] = [
                rope_deltas.get(owner, 0) if owner is not None else 0 for owner in layout.owners
            ]
        if self.reuse_keyword:
            values[contract_keys.REUSE_DECODE_INPUTS_KEYWORD] = commands.reuse_inputs
        if self.version >= contract.CONTRACT_V1:
            values.update(
                reload_inputs=commands.reload_inputs,
                reload_page_table=commands.reload_page_table,
                reload_sampling_params=commands.reload_sampling_params,
                reset_sampling_state=commands.reset_sampling_state,
            )
        return values

    def _run_decode(
        self,
        step: StepState,
        computed: np.ndarray,
        totals: np.ndarray,
        *,
        device: bool,
        defer: bool = False,
    ) -> None:
        """One token per slot, every slot in the call (empty ones at position -1).
        Sampling on the device with async decode: submit without blocking and start the
        readback; the host learns the tokens when vLLM asks. `defer`: the inputs are built
        now, the call waits on the step for the grammar bitmask (`_sample`).

        The inputs are whole-batch array operations over the layout's slots, and the page
        table the persistent per-slot one: nothing here loops over rows."""
        STATS.count("step.decode")
        assert self.methods is not None
        batch = self.input_batch
        capacity = self.max_num_reqs
        layout = step.layout
        slots = layout.slots
        step.rows = layout.rows
        n = len(slots)
        # A token still in flight is unknown here (-1): the generator has it resident.
        column = np.minimum(computed, batch.token_ids_cpu.shape[1] - 1)
        known = batch.token_ids_cpu[np.arange(n), column].astype(np.int64)
        tokens_np = np.zeros(capacity, dtype=np.int64)
        tokens_np[slots] = np.where(computed < totals, known, -1)
        positions_np = np.full(capacity, EMPTY_POSITION, dtype=np.int64)
        positions_np[slots] = computed
        tables, page_table = self.tables.decode_tables(layout, positions_np)
        if self.align_state:
            indices = torch.zeros(capacity, dtype=torch.int32)  # 0: vLLM's null block
            indices[torch.from_numpy(np.asarray(slots, dtype=np.int64))] = torch.tensor(
                self._state_blocks(step.req_ids, computed.tolist(), [1] * n), dtype=torch.int32
            )
            self._state_indices = indices
        commands = self._decode_commands(layout.owners, page_table, device)
        read = self.methods.read
        use_async = self.async_decode and device and self.resident_inputs and read is not None
        values = self._decode_values(layout, tables, commands)
        values.update(
            tokens=torch.from_numpy(tokens_np).view(capacity, 1),
            start_pos=torch.from_numpy(positions_np),
            read_from_device=not use_async,
        )
        if device:
            values["sampling_params"] = slot_params(layout, capacity, batch.vocab_size)
            # As the reference plugin does: the history goes with a decode only when a
            # request of the batch asks for a penalty (and the device applies them).
            if self.device_support.penalties and layout.penalised:
                values.update(self.history.tensors(layout))
        if self.version < contract.CONTRACT_V1 and device:
            values["reset_batch"] = commands.transition
        if self.version < contract.CONTRACT_V1:
            # A legacy-form class takes its active rows first, as the reference plugin's
            # condensed batch gives them (`compact_rows`).
            if self._order_layout is not layout:
                self._order_layout, self._order = layout, row_order(slots, layout.idle)
            if self._order is not None:
                values = self._order.gather(values)
                step.rows, step.order = self._order.ranks, self._order
                STATS.count("decode.compacted")
        commands.count()
        if defer:
            step.submit = lambda bitmask: self._submit_decode(
                step, values, computed, page_table, use_async=use_async, bitmask=bitmask
            )
            return
        self._submit_decode(step, values, computed, page_table, use_async=use_async, device=device)

    def _submit_decode(
        self,
        step: StepState,
        values: dict[str, Any],
        computed: np.ndarray,
        page_table: torch.Tensor,
        *,
        use_async: bool,
        device: bool = True,
        bitmask: torch.Tensor | None = None,
    ) -> None:
        """The decode call of `_run_decode` and what it leaves: the readback started, or
        the tokens or logits on the step; `bitmask`: the grammar's, per slot."""
        assert self.methods is not None
        layout = step.layout
        capacity = self.max_num_reqs
        read = self.methods.read
        if bitmask is not None:
            if step.order is not None:
                bitmask = step.order.gather({contract.GRAMMAR_BITMASK_KEYWORD: bitmask})[
                    contract.GRAMMAR_BITMASK_KEYWORD
                ]
            values[contract.GRAMMAR_BITMASK_KEYWORD] = bitmask
            STATS.count("sampling.device.grammar")
        out = self.methods.decode(**values)
        # The generator accepted the submission: only now does the layout count as staged.
        self._device_layout = layout.owners if device else None
        if device:
            self._device_page_table = page_table
        if use_async:
            assert read is not None
            step.readback = read(out, async_read=True)
            STATS.count("decode.async")
            if self._inflight:
                STATS.count("decode.overlapped")  # submitted while a step is in flight
            self._async_req_ids = step.req_ids
            self._async_layout = layout
        else:
            primary, logprobs = split_output(out)
            if device and not primary.is_floating_point():
                # A block-output class answers `[B, k]` (k tokens a row); else `[B]`.
                block = primary.dim() == 2 and primary.shape[1] > 1
                step.tokens = (primary if block else primary.reshape(-1))[step.rows]
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
        assert self.speculation is not None and self.methods is not None
        layout = step.layout
        step.rows = layout.rows
        n = len(step.req_ids)
        last = self.input_batch.token_ids_cpu[np.arange(n), computed].astype(np.int64)
        verify = self.speculation.verify_inputs(
            step.req_ids, layout.slots, last, computed, drafts, layout.params
        )
        STATS.count("speculative.draft_tokens", sum(len(d) for d in verify.drafts))
        starts = np.full(self.max_num_reqs, EMPTY_POSITION, dtype=np.int64)
        starts[layout.slots] = computed
        tables, page_table = self.tables.decode_tables(layout, starts)
        commands = self._decode_commands(layout.owners, page_table, False)
        # Asynchronous scheduling (the bundle declares async_spec_decode): submitted
        # without reading back; read_decode_output copies the verify block, accepted when
        # vLLM (or the next step, which drains it first) asks for the output.
        read = self.methods.read
        deferred = self.async_decode and read is not None
        values = self._decode_values(layout, tables, commands)
        values.update(
            tokens=verify.tokens,
            start_pos=verify.positions,
            read_from_device=not deferred,
            num_valid_drafts=verify.num_valid,
            accepted_counts=verify.accepted_counts,
            spec_mode=verify.spec_mode,
        )
        step.verify = verify
        step.verify_out = self.methods.decode(**values)
        self._device_layout = None  # the next decode reloads everything
        if deferred:
            assert read is not None
            block = verify_block(step.verify_out, verify.spec_mode, self.class_name)
            step.readback = read(block, async_read=True)
            STATS.count("step.verify.async")

    def _finish_verify_readback(self, step: StepState, block: torch.Tensor) -> ModelRunnerOutput:
        """A deferred verify read back: accepted and committed as a synchronous verify
        is (the next drafts proposed with it)."""
        read_back_verify(step, block, self.max_num_reqs)
        return self._sample(step, None)

    def _after_commit(self, step: StepState, sampled: list[list[int]]) -> None:
        """Speculating: record what each row committed and propose its next drafts."""
        if self.speculation is None:
            return
        assert self.methods is not None
        self.speculation.after_commit(
            step, sampled, self.input_batch, self.methods.propose, self.class_name
        )

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step, once (vLLM's engine core asks after
        every step and stores them on the requests)."""
        pending = self.speculation.take() if self.speculation is not None else None
        return DraftTokenIds(*pending) if pending is not None else None

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
        assert self.methods is not None
        rows = len(step.req_ids)
        requests = self.requests
        tokens = torch.from_numpy(self.input_batch.token_ids_cpu[:rows, : max(ends)].copy())
        states = [requests[r] for r in step.req_ids]
        inputs: dict[str, Any] = {}
        if self.image_inputs:
            inputs = prefill_image_inputs(step.req_ids, computed, requests, self.pixels)
        tables = self.tables.prefill_tables([s.block_ids for s in states], computed)
        page_table = self.tables.main(tables)
        scored = (
            self.prompt_logprobs.rows(step.req_ids, requests, computed)
            if self.prompt_logprobs is not None and step.layout.any_prompt_logprobs
            else []
        )
        if scored:
            inputs[contract.PROMPT_LOGITS_KEYWORD] = True
        if contract_keys.PREFILL_OUTPUT_MASK_KEYWORD in self.prefill_keywords:
            # Only rows whose chunk ends their prompt produce a token.
            inputs[contract_keys.PREFILL_OUTPUT_MASK_KEYWORD] = (~step.discard).tolist()
        if contract_keys.ORIGINAL_PROMPT_LENS_KEYWORD in self.prefill_keywords:
            original = self.input_batch.num_prompt_tokens[:rows]
            inputs[contract_keys.ORIGINAL_PROMPT_LENS_KEYWORD] = [int(n) for n in original]
        out = self.methods.prefill(
            **inputs,
            **self.tables.per_layer(tables, self.cache_layers),
            tokens=tokens.long(),
            page_table=page_table,
            kv_cache=self.kv_cache,
            prompt_lens=torch.tensor(ends),
            empty_slots=self._state_blocks(
                step.req_ids, computed, [e - c for c, e in zip(computed, ends)]
            )
            if self.align_state
            else [self.slots.slot_of[r] for r in step.req_ids],
            enable_trace=self.prefill_trace,
            sampling_params=row_params(states, self.input_batch.vocab_size) if device else None,
            start_pos=torch.tensor(computed),
        )
        self._device_layout = None  # the next decode reloads everything
        if self.snapshots:
            self._save_snapshots(step.req_ids, computed, ends)
        primary, extra = split_output(out)
        if isinstance(primary, tuple | list):
            # A class that returns its rope deltas beside whatever it computed, sampled
            # tokens too (`((tokens, log_probs), rope_deltas)`: TT-Metal's Qwen3.6
            # autoport): the deltas kept by request, the output read as usual.
            deltas = torch.as_tensor(extra).reshape(-1).tolist() if extra is not None else []
            for req_id, delta in zip(step.req_ids, deltas):
                self.states.rope_deltas[req_id] = int(delta)
            primary, extra = split_output(primary)
        if primary.is_floating_point():
            prefill_logits(
                step,
                primary,
                extra,
                scored,
                computed,
                ends,
                prompt_logprobs=self.prompt_logprobs,
                requests=requests,
                rope_deltas=self.states.rope_deltas,
                class_name=self.class_name,
            )
            if device:
                STATS.count("sampling.device_returned_logits")  # e.g. Mistral3's prefill
        else:
            step.tokens = primary.reshape(-1)[:rows]
            step.logprobs = rows_of(extra, list(range(rows)))
        if self.observer is not None:
            self.observer("prefill", step.req_ids, computed, ends, step.logits)

    # --- sampling -----------------------------------------------------------------------

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | TTAsyncOutput:
        step, self._step = self._step, None
        if step is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        output = self._sample(step, grammar_output)
        # Never on vLLM's shared empty output; a later step's output carries them then.
        if (
            self._saved
            and isinstance(output, ModelRunnerOutput)
            and output is not EMPTY_MODEL_RUNNER_OUTPUT
        ):
            setattr(output, SNAPSHOT_SAVED, self._saved)
            self._saved = []
        return output

    # --- vLLM's "align" mode: recurrent state in position-indexed Mamba blocks -----------

    def _state_blocks(
        self, req_ids: list[str], computed: list[int], scheduled: list[int]
    ) -> list[int]:
        """Each row's Mamba block for this step, as vLLM's own `MambaHybridModelState`
        finds it: a request's Mamba row is position-indexed (column c holds the state
        after (c + 1) x block tokens); the step continues the state of column
        `(computed - 1) // block` (a prefix-cache hit's last cached block included) and
        writes column `(computed + scheduled - 1) // block`. Where the two differ the
        state is copied into the written block first (`copy_recurrent_state`, every GDN
        layer), so the block left behind keeps the state after exactly its tokens. A row
        with nothing computed (a first chunk, a resumed request) starts from zero
        (the generator's `start == 0`). The first Mamba group's block ids index every GDN
        layer's state: vLLM caches and frees the groups' blocks of a column together."""
        block, group = self.mamba_block, self.mamba_group
        sources: list[int] = []
        targets: list[int] = []
        written: list[int] = []
        for req_id, done, count in zip(req_ids, computed, scheduled):
            ids = self.requests[req_id].block_ids[group]
            target = int(ids[(done + count - 1) // block])
            if done > 0:
                source = int(ids[(done - 1) // block])
                if source != target:
                    sources.append(source)
                    targets.append(target)
            written.append(target)
        if sources:
            self.generator.copy_recurrent_state(sources, targets)
            STATS.count("recurrent.block_copies", len(sources))
        return written

    # --- snapshots of recurrent state (`serving.recurrent_prefix`) ----------------------

    def _restore_snapshots(self, scheduler_output: SchedulerOutput) -> None:
        """Each prefix-cache hit's state into its slot (before its prefill continues it),
        then the snapshots the scheduler let go freed."""
        for req_id, handle in getattr(scheduler_output, SNAPSHOT_RESTORE, {}).items():
            slot = self.slots.slot_of[req_id]
            if not self.generator.restore_recurrent_prefix(slot, handle):
                raise RuntimeError(
                    f"{self.class_name}.restore_recurrent_prefix({slot}, {handle}) failed: "
                    f"request {req_id} would continue a state it does not have"
                )
        for handle in getattr(scheduler_output, SNAPSHOT_FREE, ()):
            self.generator.free_recurrent_prefix(handle)

    def _save_snapshots(self, req_ids: list[str], computed: list[int], ends: list[int]) -> None:
        """A snapshot of each row whose prompt chunk ended on a block boundary: the state
        after exactly those tokens, which a later prompt sharing them may restore."""
        block = self.block_size
        prompt_lens = self.input_batch.num_prompt_tokens
        for row, req_id in enumerate(req_ids):
            end = ends[row]
            if end > computed[row] and end % block == 0 and end <= prompt_lens[row]:
                handle = self.generator.save_recurrent_prefix(self.slots.slot_of[req_id])
                self._saved.append((req_id, end, int(handle)))

    def _sample(
        self, step: StepState, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | TTAsyncOutput:
        if step.submit is not None:
            submit, step.submit = step.submit, None
            submit(slot_bitmask(step.layout, self.max_num_reqs, grammar_output))
        if step.readback is not None:
            verify = step.verify is not None
            pending = TTAsyncOutput(
                step,
                synchronize=self.synchronize,
                process_output=self.process_output,
                finish=self._finish_verify_readback if verify else self.outputs.from_device,
                resolved=self._inflight.remove,
                is_tokens=not verify or step.verify.spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS,
            )
            self._inflight.append(pending)
            STATS.record_max("decode.max_in_flight", len(self._inflight))
            return pending
        if step.tokens is not None:
            return self.outputs.from_device(step, step.tokens)
        if step.verify is not None:
            return self.outputs.from_verify(step)
        return self.outputs.from_host(step, grammar_output)

    # --- asynchronous decode ------------------------------------------------------------

    def drain(self, reason: str = "batch_change") -> None:
        """Read back every step in flight so the host knows all tokens."""
        if not self._inflight:
            return
        STATS.count(f"decode.drain.{reason}")
        for pending in list(self._inflight):
            pending.get_output()
