"""The host batch on vLLM's Model Runner V1 parts, for releases that still ship them
(0.33.0; removed in 0.34.0): `InputBatch` keeps the request rows, vLLM's `Sampler`
samples the host path bit for bit, `apply_grammar_bitmask` constrains structured output.

Imported only through `ttbundles.serving.compat`, which picks it where those parts exist.
Checked on vLLM 0.33.0.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors
from vllm.v1.sample.logits_processor import build_logitsprocs
from vllm.v1.sample.sampler import Sampler
from vllm.v1.worker.gpu_input_batch import CachedRequestState, InputBatch

from ttbundles.format.contract import seed_for_position

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput

RequestState = CachedRequestState


class V1HostBatch(InputBatch):
    """vLLM's V1 `InputBatch` with the two operations the runner asks of a host batch on
    every release (`sample`, `apply_grammar`)."""

    def __init__(self, vllm_config: VllmConfig, device: torch.device) -> None:
        model, sched = vllm_config.model_config, vllm_config.scheduler_config
        block_size = vllm_config.cache_config.block_size
        custom = model.logits_processors or ()
        super().__init__(
            max_num_reqs=sched.max_num_seqs,
            max_model_len=model.max_model_len,
            max_num_batched_tokens=sched.max_num_batched_tokens,
            device=device,
            vocab_size=model.get_vocab_size(),
            block_sizes=[block_size],
            max_num_blocks_per_req=[-(-model.max_model_len // block_size)],
            logitsprocs=build_logitsprocs(vllm_config, device, False, False, custom),
            logitsprocs_need_output_token_ids=bool(custom),
        )
        self._sampler = Sampler(logprobs_mode=model.logprobs_mode)

    def sample(
        self, logits: torch.Tensor, positions: np.ndarray, params: list[Any]
    ) -> tuple[list[list[int]], LogprobsTensors | None]:
        """One token per row (vLLM's `Sampler` over the batch's sampling metadata), and
        the log-probs when a row asked. A seeded row draws position p's token from a
        generator seeded for (seed, p) (`seed_for_position`), as the reference's device
        sampler does: the same tokens whatever the batch or which path sampled before."""
        for index, generator in self.generators.items():
            seed = params[index].seed
            generator.manual_seed(seed_for_position(int(seed), int(positions[index])))
        out = self._sampler(logits=logits, sampling_metadata=self.sampling_metadata)
        return out.sampled_token_ids.tolist(), out.logprobs_tensors

    def logprobs(
        self,
        raw: torch.Tensor,
        tokens: torch.Tensor,
        params: list[Any],
        *,
        processed: torch.Tensor | None = None,
    ) -> LogprobsTensors | None:
        """vLLM's `Sampler` logprobs of `tokens` (one per row of `raw` `[N, V]` float32,
        `params` each row's request), as its `forward` reports them: per
        `--logprobs-mode` from the raw logits or, in a `processed_*` mode, from
        `processed` (as sampled); the top `max(logprobs)` of every row when one asks
        (each request keeps what it asked). For rows the sampler did not score itself
        (a verify's committed tokens)."""
        wanted = [p.logprobs for p in params if p is not None and p.logprobs is not None]
        if not wanted:
            return None
        mode = self._sampler.logprobs_mode
        source = processed if processed is not None and mode.startswith("processed") else raw
        scores = source.float() if mode.endswith("logits") else Sampler.compute_logprobs(source)
        count = max(wanted)
        if count == -1:
            return LogprobsTensors(torch.empty(0), scores, torch.empty(0))
        return Sampler.gather_logprobs(scores, count, tokens.long())

    def apply_grammar(
        self, scheduler_output: SchedulerOutput, grammar_output: GrammarOutput, logits: torch.Tensor
    ) -> None:
        from vllm.v1.structured_output.utils import apply_grammar_bitmask

        apply_grammar_bitmask(scheduler_output, grammar_output, self, logits)
