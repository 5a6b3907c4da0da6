"""Several hosts served: one OpenAI endpoint over two "hosts" through vLLM's own multi-node
data parallelism, on the host mesh.

Each host is a process group of its own on 127.0.0.1 with its own environment (its own
stats file and log): the head (`vllm serve --data-parallel-size N
--data-parallel-size-local L ...`: the API server, the DP coordinator and its L ranks)
and one `vllm serve --headless --data-parallel-start-rank L ...`. Driven through the real
API server with the `openai` client. Two layouts, one after the other (each is five to
eight vLLM processes on two cores): 2 hosts x 1 rank, whose head is then stopped, and
2 hosts x 2 ranks, whose headless host is then killed.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import (
    LOGGING_CONFIG,
    _environment,
    assert_stopped_quietly,
    successes_per_engine,
)
from ttbundles.demo.hosts import Hosts, start_hosts
from ttbundles.errors import TTBundleError

pytestmark = pytest.mark.server

READY_TIMEOUT = 900.0  # up to eight vLLM processes start on two cores
GONE_TIMEOUT = 60.0  # every process of every host gone after a stop or a lost host
ARGS = ["--max-model-len", "256", "--max-num-seqs", "4"]
HEAD_ARGS = ["--api-server-count", "1"]
IDS = {"ignore_eos": True, "return_token_ids": True}
BOUND = re.compile(
    r"ttbundles: Bound TT_VISIBLE_DEVICES=(\S+) for local DP rank (\d+) \(DP rank (\d+) of (\d+)"
)


@dataclass
class Cluster:
    hosts: Hosts
    folders: list[Path]
    model: str

    def log(self, host: int) -> str:
        return (self.folders[host] / "server.log").read_text(errors="replace")

    def groups(self) -> list[int]:
        return [self.hosts.head.process.pid] + [h.process.pid for h in self.hosts.headless]

    def client(self):
        import openai

        return openai.OpenAI(
            base_url=self.hosts.head.api_url, api_key="EMPTY", timeout=120.0, max_retries=0
        )


def start_cluster(root: Path, checkpoint: Path, ranks_per_host: list[int]) -> Cluster:
    """Each host with its own folder: its log, its stats file, its environment."""
    folders, envs = [], []
    for index in range(len(ranks_per_host)):
        folder = root / f"host{index}"
        folder.mkdir()
        logging_config = folder / "logging.json"
        logging_config.write_text(json.dumps(LOGGING_CONFIG))
        env = _environment(
            {
                "VLLM_LOGGING_CONFIG_PATH": str(logging_config),
                "TT_BUNDLES_STATS_FILE": str(folder / "stats.json"),
            }
        )
        env.pop("TT_VISIBLE_DEVICES", None)
        folders.append(folder)
        envs.append(env)
    hosts = start_hosts(
        checkpoint,
        ranks_per_host,
        vllm_args=ARGS,
        head_args=HEAD_ARGS,
        envs=envs,
        logs=[f / "server.log" for f in folders],
    )
    cluster = Cluster(hosts, folders, str(checkpoint))
    try:
        hosts.wait_ready(READY_TIMEOUT)
    except TTBundleError as exc:
        hosts.stop()
        pytest.fail(f"the {ranks_per_host} hosts did not start: {exc}", pytrace=False)
    return cluster


@pytest.fixture(scope="module")
def two_by_one(tmp_path_factory, demo_checkpoint) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("hosts2x1"), demo_checkpoint, [1, 1])
    try:
        yield cluster
    finally:
        cluster.hosts.stop()


@pytest.fixture(scope="module")
def two_by_two(tmp_path_factory, demo_checkpoint) -> Iterator[Cluster]:
    cluster = start_cluster(tmp_path_factory.mktemp("hosts2x2"), demo_checkpoint, [2, 2])
    try:
        yield cluster
    finally:
        cluster.hosts.stop()


def spread_greedy_requests(cluster: Cluster, reference, engines: int) -> dict[str, float]:
    """Rounds of concurrent greedy requests until every engine served some; each output
    equal to one engine's (transformers, which the one-engine demo server matches)."""
    prompts = [[1, *range(20 + 7 * i, 30 + 7 * i)] for i in range(2 * engines + 4)]
    barrier = threading.Barrier(len(prompts))

    def send(prompt: list[int]) -> list[int]:
        barrier.wait()  # all in flight together: the load balancer spreads them
        with cluster.client() as client:
            response = client.completions.create(
                model=cluster.model, prompt=prompt, max_tokens=10, temperature=0.0,
                extra_body=IDS,
            )  # fmt: skip
        return list(response.choices[0].model_extra["token_ids"])

    per_engine: dict[str, float] = {}
    for _ in range(4):  # a balancer that happened to skip an engine gets another round
        with ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(send, prompts))
        for prompt, output in zip(prompts, outputs):
            assert output == reference.greedy(prompt, 10), f"prompt {prompt}"
        per_engine = successes_per_engine(cluster.hosts.base_url)
        if len([e for e, n in per_engine.items() if n > 0]) == engines:
            break
    assert sorted(per_engine) == [str(e) for e in range(engines)]
    assert all(n > 0 for n in per_engine.values()), per_engine
    return per_engine


def bound_ranks(log: str) -> dict[int, tuple[str, int, int]]:
    """{global DP rank: (TT_VISIBLE_DEVICES, local rank, DP size)} from a host's log."""
    return {
        int(rank): (devices, int(local), int(size))
        for devices, local, rank, size in BOUND.findall(log)
    }


def alive_in(groups: list[int]) -> list[str]:
    """The processes still in these process groups (each host is one), as `pid name`."""
    alive = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if os.getpgid(int(entry)) in groups:
                stat = Path(f"/proc/{entry}/stat").read_text()
                if stat.rpartition(")")[2].split()[0] == "Z":
                    continue  # exited, waiting for its parent (this test) to reap it
                name = Path(f"/proc/{entry}/comm").read_text().strip()
                alive.append(f"{entry} {name}")
        except (ProcessLookupError, FileNotFoundError, PermissionError):
            continue
    return alive


def wait_gone(groups: list[int], timeout: float = GONE_TIMEOUT) -> list[str]:
    deadline = time.monotonic() + timeout
    while (left := alive_in(groups)) and time.monotonic() < deadline:
        time.sleep(0.5)
    return left


# --- 2 hosts x 1 rank ----------------------------------------------------------------------


def test_two_hosts_serve_one_endpoint_each_on_its_own_mesh(two_by_one, reference):
    spread_greedy_requests(two_by_one, reference, engines=2)
    head, other = two_by_one.log(0), two_by_one.log(1)
    # Each host bound its one local rank to its own host submesh: device 0 on both, the
    # global ranks 0 and 1.
    assert bound_ranks(head) == {0: ("0", 0, 2)}, head[-3000:]
    assert bound_ranks(other) == {1: ("0", 0, 2)}, other[-3000:]
    # Each host's plan says where the ranks live; the head names every rank that joined.
    assert "runs DP rank 0 of 2" in head and "DP rank 1 on other hosts" in head
    assert "runs DP rank 1 of 2" in other and "DP rank 0 on other hosts" in other
    assert re.search(r"ttbundles: DP rank 1 on host \S+ \(127\.0\.0\.1\) joined", head)
    # Each host's engine counted its steps in that host's own stats file (local rank 0).
    for folder in two_by_one.folders:
        counters = json.loads((folder / "stats.dp0.json").read_text())
        assert counters.get("step.decode", 0) > 0, (folder, counters)


def test_stopping_the_head_stops_every_host(two_by_one):
    groups = two_by_one.groups()
    head = two_by_one.hosts.head.process
    head.send_signal(signal.SIGTERM)  # the API server alone, as Kubernetes stops it
    assert head.wait(GONE_TIMEOUT) == 0
    left = wait_gone(groups)
    assert not left, f"still running after the head stopped: {left}"
    other = two_by_one.log(1)
    found = re.search(
        r"ttbundles: the head at (127\.0\.0\.1) \(watch port (\d+)\) is gone; stopping DP rank 1",
        other,
    )
    assert found, other[-3000:]
    assert two_by_one.hosts.headless[0].process.wait(5) == 0
    # A requested stop on both hosts: each one's whole output ends with its one line, with
    # no traceback (the headless engine's teardown without an accelerator) and no dump.
    assert_stopped_quietly(two_by_one.log(0), "vllm serve", "by SIGTERM")
    assert_stopped_quietly(
        other,
        "vllm serve --headless",
        f"as the head at {found[1]} (watch port {found[2]}) is gone",
    )


# --- 2 hosts x 2 ranks ---------------------------------------------------------------------


def test_two_hosts_of_two_ranks_spread_requests_over_all_four(two_by_two, reference):
    spread_greedy_requests(two_by_two, reference, engines=4)
    head, other = two_by_two.log(0), two_by_two.log(1)
    # Global ranks 2 and 3 are local ranks 0 and 1 of the second host, on its devices 0, 1.
    assert bound_ranks(head) == {0: ("0", 0, 4), 1: ("1", 1, 4)}, head[-3000:]
    assert bound_ranks(other) == {2: ("0", 0, 4), 3: ("1", 1, 4)}, other[-3000:]
    assert "rank 2 -> [0], rank 3 -> [1]" in other and "DP ranks 0-1 on other hosts" in other
    for folder in two_by_two.folders:
        for local in (0, 1):
            assert (folder / f"stats.dp{local}.json").is_file(), folder


def test_a_killed_headless_host_stops_the_head_with_the_reason(two_by_two):
    groups = two_by_two.groups()
    head = two_by_two.hosts.head.process
    os.killpg(two_by_two.hosts.headless[0].process.pid, signal.SIGKILL)  # the host dies
    status = head.wait(GONE_TIMEOUT)
    log = two_by_two.log(0)
    # vLLM alone would keep serving with the dead ranks in its balancer; the platform
    # stops the head, names the rank and the host, and exits 1 for the supervisor.
    assert status == 1, log[-3000:]
    assert re.search(r"ttbundles: DP rank [23] on host \S+ is gone", log), log[-3000:]
    assert "exiting with status 1" in log
    left = wait_gone(groups)
    assert not left, f"still running after the headless host died: {left}"
