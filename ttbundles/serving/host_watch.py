"""Several hosts: the head and its headless hosts notice when the other side is gone.

vLLM 0.33's multi-node data parallelism checks no liveness between hosts for dense
ranks (each rank is an independent engine core talking ZMQ to the head's API server):
- a headless host whose head stopped keeps its engines running, idle, for good;
- a head whose headless host died keeps serving with the dead ranks in its load
  balancer: `/health` stays 200 and nothing tells the balancer those ranks are gone.
vLLM cannot take a rank out of a running dense DP server, so the honest outcome of a
lost host is to stop the whole server, say why, and let the supervisor restart it.

Every engine of a multi-host server holds one TCP connection to the head's watch port
(the data-parallel RPC port + 1, on `--data-parallel-address`) for its life and says
which DP rank it is and on which host. The head's `vllm serve` listens there:
- when a rank's connection closes (its host died, was stopped, or lost the network),
  the head logs one ERROR line naming the rank and the host, leaves it as the engine
  failure report (so `vllm serve` exits 1 with it) and stops itself with SIGTERM, as an
  operator would, which in turn closes every other host's connection;
- when an engine's connection closes (the head is gone), the engine logs one line and
  stops itself with SIGTERM; vLLM's headless launcher then stops the host's other
  engines and exits.
A host cut off without a TCP reset (pulled cable, powered off) is only noticed when the
kernel gives up on the connection (TCP keepalive is switched on with short timers).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
import time

logger = logging.getLogger("vllm.ttbundles")

RETRY = 1.0  # seconds between an engine's attempts to reach the head's watch port
GRACE = 20.0  # seconds an engine waits for its own SIGTERM to end it, then exits
_state: dict[str, object] = {}


def watch_port(rpc_port: int) -> int:
    """The head's watch port: the data-parallel RPC port + 1 (open it between hosts)."""
    return rpc_port + 1


def _keepalive(sock: socket.socket) -> None:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


# --- the head ---------------------------------------------------------------------------


def listen(address: str, rpc_port: int, local_ranks: range, on_lost=None) -> bool:  # noqa: ANN001
    """Start the head's listener (once per process; False if the port is taken, as in a
    second API server process of the same head, or already listening).

    `local_ranks` are the head's own ranks: vLLM already stops the server when one of
    those engines dies; only another host's rank is this watch's to report.
    """
    if _state.get("listening"):
        return False
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    port = watch_port(rpc_port)
    try:
        server.bind((address, port))
    except OSError as exc:
        server.close()
        logger.debug("ttbundles: the host watch does not listen on %s:%d: %s", address, port, exc)
        return False
    server.listen(64)
    _state["listening"] = server
    threading.Thread(
        target=_accept,
        args=(server, local_ranks, on_lost or _stop_head),
        daemon=True,
        name="ttbundles-host-watch",
    ).start()
    logger.info("ttbundles: watching the data-parallel hosts on %s:%d", address, port)
    return True


def _accept(server: socket.socket, local_ranks: range, on_lost) -> None:  # noqa: ANN001
    while True:
        try:
            conn, peer = server.accept()
        except OSError:
            return
        _keepalive(conn)
        threading.Thread(
            target=_follow, args=(conn, peer, local_ranks, on_lost), daemon=True
        ).start()


def _follow(conn: socket.socket, peer, local_ranks: range, on_lost) -> None:  # noqa: ANN001
    """One engine's connection: its hello line, then EOF when it is gone."""
    data = b""
    with conn:
        try:
            while b"\n" not in data:
                chunk = conn.recv(256)
                if not chunk:
                    return  # not one of ours
                data += chunk
            rank_text, _, host = data.split(b"\n", 1)[0].decode().partition(" ")
            rank = int(rank_text)
        except (OSError, ValueError, UnicodeDecodeError):
            return
        logger.info("ttbundles: DP rank %d on host %s (%s) joined the server", rank, host, peer[0])
        try:
            while conn.recv(256):
                pass
        except OSError:
            pass
    if rank not in local_ranks:
        on_lost(rank, host)


def _stop_head(rank: int, host: str) -> None:
    from ttbundles.serving.api_server import shutdown

    if _state.get("stopping") or shutdown.requested_stop() is not None:
        return  # a rank leaving a head that was asked to stop is that stop's doing
    _state["stopping"] = True
    line = (
        f"DP rank {rank} on host {host} is gone (its engine's connection to the head "
        "closed): vLLM cannot serve on without a rank, so this server stops; restart "
        "the headless hosts, then this head (docs/operators/several-hosts.md)"
    )
    logger.error("ttbundles: %s", line)
    from ttbundles.serving import faults

    path = faults.report_path()
    if path:
        with contextlib.suppress(OSError), open(path, "w", encoding="utf-8") as handle:
            handle.write(line + "\n")
    os.kill(os.getpid(), signal.SIGTERM)


# --- an engine --------------------------------------------------------------------------


def join(address: str, rpc_port: int, rank: int, host: str, on_lost=None) -> None:  # noqa: ANN001
    """From an engine: hold a connection to the head's watch port for life; when it
    closes, the head is gone and this engine stops (`on_lost`, default SIGTERM)."""
    threading.Thread(
        target=_hold,
        args=(address, watch_port(rpc_port), rank, host, on_lost or _stop_engine),
        daemon=True,
        name="ttbundles-head-watch",
    ).start()


def _hold(address: str, port: int, rank: int, host: str, on_lost) -> None:  # noqa: ANN001
    while True:  # the head may start after this host: keep trying until it listens
        try:
            sock = socket.create_connection((address, port), timeout=5.0)
            break
        except OSError:
            time.sleep(RETRY)
    with sock:
        sock.settimeout(None)
        _keepalive(sock)
        try:
            sock.sendall(f"{rank} {host}\n".encode())
            while sock.recv(256):
                pass
        except OSError:
            pass
    on_lost(address, port, rank)


def _stop_engine(address: str, port: int, rank: int) -> None:
    from ttbundles.serving import faults

    # The head stopping stops this host: its `vllm serve --headless` ends with this
    # reason (`faults.leave_stop_note`), quietly, as it would on its own SIGTERM.
    logger.warning(
        "ttbundles: the head at %s (watch port %d) is gone; stopping DP rank %d on this host",
        address,
        port,
        rank,
    )
    faults.leave_stop_note(f"as the head at {address} (watch port {port}) is gone")
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(GRACE)  # vLLM's engine shuts down on SIGTERM; if it has not, end it here
    logger.error("ttbundles: DP rank %d did not stop within %.0f s; exiting", rank, GRACE)
    os._exit(1)
