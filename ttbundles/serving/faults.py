"""How the engine process reports a fault and stops: one line that names what failed.

vLLM reports a failure in the engine core with its whole dump (the engine's traceback,
then the API server's "Engine core initialization failed" traceback). For a failure that
is the bundle's or the configuration's, that buries the one useful fact, so:

- a ttbundles error while the engine starts (an adapter that fails at import, TTB060)
  is one ERROR line, then the engine exits with code 1 (`SystemExit`, which vLLM lets
  through without a dump); the API server, whose `sys.excepthook` knows (through the
  report file named by `REPORT_VARIABLE`) that the engine said why, ends with one line
  too. With debug logging (`VLLM_LOGGING_LEVEL=DEBUG` or `TT_BUNDLES_DEBUG=1`) the error
  propagates as before, tracebacks included;
- a generator exception inside a step gets one ERROR line naming the bundle, the
  generator method, the step kind and the batch size, before vLLM's own report (the
  engine then dies as vLLM decides, and the API server exits non-zero);
- the engine process stops itself when its parent dies (`watch_parent`), so a `kill -9`
  of the API server does not leave it running.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import sys
import tempfile
import threading
import time
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn

from ttbundles import envs
from ttbundles.errors import TTBundleError

if TYPE_CHECKING:
    from ttbundles.serving.planning.plan import Plan

logger = logging.getLogger("vllm.ttbundles")

# Names the file where the engine process leaves the line it reported on a startup
# failure; set by the API server (platform configuration) before the engine starts.
REPORT_VARIABLE = "TT_BUNDLES_ENGINE_REPORT"

# vLLM's message when an engine core process ended during startup.
ENGINE_START_FAILED = "Engine core initialization failed"

# vLLM's API server handler for a SIGTERM during startup (launchers/api_server/entry.py).
VLLM_STARTUP_HANDLER = "_interrupt_init"

# Methods of the generator contract that run a prefill; the others run in decode steps.
PREFILL_METHODS = frozenset({"prefill_forward"})


def debugging() -> bool:
    """Whether tracebacks are wanted (vLLM's debug logging, or ttbundles' own switch)."""
    level = (envs.VLLM_LOGGING_LEVEL or "").upper()
    return level == "DEBUG" or envs.TT_BUNDLES_DEBUG


def serving_process() -> bool:
    """Whether this process is `vllm serve` itself (the API server a supervisor runs),
    not another host of vLLM's configuration (`ttbundle plan`, tests, an in-process
    `vllm.LLM`), whose exit status and signals are not ours to change."""
    argv = sys.argv
    return len(argv) > 1 and argv[1] == "serve" and os.path.basename(argv[0]) in ("vllm", "main.py")


def report_path() -> str | None:
    """The report file for engines of this API server (set in the environment, which
    the engine process inherits); None outside `vllm serve` (`serving_process`)."""
    path = envs.read(REPORT_VARIABLE)
    if not path and not serving_process():
        return None
    if not path:
        path = os.path.join(tempfile.gettempdir(), f"ttbundles-engine-{os.getpid()}.report")
        # Named by our pid, so a file already there was left by a dead process that had
        # it before (pids wrap at pid_max, 32768 by default): read at our exit, it would
        # turn a clean stop into "the engine failed", status 1.
        for stale in (path, f"{path}.stop"):
            with contextlib.suppress(OSError):
                os.unlink(stale)
        os.environ[REPORT_VARIABLE] = path
        # Runs after the exit handlers vLLM registers from here on (while serving).
        atexit.register(_at_exit)
    return path


def startup_failed(error: TTBundleError, *, bundle: str | None = None) -> NoReturn:
    """End the engine process over a ttbundles error: one ERROR line, exit code 1.

    The line names the bundle as it names itself (`bundle`, name@version) and its
    modules as it wrote them (`adapter:Gen`), never the package they import under."""
    from ttbundles.format.loader import public_names

    line = public_names(" ".join(str(error).split("\n")))
    if bundle and not line.startswith(bundle):
        line = f"{bundle}: {line}"
    logger.error("ttbundles: the engine cannot start: %s", line)
    _leave_report(line)
    # Outside `vllm serve` (an in-process engine: `ttbundle test`, `vllm.LLM`) the caller
    # gets the error itself, to report or handle as it does.
    if debugging() or not envs.read(REPORT_VARIABLE):
        raise error
    raise SystemExit(1)


def load_failed(class_name: str, exc: BaseException) -> TTBundleError:
    """TTB063 for a generator that raised while loading (`initialize_vllm_model`): its
    exception in one line, instead of vLLM's three tracebacks."""
    from ttbundles.errors import Diagnostic, Severity

    method = "initialize_vllm_model"
    frame = generator_frame(exc.__traceback__)
    if frame is not None:
        class_name, method = frame
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return TTBundleError(
        Diagnostic(
            "TTB063",
            Severity.ERROR,
            f"{class_name}.{method} raised {type(exc).__name__}"
            + (f": {text}" if text else "")
            + " while loading the model",
            hint="fix the generator (ttbundle test runs it without a server); "
            "VLLM_LOGGING_LEVEL=DEBUG shows the traceback",
        )
    )


def engine_report(value: BaseException) -> str | None:
    """The engine's own line, when `value` is vLLM's startup failure after the engine
    reported a ttbundles error (read once; the file is removed)."""
    if not isinstance(value, RuntimeError) or not str(value).startswith(ENGINE_START_FAILED):
        return None
    path = envs.read(REPORT_VARIABLE)
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            line = handle.read().strip()
        os.unlink(path)
    except OSError:
        return None
    return line or None


def generator_frame(tb: TracebackType | None) -> tuple[str, str] | None:
    """(class, method) of the innermost generator call in a traceback: every call into
    the generator goes through a `binding.BoundMethod`, whose frame names both."""
    from ttbundles.serving.binding import BoundMethod

    found = None
    while tb is not None:
        bound = tb.tb_frame.f_locals.get("self")
        if isinstance(bound, BoundMethod) and tb.tb_frame.f_code.co_name == "__call__":
            # `owner` is module-qualified, under the bundle's synthetic package: the class.
            found = (str(bound.owner).rpartition(".")[2], bound.method.name)
        tb = tb.tb_next
    return found


def step_failed(error: BaseException, bundle: str, batch: int, phase: str | None) -> None:
    """The one line said before vLLM's report of a step that raised."""
    where = generator_frame(error.__traceback__)
    if where is not None:
        owner, method = where
        kind = "prefill" if method in PREFILL_METHODS else "decode"
        what = f"{owner}.{method}"
    else:
        kind, what = phase or "unknown", "the model runner"
    line = (
        f"{bundle}: {what} raised {type(error).__name__}: {error} in a {kind} step of "
        f"batch size {batch}; the engine stops"
    )
    logger.error("ttbundles: %s", line)
    _leave_report(line)


def _leave_report(line: str) -> None:
    path = envs.read(REPORT_VARIABLE)
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")


def _at_exit() -> None:
    """`vllm serve`'s exit: status 1 after an engine failure, else quiet after a
    requested stop (`shutdown.exit_after_requested_stop`), else as vLLM exits."""
    exit_nonzero_after_engine_failure()
    from ttbundles.serving.api_server import shutdown

    note = take_stop_note()
    if note:
        shutdown.note_stop(note)
    shutdown.exit_after_requested_stop("vllm serve --headless" if headless() else "vllm serve")


def headless() -> bool:
    """Whether this process is `vllm serve --headless` (a host without the API server)."""
    return serving_process() and "--headless" in sys.argv


def _stop_note_path() -> str | None:
    path = envs.read(REPORT_VARIABLE)
    return f"{path}.stop" if path else None


def leave_stop_note(reason: str) -> None:
    """From an engine asked to stop by something other than a signal to its host (the
    head gone): `reason` for the host's `vllm serve` to end with ("as the head ... is
    gone"). Nothing outside `vllm serve`."""
    path = _stop_note_path()
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
            handle.write(reason + "\n")


def take_stop_note() -> str | None:
    """The reason an engine left (`leave_stop_note`), read once; None without one."""
    path = _stop_note_path()
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            reason = handle.read().strip()
        os.unlink(path)
    except OSError:
        return None
    return reason or None


def exit_nonzero_after_engine_failure() -> None:
    """At the API server's exit (`_at_exit`): if its engine reported a fault
    and vLLM is ending with status 0 (it shuts down gracefully when the engine dies),
    exit 1 instead, so that a supervisor restarts the server."""
    path = envs.read(REPORT_VARIABLE)
    if not path or not os.path.exists(path):
        return
    try:
        with open(path, encoding="utf-8") as handle:
            line = handle.read().strip()
        os.unlink(path)
    except OSError:
        line = ""
    sys.stderr.write(f"ttbundles: the engine failed: {line}; exiting with status 1\n")
    sys.stderr.flush()
    os._exit(1)


# --- the engine process and its parent ----------------------------------------------------


def watch_parent(poll: float = 0.5) -> None:
    """Have this process stop (SIGTERM to itself) when its parent, the API server, dies.

    A daemon thread polls `getppid()`: the parent's death re-parents this process. Not
    `prctl(PR_SET_PDEATHSIG)`: Linux sends that when the parent *thread* that started
    this process ends, which need not be the API server ending. vLLM's engine core
    handles SIGTERM as a shutdown request.
    """
    parent = os.getppid()
    thread = threading.Thread(
        target=_poll_parent, args=(parent, poll), daemon=True, name="ttbundles-parent-watch"
    )
    thread.start()


def stop_while_starting() -> Any:
    """Make SIGTERM stop the engine process while it is still starting; a function that
    puts vLLM's own handling back (call it once the engine has started).

    vLLM's engine core only records a SIGTERM that arrives during its construction and
    acts on it once construction is over: opening the mesh, loading weights and warming
    up can take many minutes on a device, and the API server waits for them. Here the
    signal is passed to vLLM's handler, then ends the process (`SystemExit`, which vLLM
    lets through without a dump). Only from the main thread (where handlers live).
    """
    if threading.current_thread() is not threading.main_thread():
        return None
    previous = signal.getsignal(signal.SIGTERM)

    def handler(signum: int, frame: Any) -> None:
        if callable(previous):
            previous(signum, frame)
        logger.warning("ttbundles: SIGTERM while the engine is starting; stopping it now")
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, handler)

    def restore() -> None:
        if signal.getsignal(signal.SIGTERM) is handler:
            signal.signal(signal.SIGTERM, previous)

    return restore


def watch_stop_signals(grace: float = 3.0) -> bool:
    """Watch for SIGINT and SIGTERM in a serving process (`vllm serve`, headless or not):
    each records a requested stop (`shutdown.note_stop`, which makes the stop quiet), and
    a SIGTERM makes the API server stop while its engine is still starting.

    The signals reach the interpreter's wakeup file descriptor, so a thread here reads
    it (and passes every byte on to the descriptor it replaced, the event loop's): it
    sees a signal before vLLM's handler acts on it, whatever that handler is.

    vLLM 0.33's API server waits for its engine's ready message in one blocking ZMQ
    poll of up to `VLLM_ENGINE_READY_TIMEOUT_S` (600 s), during which its Python SIGTERM
    handler cannot run: a stop request waits for the model to load. On a SIGTERM
    while vLLM's startup handler is still the one installed, the thread waits `grace`
    seconds for vLLM to act; if vLLM has not, it sends SIGTERM to the engine processes
    (which stop at once, `stop_while_starting`), waits for them, and ends the API server
    with status 143. Once vLLM's server has started, its own handler is installed and
    the thread only records and passes bytes on. Main thread only; False where it was
    not installed.
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    starting = signal.getsignal(signal.SIGTERM)
    if getattr(starting, "__name__", None) != VLLM_STARTUP_HANDLER:
        starting = None  # not the API server while it starts (a headless host)
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        previous = signal.set_wakeup_fd(write_end)
    except (ValueError, OSError):
        os.close(read_end)
        os.close(write_end)
        return False
    thread = threading.Thread(
        target=_forward_wakeups,
        args=(read_end, previous, starting, grace),
        daemon=True,
        name="ttbundles-stop-signals",
    )
    thread.start()

    def forget_in_child() -> None:
        # A forked engine inherits the descriptor, not the thread: its signals would
        # read as this process's. It gets back the one it would have had.
        with contextlib.suppress(ValueError, OSError):
            replaced = signal.set_wakeup_fd(previous)
            if replaced != write_end:  # not ours any more: leave it be
                signal.set_wakeup_fd(replaced)

    os.register_at_fork(after_in_child=forget_in_child)
    return True


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def _forward_wakeups(read_end: int, previous: int, starting: Any, grace: float) -> None:
    from ttbundles.serving.api_server import shutdown

    while True:
        try:
            data = os.read(read_end, 512)
        except OSError:
            return
        if not data:
            return
        for number in STOP_SIGNALS:
            if number in data:
                shutdown.note_stop(f"by {signal.Signals(number).name}")
        if previous >= 0:
            with contextlib.suppress(OSError):
                os.write(previous, data)
        if (
            starting is not None
            and signal.SIGTERM in data
            and signal.getsignal(signal.SIGTERM) is starting
        ):
            time.sleep(grace)
            if signal.getsignal(signal.SIGTERM) is starting:
                _stop_starting_server()


def _stop_starting_server() -> None:
    import multiprocessing

    children = multiprocessing.active_children()
    logger.warning(
        "ttbundles: SIGTERM while the engine is starting (vLLM waits for it in a blocking "
        "call); stopping %d engine process(es) and the API server",
        len(children),
    )
    for child in children:
        with contextlib.suppress(OSError):
            child.terminate()
    deadline = time.monotonic() + 10
    for child in children:
        child.join(max(0.0, deadline - time.monotonic()))
        if child.is_alive():
            with contextlib.suppress(OSError):
                child.kill()
    sys.stderr.write("ttbundles: vllm serve stopped by SIGTERM while starting\n")
    sys.stderr.flush()
    os._exit(128 + signal.SIGTERM)


def _poll_parent(parent: int, poll: float) -> None:
    while os.getppid() == parent and parent != 1:
        time.sleep(poll)
    logger.warning("ttbundles: the API server (pid %d) is gone; stopping the engine", parent)
    os.kill(os.getpid(), signal.SIGTERM)


def bundle_label(plan: Plan) -> str:
    return plan.bundle.label
