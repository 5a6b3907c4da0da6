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
