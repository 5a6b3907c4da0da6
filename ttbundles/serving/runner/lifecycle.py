"""What a generator asks of the worker around its steps: the prefill trace warm-up at
start-up and the release of what it captured at shutdown.

TT-Metal's executor generators declare `requires_prefill_trace_warmup = True`: their
prefill traces must be captured before the first request (capturing one mid-serving
could allocate over a live trace). The reference plugin's `warmup_model` does it in two
passes, first compiling every program without traces, then capturing with every program
compiled; `already_warmed_up_prefill`, which the classes set after a warm-up, is reset
between the passes so that the second one runs. A class declaring the attribute without
`warmup_model_prefill` is refused at load (TTB053): serving it without the warm-up would
capture traces mid-serving, the very thing the attribute forbids.

Classes that hold traces and buffers past a request (the Kolibri autoport's persistent
capture) have `release_persistent_capture()`, called once at shutdown while the mesh is
still open (the worker never closes the mesh before it).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from ttbundles.format import contract_keys as keys
from ttbundles.format.contract import Method
from ttbundles.serving.binding import BoundMethod, bind

logger = logging.getLogger("vllm.ttbundles")

WARMUP_PREFILL = Method(
    keys.WARMUP_PREFILL,
    "method",
    keys.WARMUP_KEYWORDS,
    "None (the prefill programs compiled, or their traces captured)",
)


def needs_prefill_warmup(generator_cls: type) -> bool:
    """The class declares `requires_prefill_trace_warmup` (True)."""
    return getattr(generator_cls, keys.PREFILL_WARMUP_ATTRIBUTE, False) is True


@dataclass
class Lifecycle:
    """The bound start-up and shutdown calls of one loaded generator (None: not asked)."""

    generator: Any
    warmup: BoundMethod | None
    release: Any

    @classmethod
    def bind(cls, generator: Any, generator_cls: type, class_name: str) -> Lifecycle:
        """Bound at load: a class asking for the warm-up without the method is refused
        here (TTB053), before any request."""
        warmup = None
        if needs_prefill_warmup(generator_cls):
            warmup = bind(generator, WARMUP_PREFILL, keys.WARMUP_KEYWORDS, class_name=class_name)
        release = getattr(generator, keys.RELEASE_CAPTURE, None)
        return cls(generator, warmup, release if callable(release) else None)

    def warm_up(self, kv_cache: Any, *, trace: bool, sample_on_device: bool) -> int:
        """The prefill warm-up the class asked for: a compile pass, then (prefill traced)
        a capture pass. Returns the passes run (0: none asked)."""
        if self.warmup is None:
            return 0
        self.warmup(kv_cache=kv_cache, enable_trace=False, can_sample_on_device=sample_on_device)
        if not trace:
            return 1
        if hasattr(self.generator, keys.WARMED_UP_ATTRIBUTE):
            setattr(self.generator, keys.WARMED_UP_ATTRIBUTE, False)
        self.warmup(kv_cache=kv_cache, enable_trace=True, can_sample_on_device=sample_on_device)
        return 2

    def release_capture(self) -> bool:
        """`release_persistent_capture()`, once; what it raises is logged, not raised:
        the worker is shutting down either way."""
        if self.release is None:
            return False
        release, self.release = self.release, None  # never twice
        try:
            release()
        except Exception:  # noqa: BLE001 - the generator's own code, at shutdown
            logger.exception("ttbundles: release_persistent_capture failed at shutdown")
        return True
