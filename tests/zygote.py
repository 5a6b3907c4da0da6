"""`vllm serve` for the server tier, forked from a process that imported vLLM once.

Each `vllm serve` spends about 9 s of CPU importing vLLM's API server before it reads its
arguments (17 s from start to ready for the demo model, 12 s of them importing), and the
server tier starts dozens. `start_server` here has the library's signature and hands the
server to the session's zygote (`tests/serve_zygote.py`), which forks it already
imported: the same `main()` as the `vllm` script, in its own session, with its own
arguments, environment, working directory and log.

Only servers on the platform the zygote resolved (the host mesh, no VLLM_PLUGINS filter)
are forked; any other goes through `ttbundles.demo.server.start_server`, a real process.
Tests of the process itself (signals, exit status, start-up failures, the `vllm` and
`ttbundle` commands) call the library directly and never come here.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ttbundles.demo import server as library
from ttbundles.demo.server import ServerProcess

ZYGOTE_SCRIPT = Path(__file__).with_name("serve_zygote.py")
READY_TIMEOUT = 300.0
# What vLLM reads while it is imported (the platform it resolves, the plugins it loads
# for that): a server whose environment differs from the zygote's there is started as a
# real process. The zygote imports on the host mesh.
# PYTHONPATH too: a child keeps the zygote's sys.path (a class importable only from a
# folder of its own, a TT-Metal checkout, needs a process of its own).
IMPORT_TIME_ENV = (
    "MESH_DEVICE", "VLLM_PLUGINS", "VLLM_TARGET_DEVICE", "VLLM_USE_V1", "PYTHONPATH",
)  # fmt: skip
MESH = "HOST"
# TTBUNDLES_NO_ZYGOTE=1: every server a real process, as before the zygote.
DISABLED = os.environ.get("TTBUNDLES_NO_ZYGOTE") == "1"


class ForkedProcess:
    """A server the zygote forked, with the part of `subprocess.Popen` the tests use.

    Not this process's child, so its exit status comes from the zygote, on the
    connection that asked for it."""

    def __init__(self, connection: socket.socket, pid: int, args: Sequence[str]):
        self._connection = connection
        self._buffer = b""
        self.pid = pid
        self.args = list(args)
        self.returncode: int | None = None

    def _read_status(self, timeout: float | None) -> None:
        if self.returncode is not None:
            return
        selector = selectors.DefaultSelector()
        selector.register(self._connection, selectors.EVENT_READ)
        deadline = None if timeout is None else time.monotonic() + timeout
        try:
            while not self._buffer.endswith(b"\n"):
                left = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not selector.select(left):
                    return
                chunk = self._connection.recv(4096)
                if not chunk:  # the zygote died: the child's status is lost with it
                    raise RuntimeError(f"the zygote went away; the status of {self.pid} is lost")
                self._buffer += chunk
        finally:
            selector.close()
        self.returncode = json.loads(self._buffer)["returncode"]
        self._connection.close()

    def poll(self) -> int | None:
        self._read_status(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._read_status(timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.returncode is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The session's zygote process: started on first use, stopped at exit."""

    def __init__(self, env: Mapping[str, str]):
        self.folder = Path(tempfile.mkdtemp(prefix="ttbundles-zygote-"))
        self.socket_path = self.folder / "zygote.sock"
        self.log_path = self.folder / "zygote.log"
        self.env = dict(env)
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, str(ZYGOTE_SCRIPT), str(self.socket_path)],
                env=dict(env),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + READY_TIMEOUT
        while not self.socket_path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(
                    f"the serve zygote did not start:\n{self.log_path.read_text()[-4000:]}"
                )
            time.sleep(0.1)

    def fork(self, argv: Sequence[str], env: Mapping[str, str], log_path: Path) -> ForkedProcess:
        self._wait_ready()
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        connection.connect(str(self.socket_path))
        request = {"argv": list(argv), "env": dict(env), "cwd": os.getcwd(), "log": str(log_path)}
        connection.sendall(json.dumps(request).encode() + b"\n")
        reply = b""
        while not reply.endswith(b"\n"):
            chunk = connection.recv(4096)
            if not chunk:
                raise RuntimeError(f"the serve zygote failed:\n{self.log_path.read_text()[-4000:]}")
            reply += chunk
        return ForkedProcess(connection, json.loads(reply)["pid"], argv)

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.folder, ignore_errors=True)


_zygote: Zygote | None = None
_lock = threading.Lock()


def _zygote_environment() -> dict[str, str]:
    env = library.serve_environment()
    env["MESH_DEVICE"] = MESH
    env.update({"PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    for name in ("VLLM_LOGGING_CONFIG_PATH", "VLLM_LOGGING_LEVEL", "EXTRA_MODELS_DIR"):
        env.pop(name, None)  # each child has its own
    return env


def _session_zygote() -> Zygote:
    global _zygote
    with _lock:
        if _zygote is None:
            _zygote = Zygote(_zygote_environment())
            atexit.register(_zygote.close)
        return _zygote


def forkable(env: Mapping[str, str]) -> bool:
    """Whether a server with this environment may be forked from the zygote: the same
    values as the zygote's for what vLLM reads while it is imported."""
    if DISABLED:
        return False
    zygote_env = _zygote.env if _zygote is not None else _zygote_environment()
    return all(env.get(name) == zygote_env.get(name) for name in IMPORT_TIME_ENV)


def start_server(
    checkpoint: Path,
    *,
    vllm_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: Path,
) -> ServerProcess:
    """`ttbundles.demo.server.start_server`, forked from the zygote where it can be."""
    environ = library.serve_environment() if env is None else dict(env)
    if not forkable(environ):
        return library.start_server(checkpoint, vllm_args=vllm_args, env=environ, log_path=log_path)
    host = library.DEFAULT_HOST
    port = library.free_port(host)
    command = library.serve_command(checkpoint, host=host, port=port, vllm_args=vllm_args)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process = _session_zygote().fork(command, environ, log_path)
    return ServerProcess(process, f"http://{host}:{port}", log_path)  # type: ignore[arg-type]


def run_to_exit(
    checkpoint: Path,
    *,
    vllm_args: Sequence[str] = (),
    env: Mapping[str, str],
    log_path: Path,
    timeout: float,
) -> tuple[int, str]:
    """`vllm serve` expected to stop by itself: (its exit status, its whole output)."""
    server = start_server(checkpoint, vllm_args=vllm_args, env=env, log_path=log_path)
    try:
        code = server.process.wait(timeout)
    finally:
        server.stop()
    return code, log_path.read_text(errors="replace")


def run(command: Sequence[str], env: Mapping[str, str], timeout: float) -> tuple[int, str]:
    """A `vllm serve` command line run to its end: (exit status, its whole output, the
    standard error within it). Forked where `forkable`, else a real process."""
    folder = Path(tempfile.mkdtemp(prefix="ttbundles-run-"))
    log_path = folder / "output.log"
    try:
        if forkable(env):
            process: ForkedProcess | subprocess.Popen = _session_zygote().fork(
                command, env, log_path
            )
        else:
            process = library.start_process(command, env, log_path).process
        try:
            code = process.wait(timeout)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        return code, log_path.read_text(errors="replace")
    finally:
        shutil.rmtree(folder, ignore_errors=True)
