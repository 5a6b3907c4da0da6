"""Asynchronous readback: results still "on the device" and the events that say when a
host copy is complete.
"""

from __future__ import annotations

from concurrent.futures import Future

import torch


class DeviceOutput:
    """A decode result "still on the device": what `decode_forward(read_from_device=False)`
    returns. Opaque to the worker, which hands it back to `read_decode_output`. The work
    behind it runs on the generator's device queue; `tensor` waits for it."""

    def __init__(self, future: Future, is_tokens: bool, shape: tuple[int, ...]):
        self._future = future
        self.is_tokens = is_tokens
        self.shape = shape  # known at submission, so the host buffer can be allocated
        self.dtype = torch.int64 if is_tokens else torch.float32

    @property
    def tensor(self) -> torch.Tensor:
        """logits [B, 1, V] or tokens [B], once the queued work is done."""
        return self._future.result()


class ReadEvent:
    """Completion of one readback; `wait()` blocks until the host copy is filled."""

    def __init__(self, future: Future):
        self._future = future

    def wait(self) -> None:
        self._future.result()

    def done(self) -> bool:
        return self._future.done()
