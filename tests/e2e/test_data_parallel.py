"""Multi-process data parallelism served: `vllm serve --data-parallel-size 2` on the host
mesh runs two engine cores, each on a host submesh of its own.

One server for the module (a DP server is six processes: the launcher, the DP
coordinator, two API servers, two engine cores). The demo bundle does not declare
`execution: "single"`, so its ranks are engines, not lanes.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.e2e.conftest import LOGGING_CONFIG, Server, _environment, successes_per_engine
from tests.zygote import start_server
from ttbundles.errors import TTBundleError

pytestmark = pytest.mark.server

READY_TIMEOUT = 600.0  # six vLLM processes start on two cores
MAX_NUM_SEQS = 4
MAX_MODEL_LEN = 256
BLOCK_SIZE = 16  # pinned: vLLM's default is 16 tokens in 0.33.0, 64 in 0.34.0
DP_ARGS = [
    "--data-parallel-size",
    "2",
    "--block-size",
    str(BLOCK_SIZE),
    "--max-model-len",
    str(MAX_MODEL_LEN),
    "--max-num-seqs",
    str(MAX_NUM_SEQS),
]
IDS = {"ignore_eos": True, "return_token_ids": True}
BOUND = re.compile(
    r"pid=(\d+)\) INFO .*ttbundles: Bound TT_VISIBLE_DEVICES=(\S+) for local DP rank (\d+)"
)
KV_BLOCKS = re.compile(r"pid=(\d+)\) INFO .*ttbundles: KV cache of (\d+) blocks")


@pytest.fixture(scope="module")
def dp_server(tmp_path_factory, demo_checkpoint) -> Iterator[Server]:
    root = tmp_path_factory.mktemp("dp")
    logging_config = root / "logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    stats = root / "stats.json"
    env = _environment(
        {"VLLM_LOGGING_CONFIG_PATH": str(logging_config), "TT_BUNDLES_STATS_FILE": str(stats)}
    )
    env.pop("TT_VISIBLE_DEVICES", None)
    log_path = root / "server.log"
    process = start_server(demo_checkpoint, vllm_args=DP_ARGS, env=env, log_path=log_path)
    server = Server("dp", process, str(demo_checkpoint), log_path, stats)
    try:
        try:
            process.wait_ready(READY_TIMEOUT)
        except TTBundleError as exc:
            pytest.fail(f"the data-parallel server did not start: {exc}", pytrace=False)
        yield server
    finally:
        process.stop()


def greedy(server: Server, prompt: list[int], max_tokens: int = 10) -> list[int]:
    with server.client() as client:
        response = client.completions.create(
            model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=0.0,
            extra_body=IDS,
        )  # fmt: skip
    return list(response.choices[0].model_extra["token_ids"])


def test_two_engines_serve_on_their_own_device_groups(dp_server, reference):
    prompts = [[1, *range(20 + 7 * i, 30 + 7 * i)] for i in range(8)]
    barrier = threading.Barrier(len(prompts))

    def send(prompt):
        barrier.wait()  # all in flight together: the load balancer spreads them
        return greedy(dp_server, prompt)

    per_engine: dict[str, float] = {}
    for _ in range(4):  # a balancer that happened to pick one engine gets another round
        with ThreadPoolExecutor(len(prompts)) as pool:
            outputs = list(pool.map(send, prompts))
        # Greedy output identical to one engine's (transformers, which the DP=1 demo
        # server matches in test_serving).
        for prompt, output in zip(prompts, outputs):
            assert output == reference.greedy(prompt, 10), f"prompt {prompt}"
        per_engine = successes_per_engine(dp_server.process.base_url)
        if len([e for e, n in per_engine.items() if n > 0]) == 2:
            break
    assert sorted(per_engine) == ["0", "1"]
    assert all(n > 0 for n in per_engine.values()), per_engine

    log = dp_server.log_since(0)
    bound = {int(rank): (pid, devices) for pid, devices, rank in BOUND.findall(log)}
    assert sorted(bound) == [0, 1], log[-3000:]
    (pid0, devices0), (pid1, devices1) = bound[0], bound[1]
    assert pid0 != pid1  # two engine processes
    assert (devices0, devices1) == ("0", "1")  # distinct TT_VISIBLE_DEVICES

    # Each rank counted its own steps in its own stats file.
    stats = Path(dp_server.stats_path)
    for rank in (0, 1):
        counters = json.loads((stats.parent / f"stats.dp{rank}.json").read_text())
        assert counters.get("step.decode", 0) > 0, (rank, counters)


def test_each_rank_sizes_its_kv_cache_for_its_own_sequences(dp_server):
    log = dp_server.log_since(0)
    blocks = dict(KV_BLOCKS.findall(log))
    assert len(blocks) == 2, blocks  # one line per engine process
    # Room for one rank's max_num_seqs at full length (16-token blocks, one spare), not
    # for both ranks' together.
    expected = MAX_NUM_SEQS * MAX_MODEL_LEN // BLOCK_SIZE + 1
    assert set(blocks.values()) == {str(expected)}
    assert "2 engine cores, one per 1x1 submesh of HOST" in log
