"""A step's tokens made vLLM's `ModelRunnerOutput` and committed: the device's sampled
tokens, vLLM's sampler on the host over the step's logits, or a verify's accepted drafts.

The runner decides which (and keeps asynchronous readbacks in flight); this is what each
one then does, as vLLM's own runner keeps its sampler and output assembly apart
(`vllm/v1/worker/gpu/sample/`): the rows' tokens appended to the request states, the log
probabilities, and speculation told what each row committed.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from vllm.v1.outputs import LogprobsTensors, ModelRunnerOutput

from ttbundles.serving import compat
from ttbundles.serving.runner.sample import device_logprobs
from ttbundles.serving.runner.step import StepState

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import GrammarOutput

    from ttbundles.serving.runner.speculation import Speculation
    from ttbundles.serving.runner.states import RequestStates


class StepOutputs:
    """What turns a step's tokens into vLLM's output, for one runner."""

    def __init__(
        self,
        states: RequestStates,
        *,
        capacity: int,
        class_name: str,
        processed_logprobs: bool,
        speculation: Speculation | None,
        after_commit: Callable[[StepState, list[list[int]]], None],
    ):
        self.states = states
        self.capacity = capacity
        self.class_name = class_name
        self.processed_logprobs = processed_logprobs
        self.speculation = speculation
        self.after_commit = after_commit

    def from_device(self, step: StepState, tokens: torch.Tensor) -> ModelRunnerOutput:
        """A step whose tokens the device sampled: whole-tensor conversions and the
        layout's cached index, no per-row Python beyond the output lists vLLM takes."""
        if tokens.dim() == 2 and tokens.shape[1] > 1:
            return self.from_block(step, tokens)
        n = len(step.req_ids)
        flat = tokens.reshape(-1)
        if step.rows is not None and step.readback:
            # An asynchronous decode read back by slot (every slot, or the first ones a
            # class returns for its active rows): each row's slot, in row order.
            flat = flat[:n] if step.layout.in_order and step.order is None else flat[step.rows]
        flat = flat[:n].long()
        values = flat.tolist()
        sampled = flat.reshape(n, 1).tolist()
        discarded = np.flatnonzero(step.discard)
        for i in discarded:
            sampled[int(i)] = []
        if len(discarded) or not self.states.append_rows(step, values, flat.numpy()):
            self.states.append_sampled(step.req_ids, sampled)
        logprobs = device_logprobs(step, values, self.states.requests, self.class_name)
        self.after_commit(step, sampled)
        return _output(step, sampled, logprobs)

    def from_block(self, step: StepState, tokens: torch.Tensor) -> ModelRunnerOutput:
        """A block-output decode: `tokens` `[rows, k]`, each row's k tokens one step's
        output, as vLLM's speculative path returns several. vLLM's scheduler appends them
        one by one and cuts at the first stop (EOS, a stop token, max_tokens, the length
        limit; stop strings in the detokenizer), so the request ends exactly where a
        one-token decoder would; the scheduler counts the block's KV as computed
        (`serving.scheduler.BlockOutputMixin`). Log-probs: a row per token, request by
        request, sliced by vLLM the same way."""
        block = tokens[: len(step.req_ids)].long()
        sampled = block.tolist()
        self.states.append_sampled(step.req_ids, sampled)
        logprobs = None
        if step.layout.any_logprobs:
            logprobs = compat.verify_logprobs(
                self._block_logprobs(step, block), [block.shape[1]] * len(sampled)
            )
        self.after_commit(step, sampled)
        return compat.model_runner_output(list(step.req_ids), step.layout.index, sampled, logprobs)

    def _block_logprobs(self, step: StepState, block: torch.Tensor) -> LogprobsTensors | None:
        """The device's top log-probs of each block position (`[rows, k, K]` each of
        values and ids) as vLLM's rows: token j of request i at row `i * k + j`."""
        raw = step.logprobs
        if not isinstance(raw, tuple):
            return device_logprobs(step, [], self.states.requests, self.class_name)
        values, ids = (torch.as_tensor(t) for t in raw)
        parts = [
            device_logprobs(
                dataclasses.replace(step, logprobs=(values[:, j], ids[:, j]), readback=None),
                block[:, j].tolist(),
                self.states.requests,
                self.class_name,
            )
            for j in range(block.shape[1])
        ]
        assert all(p is not None for p in parts)
        n, k = block.shape

        def rows(field: str) -> torch.Tensor:
            stacked = torch.stack([getattr(p, field) for p in parts], dim=1)
            return stacked.reshape(n * k, *stacked.shape[2:])

        return LogprobsTensors(
            rows("logprob_token_ids"), rows("logprobs"), rows("selected_token_ranks")
        )

    def from_verify(self, step: StepState) -> ModelRunnerOutput:
        """A verify's drafts accepted on the host, against its ids or logits."""
        assert self.speculation is not None
        committed, logprobs = self.speculation.commit_verify(
            step,
            self.states.batch,
            self.class_name,
            processed_logprobs=self.processed_logprobs,
        )
        self.states.append_sampled(step.req_ids, committed)
        self.after_commit(step, committed)
        return compat.model_runner_output(
            list(step.req_ids), step.layout.index, committed, logprobs
        )

    def from_host(self, step: StepState, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        """vLLM's sampler (the host batch's) over the step's logits."""
        batch = self.states.batch
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
        self.states.append_sampled(step.req_ids, sampled)
        self.after_commit(step, sampled)
        return _output(step, sampled, logprobs, step.prompt_logprobs)


def _output(
    step: StepState, sampled: list[list[int]], logprobs: Any, prompt_logprobs: Any = None
) -> ModelRunnerOutput:
    """vLLM's output of the step's rows, in the layout's order (its cached index)."""
    return compat.model_runner_output(
        list(step.req_ids),
        step.layout.index,
        sampled,
        logprobs.tolists() if logprobs is not None else None,
        prompt_logprobs,
    )
