"""Asynchronous readback: results still "on the device", their host copies, and the
events that say when a copy is complete.

The reference's "device" is one worker thread (the generator's device queue): a decode
submitted there runs while the host schedules the next step, as on a card.
"""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any


class DeviceOutput:
    """A decode result "still on the device": what `decode_forward(read_from_device=False)`
    returns. Opaque to the worker, which hands it back to `read_decode_output`."""

    def __init__(self, future: Future, is_tokens: bool):
        self._future = future
        self.is_tokens = is_tokens

    def result(self) -> tuple[Any, Any]:
        """`(tokens_or_logits, log_probs)`, once the queued work is done."""
        return self._future.result()


class HostOutput:
    """The host copy of a DeviceOutput; `value` is None until the copy has run."""

    def __init__(self) -> None:
        self.value: tuple[Any, Any] | None = None

    def fill(self, out: DeviceOutput) -> None:
        primary, logprobs = out.result()
        if isinstance(logprobs, tuple):
            logprobs = tuple(t.clone() for t in logprobs)
        self.value = (primary.clone(), logprobs)

    @classmethod
    def copy_of(cls, out: DeviceOutput) -> HostOutput:
        host = cls()
        host.fill(out)
        return host


class ReadEvent:
    """Completion of one readback; `wait()` blocks until the host copy is filled."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self) -> None:
        self._future.result()

    def done(self) -> bool:
        return self._future.done()
