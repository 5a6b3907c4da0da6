"""A decode step (or a speculative verify) whose output is still being read back from
the device, and when the steps in flight must be read back before the next one."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.outputs import AsyncModelRunnerOutput, ModelRunnerOutput

from ttbundles.serving import compat
from ttbundles.serving.binding import split_output
from ttbundles.serving.runner.step import Layout, StepState

if TYPE_CHECKING:
    from vllm.v1.core.sched.output import SchedulerOutput


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


def is_steady(
    so: SchedulerOutput,
    previous: list[str] | None,
    previous_layout: Layout | None,
    speculating: bool,
    device_grammar: bool = False,
) -> bool:
    """The same decode batch as the last asynchronous step (`previous`, its rows; None:
    that step was not asynchronous): keep overlapping, nothing to drain. Structured output
    drains unless the device applies the grammar (`device_grammar`): the host sampler
    needs every token on the host, the device's bitmask only vLLM's grammar state."""
    if previous is None or so.scheduled_new_reqs:
        return False
    if so.has_structured_output_requests and not device_grammar:
        return False
    if speculating:
        return False  # a step's committed tokens are the next step's drafts' source
    if compat.resumed_req_ids(so):
        return False
    scheduled = so.num_scheduled_tokens
    # One token each (every scheduled request has at least one), the same requests.
    if len(scheduled) != len(previous) or so.total_num_scheduled_tokens != len(scheduled):
        return False
    assert previous_layout is not None
    previous_set = previous_layout.id_set
    return previous_set.isdisjoint(so.finished_req_ids) and scheduled.keys() >= previous_set


def drain_reason(so: SchedulerOutput, speculating: bool, device_grammar: bool = False) -> str:
    """Why the steps in flight are read back before this one (a `decode.drain.*` count)."""
    if speculating:
        return "speculative"
    if so.has_structured_output_requests and not device_grammar:
        return "structured_output"
    if so.scheduled_new_reqs or any(n > 1 for n in so.num_scheduled_tokens.values()):
        return "prefill"
    return "batch_change"


def synchronize(mesh_device: Any, event: Any) -> None:
    """Wait for a readback event: `ttnn.event_synchronize` on a card; the host mesh's
    events wait for themselves."""
    if getattr(mesh_device, "is_host", False):
        event.wait()
        return
    import ttnn  # only on machines with the TT-Metal stack

    ttnn.event_synchronize(event)
