"""The host batch for releases without Model Runner V1 (0.34.0 on): the request rows,
and a host sampler built from what the release ships that runs on this build.

vLLM 0.34.0 removed V1's `InputBatch`, `Sampler` and logits processors. Its replacement
for CPUs (`vllm/v1/worker/cpu/`, Model Runner V2's standalone CPU runner) samples with
C++ kernels (`torch.ops._C.gumbel_sample_cpu`, `apply_logit_bias_cpu`, the input-batch
kernels) that exist only in a `VLLM_TARGET_DEVICE=cpu` build; an out-of-tree device's
`empty` build, ours and a TT system's, has none of them. So:

- taken from vLLM 0.34.0 as it is (pure torch, checked to run here): repetition,
  frequency and presence penalties (`CPUPenalties`), bad words (`CPUBadWords`), the
  grammar bitmask (`CPUStructuredOutputsWorker`), top-k / top-p
  (`apply_top_k_top_p_pytorch`: the dispatching `apply_top_k_top_p` picks Triton when
  it is importable, which cannot run on host tensors);
- written here with the semantics of vLLM's kernels, in 0.34.0's pipeline order
  (`CPUSampler.apply_sampling_params`): allowed token ids, logit bias and min_tokens
  (the C++ `apply_logit_bias_cpu`), min-p, the random draw, log-probs.

The random draw is vLLM V1's exponential race (`argmax(probs / q)`, `q ~ Exp(1)`), with a
seeded row's `q` from a generator seeded for (seed, position): the same draw as the
reference generator's device sampler (`ttbundles.reference.sampling`) and as our V1 path,
so a seeded request gets the same tokens whichever path samples it. (0.34.0's Gumbel
kernel keys on (seed, position) too, with its own random stream.)

Imported only through `ttbundles.serving.compat`. Checked on vLLM 0.34.0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch
from vllm.v1.worker.cpu.logits_processors import (
    CPUBadWords,
    CPUPenalties,
    LogitsContext,
    LogitsProcRequestState,
)
from vllm.v1.worker.cpu.structured_outputs import CPUStructuredOutputsWorker

from ttbundles.format.contract import seed_for_position

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

_GREEDY_EPSILON = 1e-5  # vLLM's: a temperature below it is greedy


@dataclass
class RequestState:
    """What the runner keeps of a request while it lives (V1's `CachedRequestState`'s
    fields that the runner reads)."""

    req_id: str
    prompt_token_ids: list[int] | None
    mm_features: list[Any]
    sampling_params: Any
    generator: torch.Generator | None
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int
    output_token_ids: list[int] = field(default_factory=list)
    lora_request: Any = None

    @property
    def num_prompt_tokens(self) -> int:
        return len(self.prompt_token_ids or ())

    @property
    def num_tokens(self) -> int:
        return self.num_prompt_tokens + len(self.output_token_ids)


class HostBatch:
    """The requests of the persistent batch, one row each: their tokens (prompt, then
    outputs), prompt length, token count and computed count, as arrays the runner writes
    whole. Rows are dense after `condense` (a removed row's place is taken by the last
    row), as V1's `InputBatch` keeps them, so the runner works the same on both."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        model = vllm_config.model_config
        capacity = vllm_config.scheduler_config.max_num_seqs
        self.max_num_reqs = capacity
        self.vocab_size = model.get_vocab_size()
        self.token_ids = torch.zeros((capacity, model.max_model_len), dtype=torch.int32)
        self.token_ids_cpu = self.token_ids.numpy()
        self.num_tokens_no_spec = np.zeros(capacity, dtype=np.int32)
        self.num_prompt_tokens = np.zeros(capacity, dtype=np.int32)
        self.num_computed_tokens_cpu = np.zeros(capacity, dtype=np.int32)
        self._req_ids: list[str | None] = []
        self.req_id_to_index: dict[str, int] = {}
        self._holes: list[int] = []
        self.sampler = HostSampler(vllm_config, self, device)

    @property
    def req_ids(self) -> list[str]:
        return self._req_ids  # type: ignore[return-value]  # dense after condense()

    @property
    def num_reqs(self) -> int:
        return len(self.req_id_to_index)

    def add_request(self, state: RequestState) -> None:
        if self._holes:
            self._holes.sort()
            index = self._holes.pop(0)
            self._req_ids[index] = state.req_id
        else:
            index = len(self._req_ids)
            self._req_ids.append(state.req_id)
        self.req_id_to_index[state.req_id] = index
        prompt = state.prompt_token_ids or []
        count = len(prompt) + len(state.output_token_ids)
        row = self.token_ids_cpu[index]
        row[: len(prompt)] = prompt
        row[len(prompt) : count] = state.output_token_ids
        self.num_prompt_tokens[index] = len(prompt)
        self.num_tokens_no_spec[index] = count
        self.num_computed_tokens_cpu[index] = state.num_computed_tokens

    def remove_request(self, req_id: str) -> None:
        index = self.req_id_to_index.pop(req_id, None)
        if index is not None:
            self._req_ids[index] = None
            self._holes.append(index)

    def condense(self) -> None:
        """Fill each hole with the last row until the rows are dense."""
        while self._req_ids and self._req_ids[-1] is None:
            self._req_ids.pop()
        self._holes = [h for h in self._holes if h < len(self._req_ids)]
        self._holes.sort()
        while self._holes:
            hole = self._holes.pop(0)
            last = len(self._req_ids) - 1
            req_id = self._req_ids[last]
            assert req_id is not None
            count = int(self.num_tokens_no_spec[last])
            self.token_ids_cpu[hole, :count] = self.token_ids_cpu[last, :count]
            for array in (self.num_tokens_no_spec, self.num_prompt_tokens):
                array[hole] = array[last]
            self.num_computed_tokens_cpu[hole] = self.num_computed_tokens_cpu[last]
            self._req_ids[hole] = req_id
            self.req_id_to_index[req_id] = hole
            self._req_ids.pop()
            while self._req_ids and self._req_ids[-1] is None:
                self._req_ids.pop()
            self._holes = [h for h in self._holes if h < len(self._req_ids)]

    def refresh_metadata(self) -> None:
        """Nothing to refresh: the sampler binds each layout's parameters when it first
        samples it (V1's `InputBatch` rebuilt its sampling metadata here)."""

    def sample(
        self, logits: torch.Tensor, positions: np.ndarray, params: list[Any]
    ) -> tuple[list[list[int]], LogprobsTensors | None]:
        return self.sampler.sample(logits, positions, params)

    def logprobs(
        self,
        raw: torch.Tensor,
        tokens: torch.Tensor,
        params: list[Any],
        *,
        processed: torch.Tensor | None = None,
    ) -> LogprobsTensors | None:
        """The host sampler's logprobs of `tokens` (one per row of `raw` `[N, V]`,
        `params` each row's request), for rows it did not sample itself (a verify's
        committed tokens): what `sample` reports (`HostSampler.logprobs`)."""
        return self.sampler.logprobs(
            raw, processed if processed is not None else raw, tokens, params
        )

    def apply_grammar(
        self, scheduler_output: SchedulerOutput, grammar_output: GrammarOutput, logits: torch.Tensor
    ) -> None:
        self.sampler.apply_grammar(grammar_output, logits)


@dataclass(frozen=True)
class _Rows:
    """The rows of a grammar application, as 0.34.0's worker reads them."""

    req_ids: list[str]
    cu_num_logits: torch.Tensor


class HostSampler:
    """vLLM 0.34.0's host sampling pipeline over a `HostBatch`'s rows (see the module's
    docstring for which parts are vLLM's): logit bias and friends, penalties, bad words,
    temperature, min-p, top-k/top-p, then the draw; log-probs of the raw (or processed,
    per `--logprobs-mode`) logits."""

    def __init__(self, vllm_config: VllmConfig, batch: HostBatch, device: torch.device):
        self.batch = batch
        self.logprobs_mode = vllm_config.model_config.logprobs_mode
        state = LogitsProcRequestState(
            device=device,
            max_num_reqs=batch.max_num_reqs,
            vocab_size=batch.vocab_size,
            all_token_ids=batch.token_ids,
            prompt_len=torch.from_numpy(batch.num_prompt_tokens),
            prompt_len_np=batch.num_prompt_tokens,
            prefill_len=torch.from_numpy(batch.num_tokens_no_spec),
            prefill_len_np=batch.num_tokens_no_spec,
            total_len=torch.from_numpy(batch.num_tokens_no_spec),
        )
        self.penalties = CPUPenalties(vllm_config, state)
        self.bad_words = CPUBadWords(vllm_config, state)
        self.grammar = CPUStructuredOutputsWorker(
            batch.max_num_reqs, batch.vocab_size, device, mask_stride=1
        )
        self._bound: list[Any] | None = None  # the params list the processors hold
        self._uses_penalties = self._uses_bad_words = False

    def _bind(self, params: list[Any]) -> None:
        """Register each row's parameters with vLLM's processors (indexed by row) when
        the rows' parameters changed: once per layout, not per step."""
        if params is self._bound:
            return
        penalties = bad_words = False
        for row, p in enumerate(params):
            penalties |= self.penalties.add_request(row, p)
            bad_words |= self.bad_words.add_request(row, p)
        self._uses_penalties, self._uses_bad_words = penalties, bad_words
        self._bound = params

    def apply_grammar(self, grammar_output: GrammarOutput, logits: torch.Tensor) -> None:
        rows = _Rows(
            self.batch.req_ids[: logits.shape[0]],
            torch.arange(logits.shape[0] + 1, dtype=torch.int32),
        )
        self.grammar.apply_grammar_bitmask(
            logits,
            rows,  # type: ignore[arg-type]  # the two fields it reads
            grammar_output.structured_output_request_ids,
            grammar_output.grammar_bitmask,
        )

    def sample(
        self, logits: torch.Tensor, positions: np.ndarray, params: list[Any]
    ) -> tuple[list[list[int]], LogprobsTensors | None]:
        n = logits.shape[0]
        self._bind(params)
        raw = logits.to(torch.float32)
        processed = raw.clone()
        self._logit_bias(processed, params)
        if self._uses_penalties or self._uses_bad_words:
            index = torch.arange(n, dtype=torch.int64)
            ctx = LogitsContext(
                expanded_idx_mapping=index,
                idx_mapping=index,
                idx_mapping_np=index.numpy(),
                expanded_local_pos=torch.zeros(n, dtype=torch.int32),
                input_ids=torch.zeros(n, dtype=torch.int32),
                pos=torch.from_numpy(np.asarray(positions, dtype=np.int64)),
                seq_lens_upper_bound_np=self.batch.num_tokens_no_spec[:n].copy(),
            )
            if self._uses_penalties:
                processed = self.penalties.apply(processed, ctx)
            if self._uses_bad_words:
                processed = self.bad_words.apply(processed, ctx)
        temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
        greedy = temperature < _GREEDY_EPSILON
        tokens = processed.argmax(dim=-1)
        scaled = processed
        if not bool(greedy.all()):
            scaled = processed / torch.where(greedy, 1.0, temperature).unsqueeze(1)
            min_p = torch.tensor([p.min_p for p in params], dtype=torch.float32)
            if bool((min_p > 0).any()):
                floor = min_p.clamp_min(1e-30).log().unsqueeze(1)  # [n, 1], as the max
                threshold = scaled.amax(dim=1, keepdim=True) + floor
                keep = (min_p <= 0).unsqueeze(1) | (scaled >= threshold)
                scaled = scaled.masked_fill(~keep, float("-inf"))
            scaled = self._top_k_top_p(scaled, params)
            probs = scaled.softmax(dim=-1, dtype=torch.float32)
            q = torch.empty_like(probs)
            seeded = [i for i, p in enumerate(params) if p.seed is not None]
            if len(seeded) != n:
                q.exponential_()
            for i in seeded:
                seed = seed_for_position(int(params[i].seed), int(positions[i]))
                q[i].exponential_(generator=torch.Generator().manual_seed(seed))
            drawn = probs.div_(q).argmax(dim=-1)
            tokens = torch.where(greedy, tokens, drawn)
        logprobs = self.logprobs(raw, scaled, tokens, params)
        return tokens.reshape(n, 1).tolist(), logprobs

    def _logit_bias(self, logits: torch.Tensor, params: list[Any]) -> None:
        """Allowed token ids, logit bias and min_tokens, as 0.34.0's
        `apply_logit_bias_cpu` applies them: every other token masked out; the bias
        added; stop tokens masked while a request has fewer outputs than min_tokens."""
        batch = self.batch
        for row, p in enumerate(params):
            allowed = p.allowed_token_ids
            if allowed:
                keep = torch.zeros(logits.shape[1], dtype=torch.bool)
                keep[list(allowed)] = True
                logits[row].masked_fill_(~keep, float("-inf"))
            if p.logit_bias:
                ids = torch.tensor(list(p.logit_bias), dtype=torch.int64)
                logits[row, ids] += torch.tensor(list(p.logit_bias.values()), dtype=logits.dtype)
            if p.min_tokens:
                outputs = int(batch.num_tokens_no_spec[row]) - int(batch.num_prompt_tokens[row])
                stops = p.all_stop_token_ids
                if outputs < p.min_tokens and stops:
                    logits[row, list(stops)] = float("-inf")

    @staticmethod
    def _top_k_top_p(logits: torch.Tensor, params: list[Any]) -> torch.Tensor:
        vocab = logits.shape[1]
        top_k = [p.top_k if 0 < p.top_k < vocab else vocab for p in params]
        top_p = [p.top_p for p in params]
        k = torch.tensor(top_k, dtype=torch.int64) if any(v != vocab for v in top_k) else None
        p = torch.tensor(top_p, dtype=torch.float32) if any(v < 1.0 for v in top_p) else None
        return apply_top_k_top_p_pytorch(logits, k, p, allow_cpu_sync=True)

    def logprobs(
        self, raw: torch.Tensor, processed: torch.Tensor, tokens: torch.Tensor, params: list[Any]
    ) -> LogprobsTensors | None:
        """The sampled token's log-prob and rank, then the top `max(logprobs)` of the
        batch (vLLM computes them for every row; each request keeps what it asked)."""
        wanted = [p.logprobs for p in params if p is not None and p.logprobs is not None]
        if not wanted:
            return None
        count = max(wanted)
        mode = self.logprobs_mode
        source = processed if mode.startswith("processed") else raw
        scores = source if mode.endswith("logits") else source.log_softmax(dim=-1)
        if count == -1:
            return LogprobsTensors(torch.empty(0), scores, torch.empty(0))
        ids = tokens.reshape(-1, 1).long()
        own = scores.gather(-1, ids)
        ranks = (scores >= own).sum(dim=-1)
        if count > 0:
            top_values, top_ids = torch.topk(scores, count, dim=-1)
            ids = torch.cat((ids, top_ids), dim=1)
            own = torch.cat((own, top_values), dim=1)
        return LogprobsTensors(ids, own.float(), ranks)
