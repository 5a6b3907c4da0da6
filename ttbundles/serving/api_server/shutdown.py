"""The API server's requests in flight end when its engine client shuts down.

vLLM 0.33 can leave a request in flight open forever when `vllm serve` stops (SIGTERM,
Ctrl-C), so the client hangs until its own timeout and the API server does not exit:

- `launchers/launcher.py` `serve_http` runs `AsyncLLM.shutdown` first. With the default
  `--shutdown-timeout 0`, `v1/utils.py` `shutdown` force-kills the engine core right
  after its SIGTERM (a zero grace), so the engine's abort of the requests in flight
  (`v1/engine/core.py` `_handle_shutdown`) seldom reaches the API server;
- `core_client.py` `BackgroundResources.__call__` then schedules the cancellation of the
  output-socket task, whose handler would queue `EngineDeadError` for the output handler,
  and `async_llm.py` `AsyncLLM.shutdown` at once schedules the cancellation of that output
  handler. The handler only calls `output_processor.propagate_error` on an `Exception`;
  cancelled first (most of the time), it never does, and every `generate()` waits on its
  request queue for good;
- uvicorn's graceful shutdown then waits for those connections without a bound
  (`timeout_graceful_shutdown` is not set), so the process stays alive.

After vLLM's own shutdown, `end_open_requests_on_shutdown` hands the requests still open
the error vLLM would have given them had its handler not been cancelled
(`EngineDeadError`): a stream ends with an error event, a plain call with an error status,
and the server exits. By then the engine is marked dead, so a request that arrives later
is refused by vLLM itself.

A requested stop is quiet (`note_stop`, then `exit_after_requested_stop`): a stop is
requested when a serving process gets SIGINT or SIGTERM (`faults` watches the
interpreter's signal wakeup descriptor) or, on a headless host, when the head is gone
(`host_watch`). Then:

- the API server drops the records vLLM's own shutdown causes: it cancels the task
  that reads the engine's outputs, whose handler hands the output handler an
  `EngineDeadError`, which it logs as a failure with its traceback ("See stack trace
  (above) for the root cause", when there is none), and so does every stream then in
  flight (each one's client still gets its error event). Only `EngineDeadError`, only at
  those places (`compat.engine_dead_reports`); without a requested stop (the engine
  killed, a generator raising) they stay;
- the engine's own teardown (`EngineCore.shutdown` -> `cleanup_dist_env_and_memory`)
  empties `torch.accelerator`'s cache on any platform but CPU, which raises when torch has
  no accelerator (the TT platform's torch is the CPU build): that one error is let pass
  after vLLM's cleanup has done the rest (`tolerate_no_accelerator_at_cleanup`);
- at exit, with nothing failed, the process writes one line saying why it stopped and
  ends without the interpreter's teardown (`os._exit`): there, triton's native module
  (nanobind) prints ~30 lines of "leaked instances/types/functions", harmless at exit
  and beyond our reach (triton's bindings keep nanobind's `set_leak_warnings` private).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from typing import Any

logger = logging.getLogger("vllm.ttbundles")

_MARK = "_ttbundles_ends_open_requests"
_ENDED = "_ttbundles_ended_open_requests"


def end_open_requests_on_shutdown() -> bool:
    """Wrap `AsyncLLM.shutdown` (once per process) so that the requests it leaves open
    get `EngineDeadError`. False if it was already wrapped."""
    from ttbundles.serving import compat

    AsyncLLM = compat.async_llm_class()
    original = AsyncLLM.shutdown
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def shutdown(self: Any, *args: Any, **kwargs: Any) -> None:
        try:
            original(self, *args, **kwargs)
        finally:
            end_open_requests(self)

    setattr(shutdown, _MARK, True)
    AsyncLLM.shutdown = shutdown  # type: ignore[method-assign]
    return True


def end_open_requests(llm: Any) -> None:
    """Give every request `llm` (an `AsyncLLM`) still tracks `EngineDeadError`, on its
    event loop (after the cancellations vLLM's shutdown scheduled there)."""
    handler = getattr(llm, "output_handler", None)
    processor = getattr(llm, "output_processor", None)
    if handler is None or processor is None:
        return  # never served a request: nothing can be open
    loop = handler.get_loop()
    if loop.is_closed():
        return

    def end() -> None:
        from vllm.v1.engine.exceptions import EngineDeadError

        # vLLM keeps a dead engine's requests in its tables: once is enough (it shuts
        # down twice, from the signal handler and as its engine context exits).
        if getattr(llm, _ENDED, False):
            return
        setattr(llm, _ENDED, True)
        if handler.done() and not handler.cancelled():
            return  # the handler ended on the engine's death and errored them itself
        count = processor.get_num_unfinished_requests()
        if count:
            logger.info(
                "ttbundles: the engine stopped with %d request(s) still open; ending them "
                "with an error (vLLM 0.33 would leave them open)",
                count,
            )
            processor.propagate_error(EngineDeadError())

    try:
        running = asyncio.get_running_loop()
    except RuntimeError:
        running = None
    if running is loop:
        end()
    else:
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(end)


# --- a requested stop is quiet --------------------------------------------------------

_stop: dict[str, Any] = {}

# What `torch.accelerator` raises where torch has no accelerator (torch 2.13's message).
NO_ACCELERATOR = "Cannot access accelerator device when none is available"


def note_stop(reason: str) -> None:
    """Record that this process was asked to stop, and why ("by SIGTERM"); the first
    reason stands."""
    _stop.setdefault("reason", reason)


def requested_stop() -> str | None:
    """Why this process was asked to stop, or None when it was not."""
    return _stop.get("reason")


class _ShutdownEcho(logging.Filter):
    """Drops vLLM's report of an `EngineDeadError` (`messages`) after a requested stop."""

    def __init__(self, messages: frozenset[str]) -> None:
        super().__init__()
        self.messages = messages

    def filter(self, record: logging.LogRecord) -> bool:
        if requested_stop() is None or record.msg not in self.messages or not record.exc_info:
            return True
        from vllm.v1.engine.exceptions import EngineDeadError

        return not isinstance(record.exc_info[1], EngineDeadError)


def drop_shutdown_echo() -> bool:
    """Filter (once per process) vLLM's reports of the `EngineDeadError` a requested stop
    causes: in the output handler and in every stream then in flight. False if already
    installed."""
    from ttbundles.serving import compat

    installed = False
    for name, messages in compat.engine_dead_reports().items():
        target = logging.getLogger(name)
        if not any(isinstance(f, _ShutdownEcho) for f in target.filters):
            target.addFilter(_ShutdownEcho(messages))
            installed = True
    return installed


def tolerate_no_accelerator_at_cleanup() -> bool:
    """Wrap the engine's `cleanup_dist_env_and_memory` (once per process) so that its
    last step, emptying the cache of an accelerator torch does not have, does not fail
    the engine's shutdown; any other error, or that one where torch has an
    accelerator, propagates. False if already wrapped."""
    from ttbundles.serving import compat

    core = compat.engine_core_module()
    original = core.cleanup_dist_env_and_memory
    if getattr(original, _MARK, False):
        return False

    @functools.wraps(original)
    def cleanup(*args: Any, **kwargs: Any) -> Any:
        try:
            return original(*args, **kwargs)
        except RuntimeError as error:
            import torch

            if NO_ACCELERATOR not in str(error) or torch.accelerator.is_available():
                raise
            logger.debug("ttbundles: no accelerator cache to empty at the engine's shutdown")
            return None

    setattr(cleanup, _MARK, True)
    core.cleanup_dist_env_and_memory = cleanup
    return True


def exit_after_requested_stop(what: str = "vllm serve") -> None:
    """At exit (the last exit handler that matters): after a requested stop, when no
    exception went uncaught, say so in one line and end the process with status 0
    without the interpreter's teardown. Otherwise nothing (the process exits as it
    would).

    It runs after the exit handlers registered once `vllm serve` was configured (vLLM's
    own, while serving); those registered before it are skipped, measured on 0.34.0:
    logging's (run here first), multiprocessing's (the engines are gone by then), and
    caches' and sessions' cleanups that the process ending makes moot."""
    import os
    import sys

    reason = requested_stop()
    if reason is None or getattr(sys, "last_value", None) is not None:
        return
    logging.shutdown()  # flush every handler: nothing runs after os._exit
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    with contextlib.suppress(Exception):
        sys.stderr.write(f"ttbundles: {what} stopped {reason}; exiting with status 0\n")
        sys.stderr.flush()
    os._exit(0)
