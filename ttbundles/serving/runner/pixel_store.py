"""The last processed pixels of each image the runner saw, by vLLM's multimodal hash.

Why: vLLM 0.33 drops an image's `pixel_values` from a request admitted on a prefix-cache
hit that covers the image (`strip_covered_mm_data`: nothing should need them). If that
request is later preempted and its cached blocks are evicted, it prefills again from the
start, and now the generator does need them; vLLM does not send them again. A prefix
hit on an image exists only because an earlier request with the same image (same hash)
went through this runner, so keeping recent pixels here covers that case. Bounded by
bytes, least recently used first out; an image no longer here fails that prefill with
the generator's own message.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

DEFAULT_BUDGET_BYTES = 256 * 1024 * 1024


class PixelStore:
    """`identifier -> pixel_values`, least recently used evicted past `budget_bytes`."""

    def __init__(self, budget_bytes: int = DEFAULT_BUDGET_BYTES) -> None:
        self.budget_bytes = budget_bytes
        self._items: OrderedDict[str, Any] = OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._items)

    @property
    def size_bytes(self) -> int:
        return self._bytes

    def put(self, key: str, pixels: Any) -> None:
        size = _nbytes(pixels)
        if size > self.budget_bytes:
            return
        old = self._items.pop(key, None)
        if old is not None:
            self._bytes -= _nbytes(old)
        self._items[key] = pixels
        self._bytes += size
        while self._bytes > self.budget_bytes:
            _, evicted = self._items.popitem(last=False)
            self._bytes -= _nbytes(evicted)

    def get(self, key: str) -> Any | None:
        pixels = self._items.get(key)
        if pixels is not None:
            self._items.move_to_end(key)
        return pixels


def _nbytes(tensor: Any) -> int:
    return int(tensor.numel() * tensor.element_size())
