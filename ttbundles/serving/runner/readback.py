"""A decode step (or a speculative verify) whose output is still being read back from
the device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

from ttbundles.serving.binding import split_output
from ttbundles.serving.runner.step import StepState


class TTAsyncOutput(AsyncModelRunnerOutput):
    """A decode step whose sampled tokens are still being read back from the device.

    vLLM keeps up to two steps in flight and calls `get_output` when it needs this one,
    so the host schedules step N+1 while step N is read back. The runner can also resolve
    it early (a drain) when the next step needs the tokens on the host.
    """

    def __init__(
        self,
        step: StepState,
        *,
        synchronize: Callable[[Any], None],
        process_output: Callable[..., Any],
        finish: Callable[[StepState, torch.Tensor], ModelRunnerOutput],
        resolved: Callable[[TTAsyncOutput], None],
        is_tokens: bool = True,
    ):
        """`synchronize(event)` waits for a readback event, `process_output` turns the
        device output into tokens (`is_tokens`; a speculative verify's block can be
        logits), `finish(step, tokens)` makes the step's output, `resolved(self)` tells
        the runner this step is no longer in flight."""
        self._is_tokens = is_tokens
        self._step = step
        self._synchronize = synchronize
        self._process_output = process_output
        self._finish = finish
        self._resolved = resolved
        self._output: ModelRunnerOutput | None = None

    @property
    def resolved(self) -> bool:
        return self._output is not None

    def get_output(self) -> ModelRunnerOutput:
        if self._output is None:
            host_out, events = self._step.readback  # type: ignore[misc]
            for event in events:
                self._synchronize(event)
            tokens, logprobs = split_output(
                self._process_output(host_out=host_out, is_tokens=self._is_tokens)
            )
            self._step.logprobs = logprobs
            self._output = self._finish(self._step, tokens)
            self._resolved(self)
        return self._output

    def get_kv_connector_output(self) -> None:
        return None
