"""A process that imports vLLM's command line once, then forks one `vllm serve` per request.

Run by `tests/zygote.py` (never imported by the tests themselves): `python serve_zygote.py
SOCKET`. Every `vllm serve` spends about 9 s of CPU importing vLLM's API server before it
reads its arguments; the server tier starts dozens of them on two cores. A child forked
from here skips that import and runs the same `main()` the `vllm` console script runs,
with its own arguments, environment, working directory and log, in a session of its own.

Importing configures no logging (vLLM configures it in `main()`, from the arguments and
the environment, which are the child's). What the import itself decided (the platform
vLLM resolved) holds for every child, so `tests/zygote.py` only hands over
servers whose environment asks for the same platform, and keeps the rest (and every test
of the process itself: signals, exit status, start-up failures) on real `vllm serve`
processes.

Protocol, one connection per server: the client sends one JSON line
`{"argv", "env", "cwd", "log"}`; the zygote answers `{"pid": N}` and, when that child
exits, `{"returncode": R}` (negative: the signal that ended it, as `subprocess` says).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import socket
import sys


def _preload() -> None:
    """What `vllm.entrypoints.cli.main.main()` imports before it parses anything."""
    import vllm.entrypoints.cli.benchmark.main  # noqa: F401
    import vllm.entrypoints.cli.collect_env  # noqa: F401
    import vllm.entrypoints.cli.main  # noqa: F401
    import vllm.entrypoints.cli.openai  # noqa: F401
    import vllm.entrypoints.cli.run_batch  # noqa: F401
    import vllm.entrypoints.cli.serve  # noqa: F401
    import vllm.entrypoints.openai.api_server  # noqa: F401


def _run_child(request: dict, listener: socket.socket, connections: list[socket.socket]) -> None:
    """In the forked child: become that `vllm serve`; never returns into the zygote."""
    try:
        os.setsid()  # its own group: stopping it stops the engine core it starts
        listener.close()
        for connection in connections:
            connection.close()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGCHLD, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)  # what the interpreter sets at start
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.argv = list(request["argv"])
        from vllm.entrypoints.cli.main import main
    except BaseException as exc:  # noqa: BLE001 - reported in the child's log, then exit
        with contextlib.suppress(Exception):
            os.write(2, f"serve_zygote: the child could not start: {exc!r}\n".encode())
        os._exit(70)
    raise SystemExit(main())


def serve(socket_path: str) -> None:
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(socket_path + ".tmp")
    listener.listen(16)
    os.rename(socket_path + ".tmp", socket_path)  # the client waits for this name
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    children: dict[int, socket.socket] = {}
    pending: dict[socket.socket, bytes] = {}
    while True:
        for key, _ in selector.select(timeout=0.1):
            sock = key.fileobj
            if sock is listener:
                connection, _ = listener.accept()
                pending[connection] = b""
                selector.register(connection, selectors.EVENT_READ)
                continue
            chunk = sock.recv(1 << 20)
            if not chunk:  # the client went away before asking
                selector.unregister(sock)
                pending.pop(sock, None)
                sock.close()
                continue
            pending[sock] += chunk
            if not pending[sock].endswith(b"\n"):
                continue
            request = json.loads(pending.pop(sock))
            selector.unregister(sock)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _run_child(request, listener, [*children.values(), *pending, sock])
            children[pid] = sock
            sock.sendall(json.dumps({"pid": pid}).encode() + b"\n")
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            connection = children.pop(pid, None)
            if connection is None:
                continue
            with contextlib.suppress(OSError):
                code = os.waitstatus_to_exitcode(status)
                connection.sendall(json.dumps({"returncode": code}).encode() + b"\n")
            connection.close()


if __name__ == "__main__":
    # The script's folder (tests/) first on sys.path would shadow modules for vLLM.
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)
    serve(sys.argv[1])
