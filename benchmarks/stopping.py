"""What a benchmark that starts servers does on SIGTERM (`timeout`, a CI job's cancel).

Python's default for SIGTERM ends the process at once, skipping `finally` blocks, so a
`vllm serve` a benchmark started would be left running. Raising SystemExit instead
unwinds like Ctrl-C: each benchmark's `finally` stops what it started.
"""

from __future__ import annotations

import signal
import sys


def unwind_on_sigterm() -> None:
    """Make SIGTERM unwind the main thread (exit status 143, as the shell reports it)."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
