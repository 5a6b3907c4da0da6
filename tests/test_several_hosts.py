"""Several hosts: vLLM's multi-node data parallelism planned per host.

Each host of a multi-node data-parallel server builds its own configuration (the head in
`vllm serve`, the others in `vllm serve --headless`), so each plans, and splits, only its
own mesh, for its `--data-parallel-size-local` ranks. Driven through vLLM's real
configuration (`EngineArgs.create_engine_config`, with `headless=True` as vllm serve's
headless path calls it), the real TT worker on the host mesh and `ttbundle plan`.
The served end of it is tests/e2e/test_several_hosts.py.
"""

from __future__ import annotations

import json
import os
import socket

import pytest

from tests.bundle_factory import metadata, write_bundle
from ttbundles.errors import ConfigurationError
from ttbundles.serving.planning.device_groups import plan_groups

HOST = socket.gethostname()
MULTI_NODE = {"data_parallel_address": "127.0.0.1", "data_parallel_rpc_port": 13345}


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


@pytest.fixture
def host_config(demo_checkpoint, monkeypatch):
    """One host's configuration of a multi-node server, as vllm serve makes it there."""
    import vllm  # noqa: F401 - required: a missing or broken vllm fails
    from vllm.engine.arg_utils import EngineArgs

    monkeypatch.setenv("TT_VISIBLE_DEVICES", "")  # recorded, so a worker's binding is undone
    monkeypatch.delenv("TT_VISIBLE_DEVICES")

    def make(size, local, start=None, *, headless=False, model=demo_checkpoint, **kwargs):
        kwargs.setdefault("max_model_len", 256)
        kwargs.setdefault("max_num_seqs", 4)
        args = EngineArgs(
            model=str(model),
            data_parallel_size=size,
            data_parallel_size_local=local,
            data_parallel_start_rank=start,
            **MULTI_NODE,
            **kwargs,
        )
        return args.create_engine_config(headless=headless)

    return make


def decision(config, setting="data_parallel_size") -> dict:
    plan = config.additional_config["ttbundles"]
    return {d["setting"]: d for d in plan["decisions"]}[setting]


# --- submesh bundles: each host its own ranks --------------------------------------------


def test_the_head_plans_its_own_ranks_and_says_where_the_others_are(host_config):
    config = host_config(4, 2)
    plan = config.additional_config["ttbundles"]
    assert plan["device_groups"] == [[0], [1]]  # the head's two local ranks
    assert (plan["dp_size"], plan["dp_start_rank"], plan["host"]) == (4, 0, HOST)
    reason = decision(config)["reason"]
    assert f"this host ({HOST}) runs DP ranks 0-1 of 4" in reason
    assert "rank 0 -> [0], rank 1 -> [1]" in reason
    assert "DP ranks 2-3 on other hosts, each host splitting its own mesh" in reason
    assert "handshake at 127.0.0.1:13345" in reason
    assert "max_num_seqs=4 per rank, 16 in total" in reason
    parallel = config.parallel_config
    assert (parallel.data_parallel_size, parallel.data_parallel_size_local) == (4, 2)
    assert parallel.distributed_executor_backend == "uni"


def test_a_headless_host_splits_its_own_mesh_by_local_rank(host_config):
    config = host_config(4, 2, 2, headless=True)
    plan = config.additional_config["ttbundles"]
    # Global ranks 2 and 3 live here, on this host's device groups 0 and 1.
    assert plan["device_groups"] == [[0], [1]]
    assert (plan["dp_size"], plan["dp_start_rank"]) == (4, 2)
    reason = decision(config)["reason"]
    assert "runs DP ranks 2-3 of 4" in reason and "rank 2 -> [0], rank 3 -> [1]" in reason
    assert "DP ranks 0-1 on other hosts" in reason
    assert config.parallel_config.data_parallel_rank == 2


def test_a_head_without_engines_plans_no_device_groups(host_config):
    config = host_config(2, 0)
    plan = config.additional_config["ttbundles"]
    assert plan["device_groups"] == []
    assert "none on this host" in decision(config)["reason"]
    assert "DP ranks 0-1 on hosts started with --headless" in decision(config)["reason"]


def test_a_host_s_ranks_beyond_the_size_are_refused(host_config):
    with pytest.raises(ConfigurationError) as excinfo:
        host_config(4, 2, 3, headless=True)
    assert code_of(excinfo) == "TTB212"
    assert "--data-parallel-start-rank=3 with --data-parallel-size-local=2" in str(excinfo.value)


def test_a_host_whose_mesh_cannot_hold_its_ranks_is_named_with_the_numbers():
    where = f"host {HOST} (DP ranks 4-7 of 8): "
    with pytest.raises(ConfigurationError) as excinfo:
        plan_groups("N300", 4, environ={}, flag="--data-parallel-size-local", where=where)
    assert code_of(excinfo) == "TTB212"
    message = str(excinfo.value)
    assert len(message.strip().splitlines()) <= 2  # the line and its fix
    assert f"host {HOST} (DP ranks 4-7 of 8): --data-parallel-size-local=4" in message
    assert "mesh N300 (1x2, 2 chips) does not split into 4 equal submeshes" in message
    assert "use --data-parallel-size-local 2" in message


def test_the_ray_backend_is_refused_with_the_reason(host_config):
    from ttbundles.serving.planning.configuration import _refuse_unsupported

    # Without Ray installed (as here) vLLM refuses the configuration itself; with Ray,
    # the platform's check refuses it, on the configuration as vLLM built it.
    config = host_config(2, 1)
    config.parallel_config.data_parallel_backend = "ray"
    with pytest.raises(ConfigurationError) as excinfo:
        _refuse_unsupported(config, "HOST")
    assert code_of(excinfo) == "TTB202"
    assert "--data-parallel-backend ray is not supported" in str(excinfo.value)
    assert "--headless" in str(excinfo.value)


def test_a_headless_worker_binds_by_local_rank_and_logs_its_global_rank(host_config, caplog):
    from ttbundles.serving.worker import TTWorker

    seen = []
    for local in (0, 1):
        os.environ.pop("TT_VISIBLE_DEVICES", None)  # each rank is a process of its own
        config = host_config(4, 2, 2, headless=True)
        # What vLLM's run_engine_core does for a dense rank of this host.
        parallel = config.parallel_config
        parallel.data_parallel_rank_local = local
        parallel.data_parallel_index = 2 + local
        parallel.reconfigure_for_independent_dp_rank()
        worker = TTWorker(config, 0, 0, "tcp://127.0.0.1:0", True)
        with caplog.at_level("INFO", logger="vllm.ttbundles"):
            worker.init_device()
        seen.append((os.environ["TT_VISIBLE_DEVICES"], worker.mesh_device.device_ids))
    assert seen == [("0", (0,)), ("1", (1,))]
    assert f"for local DP rank 1 (DP rank 3 of 4 on host {HOST}, a 1x1 submesh" in caplog.text


# --- single-execute bundles: one engine per host, lanes inside -------------------------


@pytest.fixture
def lanes_bundle(tmp_path, monkeypatch):
    """A single-execute bundle from EXTRA_MODELS_DIR (its adapter is only found here)."""
    package = tmp_path / "lib" / "tt_models"
    package.mkdir(parents=True)
    (package / "__init__.py").touch()
    (package / "galaxy.py").write_text("class Generator: ...\n")
    document = metadata(
        "galaxy",
        arch="LlamaForCausalLM",
        main_class="tt_models.galaxy:Generator",
        main_class_source="environment",
        capabilities={"execution": "single"},
    )
    write_bundle(tmp_path / "models" / "galaxy", document=document)
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))


def test_lanes_on_several_hosts_are_one_engine_per_host(host_config, lanes_bundle):
    head = host_config(8, 4, max_num_seqs=2)
    other = host_config(8, 4, 4, headless=True, max_num_seqs=2)
    for config, engine in ((head, 0), (other, 1)):
        plan = config.additional_config["ttbundles"]
        parallel = config.parallel_config
        assert plan["lanes"] == 4 and plan["device_groups"] == []
        # vLLM sees two engines, one on each host; this one is engine `engine`.
        assert (parallel.data_parallel_size, parallel.data_parallel_size_local) == (2, 1)
        assert parallel.data_parallel_rank == engine
        # Unset, as vLLM leaves it for a server: a set one would be offline mode (no DP
        # coordinator on the head, whose balancer then fails to start).
        assert parallel.data_parallel_rank_local is None
        assert parallel.distributed_executor_backend == "uni"
        assert config.scheduler_config.max_num_seqs == 8
        reason = decision(config)["reason"]
        assert "one engine per host, 4 in-process lanes in each" in reason
        assert f"this host ({HOST}) runs engine {engine}" in reason
        assert f"the other hosts run engine {1 - engine}" in reason
        assert decision(config, "max_num_seqs")["reason"].startswith("2 per lane x 4 lanes")
    assert "lanes 4-7" in decision(other)["reason"]


@pytest.mark.parametrize(("size", "local", "start"), [(8, 3, None), (8, 4, 2)])
def test_lanes_the_hosts_cannot_agree_on_are_refused(host_config, lanes_bundle, size, local, start):
    with pytest.raises(ConfigurationError) as excinfo:
        host_config(size, local, start, headless=start is not None)
    assert code_of(excinfo) == "TTB202"
    message = str(excinfo.value)
    assert f"host {HOST}: --data-parallel-size={size} --data-parallel-size-local={local}" in (
        message
    )
    assert "every host must run the same number of lanes" in message


# --- `ttbundle plan` with the same flags --------------------------------------------------


def test_ttbundle_plan_shows_each_host_s_layout(run_cli, demo_checkpoint):
    flags = ["--data-parallel-size", "4", "--data-parallel-size-local", "2"]
    flags += ["--data-parallel-address", "10.0.0.1", "--data-parallel-rpc-port", "13345"]
    base = ["plan", str(demo_checkpoint), *flags, "--format", "json"]
    done = run_cli(*base, "--mesh", "T3K", "--headless", "--data-parallel-start-rank", "2")
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["device_groups"] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # this host's own T3K
    reason = {d["setting"]: d for d in plan["decisions"]}["data_parallel_size"]["reason"]
    assert "runs DP ranks 2-3 of 4" in reason and "rank 2 -> [0, 1, 2, 3]" in reason
    assert "handshake at 10.0.0.1:13345" in reason
    small = run_cli(*base[:-2], "--mesh", "N150", "--headless", "--data-parallel-start-rank", "2")
    assert small.returncode == 1
    assert "Traceback" not in small.stderr
    assert f"host {HOST} (DP ranks 2-3 of 4): --data-parallel-size-local=2: mesh N150" in (
        " ".join(small.stderr.split())
    )
