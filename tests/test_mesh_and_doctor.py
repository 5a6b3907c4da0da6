"""The mesh as operators type it, `list`/`plan` failing where `vllm serve` would, `ttbundle
doctor`, and usage errors: all through the installed commands, as users call them."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttbundles.errors import ConfigurationError
from ttbundles.format.meshes import Mesh, parse_mesh, suggest

VLLM = str(Path(sys.executable).parent / "vllm")


def as_json(done):
    assert "Traceback" not in done.stderr, done.stderr
    return json.loads(done.stdout)


def two_line_usage_error(done, command: str) -> str:
    """The whole of stderr for a usage error: what is wrong, then where the help is."""
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    assert lines[0].startswith(f"ttbundle {command}: error: ")
    assert lines[1].startswith(f"See 'ttbundle {command} --help'")
    return lines[0]


# --- the one parse ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "name", "shape"),
    [
        ("HOST", "HOST", (1, 1)),
        ("host", "HOST", (1, 1)),
        (" t3k ", "T3K", (1, 8)),
        ("tg", "TG", (8, 4)),
        ("p150X4", "P150x4", (1, 4)),
        ("bh-galaxy", "BH-Galaxy", (8, 4)),
        ("(4,8)", "(4,8)", (4, 8)),
        ("(2, 4)", "(2,4)", (2, 4)),
        ("1,2", "(1,2)", (1, 2)),
        ("[1, 8]", "(1,8)", (1, 8)),
    ],
)
def test_mesh_values_parse_case_insensitively_and_as_grids(value, name, shape):
    mesh = parse_mesh(value)
    assert (mesh.name, mesh.shape) == (name, shape)
    assert isinstance(mesh, Mesh) and mesh.grid == name.startswith("(")


@pytest.mark.parametrize(
    ("value", "meant"),
    [
        ("T3000", "T3K"),  # the product name, not the nearest spelling (P300)
        ("TT-LoudBox", "T3K"),
        ("Galaxy", "TG"),
        ("BHGalaxy", "BH-Galaxy"),
        ("n300s", "N300"),
        ("p150a", "P150"),
        ("N3000", "N300"),
        ("HSOT", "HOST"),
        ("N150X", "N150"),  # one slip from N150 and from N150x4: the plain preset first
        ("P150X", "P150"),
        ("BOGUS", None),
        ("galaxy-of-doom", None),
    ],
)
def test_an_unknown_mesh_is_one_error_naming_the_valid_ones(value, meant):
    assert suggest(value) == meant
    with pytest.raises(ConfigurationError) as caught:
        parse_mesh(value)
    [diagnostic] = caught.value.diagnostics
    assert diagnostic.code == "TTB106"
    assert diagnostic.message == f"MESH_DEVICE={value!r} is not a mesh"
    assert "N150, N300, N150x4, T3K, TG" in diagnostic.hint and "(4,8)" in diagnostic.hint
    assert diagnostic.hint.startswith(f"did you mean {meant}? " if meant else "valid meshes")


@pytest.mark.parametrize("value", ["(0,8)", "(4,8,2)", "4x8"])
def test_a_bad_grid_is_the_same_error(value):
    with pytest.raises(ConfigurationError) as caught:
        parse_mesh(value)
    assert [d.code for d in caught.value.diagnostics] == ["TTB106"]


# --- list: what registers, and where the server would refuse ------------------------------


def test_list_host_in_lower_case_selects_the_demo_bundle(run_cli):
    done = run_cli("list", "--format", "json", env={"MESH_DEVICE": "host"})
    assert done.returncode == 0, done.stderr
    data = as_json(done)
    assert data["mesh"] == "HOST"
    llama = {e["bundle"]: e for e in data["entries"] if e["tt_arch"] == "TTLlamaForCausalLM"}
    assert llama["demo"]["status"] == "registered"
    assert llama["tt-llama"]["status"] == "shadowed"


def test_list_shows_environment_classes_not_importable_here_as_unservable(run_cli):
    done = run_cli("list", "--format", "json", env={"MESH_DEVICE": "HOST"})
    assert done.returncode == 0, done.stderr  # the server starts; serving those would fail
    data = as_json(done)
    qwen = next(e for e in data["entries"] if e["tt_arch"] == "TTQwen3ForCausalLM")
    assert qwen["status"] == "unservable"
    assert qwen["reason"].startswith(
        "TTB058 module 'models.tt_transformers.tt.generator_vllm' is not importable here"
    )
    [warning] = [p for p in data["diagnostics"] if p["code"] == "TTB058"]
    assert warning["severity"] == "warning" and "TTQwen3ForCausalLM" in warning["message"]
    human = run_cli("list", env={"MESH_DEVICE": "HOST"})
    assert "not servable" in human.stdout
    assert "warning TTB058" in human.stdout


def test_list_does_not_judge_imports_for_a_mesh_of_another_machine(run_cli):
    data = as_json(run_cli("list", "--mesh", "T3K", "--format", "json"))
    assert "unservable" not in {e["status"] for e in data["entries"]}
    assert data["diagnostics"] == []


@pytest.mark.parametrize(
    ("args", "env", "given"),
    [
        (["--mesh", "BOGUS"], {}, "--mesh 'BOGUS'"),
        (["--mesh", "T3000"], {}, "--mesh 'T3000'"),
        ([], {"MESH_DEVICE": "N3000"}, "MESH_DEVICE='N3000'"),
    ],
)
def test_list_refuses_an_unknown_mesh(run_cli, args, env, given):
    done = run_cli("list", *args, env=env)
    assert done.returncode == 1
    assert done.stdout == "" and "Traceback" not in done.stderr
    first, fix = done.stderr.splitlines()
    assert first == f"error TTB106 {given} is not a mesh"
    meant = {"BOGUS": "", "T3000": "did you mean T3K? ", "N3000": "did you mean N300? "}
    value = given.split("'")[1]
    assert fix.startswith(f"    fix: {meant[value]}valid meshes: N150, N300")


def test_list_with_a_device_mesh_and_no_ttnn_exits_1_as_the_server_would(run_cli):
    done = run_cli("list", env={"MESH_DEVICE": "T3K"})
    assert done.returncode == 1
    assert "error TTB107 MESH_DEVICE=T3K asks for a Tenstorrent mesh, but ttnn" in done.stdout
    data = as_json(run_cli("list", "--format", "json", env={"MESH_DEVICE": "T3K"}))
    assert [p["code"] for p in data["diagnostics"]] == ["TTB107"]
    # --mesh is a what-if for the machine that has the mesh: it selects, nothing more.
    assert run_cli("list", "--mesh", "T3K").returncode == 0


def test_strict_list_exits_1_when_a_bundle_is_skipped(make_bundle, run_cli, tmp_path):
    make_bundle("broken", parent=tmp_path / "m", metadata={"capabilites": {}})
    env = {"EXTRA_MODELS_DIR": str(tmp_path / "m"), "TT_VLLM_BUILTIN_MODELS": "0"}
    assert run_cli("list", env=env).returncode == 0
    done = run_cli("list", "--format", "json", env={**env, "TT_BUNDLES_STRICT": "1"})
    assert done.returncode == 1
    data = as_json(done)
    assert [(p["code"], p["severity"]) for p in data["diagnostics"]] == [("TTB030", "error")]
    assert data["entries"][0]["status"] == "skipped"


def test_an_unknown_option_is_two_lines_with_a_did_you_mean(run_cli):
    line = two_line_usage_error(run_cli("list", "--fromat", "json"), "list")
    assert line == "ttbundle list: error: no such option --fromat; did you mean --format?"
    line = two_line_usage_error(run_cli("doctor", "--formt", "json"), "doctor")
    assert line.endswith("did you mean --format?")
    done = run_cli("lst")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == (
        "ttbundle: error: No such command 'lst'. Did you mean 'list'?"
    )


# --- doctor -----------------------------------------------------------------------------


def doctor(run_cli, env):
    done = run_cli("doctor", "--format", "json", env=env)
    data = as_json(done)
    assert done.returncode == (0 if data["ok"] else 1)
    return data, {c["name"]: c for c in data["checks"]}


def test_doctor_on_the_host_mesh_says_the_server_would_start(run_cli):
    data, checks = doctor(run_cli, {"MESH_DEVICE": "host"})
    assert data["ok"] is True and data["mesh"] == "HOST"
    assert checks["mesh"]["status"] == "ok"
    assert checks["mesh"]["detail"].startswith("HOST: the host mesh")
    assert checks["platform"]["detail"] == "activates: MESH_DEVICE=host asks for the host mesh"
    assert checks["ttnn"]["detail"].startswith("not importable")
    from ttbundles.vllm_window import installed_vllm

    assert checks["vllm"]["detail"].startswith(f"{installed_vllm()} (tested window: ")
    assert checks["torch"]["status"] == "ok"
    served = {b["bundle"]: b for b in data["bundles"]}
    assert served["demo"]["servable"] is True
    assert served["tt-qwen3"]["servable"] is False
    assert [p["code"] for p in data["diagnostics"]] == ["TTB058"]
    human = run_cli("doctor", env={"MESH_DEVICE": "host"})
    assert human.returncode == 0
    assert human.stdout.splitlines()[-1] == "vllm serve would start here"
    assert any(line.startswith("ok    platform") for line in human.stdout.splitlines())


@pytest.mark.parametrize(
    ("env", "codes", "failing"),
    [
        ({"MESH_DEVICE": "T3000"}, ["TTB106"], "mesh"),
        ({"MESH_DEVICE": "T3K"}, ["TTB107"], "ttnn"),  # the mesh is fine; ttnn is missing
        ({}, ["TTB108"], "platform"),  # no MESH_DEVICE, no ttnn: vLLM finds no device
        ({"MESH_DEVICE": "HOST", "VLLM_PLUGINS": "tt"}, ["TTB108"], "plugins"),
    ],
)
def test_doctor_names_what_would_fail_and_exits_1(run_cli, env, codes, failing):
    data, checks = doctor(run_cli, env)
    assert data["ok"] is False
    assert [p["code"] for p in data["diagnostics"] if p["severity"] == "error"] == codes
    assert [name for name, check in checks.items() if check["status"] == "error"] == [failing]
    human = run_cli("doctor", env=env)
    assert human.returncode == 1
    assert f"error {codes[0]}" in human.stdout
    assert human.stdout.splitlines()[-1] == "vllm serve would fail here (1 error)"


def test_doctor_t3000_suggests_t3k(run_cli):
    data, _ = doctor(run_cli, {"MESH_DEVICE": "T3000"})
    [problem] = data["diagnostics"]
    assert problem["hint"].startswith("did you mean T3K?")


# --- plan: the errors that come before vLLM is imported ------------------------------------


def test_plan_refuses_an_unknown_mesh_before_importing_vllm(run_cli):
    done = run_cli("plan", "./some-checkpoint", "--mesh", "N3000")
    assert done.returncode == 1
    # Only the diagnostic: vLLM, which logs as it imports, was never imported.
    assert done.stderr.splitlines() == [
        "error TTB106 --mesh 'N3000' is not a mesh",
        "    fix: did you mean N300? valid meshes: N150, N300, N150x4, T3K, TG, P100, P150, "
        "P150x2, P150x4, P150x8, P300, P300x2, BH-Galaxy, HOST, or a grid such as (4,8) "
        "(see docs/reference/codes.md#ttb106)",
    ]
    assert done.stdout == ""


def test_plan_without_a_model_is_a_usage_error(run_cli):
    done = run_cli("plan", "--mesh", "HOST")
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == "error TTB004 no model given"
    assert "ttbundle plan MODEL [vllm serve options]" in done.stderr


# --- plan and vllm serve through vLLM (the slow tier) --------------------------------------


def _environment_bundle(models: Path, module: str) -> Path:
    """An extra bundle for LlamaForCausalLM whose class comes from the environment."""
    folder = models / "from-env"
    folder.mkdir(parents=True)
    (folder / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": "from-env",
                "version": "1.0.0",
                "arch": "LlamaForCausalLM",
                "main_class": f"{module}:Generator",
                "main_class_source": "environment",
                "capabilities": {},
            }
        )
    )
    return folder


@pytest.mark.server  # builds a vLLM configuration in a subprocess
def test_plan_takes_the_model_first_and_models_dir(run_cli_process, demo_checkpoint, tmp_path):
    models = tmp_path / "models"
    _environment_bundle(models, "tt_nowhere.gen")
    done = run_cli_process(
        "plan",
        demo_checkpoint,
        "--mesh",
        "host",
        "--models-dir",
        models,
        "--max-model-len",
        "64",
        timeout=300,
    )
    # The extra bundle wins, and its class cannot be imported: the engine would die on it.
    assert done.returncode == 1, done.stdout + done.stderr
    assert (
        "error TTB058 from-env@1.0.0 serves this model with tt_nowhere.gen:Generator, but "
        "module 'tt_nowhere.gen' is not importable here"
    ) in done.stderr
    assert "Traceback" not in done.stderr
    # The same with the module on the path: planned, positional model and all.
    (tmp_path / "lib" / "tt_nowhere").mkdir(parents=True)
    (tmp_path / "lib" / "tt_nowhere" / "__init__.py").write_text("")
    (tmp_path / "lib" / "tt_nowhere" / "gen.py").write_text("class Generator: ...\n")
    done = run_cli_process(
        "plan",
        demo_checkpoint,
        "--mesh",
        "host",
        "--models-dir",
        models,
        "--max-model-len",
        "64",
        "--format",
        "json",
        env={"PYTHONPATH": str(tmp_path / "lib")},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    plan = as_json(done)
    assert (plan["bundle"]["name"], plan["mesh"], plan["model"]) == (
        "from-env",
        "HOST",
        str(demo_checkpoint),
    )
    decisions = {d["setting"]: d for d in plan["decisions"]}
    assert decisions["max_model_len"]["effective"] == 64
    # The old spelling still works.
    old = run_cli_process(
        "plan", "--model", demo_checkpoint, "--mesh", "HOST", "--format", "json", timeout=300
    )
    assert old.returncode == 0, old.stderr
    assert as_json(old)["bundle"]["name"] == "demo"


@pytest.mark.server  # imports vLLM's parser in a subprocess
def test_plan_answers_an_unknown_option_in_two_lines(run_cli, demo_checkpoint):
    done = run_cli("plan", demo_checkpoint, "--mesh", "HOST", "--max-model-lenn", "64", timeout=300)
    line = two_line_usage_error(done, "plan")
    assert (
        line
        == "ttbundle plan: error: no such option --max-model-lenn; did you mean --max-model-len?"
    )
    assert done.stderr.splitlines()[1] == "See 'ttbundle plan --help' and 'vllm serve --help'."
    done = run_cli("plan", demo_checkpoint, "--mesh-device", "T3K", timeout=300)
    line = two_line_usage_error(done, "plan")
    assert line.endswith("did you mean --mesh?")


@pytest.mark.server  # builds a vLLM configuration in a subprocess
def test_plan_for_a_mesh_attached_elsewhere_warns(run_cli, demo_checkpoint):
    done = run_cli("plan", demo_checkpoint, "--mesh", "t3k", "--format", "json", timeout=300)
    assert done.returncode == 0, done.stderr
    plan = as_json(done)
    assert (plan["mesh"], plan["bundle"]["name"]) == ("T3K", "tt-llama")
    [warning] = plan["diagnostics"]
    assert (warning["code"], warning["severity"]) == ("TTB107", "warning")


def _serve(checkpoint: Path, mesh: str | None, *args: str) -> subprocess.CompletedProcess:
    """`vllm serve CHECKPOINT --port 0 ARGS` with MESH_DEVICE=mesh (None: unset)."""
    drop = ("EXTRA_MODELS_DIR", "MESH_DEVICE", "VLLM_LOGGING_LEVEL")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env["NO_COLOR"] = "1"
    if mesh is not None:
        env["MESH_DEVICE"] = mesh
    return subprocess.run(
        [VLLM, "serve", str(checkpoint), "--port", "0", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


@pytest.mark.server  # runs vllm serve
@pytest.mark.parametrize(
    ("mesh", "expected"),
    [
        (
            "N3000",
            "error TTB106: MESH_DEVICE='N3000' is not a mesh (fix: did you mean N300? "
            "valid meshes: N150,",
        ),
        (
            "t3k",
            "error TTB107: MESH_DEVICE=T3K asks for a Tenstorrent mesh, but ttnn (TT-Metal) "
            "is not importable in this Python",
        ),
    ],
)
def test_vllm_serve_reports_a_wrong_or_unopenable_mesh_in_one_line(demo_checkpoint, mesh, expected):
    done = _serve(demo_checkpoint, mesh)
    output = done.stdout + done.stderr
    assert done.returncode == 1
    [line] = [x for x in output.splitlines() if "TTB1" in x]
    assert line.startswith(expected)
    assert "Failed to infer device type" not in output
    assert "Traceback" not in output


@pytest.mark.server  # runs vllm serve
def test_vllm_serve_without_a_card_or_mesh_device_says_to_set_it_in_one_line(demo_checkpoint):
    """No card, no ttnn, MESH_DEVICE unset: vLLM finds no platform. The whole output is
    our one line (what to set, how to check a card), exit 1; never vLLM's traceback nor
    its "Failed to import from vllm._C" warning. vLLM's `serve --help` needs a platform
    too (its defaults name the device): the same line there."""
    from ttbundles.serving.plugin import NO_DEVICE_LINE

    done = _serve(demo_checkpoint, None)
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stdout == ""
    assert done.stderr.splitlines() == [NO_DEVICE_LINE]
    assert NO_DEVICE_LINE.startswith("TTB245 ") and "MESH_DEVICE=HOST" in NO_DEVICE_LINE
    assert "ls /dev/tenstorrent" in NO_DEVICE_LINE
    helped = subprocess.run(
        [VLLM, "serve", "--help"],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "MESH_DEVICE"},
        timeout=300,
    )
    assert helped.returncode == 1
    assert helped.stderr.splitlines() == [NO_DEVICE_LINE] and "Traceback" not in helped.stdout


@pytest.mark.server  # runs vllm serve and ttbundle plan
@pytest.mark.parametrize(
    ("option", "name"),
    [
        (["--tensor-parallel-size", "3"], "tensor-parallel-size"),
        (["-tp", "2"], "tensor-parallel-size"),
        (["--pipeline-parallel-size", "2"], "pipeline-parallel-size"),
    ],
)
def test_vllm_parallelism_is_refused_as_documented_before_vllm_checks_it(
    run_cli, demo_checkpoint, option, name
):
    """The demo checkpoint's 4 heads do not divide by 3: vLLM would refuse that first, in
    pydantic's words. The documented TTB201 comes first, from serve and plan alike."""
    from tests import zygote  # on the host mesh: forked from the test servers' zygote

    env = {
        k: v for k, v in os.environ.items() if k not in ("EXTRA_MODELS_DIR", "VLLM_LOGGING_LEVEL")
    }
    env.update({"NO_COLOR": "1", "MESH_DEVICE": "HOST"})
    command = [VLLM, "serve", str(demo_checkpoint), "--port", "0", *option]
    code, output = zygote.run(command, env, timeout=300)
    assert code == 1, output
    [line] = [x for x in output.splitlines() if x.strip()]
    assert line.startswith(f"error TTB201: --{name}={option[1]}: on Tenstorrent the mesh")
    assert "attention heads" not in output and "Traceback" not in output
    planned = run_cli("plan", demo_checkpoint, *option, env={"MESH_DEVICE": "HOST"}, timeout=300)
    assert planned.returncode == 1
    assert f"error TTB201 --{name}={option[1]}: on Tenstorrent" in planned.stderr


@pytest.mark.server  # runs vllm serve and one request
def test_vllm_serve_with_lower_case_host_serves_the_demo_bundle(demo_checkpoint, tmp_path):
    import openai

    from ttbundles.demo.server import serve_environment, start_server

    env = serve_environment({k: v for k, v in os.environ.items() if k != "EXTRA_MODELS_DIR"})
    env["MESH_DEVICE"] = "host"
    log = tmp_path / "server.log"
    server = start_server(
        demo_checkpoint, vllm_args=["--max-model-len", "128"], env=env, log_path=log
    )
    try:
        server.wait_ready(300)
        client = openai.OpenAI(base_url=server.api_url, api_key="EMPTY", max_retries=0)
        out = client.completions.create(
            model=str(demo_checkpoint), prompt="hello", max_tokens=4, temperature=0
        )
        assert out.usage.completion_tokens == 4
    finally:
        server.stop(60)
    text = log.read_text()
    assert "serving TTLlamaForCausalLM with demo@1.0.0" in text
    assert "on mesh HOST" in text
    assert "No module named 'models'" not in text


def test_bundle_test_parses_its_mesh_the_same_way(run_cli, tmp_path):
    done = run_cli(
        "test",
        "bundles/demo",
        "--model",
        tmp_path,
        "--mesh",
        "T3000",
        cwd=Path(__file__).parents[1],
    )
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == "error TTB106 --mesh 'T3000' is not a mesh"
    assert "did you mean T3K?" in done.stderr


# --- the environment, read in one place --------------------------------------------------


def test_an_old_variable_name_is_still_read_with_a_deprecation_note(monkeypatch, caplog):
    from ttbundles import envs

    monkeypatch.delenv("TT_BUNDLES_DEBUG", raising=False)
    monkeypatch.setenv("TTBUNDLE_DEBUG", "1")
    monkeypatch.setattr(envs, "_noted", set())
    with caplog.at_level(logging.WARNING, logger="ttbundles"):
        assert envs.TT_BUNDLES_DEBUG is True
        assert envs.TT_BUNDLES_DEBUG is True
    assert [r.getMessage() for r in caplog.records] == [
        "ttbundles: TTBUNDLE_DEBUG is deprecated and will stop working; set TT_BUNDLES_DEBUG "
        "instead"
    ]  # once a process
    monkeypatch.setenv("TT_BUNDLES_DEBUG", "0")
    assert envs.TT_BUNDLES_DEBUG is False  # the new name wins


@pytest.mark.parametrize(
    "value, shown", [("1", True), ("yes", True), ("false", False), ("0", False), ("", False)]
)
def test_the_engine_and_the_cli_read_the_debug_switch_alike(monkeypatch, value, shown):
    from ttbundles import envs
    from ttbundles.serving import faults

    monkeypatch.delenv("VLLM_LOGGING_LEVEL", raising=False)
    monkeypatch.delenv("TTBUNDLE_DEBUG", raising=False)
    monkeypatch.setenv("TT_BUNDLES_DEBUG", value)
    assert faults.debugging() is shown  # the engine's tracebacks
    assert envs.TT_BUNDLES_DEBUG is shown  # the CLI's (cli/app.py)


@pytest.mark.parametrize("value", ["", "  ", None])
def test_a_blank_mesh_device_is_unset_everywhere(monkeypatch, value):
    from ttbundles import doctor, envs
    from ttbundles.serving.plugin import activation

    environ = {} if value is None else {"MESH_DEVICE": value}
    assert envs.read("MESH_DEVICE", environ) is None
    assert not doctor._mesh_set(environ)
    active, why = activation(environ)
    assert "MESH_DEVICE is unset" in why or "ttnn" in why
