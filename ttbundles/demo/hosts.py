"""Several "hosts" of one multi-node data-parallel `vllm serve`, on this machine.

vLLM's multi-node data parallelism is a head (`vllm serve` with the API server, the DP
coordinator and its own ranks) and one `vllm serve --headless` per other host, which
connects to the head's handshake address and runs that host's ranks. Here every host is
its own process group with its own environment (its own MESH_DEVICE, stats file, log),
on 127.0.0.1: what two Tenstorrent hosts run, without the second machine. The end-to-end
tests and `benchmarks/bench_multihost.py` start their servers here. Nothing here imports
vLLM or torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.demo.server import (
    DEFAULT_HOST,
    ServerProcess,
    free_port,
    port_is_free,
    serve_environment,
    start_process,
    start_server,
    vllm_command,
)


def rpc_port_pair(host: str = DEFAULT_HOST, attempts: int = 64) -> int:
    """A data-parallel RPC port whose next port is free too: the head's host watch
    listens on the RPC port + 1 (`serving.host_watch`), and an OS-chosen port's
    neighbour may be any other socket's (a busy machine's outgoing connections take
    ports from the same range)."""
    for _ in range(attempts):
        port = free_port(host)
        if port < 65535 and port_is_free(host, port + 1):
            return port
    raise OSError(f"no free pair of ports on {host} after {attempts} tries")


def multi_node_args(size: int, local: int, rpc_port: int, address: str = DEFAULT_HOST) -> list[str]:
    """The data-parallel flags every host gives (the head's share of ranks: `local`)."""
    return [
        "--data-parallel-size",
        str(size),
        "--data-parallel-size-local",
        str(local),
        "--data-parallel-address",
        address,
        "--data-parallel-rpc-port",
        str(rpc_port),
    ]


def headless_command(
    checkpoint: Path, start_rank: int, flags: Sequence[str], vllm_args: Sequence[str] = ()
) -> list[str]:
    """`vllm serve CHECKPOINT --headless --data-parallel-start-rank R` with the flags."""
    return [
        *vllm_command(),
        "serve",
        str(checkpoint),
        "--headless",
        "--data-parallel-start-rank",
        str(start_rank),
        *flags,
        *vllm_args,
    ]


@dataclass
class Hosts:
    """A head and its headless hosts, each a process group of its own."""

    head: ServerProcess
    headless: list[ServerProcess] = field(default_factory=list)

    @property
    def base_url(self) -> str:
        return self.head.base_url

    def wait_ready(self, timeout: float) -> float:
        """Until the head answers /health (it does once every rank, on every host, has
        started); a host that exits first fails it with that host's log."""
        import time

        start = time.monotonic()
        while True:
            for host in self.headless:
                if not host.is_running():
                    raise host._failure(
                        f"the headless host exited with code {host.process.returncode} "
                        "before the server was ready"
                    )
            try:
                self.head.wait_ready(min(2.0, max(0.1, timeout - (time.monotonic() - start))))
                return time.monotonic() - start
            except Exception:  # noqa: BLE001 - not ready yet, or the head failed: below
                if not self.head.is_running() or time.monotonic() - start > timeout:
                    raise

    def stop(self) -> None:
        """The head first (as an operator would), then every headless host."""
        self.head.stop()
        for host in self.headless:
            host.stop()


def start_hosts(
    checkpoint: Path,
    ranks_per_host: Sequence[int],
    *,
    vllm_args: Sequence[str] = (),
    head_args: Sequence[str] = (),
    envs: Sequence[Mapping[str, str] | None] = (),
    logs: Sequence[Path] = (),
    port: int | None = None,
) -> Hosts:
    """Start a head with `ranks_per_host[0]` ranks and one headless host per further
    entry, each with its own environment (`envs[i]`, default this process's) and log.
    `vllm_args` go to every host, `head_args` to the head only (`--api-server-count`,
    which vLLM refuses with `--headless`)."""
    size = sum(ranks_per_host)
    rpc_port = rpc_port_pair()
    flags = multi_node_args(size, ranks_per_host[0], rpc_port)

    def environment(index: int) -> dict[str, str]:
        base = envs[index] if index < len(envs) else None
        return serve_environment(base)

    def log(index: int) -> Path | None:
        return logs[index] if index < len(logs) else None

    head = start_server(
        checkpoint,
        port=port,
        vllm_args=[*flags, *vllm_args, *head_args],
        env=environment(0),
        log_path=log(0),
    )
    hosts = Hosts(head)
    first = ranks_per_host[0]
    try:
        for index, local in enumerate(ranks_per_host[1:], start=1):
            host_flags = multi_node_args(size, local, rpc_port)
            command = headless_command(checkpoint, first, host_flags, vllm_args)
            hosts.headless.append(start_process(command, environment(index), log(index)))
            first += local
    except BaseException:
        hosts.stop()
        raise
    return hosts
