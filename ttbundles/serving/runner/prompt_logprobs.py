"""Prompt logprobs, from the logits of every prompt position a bundle's prefill returns.

A bundle declaring `capabilities.prompt_logprobs` returns `[B, L, V]` logits from
`prefill_forward(..., return_prompt_logits=True)` (`contract.PROMPT_LOGITS_KEYWORD`):
column j of row b is the distribution after its token `start_pos[b] + j`. This module turns
them into what vLLM's prompt-logprobs processing takes: for each prompt position p but the
last, the log-probability of prompt token p + 1 with its rank and the request's top-k, as
one `LogprobsTensors` per prompt, handed over when the prompt's last chunk ran (vLLM's
engine takes no partial prefill output). Computed here with torch rather than vLLM's CPU
worker, whose kernels an empty vLLM build lacks (as for the host sampler on 0.34.0), and
alike on both releases: log-softmax of the raw logits in float32, vLLM's default
`raw_logprobs` mode; rank 1 is the most likely token, ties counted as vLLM counts them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.v1.outputs import LogprobsTensors

from ttbundles.format.contract import PROMPT_LOGITS_KEYWORD
from ttbundles.serving.binding import GeneratorContractError


@dataclass
class _Progress:
    """A prompt's scored positions so far: the chunks' tensors and where the next begins."""

    next_position: int = 0
    ids: list[torch.Tensor] = field(default_factory=list)
    values: list[torch.Tensor] = field(default_factory=list)
    ranks: list[torch.Tensor] = field(default_factory=list)


class PromptLogprobs:
    """The runner's prompt-logprobs state: prompts in progress, and those handed over (a
    request resumed after preemption recomputes its prompt without scoring it again)."""

    def __init__(self) -> None:
        self._progress: dict[str, _Progress] = {}
        self._done: set[str] = set()

    def rows(
        self, req_ids: list[str], requests: Mapping[str, Any], computed: list[int]
    ) -> list[int]:
        """The rows of a prefill step whose prompt is to be scored in this chunk."""
        out = []
        for row, req_id in enumerate(req_ids):
            state = requests[req_id]
            params = state.sampling_params
            if params is None or params.prompt_logprobs is None or req_id in self._done:
                continue
            if computed[row] >= len(state.prompt_token_ids):
                continue  # past its prompt (recomputing output after a preemption)
            progress = self._progress.get(req_id)
            if progress is None or progress.next_position != computed[row]:
                # First chunk, or a prompt recomputed from elsewhere (preempted mid-prompt):
                # vLLM skips prefix caching for such requests, so it starts at 0.
                self._progress[req_id] = _Progress(next_position=computed[row])
            out.append(row)
        return out

    def score(
        self,
        class_name: str,
        rows: list[int],
        every: torch.Tensor,
        computed: list[int],
        ends: list[int],
        req_ids: list[str],
        requests: Mapping[str, Any],
    ) -> dict[str, LogprobsTensors]:
        """Score `rows` of a prefill's `[B, L, V]` logits; the prompts completed now."""
        widest = max(ends[r] - computed[r] for r in rows)
        if every.shape[1] < widest:
            raise GeneratorContractError.single(
                "TTB241",
                f"{class_name}.prefill_forward({PROMPT_LOGITS_KEYWORD}=True) returned logits "
                f"{tuple(every.shape)}, not one per position of the chunk ({widest} for the "
                "longest)",
                hint="return [B, L, V] logits, column j the distribution after token "
                "start_pos + j, when the keyword is True (docs/authors/generator-contract.md)",
            )
        finished: dict[str, LogprobsTensors] = {}
        for row in rows:
            req_id = req_ids[row]
            state = requests[req_id]
            prompt_len = len(state.prompt_token_ids)
            progress = self._progress[req_id]
            start = computed[row]
            # Position p predicts prompt token p + 1; the last prompt position predicts
            # the first output token and is not a prompt logprob.
            stop = min(ends[row], prompt_len - 1)
            if stop > start:
                logprobs = torch.log_softmax(every[row, : stop - start].float(), dim=-1)
                targets = torch.as_tensor(state.prompt_token_ids[start + 1 : stop + 1])
                self._add(progress, logprobs, targets, state.sampling_params.prompt_logprobs)
            progress.next_position = ends[row]
            if ends[row] >= prompt_len:
                del self._progress[req_id]
                self._done.add(req_id)
                if progress.ids:
                    finished[req_id] = LogprobsTensors(
                        torch.cat(progress.ids),
                        torch.cat(progress.values),
                        torch.cat(progress.ranks),
                    )
        return finished

    @staticmethod
    def _add(progress: _Progress, logprobs: torch.Tensor, targets: torch.Tensor, k: int) -> None:
        """One chunk's rows: the prompt token first, then the top `k` (-1: every token)."""
        own = logprobs.gather(-1, targets.unsqueeze(-1))  # [n, 1]
        count = logprobs.shape[-1] if k < 0 else min(k, logprobs.shape[-1])
        ids = targets.unsqueeze(-1)
        values = own
        if count > 0:
            top_values, top_ids = torch.topk(logprobs, count, dim=-1)
            ids = torch.cat((ids, top_ids), dim=1)
            values = torch.cat((values, top_values), dim=1)
        progress.ids.append(ids.to(torch.int64))
        progress.values.append(values.to(torch.float32))
        progress.ranks.append((logprobs >= own).sum(-1).to(torch.int64))

    def forget(self, req_id: str) -> None:
        """A finished request: nothing of it is kept."""
        self._progress.pop(req_id, None)
        self._done.discard(req_id)
