"""Output people and scripts can trust (issue 23), each run as a user runs it: the
installed `ttbundle` in a subprocess, from a working folder, with relative paths and
output piped (not a terminal)."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from ttbundles.codes import CODES
from ttbundles.demo.server import port_is_free

DIAGNOSTIC_KEYS = {"code", "severity", "message", "file", "pointer", "line", "column", "hint"}


def envelope(done, code: int) -> dict:
    """The one JSON shape, with `ok` matching the exit status."""
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == code, (done.stdout, done.stderr)
    data = json.loads(done.stdout)
    assert list(data)[0] == "ok" and list(data)[-1] == "diagnostics"
    assert data["ok"] is (code == 0)
    assert all(set(d) == DIAGNOSTIC_KEYS and d["code"] in CODES for d in data["diagnostics"])
    return data


@pytest.fixture
def workdir(tmp_path, demo_checkpoint):
    """A working folder with the tiny checkpoint at ./ckpt and a copy of the demo bundle
    at ./demo, as a user has them."""
    from ttbundles.paths import builtin_bundles_dir

    shutil.copytree(demo_checkpoint, tmp_path / "ckpt")
    shutil.copytree(builtin_bundles_dir() / "demo", tmp_path / "demo")
    return tmp_path


# --- --format json on every command ---------------------------------------------------


def test_json_on_pack_init_schema_demo(run_cli, workdir):
    packed = envelope(run_cli("pack", "demo", "-o", "dist", "-f", "json", cwd=workdir), 0)
    assert packed["path"] == "dist/demo-1.0.0.ttbundle" and packed["name"] == "demo"
    assert packed["root_digest"].startswith("sha256:")
    made = envelope(
        run_cli("init", "new", "--arch", "LlamaForCausalLM", "-f", "json", cwd=workdir), 0
    )
    assert made["folder"] == "new" and (workdir / "new" / "vllm_metadata.json").is_file()
    schema = envelope(run_cli("schema", "--format", "json", cwd=workdir), 0)
    assert schema["schema"]["type"] == "object"
    written = envelope(run_cli("demo", "--write-checkpoint", "tiny", "-f", "json", cwd=workdir), 0)
    assert written["path"].endswith("tiny") and (workdir / "tiny" / "config.json").is_file()


def test_list_ok_is_the_exit_status(run_cli, workdir):
    """A broken bundle among others: exit 0 (the server starts), so `ok` is true and the
    error is among the diagnostics; a mesh the server refuses: exit 1, `ok` false."""
    broken = workdir / "models" / "broken"
    broken.mkdir(parents=True)
    (broken / "vllm_metadata.json").write_text("{")
    env = {"EXTRA_MODELS_DIR": "models", "MESH_DEVICE": "HOST"}
    data = envelope(run_cli("list", "-f", "json", env=env, cwd=workdir), 0)
    assert "TTB010" in [d["code"] for d in data["diagnostics"]]
    envelope(run_cli("list", "-f", "json", env={**env, "MESH_DEVICE": "NOPE"}, cwd=workdir), 1)


def test_list_names_a_bundle_with_invalid_metadata_by_its_folder(run_cli, workdir):
    """Not `-@-`: the folder, and that a built-in serves the architecture instead."""
    models = workdir / "models"
    shutil.copytree(workdir / "demo", models / "my-demo")
    meta = models / "my-demo" / "vllm_metadata.json"
    meta.write_text(meta.read_text().replace('"adapter:DemoGenerator"', '"adapter:Nope"'))
    (models / "broken").mkdir()
    (models / "broken" / "vllm_metadata.json").write_text("{")
    env = {"EXTRA_MODELS_DIR": "models", "MESH_DEVICE": "HOST"}
    done = run_cli("list", env=env, cwd=workdir)
    assert done.returncode == 0, done.stderr
    assert "-@-" not in done.stdout
    assert "broken (folder)" in done.stdout
    assert (
        "note: TTLlamaForCausalLM: extra bundle demo@1.0.0 (models/my-demo) was skipped; "
        "demo@1.0.0 (built-in" in done.stdout
    )


# --- the demo's port ----------------------------------------------------------------


def test_a_port_held_only_by_closed_connections_is_free():
    """After a server stops, its port's connections linger in TIME_WAIT: a new server
    (uvicorn sets SO_REUSEADDR) can listen there, so `demo --port` must not refuse it;
    a port something listens on is still refused."""
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vllm serve's listener
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    assert not port_is_free("127.0.0.1", port)
    accepted.close()  # the server side closes first: its port's connection in TIME_WAIT
    client.close()
    server.close()
    assert port_is_free("127.0.0.1", port)


# --- plan: the server's code path, the server's words, only its own output ------------


@pytest.mark.vllm
def test_plan_is_quiet_and_uses_the_servers_defaults(run_cli, workdir):
    done = run_cli("plan", "./ckpt", "--mesh", "HOST", "-f", "json", cwd=workdir, timeout=300)
    data = envelope(done, 0)
    assert done.stderr == ""  # vLLM's log is captured
    seqs = next(d for d in data["decisions"] if d["setting"] == "max_num_seqs")
    assert seqs["requested"] == 256  # vllm serve's default (the offline LLM class's is 128)
    verbose = run_cli("plan", "./ckpt", "--mesh", "HOST", "-v", cwd=workdir, timeout=300)
    assert verbose.returncode == 0
    assert "Resolved architecture: LlamaForCausalLM" in verbose.stderr
    assert "TTLlamaForCausalLM: demo@1.0.0" in verbose.stdout


@pytest.mark.vllm
def test_plan_fails_with_the_servers_error_text(run_cli, workdir):
    done = run_cli(
        "plan", "./ckpt", "--mesh", "HOST", "--max-model-len", "4096", cwd=workdir, timeout=300
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith("error TTB209 ModelConfig: User-specified max_model_len (4096)")
    assert "pydantic.dev" not in done.stderr and "INFO" not in done.stderr


def test_a_missing_model_folder_is_ttb001_before_vllm_loads(run_cli, workdir):
    done = run_cli("plan", "./nope", "--mesh", "HOST", cwd=workdir)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == "./nope: error TTB001 no such model checkpoint folder"
