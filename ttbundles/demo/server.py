"""Start `vllm serve` on the host mesh and stop it: the one launcher of servers.

`ttbundle demo`, the end-to-end tests and the serving benchmark all start their servers
here, with the environment the host mesh needs. Nothing here imports vLLM or torch: the
server is a separate process.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Mapping, Sequence
from pathlib import Path

from ttbundles.errors import TTBundleError
from ttbundles.format.meshes import HOST

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000  # vllm serve's own default, for the foreground server
READY_TIMEOUT = 300.0  # seconds; a cold start here takes about 40
STOP_TIMEOUT = 30.0  # seconds between asking the server to stop and killing it

# The vLLM plugins the host mesh needs, named as the reference plugin names them: the
# platform (tt) and the registration (tt_model_registry; a filter that also names its
# alias `ttbundles` registers once all the same).
REQUIRED_PLUGINS = ("tt", "tt_model_registry")
# Options `ttbundle demo` sets itself; given again after `--` they would silently win.
OWN_SERVE_OPTIONS = ("--host", "--port")


def serve_environment(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """`base` (default: this process's environment) with what the host mesh needs.

    MESH_DEVICE=HOST unless a mesh is set; VLLM_PLUGINS left unset (every plugin loads)
    or extended with tt and tt_model_registry; no model hub (HF_HUB_OFFLINE=1).
    """
    env = dict(os.environ if base is None else base)
    if not env.get("MESH_DEVICE"):
        env["MESH_DEVICE"] = HOST
    plugins = env.get("VLLM_PLUGINS")
    if plugins is not None:
        names = [p.strip() for p in plugins.split(",") if p.strip()]
        names += [p for p in REQUIRED_PLUGINS if p not in names]
        env["VLLM_PLUGINS"] = ",".join(names)
    env["HF_HUB_OFFLINE"] = "1"
    return env


def vllm_command() -> list[str]:
    """How to run the vLLM CLI: the `vllm` next to this interpreter, else on PATH."""
    beside = Path(sys.executable).parent / "vllm"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("vllm")
    if found:
        return [found]
    raise TTBundleError.single(
        "TTB209",
        "the vllm command is not installed next to this Python nor on PATH",
        hint="install vLLM 0.33.0 (pip install 'ttbundles[serve]'; in this repository, "
        "scripts/setup)",
    )


def check_vllm_args(vllm_args: Sequence[str]) -> None:
    """Refuse `vllm serve` options that would move the server away from where we wait."""
    clashes = [a for a in vllm_args if a.split("=", 1)[0] in OWN_SERVE_OPTIONS]
    if clashes:
        raise TTBundleError.single(
            "TTB209",
            f"{', '.join(clashes)} among the vllm serve options would override the server "
            "address that ttbundle demo waits on",
            hint="use ttbundle demo's own --host and --port options",
        )


def serve_command(
    checkpoint: Path, *, host: str, port: int, vllm_args: Sequence[str] = ()
) -> list[str]:
    """`vllm serve CHECKPOINT --host HOST --port PORT [vllm_args...]`."""
    check_vllm_args(vllm_args)
    return [
        *vllm_command(),
        "serve",
        str(checkpoint),
        "--host",
        host,
        "--port",
        str(port),
        *vllm_args,
    ]


def _client_host(host: str) -> str:
    """Where a client on this machine reaches a server bound to `host`."""
    return "127.0.0.1" if host in ("", "0.0.0.0", "::") else host


def free_port(host: str = DEFAULT_HOST) -> int:
    """A port nothing listens on now (the OS's choice)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((_client_host(host), 0))
        return sock.getsockname()[1]


def port_problem(host: str, port: int) -> str | None:
    """Why a server could not listen on `host`:`port` now, or None when it could.

    Bound as uvicorn binds (SO_REUSEADDR): a port held only by closed connections
    (TIME_WAIT, after a server stopped) is free; one something listens on is not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                return f"port {port} on {host} is in use: something is listening on it"
            return f"cannot listen on port {port} of {host}: {exc.strerror or exc}"
        return None


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on `port` now (`port_problem`)."""
    return port_problem(host, port) is None


def check_port(host: str, port: int) -> None:
    """TTB210 when a server could not listen on `host`:`port` (`port_problem`)."""
    problem = port_problem(host, port)
    if problem is not None:
        raise TTBundleError.single(
            "TTB210",
            problem,
            hint="choose another --port, or stop what listens there (ss -ltnp shows it); "
            "without --port, --query picks a free one",
        )


# Local servers only: never through a proxy the environment may name.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of a GET; status 0 when nothing answers."""
    try:
        with _OPENER.open(url, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError):
        return 0, ""


class ServerProcess:
    """A `vllm serve` process started by `start_server`, in its own process group.

    Its own group, so stopping it also stops the engine-core process it spawns, and so a
    Ctrl-C meant for the caller does not reach it before the caller decides.
    """

    def __init__(self, process: subprocess.Popen, base_url: str, log_path: Path | None):
        self.process = process
        self.base_url = base_url
        self.log_path = log_path

    @property
    def api_url(self) -> str:
        """The OpenAI-compatible API root, for `openai.OpenAI(base_url=...)`."""
        return f"{self.base_url}/v1"

    def is_running(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        if self.log_path is None or not self.log_path.is_file():
            return ""
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return "".join(deque(handle, maxlen=lines))

    def wait_ready(self, timeout: float = READY_TIMEOUT) -> float:
        """Block until /health answers 200; the seconds it took.

        Raises TTBundleError (with the log's tail) if the server exits or times out.
        """
        start = time.monotonic()
        while True:
            if not self.is_running():
                raise self._failure(
                    f"vllm serve exited with code {self.process.returncode} before it was ready"
                )
            status, _ = http_get(f"{self.base_url}/health", timeout=2.0)
            if status == 200:
                return time.monotonic() - start
            if time.monotonic() - start > timeout:
                raise self._failure(f"vllm serve was not ready after {timeout:.0f} s")
            time.sleep(0.5)

    def _failure(self, message: str) -> TTBundleError:
        tail = self.log_tail()
        where = f" (log: {self.log_path})" if self.log_path else ""
        return TTBundleError.single(
            "TTB209",
            message + where + (f"; last lines:\n{tail.rstrip()}" if tail else ""),
            hint="the server's last lines above say why; `ttbundle plan --model CHECKPOINT "
            "[vllm serve options]` checks a configuration without starting a server",
        )

    def stop(self, timeout: float = STOP_TIMEOUT) -> int | None:
        """SIGTERM the server's process group, then SIGKILL after `timeout`. Idempotent."""
        if self.is_running():
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except (subprocess.TimeoutExpired, KeyboardInterrupt):  # too slow, or a 2nd Ctrl-C
                self._signal_group(signal.SIGKILL)
                self.process.wait(timeout)
        # Whatever the server left behind in its group (an engine core that outlived it).
        self._signal_group(signal.SIGKILL)
        return self.process.returncode

    def _signal_group(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def start_server(
    checkpoint: Path,
    *,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    vllm_args: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    log_path: Path | None = None,
) -> ServerProcess:
    """Start `vllm serve` on `checkpoint` without waiting for it (see `wait_ready`).

    `env` defaults to `serve_environment()`; `port` to a free one. With `log_path` the
    server's output goes to that file, else to this process's stdout and stderr.
    """
    port = free_port(host) if port is None else port
    check_port(host, port)
    command = serve_command(checkpoint, host=host, port=port, vllm_args=vllm_args)
    environ = serve_environment() if env is None else env
    return start_process(command, environ, log_path, f"http://{_client_host(host)}:{port}")


def start_process(
    command: Sequence[str],
    env: Mapping[str, str],
    log_path: Path | None,
    base_url: str = "",
) -> ServerProcess:
    """Start one serving process in a process group of its own (so stopping it stops
    everything it started), its output to `log_path` or, without one, to ours.

    `base_url` is empty for a process that answers no HTTP (a headless host)."""
    output = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        output = open(log_path, "wb")  # noqa: SIM115 - handed to the child, closed below
    try:
        process = subprocess.Popen(
            list(command),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=output,
            stderr=subprocess.STDOUT if output is not None else None,
            start_new_session=True,
        )
    finally:
        if output is not None:
            output.close()
    return ServerProcess(process, base_url, log_path)
