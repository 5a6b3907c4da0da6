"""Output people and scripts can trust (issue 23), each run as a user runs it: the
installed `ttbundle` in a subprocess, from a working folder, with relative paths and
output piped (not a terminal)."""

from __future__ import annotations

import json
import shutil
import signal
import socket

import pytest

from ttbundles.codes import CODES
from ttbundles.demo.server import port_problem

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
    # Without the evidence the demo ships with: the tests edit their copy.
    shutil.copytree(
        builtin_bundles_dir() / "demo", tmp_path / "demo", ignore=shutil.ignore_patterns("evidence")
    )
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
    (uvicorn sets SO_REUSEADDR) can listen there, so `demo --port` must not refuse it
    (tests/e2e/test_serving.py serves the demo on such a port)."""
    from tests.conftest import time_wait_port

    assert port_problem("127.0.0.1", time_wait_port()) is None


def test_demo_on_a_port_something_listens_on_is_ttb210_before_any_work(run_cli, tmp_path):
    """A listener holds the port: TTB210 saying so, before the checkpoint is prepared
    (nothing is written to the cache), in text and in JSON."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen(1)
        port = held.getsockname()[1]
        env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
        done = run_cli("demo", "--tiny", "--query", "--port", port, env=env, cwd=tmp_path)
        assert (done.returncode, done.stdout) == (1, ""), done.stderr
        assert done.stderr.startswith(
            f"error TTB210 port {port} on 127.0.0.1 is in use: something is listening on it"
        )
        assert "fix: choose another --port" in done.stderr
        args = ("demo", "--tiny", "--query", "--port", port, "-f", "json")
        data = envelope(run_cli(*args, env=env, cwd=tmp_path), 1)
        assert [d["code"] for d in data["diagnostics"]] == ["TTB210"]
    assert not (tmp_path / "cache").exists()
    bad = run_cli("demo", "--port", "70000", cwd=tmp_path)
    assert bad.returncode == 2 and "--port" in bad.stderr  # a usage error (TTB004)


# --- plan: the server's code path, the server's words, only its own output ------------


@pytest.mark.server  # builds a vLLM configuration in a subprocess
def test_plan_is_quiet_and_uses_the_servers_defaults(run_cli_process, run_cli, workdir):
    # A process: what vLLM or torch might write to the standard error's file descriptor
    # itself (not through sys.stderr) shows only there.
    done = run_cli_process(
        "plan", "./ckpt", "--mesh", "HOST", "-f", "json", cwd=workdir, timeout=300
    )
    data = envelope(done, 0)
    assert done.stderr == ""  # vLLM's log is captured
    seqs = next(d for d in data["decisions"] if d["setting"] == "max_num_seqs")
    assert seqs["requested"] == 256  # vllm serve's default (the offline LLM class's is 128)
    verbose = run_cli("plan", "./ckpt", "--mesh", "HOST", "--vllm-log", cwd=workdir)
    assert verbose.returncode == 0
    assert "Resolved architecture: LlamaForCausalLM" in verbose.stderr
    assert "TTLlamaForCausalLM: demo@1.0.0" in verbose.stdout


def test_plan_fails_with_the_servers_error_text(run_cli, workdir):
    # A length vLLM refuses itself (one beyond the checkpoint's positions is ours: TTB247).
    done = run_cli(
        "plan", "./ckpt", "--mesh", "HOST", "--max-model-len", "0", cwd=workdir, timeout=300
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(
        "error TTB209 ModelConfig: max_model_len must be a positive integer, got int: 0"
    )
    assert "pydantic.dev" not in done.stderr and "INFO" not in done.stderr


def test_a_missing_model_folder_is_ttb001_before_vllm_loads(run_cli, workdir):
    done = run_cli("plan", "./nope", "--mesh", "HOST", cwd=workdir)
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == "./nope: error TTB001 no such model checkpoint folder"


# --- install: idempotent, explicit about versions, checked like validate -----------------


def _pack(run_cli, cwd, folder: str, version: str) -> tuple[str, str]:
    """Pack ./folder at `version` into ./dist; (archive path, root digest)."""
    meta = cwd / folder / "vllm_metadata.json"
    data = json.loads(meta.read_text())
    data["version"] = version
    meta.write_text(json.dumps(data))
    packed = envelope(run_cli("pack", folder, "-o", "dist", "-f", "json", cwd=cwd), 0)
    return packed["path"], packed["root_digest"]


def test_install_is_idempotent_and_names_versions_and_digests(run_cli, workdir):
    old, old_digest = _pack(run_cli, workdir, "demo", "1.0.0")
    new, new_digest = _pack(run_cli, workdir, "demo", "1.1.0")
    first = run_cli("install", old, "--models-dir", "models", cwd=workdir)
    assert first.stdout == "installed demo 1.0.0 at models/demo\n", first.stderr
    again = run_cli("install", old, "--models-dir", "models", cwd=workdir)
    assert (again.returncode, again.stderr) == (0, "")
    assert again.stdout == f"up to date: demo 1.0.0 ({old_digest[:19]}) at models/demo\n"
    data = envelope(run_cli("install", old, "--models-dir", "models", "-f", "json", cwd=workdir), 0)
    assert data["action"] == "up to date" and data["digest"] == old_digest
    upgrade = run_cli("install", new, "--models-dir", "models", cwd=workdir)
    assert (upgrade.returncode, upgrade.stdout) == (1, "")
    assert (
        f"models/demo: error TTB090 demo 1.0.0 ({old_digest[:19]}) is installed; "
        f"this archive is demo 1.1.0 ({new_digest[:19]}): an upgrade" in upgrade.stderr
    )
    done = run_cli("install", new, "--models-dir", "models", "--replace", cwd=workdir)
    assert done.stdout == (
        "replaced demo 1.0.0 -> 1.1.0 at models/demo "
        f"(upgrade; {old_digest[:19]} -> {new_digest[:19]})\n"
    )
    back = run_cli("install", old, "--models-dir", "models", cwd=workdir)
    assert "demo 1.0.0" in back.stderr and ": a downgrade" in back.stderr
    assert "fix: pass --replace to downgrade" in back.stderr
    down = run_cli("install", old, "--models-dir", "models", "--replace", cwd=workdir)
    assert "replaced demo 1.1.0 -> 1.0.0 at models/demo (downgrade; " in down.stdout


def test_install_refuses_what_validate_refuses_unless_forced(run_cli, workdir):
    """A consistent manifest around an adapter with a syntax error: the archive verifies,
    and install refuses it with validate's error (not a server failing later)."""
    from ttbundles.archive.writer import write_archive  # pack itself refuses such a bundle

    adapter = workdir / "demo" / "adapter.py"
    adapter.write_text(adapter.read_text() + "\ndef broken(:\n")
    write_archive(workdir / "demo", workdir / "dist")
    archive = "dist/demo-1.0.0.ttbundle"
    assert run_cli("verify", archive, cwd=workdir).returncode == 0
    done = run_cli("install", archive, "--models-dir", "models", cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert "error TTB051" in done.stderr and "error TTB093 install refused" in done.stderr
    assert "dist/demo-1.0.0.ttbundle!/adapter.py" in done.stderr
    assert not (workdir / "models" / "demo").exists()
    forced = run_cli("install", archive, "--models-dir", "models", "--force", cwd=workdir)
    assert forced.returncode == 0 and forced.stdout.startswith("installed demo 1.0.0")


# --- smaller items ------------------------------------------------------------------------


def test_a_grid_of_absurd_size_is_not_a_mesh(run_cli, workdir):
    done = run_cli("list", "--mesh", "(100000000000000000000,1)", cwd=workdir)
    assert done.returncode == 1
    assert "TTB106" in done.stderr and "a mesh has at most 1024" in done.stderr


# --- the scaffold -----------------------------------------------------------------------


def test_the_template_fails_validate_strict_until_written(run_cli, workdir):
    made = run_cli("init", "my-llama", "--arch", "LlamaForCausalLM", cwd=workdir)
    assert made.returncode == 0 and made.stdout == "my-llama\n"
    plain = run_cli("validate", "my-llama", cwd=workdir)
    assert plain.returncode == 0 and "warning TTB065" in plain.stdout
    strict = run_cli("validate", "my-llama", "--strict", cwd=workdir)
    assert strict.returncode == 1
    assert "TTB065 TTLlamaForCausalLMGenerator is still the template: " in strict.stdout
    assert "initialize_vllm_model" in strict.stdout and "prefill_forward" in strict.stdout


def test_init_refuses_to_mix_with_an_existing_adapter(run_cli, workdir):
    (workdir / "mine").mkdir()
    (workdir / "mine" / "adapter.py").write_text((workdir / "demo" / "adapter.py").read_text())
    done = run_cli("init", "mine", "--arch", "LlamaForCausalLM", cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert "TTB039" in done.stderr and "--keep-adapter" in done.stderr
    assert not (workdir / "mine" / "vllm_metadata.json").exists()
    kept = run_cli("init", "mine", "--arch", "LlamaForCausalLM", "--keep-adapter", cwd=workdir)
    assert kept.returncode == 0, kept.stderr
    assert "kept the existing mine/adapter.py; main_class is adapter:DemoGenerator" in kept.stderr
    assert run_cli("validate", "mine", cwd=workdir).returncode == 0


# --- ttbundle test: a limit of the settings is a skip, not a failure -------------------------


def test_prefix_cache_at_a_sequence_of_one_block_is_skipped_not_failed():
    from ttbundles.conformance.compare import CaseResult
    from ttbundles.conformance.session import exercised

    served = {"engines": [{"name": "host", "block_size": 32}]}
    short = CaseResult("prefix_cache", "p0", "p0", "reference")
    short.details = {"num_cached_tokens": 0, "prompt_tokens": 9, "prefill_chunks": 1}
    exercised(short, "prefix_cache", served)
    assert short.passed and "does not exceed one block of 32" in short.skipped
    long = CaseResult("prefix_cache", "p0", "p0", "reference")
    long.details = {"num_cached_tokens": 0, "prompt_tokens": 70, "prefill_chunks": 1}
    exercised(long, "prefix_cache", served)
    assert not long.passed and long.failures[0].code == "TTB124" and long.skipped is None


def test_a_prompt_that_fits_one_chunk_is_skipped_not_failed():
    """tests.chunk_size at or above a prompt's length: that prompt cannot be chunked (a
    limit of the settings, skipped with the reason); a longer one prefilled in one step
    is the bundle's failure (TTB124)."""
    from ttbundles.conformance.compare import CaseResult
    from ttbundles.conformance.session import exercised

    served = {"chunk_size": 16, "engines": []}
    short = CaseResult("chunked_prefill", "p0", "p0", "reference")
    short.details = {"num_cached_tokens": 0, "prompt_tokens": 10, "prefill_chunks": 1}
    exercised(short, "chunked_prefill", served)
    assert short.passed and "the prompt of 10 tokens fits one chunk of 16" in short.skipped
    long = CaseResult("chunked_prefill", "p0", "p0", "reference")
    long.details = {"num_cached_tokens": 0, "prompt_tokens": 35, "prefill_chunks": 1}
    exercised(long, "chunked_prefill", served)
    assert not long.passed and long.failures[0].code == "TTB124" and long.skipped is None


def test_a_relative_model_is_resolved_where_it_was_typed(workdir, monkeypatch):
    from ttbundles.paths import model_argument

    monkeypatch.chdir(workdir)
    assert model_argument("./ckpt") == str(workdir / "ckpt")
    assert model_argument("org/model") == "org/model"  # a hub repository id stays


def test_ttbundle_test_refuses_a_missing_relative_model_with_ttb001(run_cli, workdir):
    done = run_cli("test", "demo", "--model", "./nope", cwd=workdir)
    assert done.returncode == 1
    assert "./nope: error TTB001 no such model checkpoint folder" in done.stderr


def test_validate_import_does_not_ask_for_validate_import(run_cli, workdir):
    """A computed capability is TTB040 "run validate --import"; with --import it was
    checked, so the hint says so instead of asking for what was just done."""
    adapter = workdir / "demo" / "adapter.py"
    text = adapter.read_text()
    adapter.write_text(
        text.replace('"supports_prefix_caching": True', '"supports_prefix_caching": bool(1)')
    )
    static = run_cli("validate", "demo", cwd=workdir)
    assert "warning TTB040" in static.stdout and "validate --import" in static.stdout
    done = run_cli("validate", "demo", "--import", "-v", "-f", "json", cwd=workdir, timeout=300)
    data = envelope(done, 0)
    (note,) = [d for d in data["diagnostics"] if d["code"] == "TTB040"]
    assert note["severity"] == "info" and "validate --import" not in note["hint"]


def test_init_from_a_mistyped_hub_id_suggests_the_cached_one(run_cli_process, workdir):
    cache = workdir / "hub"
    snapshot = cache / "models--hf--qwen" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((workdir / "ckpt" / "config.json").read_text())
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    done = run_cli_process("init", "q", "--from-hf", "hf/qwne", env=env, cwd=workdir)
    assert done.returncode == 1 and "TTB208" in done.stderr
    assert "did you mean hf/qwen? (in the hub cache)" in done.stderr


def test_pack_install_and_test_refuse_the_template(run_cli, workdir):
    """What `validate --strict` refuses as "still the template" no archive may carry:
    pack refuses it with validate's own line, install refuses an archive of it (written
    around pack) unless --force, and `ttbundle test` says so before serving anything."""
    from ttbundles.archive.writer import write_archive

    assert run_cli("init", "my-llama", "--arch", "LlamaForCausalLM", cwd=workdir).returncode == 0
    strict = run_cli("validate", "my-llama", "--strict", cwd=workdir)
    (line,) = [x for x in strict.stdout.splitlines() if "TTB065" in x]
    assert line.startswith("my-llama/adapter.py:") and "still the template" in line
    # The readback methods count only where async_decode is declared.
    assert line.endswith(
        "initialize_vllm_model, prefill_forward, decode_forward, allocate_kv_cache only "
        "raise NotImplementedError"
    )
    packed = run_cli("pack", "my-llama", "-o", "dist", cwd=workdir)
    assert (packed.returncode, packed.stdout) == (1, "")
    assert packed.stderr.splitlines()[0] == line
    assert not (workdir / "dist").exists()
    data = envelope(run_cli("pack", "my-llama", "-o", "dist", "-f", "json", cwd=workdir), 1)
    assert [(d["code"], d["severity"]) for d in data["diagnostics"]] == [("TTB065", "error")]

    write_archive(workdir / "my-llama", workdir / "dist")
    archive = "dist/my-llama-0.1.0.ttbundle"
    done = run_cli("install", archive, "--models-dir", "models", cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert f"{archive}!/adapter.py:" in done.stderr and "error TTB065" in done.stderr
    assert "error TTB093 install refused" in done.stderr
    assert not (workdir / "models" / "my-llama").exists()
    forced = run_cli("install", archive, "--models-dir", "models", "--force", cwd=workdir)
    assert forced.stdout == "installed my-llama 0.1.0 at models/my-llama\n", forced.stderr

    tested = run_cli("test", "my-llama", "--model", "./ckpt", cwd=workdir)
    assert (tested.returncode, tested.stdout) == (1, "")
    assert tested.stderr.splitlines()[0] == line
    tested = run_cli("test", archive, "--model", "./ckpt", cwd=workdir)
    assert tested.returncode == 1 and f"{archive}!/adapter.py:" in tested.stderr


def test_pack_into_a_place_it_cannot_write_is_ttb089(run_cli, workdir):
    """An output "folder" that is a file: the archive cannot be written, said as such (not
    TTB080, which is an archive that cannot be read)."""
    done = run_cli("pack", "demo", "-o", "demo/adapter.py/dist", cwd=workdir)
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr.startswith(
        "demo/adapter.py/dist/demo-1.0.0.ttbundle: error TTB089 cannot write demo-1.0.0.ttbundle"
    ), done.stderr


def test_a_written_template_packs(run_cli, workdir):
    """Once its methods are written the bundle packs: the refusal is about the template,
    not about a bundle made by init."""
    assert run_cli("init", "mine", "--arch", "LlamaForCausalLM", cwd=workdir).returncode == 0
    adapter = workdir / "mine" / "adapter.py"
    adapter.write_text(adapter.read_text().replace("raise NotImplementedError", "return None"))
    done = run_cli("pack", "mine", "-o", "dist", cwd=workdir)
    assert (done.returncode, done.stdout) == (0, "dist/mine-0.1.0.ttbundle\n"), done.stderr


# --- ttbundle test leaves nothing behind ---------------------------------------------------


def _test_env(workdir):
    """A private temporary folder and user cache, to see what a run leaves."""
    (workdir / "tmp").mkdir()
    return {"TMPDIR": str(workdir / "tmp"), "XDG_CACHE_HOME": str(workdir / "cache")}


def _user_indexes(workdir) -> list[str]:
    cache = workdir / "cache" / "ttbundles"
    return sorted(p.name for p in cache.glob("index-*.json")) if cache.is_dir() else []


def test_a_failed_test_run_removes_its_folder_and_keeps_the_log(run_cli_process, workdir):
    """The serving process stopped by --timeout: TTB127, the run's temporary folder gone,
    its serving log kept in the user cache and named."""
    env = _test_env(workdir)
    done = run_cli_process(
        "test", "demo", "--model", "./ckpt", "--timeout", "1", env=env, cwd=workdir
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    log = workdir / "cache" / "ttbundles" / "test-logs" / "demo.log"
    assert f"{log}: error TTB127 serving demo for the test failed: the serving process " in (
        done.stderr
    )
    assert "stopped after 1 s" in done.stderr and log.is_file()
    assert list((workdir / "tmp").iterdir()) == []


@pytest.mark.parametrize(("sig", "status"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupted_test_run_stops_its_server_and_removes_its_folder(workdir, sig, status):
    """Ctrl-C (SIGINT) or a plain kill (SIGTERM) while the serving process starts: it is
    stopped, and the run's temporary folder is removed."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = {**os.environ, **_test_env(workdir)}
    ttbundle = str(Path(sys.executable).parent / "ttbundle")
    run = subprocess.Popen(
        [ttbundle, "test", "demo", "--model", "./ckpt"],
        cwd=workdir,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    spec = ""
    try:
        # The signal goes as soon as the run has written its serving process's spec: the
        # CLI is then starting that process and waits for it, so the signal always finds
        # it at work (a signal sent once the serving process was seen running could come
        # after it had served everything, the run about to end by itself: seen under load).
        deadline = time.monotonic() + 120
        while not spec and time.monotonic() < deadline:
            specs = list((workdir / "tmp").glob("ttbundle-test-*/spec.json"))
            spec = str(specs[0]) if specs else ""
            time.sleep(0.05)
        assert spec, "the run did not get to start its serving process"
        run.send_signal(sig)
        out, err = run.communicate(timeout=120)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    assert run.returncode == status, err
    assert "Traceback" not in err
    assert list((workdir / "tmp").iterdir()) == []
    # The serving process and anything of its command line stop: at once when the CLI
    # could stop them itself, else within seconds by following their parent (a signal
    # while the harness was being started).
    deadline = time.monotonic() + 15
    left = _pids_running(spec)
    while left and time.monotonic() < deadline:
        left = [pid for pid in _pids_running(spec) if not _zombie(pid)]
        time.sleep(0.1)
    assert left == [], "still running 15 s after: " + "; ".join(map(_describe, left))


def test_a_killed_test_runs_folder_is_removed_by_the_next_run(run_cli_process, workdir):
    """`kill -9` runs no clean-up: the folder stays, and the next run removes it (its
    lock died with the process), whatever that run's own outcome."""
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    env = _test_env(workdir)
    ttbundle = str(Path(sys.executable).parent / "ttbundle")
    run = subprocess.Popen(
        [ttbundle, "test", "demo", "--model", "./ckpt"],
        cwd=workdir,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        while not list((workdir / "tmp").glob("ttbundle-test-*/spec.json")):
            assert time.monotonic() < deadline, "the serving process did not start"
            time.sleep(0.1)
        run.kill()
        run.wait()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    (left,) = list((workdir / "tmp").iterdir())
    assert left.name.startswith(f"ttbundle-test-{run.pid}-")
    done = run_cli_process(
        "test", "demo", "--model", "./ckpt", "--timeout", "1", env=env, cwd=workdir
    )
    assert done.returncode == 1 and "TTB127" in done.stderr, done.stderr
    assert list((workdir / "tmp").iterdir()) == []


def test_the_sweep_removes_only_folders_whose_run_is_gone(tmp_path):
    """A held lock (a live run), a folder without the lock file (one being made) and
    anything not a run folder stay; an unheld one goes."""
    import fcntl

    from ttbundles.conformance.workdirs import LOCK, PREFIX, sweep_orphans

    live, dead, bare = (tmp_path / f"{PREFIX}{n}-x" for n in (1, 2, 3))
    for folder in (live, dead, bare):
        folder.mkdir()
    (dead / LOCK).touch()
    (dead / "spec.json").write_text("{}")
    (live / LOCK).touch()
    (tmp_path / f"{PREFIX}4-file").write_text("")
    (tmp_path / "other").mkdir()
    with open(live / LOCK, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        assert sweep_orphans(tmp_path) == [dead]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [live.name, bare.name, f"{PREFIX}4-file", "other"]
    )


def _describe(pid: int) -> str:
    """What a process is, for a failure message."""
    from pathlib import Path

    try:
        status = Path(f"/proc/{pid}/status").read_text().splitlines()[:8]
        command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError as exc:
        return f"pid {pid}: {exc}"
    return f"pid {pid}: {command}; " + "; ".join(status)


def _pids_running(argument: str) -> list[int]:
    """Every process with `argument` on its command line."""
    from pathlib import Path

    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if argument in (proc / "cmdline").read_bytes().decode().split("\0"):
                    pids.append(int(proc.name))
            except OSError:
                continue
    return pids


def _zombie(pid: int) -> bool:
    from pathlib import Path

    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[1].startswith("Z")
    except OSError:
        return True


@pytest.mark.server
def test_the_readme_rope_settings_skip_what_they_cannot_check_and_leave_nothing(
    run_cli_process, workdir
):
    """As the README runs it, relative paths: at --max-tokens 4 the short prompt's resent
    sequence fits one KV block, so its cache-hit check is skipped with the reason (exit
    0), not failed; the run leaves no folder and no index of its models folder."""
    env = _test_env(workdir)
    args = ("test", "demo", "--model", "./ckpt", "--max-tokens", "4", "--path", "prefix_cache")
    done = run_cli_process(*args, "--golden", "reference", env=env, cwd=workdir, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "demo@1.0.0 on HOST, checkpoint ./ckpt: 3 prompts x 4 tokens" in done.stdout
    rows = [line.split() for line in done.stdout.splitlines() if line.startswith("prefix_cache")]
    assert [(r[1], r[-1]) for r in rows] == [("p0", "skipped"), ("p1", "pass"), ("p2", "pass")]
    assert (
        "note: prefix_cache, prompt p0 'The capital of France is': skipped: the cache-hit "
        "check cannot run: the resent sequence of 14 tokens does not exceed one block of 16"
    ) in done.stdout
    verdict = done.stdout.rstrip().splitlines()[-1]
    assert verdict.startswith("PASSED: 4 cases, 0 failures")  # 3 prompts and the perplexity
    assert list((workdir / "tmp").iterdir()) == []
    assert _user_indexes(workdir) == []  # the harness's registration wrote one: removed


# --- the user cache's indexes ----------------------------------------------------------------


def test_the_user_cache_forgets_indexes_of_folders_that_are_gone(run_cli, workdir):
    """`ttbundle list` keeps an index of each models folder in the user cache. Once a
    folder is removed, the next process that writes the cache removes its index (at most
    hourly: the sweep stamp is aged here); another version's recent index stays, an old
    one goes, and a file that is not an index is never touched."""
    import os
    import time

    env = {"XDG_CACHE_HOME": str(workdir / "cache"), "MESH_DEVICE": "HOST"}
    for folder in ("gone", "kept"):
        shutil.copytree(workdir / "demo", workdir / folder / "demo")
        done = run_cli("list", "--models-dir", folder, env=env, cwd=workdir)
        assert done.returncode == 0, done.stderr
    cache = workdir / "cache" / "ttbundles"
    first = _user_indexes(workdir)
    assert len(first) >= 2
    other = json.loads((cache / first[0]).read_text())
    other_version = {**other, "checker": [[1, 2]], "folder": str(workdir / "kept")}
    (cache / "index-00000000000000aa.json").write_text(json.dumps(other_version))
    old = cache / "index-00000000000000bb.json"
    old.write_text(json.dumps(other_version))
    month_ago = time.time() - 30 * 24 * 3600
    os.utime(old, (month_ago, month_ago))
    (cache / "index-notes.txt").write_text("mine")
    (cache / "index-00000000000000cc.json").write_text("{not json")
    shutil.rmtree(workdir / "gone")
    shutil.copytree(workdir / "demo", workdir / "fresh" / "demo")
    assert run_cli("list", "--models-dir", "fresh", env=env, cwd=workdir).returncode == 0
    assert old.exists()  # swept at most hourly: not yet
    hour_ago = time.time() - 3700
    os.utime(cache / ".index-sweep", (hour_ago, hour_ago))
    shutil.rmtree(workdir / "fresh")
    shutil.copytree(workdir / "demo", workdir / "fresh2" / "demo")
    assert run_cli("list", "--models-dir", "fresh2", env=env, cwd=workdir).returncode == 0
    names = _user_indexes(workdir)
    assert "index-00000000000000aa.json" in names and old.name not in names
    assert "index-00000000000000cc.json" in names  # unreadable as an index: left alone
    assert (cache / "index-notes.txt").read_text() == "mine"
    folders = {
        json.loads((cache / n).read_text())["folder"]
        for n in names
        if n not in ("index-00000000000000aa.json", "index-00000000000000cc.json")
    }
    assert str(workdir / "gone") not in folders and str(workdir / "fresh") not in folders
    assert str(workdir / "kept") in folders and str(workdir / "fresh2") in folders


# --- one code per condition, one envelope per command -------------------------------------


def test_every_command_takes_format_json():
    """Every command, `test` included (human, json, junit), offers --format json."""
    from ttbundles.cli.app import command

    root = command()
    lacking = []
    for name, cmd in root.commands.items():
        formats = [p for p in cmd.params if "--format" in getattr(p, "opts", [])]
        kind = formats[0].type_descriptor.annotation if formats else None
        if kind is None or "json" not in [c.value for c in kind]:
            lacking.append(name)
    assert len(root.commands) >= 17 and lacking == []


MISSING = [
    ("validate", "nope"),
    ("pack", "nope"),
    ("verify", "nope"),
    ("install", "nope.ttbundle", "--models-dir", "models"),
    ("inspect", "nope"),
    ("migrate", "nope"),
    ("push", "nope", "localhost:5999/x:1"),
    ("sign", "nope", "--key", "nope.key"),
    ("init", "q", "--from-hf", "./nope"),
    ("plan", "./nope", "--mesh", "HOST"),
    ("test", "nope", "--model", "./ckpt"),
    ("test", "demo", "--model", "./nope"),
    ("test", "demo", "--model", "./ckpt", "--golden", "nope.json.gz"),
]


def test_a_path_that_does_not_exist_is_ttb001_in_every_command(run_cli, workdir):
    """One condition, one code: each command given a missing path (relative, as typed)
    answers TTB001 naming it, exit 1, `ok` false; nothing else is said first."""
    for args in MISSING:
        data = envelope(run_cli(*args, "-f", "json", cwd=workdir, timeout=120), 1)
        first = data["diagnostics"][0]
        assert (first["code"], first["severity"]) == ("TTB001", "error"), args
        assert first["file"] in ("nope", "./nope", "nope.ttbundle", "nope.json.gz"), args


# --- the startup summary ----------------------------------------------------------------------


def test_the_startup_summary_is_said_once_however_often_vllm_asks(caplog, monkeypatch):
    """vLLM asks for the registry several times per process and changes the environment
    between (the platform sets variables): the summary line is said once, not again when
    a reason got worded or an unrelated variable changed."""
    import logging

    from ttbundles.serving import registration

    monkeypatch.setattr(registration, "_state", {})
    monkeypatch.setenv("MESH_DEVICE", "HOST")
    monkeypatch.delenv("EXTRA_MODELS_DIR", raising=False)
    with caplog.at_level(logging.INFO, logger="vllm.ttbundles"):
        registration.checked_registry()
        registration.checked_registry()  # the summary worded the inactive bundles' reasons
        monkeypatch.setenv("VLLM_TTBUNDLES_TEST_VARIABLE", "1")
        registration.checked_registry()  # a new environment: computed again, same outcome
    summaries = [
        r.getMessage() for r in caplog.records if " bundles for mesh HOST: " in r.getMessage()
    ]
    assert len(summaries) == 1, summaries
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="vllm.ttbundles"):
        monkeypatch.setenv("TT_QWEN35_TEXT_VER", "qwen36_autoport")  # a `when` a bundle reads
        registration.checked_registry()
    assert [r for r in caplog.records if " bundles for mesh HOST: " in r.getMessage()]
