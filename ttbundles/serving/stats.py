"""Counters of what the serving path did (step kinds, sampling paths, in-flight depth).

Tests and benchmarks read them to see which path a batch took; the worker logs them at
shutdown. A plain process-local counter: the worker runs inside the engine-core process.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

logger = logging.getLogger("vllm.ttbundles")


class Stats:
    def __init__(self) -> None:
        self._counts: Counter[str] = Counter()
        self._lock = threading.Lock()

    def count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def record_max(self, name: str, value: int) -> None:
        with self._lock:
            self._counts[name] = max(self._counts[name], value)

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self._counts)


STATS = Stats()
