"""Drive a TT generator from vLLM's scheduler output, step by step.

The runner keeps vLLM's request bookkeeping (`InputBatch`: tokens, sampling parameters,
seeded generators, logits processors) so that host sampling is vLLM's own `Sampler`,
bit for bit; the generator owns the model and attention over the paged KV cache that the
runner allocates through it. Each step is prefill-only or decode-only (the phase-based
scheduler guarantees it), which maps onto the contract's `prefill_forward` and
`decode_forward`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.sampling_params import SamplingType
from vllm.v1.outputs import (
    EMPTY_MODEL_RUNNER_OUTPUT,
    AsyncModelRunnerOutput,
    ModelRunnerOutput,
)
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from ttbundles.format.contract import SamplingParamsBatch
from ttbundles.serving.sampling_path import batch_host_reason, device_params
from ttbundles.serving.stats import STATS

if TYPE_CHECKING:  # vLLM's config and scheduler types are only needed for annotations
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

logger = logging.getLogger("vllm.ttbundles")


@dataclass
class _StepState:
    """What execute_model leaves for sample_tokens."""

    scheduler_output: SchedulerOutput
    req_ids: list[str]
    discard: np.ndarray  # rows whose prompt is not complete: no token this step
    logits: torch.Tensor | None = None  # [num_reqs, vocab], host path
    tokens: torch.Tensor | None = None  # [num_reqs], device path, already on the host
    readback: tuple[Any, list[Any]] | None = None  # device path, asynchronous readback


class TTAsyncOutput(AsyncModelRunnerOutput):
    """A decode step whose sampled tokens are still being read back from the device.

    vLLM keeps up to two steps in flight and calls `get_output` when it needs this one,
    so the host schedules step N+1 while step N is read back. The runner can also resolve
    it early (a drain) when the next step needs the tokens on the host.
    """

    def __init__(self, runner: TTModelRunner, step: _StepState):
        self._runner = runner
        self._step = step
        self._output: ModelRunnerOutput | None = None

    @property
    def resolved(self) -> bool:
        return self._output is not None

    def get_output(self) -> ModelRunnerOutput:
        if self._output is None:
            host_out, events = self._step.readback  # type: ignore[misc]
            for event in events:
                event.wait()
            tokens = self._runner.model.process_decode_output_host(host_out, is_tokens=True)
            self._output = self._runner._finish_with_tokens(self._step, tokens)
            self._runner._inflight.remove(self)
        return self._output

    def get_kv_connector_output(self) -> None:
        return None


class TTModelRunner:
    def __init__(self, vllm_config: VllmConfig, generator_cls: type, mesh_device: Any):
        self.vllm_config = vllm_config
        self.model_config = vllm_config.model_config
        self.generator_cls = generator_cls
        self.mesh_device = mesh_device
        self.device = torch.device("cpu")
        sched = vllm_config.scheduler_config
        self.max_num_reqs = sched.max_num_seqs
        self.max_model_len = self.model_config.max_model_len
        self.block_size = vllm_config.cache_config.block_size
        self.plan = (vllm_config.additional_config or {}).get("ttbundles", {})
        self.options = (vllm_config.additional_config or {}).get("tt", {})
        self.model: Any = None
        self.kv_cache: Any = None
        self.requests: dict[str, CachedRequestState] = {}
        custom = self.model_config.logits_processors or ()
        self.input_batch = InputBatch(
            max_num_reqs=self.max_num_reqs,
            max_model_len=self.max_model_len,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            device=self.device,
            vocab_size=self.model_config.get_vocab_size(),
            block_sizes=[self.block_size],
            max_num_blocks_per_req=[-(-self.max_model_len // self.block_size)],
            logitsprocs=build_logitsprocs(vllm_config, self.device, False, False, custom),
            logitsprocs_need_output_token_ids=bool(custom),
        )
        self.sampler = Sampler(logprobs_mode=self.model_config.logprobs_mode)
        self._step: _StepState | None = None
        # Asynchronous decode: the bundle declares it and async scheduling stayed on.
        self.async_decode = bool(vllm_config.scheduler_config.async_scheduling)
        self._inflight: list[TTAsyncOutput] = []
        self._async_req_ids: list[str] | None = None

    # --- set-up -----------------------------------------------------------------------

    def load_model(self) -> None:
        hf_config = self.model_config.hf_config
        self.model = self.generator_cls.initialize_vllm_model(
            hf_config=hf_config,
            mesh_device=self.mesh_device,
            max_batch_size=self.max_num_reqs,
            max_seq_len=self.max_model_len,
            tt_data_parallel=int(self.plan.get("lanes", 1)),
            optimizations=self.options.get("optimizations"),
        )

    def max_tokens_all_users(self) -> int | None:
        """The generator's own KV capacity in tokens, when it declares one."""
        method = getattr(self.generator_cls, "get_max_tokens_all_users", None)
        if method is None:
            return None
        return int(
            method(
                hf_config=self.model_config.hf_config,
                mesh_device=self.mesh_device,
                max_batch_size=self.max_num_reqs,
                max_seq_len=self.max_model_len,
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
        shape = (num_blocks, num_kv_heads, self.block_size, head_size)
        per_layer = getattr(self.model, "allocate_kv_cache_per_layer", None)
        if per_layer is not None:
            # Newer generators (hybrid attention) take one (shape, dtype, index) per layer,
            # and are preferred through it where they offer it.
            specs = [(shape, dtype, layer) for layer in range(num_layers)]
            self.kv_cache = per_layer(per_layer_specs=specs)
        else:
            self.kv_cache = self.model.allocate_kv_cache(
                kv_cache_shape=shape, dtype=dtype, num_layers=num_layers
            )

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
        num_sched = scheduler_output.num_scheduled_tokens
        computed = [self.requests[r].num_computed_tokens for r in req_ids]
        counts = [num_sched[r] for r in req_ids]
        totals = [self.requests[r].num_tokens for r in req_ids]
        # A row is decoding when it computes one token, its newest (known or in flight).
        is_decode = all(n == 1 and c >= t - 1 for n, c, t in zip(counts, computed, totals))
        step = _StepState(
            scheduler_output,
            req_ids,
            np.array([c + n < t for c, n, t in zip(computed, counts, totals)]),
        )
        reason = batch_host_reason(
            (self.requests[r].sampling_params for r in req_ids),
            is_prefill=not is_decode,
            mode=self.options.get("sample_on_device_mode"),
            always_host=bool(self.options.get("always_compat_sampling")),
            custom_logits_processors=bool(self.model_config.logits_processors),
            structured=scheduler_output.has_structured_output_requests,
        )
        params = None
        if reason is None:
            params = device_params(
                [self.requests[r].sampling_params for r in req_ids], batch.vocab_size
            )
            STATS.count("sampling.device")
        else:
            STATS.count("sampling.host")
            STATS.count(f"sampling.host.{reason}")
        if is_decode:
            self._decode(step, computed, totals, params, steady)
        else:
            self._prefill(step, [c + n for c, n in zip(computed, counts)], computed, params)
        if step.readback is None:
            self._async_req_ids = None
        self._step = step
        return None

    def _decode(
        self,
        step: _StepState,
        computed: list[int],
        totals: list[int],
        params: SamplingParamsBatch | None,
        steady: bool,
    ) -> None:
        """One token per row. Sampling on the device with async decode: submit without
        blocking and start the readback; the host learns the tokens when vLLM asks."""
        STATS.count("step.decode")
        batch = self.input_batch
        # A token still in flight is unknown here (-1): the generator has it on the device.
        tokens = torch.tensor(
            [
                [int(batch.token_ids_cpu[i, c]) if c < t else -1]
                for i, (c, t) in enumerate(zip(computed, totals))
            ],
            dtype=torch.int64,
        )
        use_async = self.async_decode and params is not None
        out = self.model.decode_forward(
            tokens=tokens,
            start_pos=torch.tensor(computed, dtype=torch.int64),
            page_table=self._page_table(step.req_ids),
            kv_cache=self.kv_cache,
            enable_trace=False,
            read_from_device=not use_async,
            sampling_params=params,
            reset_batch=not steady,
        )
        if use_async:
            step.readback = self.model.read_decode_output(out, async_read=True)
            STATS.count("decode.async")
            if self._inflight:
                STATS.count("decode.overlapped")  # submitted while a step is in flight
            self._async_req_ids = step.req_ids
        elif params is not None:
            step.tokens = out.reshape(-1)
        else:
            step.logits = out.reshape(len(step.req_ids), -1).float()

    def _prefill(
        self,
        step: _StepState,
        ends: list[int],
        computed: list[int],
        params: SamplingParamsBatch | None,
    ) -> None:
        """One chunk per row, rows holding their tokens from position 0 (TT-Metal's
        convention); positions below `computed` are already in the cache."""
        STATS.count("step.prefill")
        rows = len(step.req_ids)
        tokens = torch.from_numpy(self.input_batch.token_ids_cpu[:rows, : max(ends)].copy())
        out = self.model.prefill_forward(
            tokens=tokens.long(),
            page_table=self._page_table(step.req_ids),
            kv_cache=self.kv_cache,
            prompt_lens=torch.tensor(ends),
            start_pos=torch.tensor(computed),
            enable_trace=False,
            sampling_params=params,
        )
        if params is not None:
            step.tokens = out.reshape(-1)
        else:
            step.logits = out.reshape(rows, -1).float()

    def sample_tokens(
        self, grammar_output: GrammarOutput | None
    ) -> ModelRunnerOutput | TTAsyncOutput:
        step, self._step = self._step, None
        if step is None:
            return EMPTY_MODEL_RUNNER_OUTPUT
        if step.readback is not None:
            pending = TTAsyncOutput(self, step)
            self._inflight.append(pending)
            STATS.record_max("decode.max_in_flight", len(self._inflight))
            return pending
        if step.tokens is not None:
            return self._finish_with_tokens(step, step.tokens)
        batch = self.input_batch
        logits = step.logits
        assert logits is not None
        if grammar_output is not None:
            from vllm.v1.structured_output.utils import apply_grammar_bitmask

            apply_grammar_bitmask(step.scheduler_output, grammar_output, batch, logits)
        # A seeded row whose prompt is not complete draws a token that is thrown away:
        # undo that draw. CPU generators have no offset to rewind (vLLM's GPU runner
        # rewinds the offset), so keep their state and put it back.
        rewind = {
            int(i): generator.get_state()
            for i in np.nonzero(step.discard)[0]
            if (generator := batch.generators.get(int(i))) is not None
        }
        sampler_output = self.sampler(logits=logits, sampling_metadata=batch.sampling_metadata)
        sampled = sampler_output.sampled_token_ids.tolist()
        for i in np.nonzero(step.discard)[0]:
            sampled[int(i)] = []
        for i, state in rewind.items():
            batch.generators[i].set_state(state)
        self._append_sampled(step.req_ids, sampled)
        logprobs = sampler_output.logprobs_tensors
        return ModelRunnerOutput(
            req_ids=list(step.req_ids),
            req_id_to_index={r: i for i, r in enumerate(step.req_ids)},
            sampled_token_ids=sampled,
            logprobs=logprobs.tolists() if logprobs is not None else None,
            prompt_logprobs_dict={},
        )

    def _finish_with_tokens(self, step: _StepState, tokens: torch.Tensor) -> ModelRunnerOutput:
        sampled = [[int(t)] for t in tokens.reshape(-1).tolist()[: len(step.req_ids)]]
        for i in np.nonzero(step.discard)[0]:
            sampled[int(i)] = []
        self._append_sampled(step.req_ids, sampled)
        return ModelRunnerOutput(
            req_ids=list(step.req_ids),
            req_id_to_index={r: i for i, r in enumerate(step.req_ids)},
            sampled_token_ids=sampled,
            prompt_logprobs_dict={},
        )

    # --- asynchronous decode ------------------------------------------------------------

    def _is_steady(self, so: SchedulerOutput) -> bool:
        """The same decode batch as the last asynchronous step: keep overlapping."""
        previous = self._async_req_ids
        if previous is None or so.scheduled_new_reqs or so.has_structured_output_requests:
            return False
        cached = so.scheduled_cached_reqs
        if cached.resumed_req_ids or so.finished_req_ids & set(previous):
            return False
        scheduled = so.num_scheduled_tokens
        return len(scheduled) == len(previous) and all(scheduled.get(r) == 1 for r in previous)

    def _drain_reason(self, so: SchedulerOutput) -> str:
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
            batch.is_token_ids[index, start:end] = True
            batch.num_tokens_no_spec[index] = end

    def _page_table(self, req_ids: list[str]) -> torch.Tensor:
        rows = [self.requests[r].block_ids[0] for r in req_ids]
        width = max(len(r) for r in rows)
        table = torch.zeros((len(rows), width), dtype=torch.int32)
        for i, row in enumerate(rows):
            table[i, : len(row)] = torch.tensor(row, dtype=torch.int32)
        return table

    def _update_states(self, scheduler_output: SchedulerOutput) -> None:
        """Mirror the scheduler's view: finished, new, resumed and continuing requests.

        Requests not scheduled this step leave the persistent batch (the phase-based
        scheduler leaves decodes out of prefill steps) and rejoin when scheduled again.
        """
        batch = self.input_batch
        for req_id in scheduler_output.finished_req_ids:
            self.requests.pop(req_id, None)
            batch.remove_request(req_id)
        scheduled = scheduler_output.num_scheduled_tokens.keys()
        cached = scheduler_output.scheduled_cached_reqs
        for req_id in list(batch.req_id_to_index.keys() - (scheduled - cached.resumed_req_ids)):
            batch.remove_request(req_id)

        to_add: list[CachedRequestState] = []
        for new in scheduler_output.scheduled_new_reqs:
            params = new.sampling_params
            generator = None
            if params is not None and params.sampling_type == SamplingType.RANDOM_SEED:
                generator = torch.Generator(device=self.device)
                generator.manual_seed(params.seed)
            state = CachedRequestState(
                req_id=new.req_id,
                prompt_token_ids=new.prompt_token_ids,
                mm_features=new.mm_features,
                sampling_params=params,
                generator=generator,
                block_ids=tuple(list(ids) for ids in new.block_ids),
                num_computed_tokens=new.num_computed_tokens,
                output_token_ids=[],
                lora_request=new.lora_request,
            )
            self.requests[new.req_id] = state
            to_add.append(state)

        for i, req_id in enumerate(cached.req_ids):
            state = self.requests[req_id]
            state.num_computed_tokens = cached.num_computed_tokens[i]
            num_output = cached.num_output_tokens[i]
            if num_output < len(state.output_token_ids):
                del state.output_token_ids[num_output:]
            new_blocks = cached.new_block_ids[i]
            index = batch.req_id_to_index.get(req_id)
            if req_id in cached.resumed_req_ids:
                assert new_blocks is not None
                state.block_ids = tuple(list(ids) for ids in new_blocks)
            elif new_blocks is not None:
                for ids, extra in zip(state.block_ids, new_blocks):
                    ids.extend(extra)
            if index is None:
                to_add.append(state)
                continue
            batch.num_computed_tokens_cpu[index] = state.num_computed_tokens
            if new_blocks is not None:
                batch.block_table.append_row(new_blocks, index)
        for state in to_add:
            batch.add_request(state)
        batch.condense()
        batch.refresh_metadata()
