"""The vLLM entry points: platform activation, registration in every process, isolation
of bundle modules, the startup policies, and `ttbundle plan` agreeing with the server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from importlib import metadata

import pytest
import vllm  # noqa: F401 - required: a missing or broken vllm fails

from tests.bundle_factory import contract_adapter
from ttbundles.errors import ConfigurationError
from ttbundles.registry.registry import Status, compute

# Two bundles with the same module names, told apart by what helper.py says.
ADAPTER = contract_adapter(preamble="from .helper import WHO\n", attributes="    who = WHO\n")


def write_bundle(parent, name, arch, who, **fields):
    folder = parent / name
    folder.mkdir(parents=True)
    (folder / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": name,
                "version": "1.0.0",
                "arch": arch,
                "main_class": "adapter:Generator",
                **fields,
            }
        )
    )
    (folder / "adapter.py").write_text(ADAPTER)
    (folder / "helper.py").write_text(f"WHO = {who!r}\n")
    return folder


@pytest.fixture
def two_bundles(tmp_path, monkeypatch):
    """Two bundles that both ship adapter.py and helper.py, for different architectures."""
    models = tmp_path / "models"
    write_bundle(models, "alpha", "AlphaForCausalLM", "alpha")
    write_bundle(models, "beta", "BetaForCausalLM", "beta")
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(models))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    return models


def test_platform_activates_where_mesh_device_is_set_or_ttnn_is_found(monkeypatch):
    from ttbundles.serving.plugin import PLATFORM_QUALNAME, platform_plugin

    monkeypatch.setenv("MESH_DEVICE", "HOST")
    assert platform_plugin() == PLATFORM_QUALNAME
    monkeypatch.delenv("MESH_DEVICE")
    assert platform_plugin() is None  # no ttnn on this machine: inert
    monkeypatch.setenv("MESH_DEVICE", "")
    assert platform_plugin() is None
    # Set at all: ours, so that a missing TT-Metal or a wrong value is reported by us.
    monkeypatch.setenv("MESH_DEVICE", "t3k")
    assert platform_plugin() == PLATFORM_QUALNAME
    assert os.environ["MESH_DEVICE"] == "T3K"  # canonical, for TT-Metal's exact lookups
    monkeypatch.setenv("MESH_DEVICE", "N3000")
    assert platform_plugin() == PLATFORM_QUALNAME
    assert os.environ["MESH_DEVICE"] == "N3000"  # left for the startup error to name


def test_plugin_import_is_light():
    code = (
        "import sys, ttbundles.serving.plugin; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & "
        "{'vllm', 'torch', 'pydantic', 'ttnn', 'transformers', 'numpy'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.server  # starts vLLM processes: the slow tier
def test_registration_imports_no_adapter(two_bundles):
    code = (
        "import sys; from ttbundles.serving.registration import register_all; "
        "r = register_all(); print(sorted(r.registered)); "
        "print([m for m in sys.modules if m.startswith('_ttb_')])"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=os.environ
    )
    lines = done.stdout.strip().splitlines()
    assert lines[-2] == "['TTAlphaForCausalLM', 'TTBetaForCausalLM']"
    assert lines[-1] == "[]"


def _load_both():
    from vllm.model_executor.models.registry import ModelRegistry

    out = []
    for arch in ("TTAlphaForCausalLM", "TTBetaForCausalLM"):
        cls = ModelRegistry.models[arch].load_model_cls()
        out.append((cls.__module__, cls.who))
    return out


@pytest.mark.server  # starts vLLM processes: the slow tier
def test_vllm_inspection_subprocess_imports_bundles_side_by_side(two_bundles):
    from vllm.model_executor.models.registry import _run_in_subprocess

    from ttbundles.serving.registration import register_all

    register_all()
    loaded = _run_in_subprocess(_load_both)  # vLLM's own inspection subprocess
    (module_a, who_a), (module_b, who_b) = loaded
    assert (who_a, who_b) == ("alpha", "beta")
    assert module_a != module_b
    assert module_a.startswith("_ttb_alpha_") and module_a.endswith(".adapter")
    assert "bundles" not in " ".join(sys.path)


WORKER_LIKE = """
from vllm.plugins import load_general_plugins
from vllm.model_executor.models.registry import ModelRegistry

load_general_plugins()  # what every vLLM worker process does first
for arch in ("TTAlphaForCausalLM", "TTBetaForCausalLM"):
    cls = ModelRegistry.models[arch].load_model_cls()
    print(cls.__module__, cls.who)
"""


@pytest.mark.server  # starts vLLM processes: the slow tier
def test_a_fresh_process_registers_and_imports_the_same_way(two_bundles):
    done = subprocess.run(
        [sys.executable, "-c", WORKER_LIKE],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()[-2:]
    assert [line.split()[1] for line in lines] == ["alpha", "beta"]
    assert lines[0].split()[0].startswith("_ttb_alpha_")


def test_broken_bundle_is_skipped_or_fatal_under_strict(tmp_path, monkeypatch):
    from ttbundles.serving.registration import register_all

    models = tmp_path / "models"
    write_bundle(models, "good", "GoodForCausalLM", "good")
    broken = write_bundle(models, "broken", "BrokenForCausalLM", "broken")
    (broken / "vllm_metadata.json").write_text('{"schema_version": 1, "name": "broken"')
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(models))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    registry = register_all()
    skipped = [e for e in registry.entries if e.status is Status.SKIPPED]
    assert [e.path.name for e in skipped] == ["broken"]
    assert skipped[0].reason.startswith("invalid: TTB010")
    assert list(registry.registered) == ["TTGoodForCausalLM"]
    monkeypatch.setenv("TT_BUNDLES_STRICT", "1")
    with pytest.raises(ConfigurationError) as excinfo:
        register_all()
    assert excinfo.value.diagnostics[0].code == "TTB010"


def test_requirements_are_checked_against_the_environment(tmp_path):
    models = tmp_path / "models"
    write_bundle(
        models, "future", "FutureForCausalLM", "x", requires={"vllm": ">=99", "python": ">=3.8"}
    )
    write_bundle(models, "needs-ttnn", "TtnnForCausalLM", "x", requires={"ttnn": ">=0.1"})
    registry = compute({"TT_VLLM_BUILTIN_MODELS": "0"}, models_dirs=[models])
    reasons = {e.path.name: e.reason for e in registry.entries}
    installed = metadata.version("vllm")
    assert reasons["future"] == f"TTB100 requires vllm>=99, but vllm {installed} is installed"
    assert reasons["needs-ttnn"] == "TTB100 requires ttnn>=0.1, but ttnn is not installed"
    assert registry.registered == {}


def test_conflicting_extras_first_wins_with_a_warning(tmp_path):
    first, second = tmp_path / "a", tmp_path / "b"
    write_bundle(first, "one", "SameForCausalLM", "one")
    write_bundle(second, "two", "SameForCausalLM", "two")
    registry = compute({"TT_VLLM_BUILTIN_MODELS": "0"}, models_dirs=[first, second])
    assert registry.registered["TTSameForCausalLM"].metadata.name == "one"
    (warning,) = [d for d in registry.problems if d.code == "TTB071"]
    assert "one@1.0.0" in warning.message and "two@1.0.0" in warning.message


@pytest.mark.server  # starts vLLM processes: the slow tier
def test_plan_cli_matches_the_server_hook(tmp_path, monkeypatch, demo_checkpoint):
    from vllm.engine.arg_utils import EngineArgs

    models = tmp_path / "models"
    folder = models / "plain"
    folder.mkdir(parents=True)
    (folder / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": "plain",
                "version": "2.0",
                "arch": "LlamaForCausalLM",
                "main_class": "tt_models.plain:Generator",
                "main_class_source": "environment",
                "capabilities": {"prefix_caching": True},
            }
        )
    )
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(models))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    # The class must be importable here: the platform refuses one that is not (TTB058).
    lib = tmp_path / "lib" / "tt_models"
    lib.mkdir(parents=True)
    (lib / "__init__.py").write_text("")
    (lib / "plain.py").write_text("class Generator: ...\n")
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path / "lib"))
    config = EngineArgs(
        model=str(demo_checkpoint), max_model_len=200, max_num_seqs=3
    ).create_engine_config()
    in_process = config.additional_config["ttbundles"]
    ttbundle = os.path.join(os.path.dirname(sys.executable), "ttbundle")
    done = subprocess.run(
        [
            ttbundle,
            "plan",
            "--model",
            str(demo_checkpoint),
            "--mesh",
            "HOST",
            "--format",
            "json",
            "--max-model-len",
            "200",
            "--max-num-seqs",
            "3",
        ],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    planned = json.loads(done.stdout)
    # One difference only: the command line names where max_model_len came from; a
    # configuration built in code has no command line to name.
    sources = {"max_model_len": ("as requested (--max-model-len)", "as requested")}
    for cli, code in zip(planned["decisions"], in_process["decisions"], strict=True):
        if cli["setting"] in sources:
            assert (cli.pop("reason"), code.pop("reason")) == sources[cli["setting"]]
        assert cli == code
    assert planned["bundle"] == in_process["bundle"]
    failed = subprocess.run(
        [ttbundle, "plan", "--model", str(demo_checkpoint), "--tensor-parallel-size", "2"],
        capture_output=True,
        text=True,
        env=os.environ,
        timeout=300,
    )
    assert failed.returncode == 1
    assert "TTB201" in failed.stderr and "Traceback" not in failed.stderr


@pytest.mark.server  # starts vLLM processes: the slow tier
def test_vllm_serve_reports_a_configuration_error_without_a_traceback(demo_checkpoint):
    from tests import zygote  # forked from the test servers' zygote

    vllm_cli = os.path.join(os.path.dirname(sys.executable), "vllm")
    command = [
        vllm_cli,
        "serve",
        str(demo_checkpoint),
        "--port",
        "0",
        "--tensor-parallel-size",
        "2",
    ]
    code, output = zygote.run(command, os.environ, timeout=300)
    assert code == 1
    assert "error TTB201: --tensor-parallel-size=2" in output
    assert "Traceback" not in output
