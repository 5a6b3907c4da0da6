"""Multi-process data parallelism: splitting the mesh into device groups, binding a rank.

The split and the binding are plain functions; the plan and the worker are driven through
the real vLLM configuration (`EngineArgs.create_engine_config`, the platform hook) and
the real TT worker on the host mesh. TT-Metal's side of the split (a subprocess that
opens the parent mesh and creates the submeshes) runs against a twin of the three ttnn
calls it makes, written to a temporary folder: there is no TT hardware here.
"""

from __future__ import annotations

import json
import os
import sys
import types

import pytest

from ttbundles.errors import ConfigurationError
from ttbundles.serving.planning import device_groups
from ttbundles.serving.planning.device_groups import (
    CACHE_VARIABLE,
    bind_rank,
    check_no_user_binding,
    host_groups,
    plan_groups,
    split_logical,
    submesh_shape,
)


def code_of(excinfo) -> str:
    return excinfo.value.diagnostics[0].code


# --- the split --------------------------------------------------------------------------


def test_a_row_of_chips_splits_into_contiguous_groups():
    groups = split_logical((1, 8), 2, "T3K")
    assert groups.submesh_shape == (1, 4)
    assert groups.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert split_logical((1, 8), 4, "T3K").groups == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert split_logical((1, 2), 2, "N300").groups == ((0,), (1,))


def test_a_galaxy_splits_by_columns_first_then_rows():
    by_columns = split_logical((8, 4), 4, "TG")
    assert by_columns.submesh_shape == (8, 1)
    assert by_columns.groups[0] == tuple(range(0, 32, 4))  # column 0, row-major ids
    assert by_columns.groups[3] == tuple(range(3, 32, 4))
    halves = split_logical((8, 4), 2, "TG")
    assert halves.submesh_shape == (8, 2)
    assert halves.groups[1][:2] == (2, 3)
    by_rows = split_logical((8, 4), 8, "TG")
    assert by_rows.submesh_shape == (1, 4)
    assert by_rows.groups[7] == (28, 29, 30, 31)
    # Every chip in exactly one group.
    for groups in (by_columns, halves, by_rows):
        assert sorted(i for g in groups.groups for i in g) == list(range(32))


def test_an_uneven_split_is_refused_with_the_sizes_that_work():
    with pytest.raises(ConfigurationError) as excinfo:
        submesh_shape((1, 8), 3, "T3K")
    assert code_of(excinfo) == "TTB212"
    message = str(excinfo.value)
    assert "T3K (1x8, 8 chips)" in message and "3 equal submeshes" in message
    assert "--data-parallel-size 2 or 4 or 8" in message
    with pytest.raises(ConfigurationError):
        submesh_shape((1, 1), 2, "N150")  # more ranks than chips


def test_the_host_mesh_gives_each_rank_a_host_submesh():
    groups = host_groups(3)
    assert groups.submesh_shape == (1, 1)
    assert groups.groups == ((0,), (1,), (2,))
    assert plan_groups("host", 2, environ={}).groups == ((0,), (1,))
    assert groups.describe() == "rank 0 -> [0], rank 1 -> [1], rank 2 -> [2]"


def test_without_tt_metal_a_card_is_split_from_its_shape():
    groups = plan_groups("T3K", 2, environ={})
    assert groups.source == "logical" and groups.groups == ((0, 1, 2, 3), (4, 5, 6, 7))
    with pytest.raises(ConfigurationError) as excinfo:
        plan_groups("not-a-mesh", 2, environ={})
    assert code_of(excinfo) == "TTB106" and "not-a-mesh" in str(excinfo.value)


# --- TT-Metal's split, against a ttnn twin ----------------------------------------------

# The ttnn calls the discovery subprocess makes, with TT-Metal's names and shapes: a mesh
# whose physical chip ids are not row-major (as on a real T3K), split into submeshes.
TTNN_TWIN = """
import os, time
PHYSICAL = [4, 0, 3, 7, 5, 1, 2, 6]

class MeshShape:
    def __init__(self, rows, columns):
        self.rows, self.columns = rows, columns

class _Mesh:
    def __init__(self, ids):
        self._ids = ids
    def get_device_ids(self):
        return list(self._ids)
    def create_submeshes(self, shape):
        size = shape.rows * shape.columns
        return [_Mesh(self._ids[i:i + size]) for i in range(0, len(self._ids), size)]

def open_mesh_device(shape):
    if os.environ.get("TWIN_HANG"):
        time.sleep(60)
    if os.environ.get("TWIN_FAIL"):
        raise RuntimeError("No chips detected in the cluster")
    return _Mesh(PHYSICAL[: shape.rows * shape.columns])

def close_mesh_device(mesh):
    pass
"""


@pytest.fixture
def ttnn_twin(tmp_path, monkeypatch):
    (tmp_path / "ttnn.py").write_text(TTNN_TWIN)
    monkeypatch.syspath_prepend(str(tmp_path))  # this process finds it (find_spec) ...
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # ... and so does the subprocess
    monkeypatch.delenv("TWIN_HANG", raising=False)
    monkeypatch.delenv("TWIN_FAIL", raising=False)
    yield
    sys.modules.pop("ttnn", None)


def test_tt_metal_says_the_physical_ids_and_children_reuse_them(ttnn_twin):
    environ: dict[str, str] = {}
    groups = plan_groups("T3K", 2, environ=environ)
    assert groups.source == "discovered"
    assert groups.submesh_shape == (1, 4)
    assert groups.groups == ((4, 0, 3, 7), (5, 1, 2, 6))
    # Handed down: a child process planning again does not open the mesh again.
    assert json.loads(environ[CACHE_VARIABLE])["groups"] == [[4, 0, 3, 7], [5, 1, 2, 6]]
    environ[CACHE_VARIABLE] = environ[CACHE_VARIABLE].replace("[4, 0, 3, 7]", "[9, 9, 9, 9]")
    assert plan_groups("T3K", 2, environ=environ).groups[0] == (9, 9, 9, 9)
    # A record for another mesh or rank count is not reused.
    assert plan_groups("T3K", 4, environ=environ).groups[0] == (4, 0)
    assert "ttnn" not in sys.modules  # TT-Metal ran in the subprocess only


def test_a_mesh_that_does_not_open_is_a_clear_error(ttnn_twin, monkeypatch):
    monkeypatch.setenv("TWIN_FAIL", "1")
    with pytest.raises(ConfigurationError) as excinfo:
        plan_groups("T3K", 2, environ={})
    assert code_of(excinfo) == "TTB213"
    assert "No chips detected in the cluster" in str(excinfo.value)


def test_a_mesh_that_hangs_times_out(ttnn_twin, monkeypatch):
    monkeypatch.setenv("TWIN_HANG", "1")
    with pytest.raises(ConfigurationError) as excinfo:
        device_groups.discover_submeshes("T3K", (1, 8), (1, 4), timeout=2.0)
    assert code_of(excinfo) == "TTB213" and "within 2 s" in str(excinfo.value)


# --- binding a rank ---------------------------------------------------------------------


def test_binding_sets_the_rank_s_group():
    environ: dict[str, str] = {}
    assert bind_rank([[0, 1], [2, 3]], 1, environ) == "2,3"
    assert environ["TT_VISIBLE_DEVICES"] == "2,3"
    assert bind_rank([[0, 1], [2, 3]], 1, environ) == "2,3"  # the same value again: fine


@pytest.mark.parametrize("rank", [2, None])
def test_a_rank_without_a_group_is_refused(rank):
    with pytest.raises(ConfigurationError) as excinfo:
        bind_rank([[0], [1]], rank, {})
    assert code_of(excinfo) == "TTB212" and "has no device group" in str(excinfo.value)


def test_a_different_binding_in_the_environment_is_refused():
    environ = {"TT_VISIBLE_DEVICES": "0,1"}
    with pytest.raises(ConfigurationError) as excinfo:
        bind_rank([[0, 1], [2, 3]], 1, environ)
    assert code_of(excinfo) == "TTB212" and "conflicts with its device group 2,3" in str(
        excinfo.value
    )
    assert environ["TT_VISIBLE_DEVICES"] == "0,1"


def test_binding_after_tt_metal_was_imported_is_refused(monkeypatch):
    monkeypatch.setitem(sys.modules, "ttnn", types.ModuleType("ttnn"))
    with pytest.raises(ConfigurationError) as excinfo:
        bind_rank([[0], [1]], 0, {})
    assert code_of(excinfo) == "TTB212" and "TT-Metal was imported" in str(excinfo.value)


def test_a_server_wide_device_choice_conflicts_with_per_rank_groups():
    with pytest.raises(ConfigurationError) as excinfo:
        check_no_user_binding({"TT_VISIBLE_DEVICES": "0"}, None, 2)
    assert code_of(excinfo) == "TTB212" and "unset TT_VISIBLE_DEVICES" in str(excinfo.value)
    with pytest.raises(ConfigurationError) as excinfo:
        check_no_user_binding({}, [0, 1], 2)
    assert "--device-ids [0, 1]" in str(excinfo.value)
    check_no_user_binding({}, None, 2)


# --- through vLLM's configuration and the real worker -----------------------------------


@pytest.fixture
def dp_config(demo_checkpoint, monkeypatch):
    """A `--data-parallel-size 2` configuration of the demo bundle, as vllm serve makes it."""
    import vllm  # noqa: F401 - required: a missing or broken vllm fails
    from vllm.engine.arg_utils import EngineArgs

    # Recorded, so that what the workers below set is undone after the test.
    monkeypatch.setenv("TT_VISIBLE_DEVICES", "")
    monkeypatch.delenv("TT_VISIBLE_DEVICES")
    monkeypatch.delenv("EXTRA_MODELS_DIR", raising=False)

    def make(**kwargs):
        kwargs.setdefault("max_model_len", 256)
        kwargs.setdefault("max_num_seqs", 4)
        return EngineArgs(
            model=str(demo_checkpoint), data_parallel_size=2, **kwargs
        ).create_engine_config()

    return make


def test_the_plan_holds_each_rank_s_group(dp_config):
    config = dp_config()
    plan = config.additional_config["ttbundles"]
    assert plan["device_groups"] == [[0], [1]]
    assert plan["submesh_shape"] == [1, 1]
    assert config.parallel_config.data_parallel_size == 2  # two engines, not lanes
    assert plan["lanes"] == 1
    decisions = {d["setting"]: d for d in plan["decisions"]}
    reason = decisions["data_parallel_size"]["reason"]
    assert "2 engine cores" in reason and "rank 0 -> [0], rank 1 -> [1]" in reason
    assert "max_num_seqs=4 per rank, 8 in total" in reason
    assert config.scheduler_config.max_num_seqs == 4  # per rank, as vLLM has it
    assert config.parallel_config.distributed_executor_backend == "uni"


def test_the_plan_refuses_a_server_wide_binding(dp_config, monkeypatch):
    monkeypatch.setenv("TT_VISIBLE_DEVICES", "0")
    with pytest.raises(ConfigurationError) as excinfo:
        dp_config()
    assert code_of(excinfo) == "TTB212"
    monkeypatch.delenv("TT_VISIBLE_DEVICES")
    with pytest.raises(ConfigurationError) as excinfo:
        dp_config(device_ids=[0, 1])
    assert code_of(excinfo) == "TTB212" and "--device-ids" in str(excinfo.value)


def test_each_worker_binds_its_own_group_and_sizes_its_own_kv_cache(dp_config, monkeypatch):
    from ttbundles.serving.worker import TTWorker

    seen = []
    for rank in (0, 1):
        os.environ.pop("TT_VISIBLE_DEVICES", None)  # each rank is a process of its own
        config = dp_config()
        # What vLLM's run_engine_core does for a dense rank before building its engine.
        config.parallel_config.data_parallel_rank_local = rank
        config.parallel_config.reconfigure_for_independent_dp_rank()
        worker = TTWorker(config, 0, 0, "tcp://127.0.0.1:0", True)
        worker.init_device()
        worker.load_model()
        seen.append((os.environ["TT_VISIBLE_DEVICES"], worker.mesh_device.device_ids))
        blocks = worker.determine_available_memory() // (
            worker.get_cache_block_size_bytes() * len(worker.get_kv_cache_spec())
        )
        # Room for this rank's 4 sequences of 256 tokens, not 8 (vLLM's default block
        # size: 16 tokens in 0.33.0, 64 in 0.34.0).
        block = worker.cache_config.block_size
        assert block in (16, 64)
        assert blocks == 4 * 256 // block + 1
    assert seen == [("0", (0,)), ("1", (1,))]


def test_a_worker_whose_rank_has_no_group_stops_before_the_mesh(dp_config, caplog):
    """One error line, and (outside `vllm serve`, as here) the error to the caller."""
    from ttbundles.serving.worker import TTWorker

    config = dp_config()
    config.parallel_config.data_parallel_rank_local = 2
    worker = TTWorker(config, 0, 0, "tcp://127.0.0.1:0", True)
    with pytest.raises(ConfigurationError) as excinfo:
        worker.init_device()
    assert code_of(excinfo) == "TTB212"
    assert "rank 2 has no device group" in caplog.text
    assert worker.mesh_device is None


def test_a_rank_writes_its_own_stats_file():
    from ttbundles.serving.worker import rank_stats_path

    assert rank_stats_path("/tmp/x/stats.json", 1) == "/tmp/x/stats.dp1.json"
    assert rank_stats_path("/tmp/x.d/stats", 0) == "/tmp/x.d/stats.dp0"


# --- `ttbundle plan` says the topology ---------------------------------------------------


def test_ttbundle_plan_shows_the_ranks_and_their_device_groups(run_cli, demo_checkpoint):
    args = ["plan", "--model", demo_checkpoint, "--data-parallel-size", "2"]
    done = run_cli(*args, "--mesh", "HOST", "--format", "json", timeout=300)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["device_groups"] == [[0], [1]]
    human = run_cli(*args, "--mesh", "HOST", timeout=300)
    assert human.returncode == 0, human.stderr
    text = " ".join(human.stdout.split())  # the table wraps long reasons
    assert "data_parallel_size" in text and "2 engine cores" in text
    card = run_cli(*args, "--mesh", "T3K", "--format", "json", timeout=300)
    assert card.returncode == 0, card.stderr
    decisions = {d["setting"]: d for d in json.loads(card.stdout)["decisions"]}
    assert (
        "rank 0 -> [0, 1, 2, 3], rank 1 -> [4, 5, 6, 7]"
        in (decisions["data_parallel_size"]["reason"])
    )


def test_ttbundle_plan_refuses_an_uneven_split_and_a_server_wide_binding(run_cli, demo_checkpoint):
    base = ["plan", "--model", demo_checkpoint]
    uneven = run_cli(*base, "--mesh", "T3K", "--data-parallel-size", "3", timeout=300)
    assert uneven.returncode == 1
    assert "TTB212" in uneven.stderr and "Traceback" not in uneven.stderr
    bound = run_cli(
        *base,
        "--mesh",
        "HOST",
        "--data-parallel-size",
        "2",
        env={"TT_VISIBLE_DEVICES": "0"},
        timeout=300,
    )
    assert bound.returncode == 1
    assert "TTB212" in bound.stderr and "TT_VISIBLE_DEVICES=0" in bound.stderr


def test_ttbundle_plan_keeps_refusing_moe_with_several_engines(
    run_cli, moe_checkpoint, tmp_path, make_bundle
):
    moe = moe_checkpoint
    make_bundle("mixtral", metadata={"arch": "MixtralForCausalLM"}, parent=tmp_path / "models")
    done = run_cli(
        "plan",
        "--model",
        moe,
        "--mesh",
        "HOST",
        "--data-parallel-size",
        "2",
        env={"EXTRA_MODELS_DIR": str(tmp_path / "models"), "TT_VLLM_BUILTIN_MODELS": "0"},
        timeout=300,
    )
    assert done.returncode == 1
    assert "TTB207" in done.stderr and "Traceback" not in done.stderr
