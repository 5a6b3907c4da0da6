"""`ttbundle` as users call it: the installed console script, in a subprocess."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

META = "vllm_metadata.json"
LEGACY = '{"arch": "DemoForCausalLM", "main_class": "adapter:DemoGenerator"}\n'

# Every diagnostic in a JSON document has exactly these keys (null where not known).
DIAGNOSTIC_KEYS = {"code", "severity", "message", "file", "pointer", "line", "column", "hint"}


def no_traceback(done):
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    return done


def as_json(done):
    no_traceback(done)
    return json.loads(done.stdout)


# --- validate ----------------------------------------------------------------------------


def test_validate_valid(make_bundle, run_cli):
    folder = make_bundle("demo")
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0
    assert done.stdout.strip() == f"{folder}: valid (0 errors, 0 warnings; bundles: demo)"


@pytest.mark.parametrize(
    ("kwargs", "location", "code", "fix"),
    [
        (
            {"metadata": {"capabilites": {}}},
            f"{META}:8:3 /capabilites",
            "error TTB030",
            "did you mean 'capabilities'?; free extensions start with 'x-'",
        ),
        (
            {"metadata": '{\n  "schema_version": 1,\n}\n'},
            f"{META}:3:1",
            "error TTB010",
            "fix the JSON syntax at that position",
        ),
        (
            {"metadata": {"main_class": "adaptr:DemoGenerator"}},
            f"{META}:6:17 /main_class",
            "error TTB050",
            "did you mean 'adapter'?",
        ),
        (
            {"adapter": "class DemoGenerator(:\n    pass\n"},
            "adapter.py:1:21",
            "error TTB051",
            "fix the Python syntax",
        ),
        (
            {"metadata": {"targets": {"N15O": {}}}},
            f"{META}:9:5 /targets/N15O",
            "error TTB035",
            "did you mean 'N150'?",
        ),
    ],
    ids=["unknown key", "json syntax", "module missing", "python syntax", "mesh"],
)
def test_validate_invalid_human(make_bundle, run_cli, kwargs, location, code, fix):
    folder = make_bundle("demo", **kwargs)
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 1
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"{folder}/{location}: {code} ")
    assert lines[1] == f"    fix: {fix} (see docs/reference/codes.md#{code.split()[1].lower()})"
    assert lines[-1].startswith(f"{folder}: INVALID (1 error, 0 warnings")
    assert done.stderr == ""


def test_validate_json(make_bundle, run_cli):
    folder = make_bundle("demo", metadata={"capabilites": {}, "targets": {"t3k": {}}})
    done = run_cli("validate", folder, "--format", "json")
    assert done.returncode == 1
    data = as_json(done)
    assert (data["valid"], data["strict"], data["strict_unverifiable"]) == (False, False, False)
    [path] = data["paths"]
    assert (path["path"], path["valid"]) == (str(folder), False)
    assert path["bundles"] == [{"path": str(folder), "name": None, "version": None, "legacy": None}]
    found = [
        (d["code"], d["severity"], d["pointer"], d["line"], d["column"])
        for d in path["diagnostics"]
    ]
    assert found == [
        ("TTB035", "error", "/targets/t3k", 10, 5),
        ("TTB030", "error", "/capabilites", 8, 3),
    ]
    assert all(d["file"] == str(folder / META) for d in path["diagnostics"])
    assert path["diagnostics"][0]["hint"] == "did you mean 'T3K'?"
    assert set(path["diagnostics"][0]) == DIAGNOSTIC_KEYS


def test_validate_json_valid_bundle_lists_it(make_bundle, run_cli):
    folder = make_bundle("demo")
    data = as_json(run_cli("validate", "-f", "json", folder))
    assert data["valid"] is True
    assert data["paths"][0]["bundles"] == [
        {"path": str(folder), "name": "demo", "version": "1.0.0", "legacy": False}
    ]
    assert data["paths"][0]["diagnostics"] == []


def test_strict_turns_warnings_into_errors(make_bundle, run_cli):
    folder = make_bundle("demo", metadata={"models": [{"repo": "org/model"}]})
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0
    assert f"{META}:9:5 /models/0: warning TTB037 " in done.stdout
    assert done.stdout.splitlines()[-1] == (f"{folder}: valid (0 errors, 1 warning; bundles: demo)")

    done = no_traceback(run_cli("validate", "--strict", folder))
    assert done.returncode == 1
    assert f"{META}:9:5 /models/0: error TTB037 " in done.stdout
    assert done.stdout.splitlines()[-1] == (
        f"{folder}: INVALID (1 error, 0 warnings; bundles: demo)"
    )

    data = as_json(run_cli("validate", "--strict", "--format", "json", folder))
    assert (data["valid"], data["strict"]) == (False, True)
    assert [d["code"] for d in data["paths"][0]["diagnostics"]] == ["TTB037"]


# A bundle adapter as TT-Metal writes them (generator_vllm.py's LlamaForCausalLM): every
# method forwards to Generator, which lies outside the bundle.
TT_METAL_LIKE = """from models.tt_transformers.tt.generator import Generator


class DemoGenerator(Generator):
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_device_grammar": True,
        "supports_chunked_prefill": True,
    }

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              n_layers=None, tt_data_parallel=1, optimizations="performance"):
        return cls(None, None, mesh_device)

    def prefill_forward(self, *args, **kwargs):
        return super().prefill_forward_text(*args, **kwargs)

    def decode_forward(self, *args, **kwargs):
        return super().decode_forward(*args, **kwargs)

    def allocate_kv_cache(self, *args, **kwargs):
        return None
"""


def test_strict_passes_a_base_outside_the_bundle_strict_unverifiable_fails_it(make_bundle, run_cli):
    folder = make_bundle(
        "demo",
        adapter=TT_METAL_LIKE,
        metadata={
            "capabilities": {
                "prefix_caching": True,
                "async_decode": True,
                "sample_on_device": ["decode_only", "all"],
                "chunked_prefill": True,
            }
        },
    )
    done = no_traceback(run_cli("validate", "--strict", folder))
    assert done.returncode == 0, done.stdout
    assert f"{folder}/adapter.py:4: warning TTB057 async_decode is declared" in done.stdout
    assert done.stdout.splitlines()[-1] == f"{folder}: valid (0 errors, 1 warning; bundles: demo)"

    done = no_traceback(run_cli("validate", "--strict-unverifiable", folder))
    assert done.returncode == 1
    assert f"{folder}/adapter.py:4: error TTB057 " in done.stdout
    assert done.stdout.splitlines()[-1] == (
        f"{folder}: INVALID (1 error, 0 warnings; bundles: demo)"
    )

    data = as_json(run_cli("validate", "--strict", "--strict-unverifiable", "-f", "json", folder))
    assert (data["valid"], data["strict"], data["strict_unverifiable"]) == (False, True, True)
    # JSON keeps each diagnostic's own severity; the verdict applies the strictness.
    assert [(d["code"], d["severity"]) for d in data["paths"][0]["diagnostics"]] == [
        ("TTB057", "warning")
    ]


def test_notes_only_with_verbose(make_bundle, run_cli):
    # A model_capabilities key ttbundles does not know is a note (TTB064).
    adapter = make_bundle.adapter.replace(
        '"supports_prefix_caching": False,',
        '"supports_prefix_caching": False, "state_slots_are_stateless": True,',
    )
    folder = make_bundle("demo", adapter=adapter)
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0
    assert "TTB064" not in done.stdout
    assert "1 note" in done.stdout
    done = no_traceback(run_cli("validate", "-v", folder))
    assert done.returncode == 0
    assert "info TTB064 " in done.stdout and "'state_slots_are_stateless'" in done.stdout


def test_an_environment_class_not_importable_is_a_warning(make_bundle, run_cli):
    folder = make_bundle(
        "demo",
        adapter=None,
        metadata={"main_class": "models.x.generator_vllm:Gen", "main_class_source": "environment"},
    )
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0
    assert f"{folder}/{META}:6:17 /main_class: warning TTB058 " in done.stdout
    assert "not checkable here" in done.stdout


def test_validate_several_paths(make_bundle, run_cli, tmp_path):
    good = make_bundle("good")
    bad = make_bundle("bad", metadata={"version": "one"})
    missing = tmp_path / "missing"
    done = no_traceback(run_cli("validate", good, bad, missing))
    assert done.returncode == 1
    verdicts = [line for line in done.stdout.splitlines() if not line.startswith(" ")]
    assert verdicts == [
        f"{good}: valid (0 errors, 0 warnings; bundles: good)",
        f"{bad}/{META}:4:14 /version: error TTB034 'one' is not a PEP 440 version",
        f"{bad}: INVALID (1 error, 0 warnings; bundles: -)",
        f"{missing}: error TTB001 no such file or folder",
        f"{missing}: INVALID (1 error, 0 warnings; bundles: -)",
    ]
    data = as_json(run_cli("validate", "--format", "json", good, bad))
    assert [(p["path"], p["valid"]) for p in data["paths"]] == [
        (str(good), True),
        (str(bad), False),
    ]
    assert data["valid"] is False


def test_validate_models_folder(make_bundle, run_cli, tmp_path):
    models = tmp_path / "models"
    make_bundle("a", parent=models)
    second = make_bundle("b", parent=models)
    done = no_traceback(run_cli("validate", models))
    assert done.returncode == 1
    assert done.stdout.startswith(f"{second}/{META}:5:11 /arch: error TTB071 ")
    assert done.stdout.splitlines()[-1] == f"{models}: INVALID (1 error, 0 warnings; bundles: a, b)"


@pytest.mark.parametrize(
    "args",
    [
        ["validate"],
        ["validate", "--bogus", "."],
        ["validate", "--format", "yaml", "."],
        ["validate", "--timeout", "0", "."],
        ["frobnicate"],
        ["init"],
        ["init", "x"],  # neither --arch nor --from-hf
        ["list", "--mesh"],
    ],
    ids=lambda a: " ".join(a),
)
def test_usage_errors_exit_2(run_cli, tmp_path, args):
    done = no_traceback(run_cli(*args, cwd=tmp_path))
    assert done.returncode == 2
    # One line saying what is wrong, one saying where the help is; never the usage.
    lines = done.stderr.splitlines()
    assert lines[0].startswith(f"ttbundle {args[0]}: error: ") or lines[0].startswith(
        "ttbundle: error: "
    )
    assert len(lines) == 2 and lines[1].startswith("See 'ttbundle")
    assert "Usage:" not in done.stderr
    assert done.stdout == ""


def test_help_exits_0(run_cli):
    done = no_traceback(run_cli("validate", "--help"))
    assert done.returncode == 0
    assert "--strict" in done.stdout and "Example: ttbundle validate" in done.stdout
    assert "--strict-unverifiable" in done.stdout and "TTB057" in done.stdout


# --- list --------------------------------------------------------------------------------


def entries(data):
    return {
        (e["tt_arch"], e["bundle"]): (e["source"], e["status"], e["reason"])
        for e in data["entries"]
    }


def test_list_extra_dirs_only(make_bundle, run_cli, tmp_path):
    first = make_bundle("one", parent=tmp_path / "m1", metadata={"arch": "OneForCausalLM"})
    second = make_bundle("two", parent=tmp_path / "m2", metadata={"arch": "TwoForCausalLM"})
    env = {
        "EXTRA_MODELS_DIR": os.pathsep.join([str(tmp_path / "m1"), str(tmp_path / "m2")]),
        "TT_VLLM_BUILTIN_MODELS": "0",
    }
    data = as_json(run_cli("list", "--format", "json", env=env))
    assert data["mesh"] is None and data["diagnostics"] == []
    assert [
        (e["tt_arch"], e["bundle"], e["source"], e["status"], e["path"]) for e in data["entries"]
    ] == [
        ("TTOneForCausalLM", "one", "extra", "registered", str(first)),
        ("TTTwoForCausalLM", "two", "extra", "registered", str(second)),
    ]
    assert data["entries"][0]["main_class"] == "adapter:DemoGenerator"
    assert data["entries"][0]["capabilities"]["execution"] == "submesh"

    done = no_traceback(run_cli("list", "-v", env=env))
    assert done.returncode == 0
    assert "TT architectures (mesh: any)" in done.stdout
    rows = [line for line in done.stdout.splitlines() if "ForCausalLM" in line]
    assert len(rows) == 2
    assert "one@1.0.0" in rows[0] and "registered" in rows[0] and str(first) in rows[0]


def test_list_builtins(run_cli):
    data = as_json(run_cli("list", "--format", "json"))
    found = entries(data)
    assert found[("TTLlamaForCausalLM", "tt-llama-galaxy")] == (
        "built-in",
        "inactive",
        "TTB101 applies only when TT_LLAMA_TEXT_VER=llama3_70b_galaxy",
    )
    assert found[("TTMistralForCausalLM", "tt-mistral")] == ("built-in", "registered", "")

    data = as_json(run_cli("list", "--mesh", "N150", "--format", "json"))
    found = entries(data)
    assert found[("TTLlamaForCausalLM", "tt-llama")] == ("built-in", "registered", "")
    assert found[("TTLlamaForCausalLM", "tt-llama-galaxy")] == (
        "built-in",
        "inactive",
        "TTB101 targets TG, not N150",
    )
    assert data["diagnostics"] == []


def test_builtins_off(run_cli, tmp_path):
    for value in ("0", "off"):
        data = as_json(run_cli("list", "--format", "json", env={"TT_VLLM_BUILTIN_MODELS": value}))
        assert data["entries"] == []


def test_extra_bundle_shadows_builtin(make_bundle, run_cli, tmp_path):
    mine = make_bundle("my-llama", parent=tmp_path / "m", metadata={"arch": "LlamaForCausalLM"})
    data = as_json(
        run_cli("list", "--format", "json", env={"EXTRA_MODELS_DIR": str(tmp_path / "m")})
    )
    found = entries(data)
    assert found[("TTLlamaForCausalLM", "my-llama")] == ("extra", "registered", "")
    assert found[("TTLlamaForCausalLM", "tt-llama")] == (
        "built-in",
        "shadowed",
        f"TTB102 shadowed by my-llama@1.0.0 from {mine}",
    )
    registered = [e for e in data["entries"] if e["status"] == "registered"]
    assert [e["bundle"] for e in registered if e["tt_arch"] == "TTLlamaForCausalLM"] == ["my-llama"]


@pytest.mark.parametrize(
    ("env", "args", "winner", "loser_status"),
    [
        ({"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"}, [], "tt-llama-galaxy", "shadowed"),
        (
            {"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"},
            ["--mesh", "TG"],
            "tt-llama-galaxy",
            "shadowed",
        ),
        (
            {"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy", "MESH_DEVICE": "TG"},
            [],
            "tt-llama-galaxy",
            "shadowed",
        ),
        ({"TT_LLAMA_TEXT_VER": "llama3_70b_galaxy"}, ["--mesh", "N150"], "tt-llama", "inactive"),
        ({"TT_LLAMA_TEXT_VER": "llama2_70b"}, ["--mesh", "T3K"], "tt-llama2-70b", "shadowed"),
        ({"TT_LLAMA_TEXT_VER": "tt_transformers"}, ["--mesh", "N150"], "tt-llama", "inactive"),
    ],
)
def test_env_selected_variants(run_cli, env, args, winner, loser_status):
    data = as_json(run_cli("list", "--format", "json", *args, env=env))
    llama = {e["bundle"]: e for e in data["entries"] if e["tt_arch"] == "TTLlamaForCausalLM"}
    assert [n for n, e in llama.items() if e["status"] == "registered"] == [winner]
    other = "tt-llama" if winner != "tt-llama" else "tt-llama-galaxy"
    assert llama[other]["status"] == loser_status
    expected_mesh = args[1] if args else env.get("MESH_DEVICE")
    assert data["mesh"] == expected_mesh


def test_list_mesh_filters_targets(make_bundle, run_cli, tmp_path):
    make_bundle(
        "n150-only", parent=tmp_path / "m", metadata={"targets": {"N150": {"max_num_seqs": 32}}}
    )
    env = {"EXTRA_MODELS_DIR": str(tmp_path / "m"), "TT_VLLM_BUILTIN_MODELS": "0"}
    data = as_json(run_cli("list", "--mesh", "N150", "--format", "json", env=env))
    assert [(e["bundle"], e["status"]) for e in data["entries"]] == [("n150-only", "registered")]
    data = as_json(run_cli("list", "--mesh", "T3K", "--format", "json", env=env))
    assert [(e["bundle"], e["status"], e["reason"]) for e in data["entries"]] == [
        ("n150-only", "inactive", "TTB101 targets N150, not T3K")
    ]
    done = no_traceback(run_cli("list", "--mesh", "T3K", env=env))
    assert "TT architectures (mesh: T3K)" in done.stdout


def test_list_reports_broken_and_missing(make_bundle, run_cli, tmp_path):
    make_bundle("broken", parent=tmp_path / "m", metadata={"capabilites": {}})
    env = {
        "EXTRA_MODELS_DIR": os.pathsep.join([str(tmp_path / "m"), str(tmp_path / "nope")]),
        "TT_VLLM_BUILTIN_MODELS": "0",
    }
    done = run_cli("list", "--format", "json", env=env)
    assert done.returncode == 0
    data = as_json(done)
    [entry] = data["entries"]
    assert (entry["bundle"], entry["status"]) == (None, "skipped")
    assert entry["reason"] == "invalid: TTB030 unknown key 'capabilites'"
    assert sorted((p["code"], p["severity"]) for p in data["diagnostics"]) == [
        ("TTB001", "warning"),
        ("TTB030", "error"),
    ]


def test_list_models_dir_option(make_bundle, run_cli, tmp_path):
    make_bundle("one", parent=tmp_path / "m")
    data = as_json(
        run_cli(
            "list",
            "--models-dir",
            tmp_path / "m",
            "--format",
            "json",
            env={"TT_VLLM_BUILTIN_MODELS": "0", "EXTRA_MODELS_DIR": str(tmp_path / "ignored")},
        )
    )
    assert [e["bundle"] for e in data["entries"]] == ["one"]
    assert data["diagnostics"] == []


# --- init and migrate --------------------------------------------------------------------


def test_init_then_validate(run_cli, tmp_path):
    folder = tmp_path / "my-model"
    done = no_traceback(run_cli("init", folder, "--arch", "MyForCausalLM"))
    assert done.returncode == 0
    assert done.stdout.strip() == str(folder)
    meta = json.loads((folder / META).read_text())
    assert (meta["name"], meta["arch"], meta["main_class"]) == (
        "my-model",
        "MyForCausalLM",
        "adapter:TTMyForCausalLMGenerator",
    )
    assert (folder / "adapter.py").is_file()
    # Valid, with one warning: the methods are still the template (TTB065), which
    # --strict refuses until they are written.
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip().endswith(f"{folder}: valid (0 errors, 1 warning; bundles: my-model)")
    assert "warning TTB065" in done.stdout
    assert no_traceback(run_cli("validate", "--strict", folder)).returncode == 1
    # Nothing else left unchecked, and the signatures pass --import (the template imports
    # nothing, so it imports anywhere).
    args = ("validate", "--strict-unverifiable", "--import", "-v", folder)
    done = no_traceback(run_cli(*args))
    assert done.stdout.strip().endswith(f"{folder}: valid (0 errors, 1 warning; bundles: my-model)")


def test_init_template_follows_the_contract(run_cli, tmp_path):
    """The template's signatures are the worker's calls (format.contract): decode contract
    v1 with the four keyword-only commands, every capability listed and False."""
    import ast

    from ttbundles.format import contract

    folder = tmp_path / "my-model"
    assert no_traceback(run_cli("init", folder, "--arch", "MyForCausalLM")).returncode == 0
    [cls] = [
        n
        for n in ast.parse((folder / "adapter.py").read_text()).body
        if isinstance(n, ast.ClassDef)
    ]
    attributes = {
        t.id: ast.literal_eval(n.value)
        for n in cls.body
        if isinstance(n, ast.Assign)
        for t in n.targets
    }
    assert attributes[contract.CONTRACT_MARKER] == contract.CONTRACT_V1
    capabilities = attributes[contract.CAPABILITIES_ATTRIBUTE]
    assert set(contract.TT_METAL_FLAGS) <= set(capabilities)
    assert not any(capabilities.values())
    meta = json.loads((folder / META).read_text())
    assert set(contract.TT_METAL_FLAGS.values()) <= set(meta["capabilities"])
    assert not any(meta["capabilities"].values())

    methods = {n.name: n for n in cls.body if isinstance(n, ast.FunctionDef)}
    assert set(contract.REQUIRED_METHODS) | set(contract.ASYNC_METHODS) <= set(methods)
    assert contract.KV_CACHE_METHODS[0] in methods
    assert [d.id for d in methods[contract.INITIALIZE.name].decorator_list] == ["classmethod"]
    decode = methods[contract.DECODE.name].args
    assert [a.arg for a in decode.kwonlyargs] == list(contract.DECODE_COMMANDS)
    assert [ast.literal_eval(d) for d in decode.kw_defaults] == list(
        contract.SAFE_COMMAND_DEFAULTS.values()
    )
    named = [a.arg for a in decode.args[1:] + decode.kwonlyargs]
    assert set(named) == contract.decode_keywords(contract.CONTRACT_V1)
    for method in (contract.INITIALIZE, contract.PREFILL):
        args = methods[method.name].args.args[1:]
        assert [a.arg for a in args] == list(method.passes)


def test_init_from_local_checkpoint(run_cli, tmp_path):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(
        json.dumps({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})
    )
    folder = tmp_path / "mistral-bundle"
    done = no_traceback(run_cli("init", folder, "--from-hf", checkpoint, "--name", "my-mistral"))
    assert done.returncode == 0, done.stderr
    meta = json.loads((folder / META).read_text())
    assert (meta["name"], meta["arch"]) == ("my-mistral", "MistralForCausalLM")
    assert "models" not in meta  # a local folder has no repo to pin
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0, done.stdout


@pytest.mark.parametrize(
    ("setup", "code"),
    [
        ("exists", "TTB039"),
        ("no config", "TTB208"),
        ("no architectures", "TTB208"),
        ("bad arch", "TTB033"),
    ],
)
def test_init_refuses(run_cli, make_bundle, tmp_path, setup, code):
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    args = ["--from-hf", checkpoint]
    folder = tmp_path / "new"
    if setup == "exists":
        folder = make_bundle("new")
        args = ["--arch", "XForCausalLM"]
    elif setup == "no architectures":
        (checkpoint / "config.json").write_text("{}")
    elif setup == "bad arch":
        args = ["--arch", "Not-An-Identifier"]
    done = no_traceback(run_cli("init", folder, *args))
    assert done.returncode == 1
    assert f"error {code}" in done.stderr
    assert "fix:" in done.stderr


def test_migrate(make_bundle, run_cli):
    folder = make_bundle("old-model", metadata=LEGACY)
    data = as_json(run_cli("validate", "--format", "json", folder))
    assert [d["code"] for d in data["paths"][0]["diagnostics"]] == ["TTB021"]
    assert data["paths"][0]["bundles"][0]["legacy"] is True

    done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 0
    assert done.stdout.strip() == f"{folder}: migrated to schema_version 1"
    meta = json.loads((folder / META).read_text())
    assert meta == {
        "schema_version": 1,
        "name": "old-model",
        "version": "0.1.0",
        "arch": "DemoForCausalLM",
        "main_class": "adapter:DemoGenerator",
        "main_class_source": "bundle",
    }

    data = as_json(run_cli("validate", "--strict", "--format", "json", folder))
    assert data["valid"] is True
    assert data["paths"][0]["diagnostics"] == []
    assert data["paths"][0]["bundles"][0]["legacy"] is False

    done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 0
    assert done.stdout.strip() == f"{folder}: already schema_version 1; nothing to do"


def test_migrate_invalid_metadata(make_bundle, run_cli):
    folder = make_bundle("old", metadata='{"arch": "Bad-Arch", "main_class": "adapter:G"}')
    before = (folder / META).read_text()
    done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 1
    assert f"{folder}/{META}:1:10 /arch: error TTB033" in done.stderr
    assert (folder / META).read_text() == before


# --- schema and inspect ------------------------------------------------------------------


def test_schema(run_cli):
    done = no_traceback(run_cli("schema"))
    assert done.returncode == 0
    schema = json.loads(done.stdout)
    assert schema["$id"] == "https://ttbundles.dev/schemas/vllm_metadata/v1.schema.json"
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"


def test_inspect_json(make_bundle, run_cli):
    folder = make_bundle("demo", files={"weights/README.md": "no weights\n"})
    done = run_cli("inspect", folder, "--format", "json")
    assert done.returncode == 0, done.stderr
    data = as_json(done)
    assert data["metadata"]["name"] == "demo"
    assert data["tt_arch"] == "TTDemoForCausalLM"
    assert data["path"] == str(folder)
    digest = data["root_digest"]
    assert digest.startswith("sha256:") and len(digest) == len("sha256:") + 64
    expected = []
    for rel in ("adapter.py", META, "weights/README.md"):
        content = (folder / rel).read_bytes()
        expected.append(
            {"path": rel, "size": len(content), "sha256": hashlib.sha256(content).hexdigest()}
        )
    assert sorted(data["files"], key=lambda f: f["path"]) == expected
    # The identity depends on the content only.
    assert as_json(run_cli("inspect", folder, "--format", "json"))["root_digest"] == digest
    (folder / "adapter.py").write_text(make_bundle.adapter + "\n# changed\n")
    assert as_json(run_cli("inspect", folder, "--format", "json"))["root_digest"] != digest


def test_inspect_invalid_bundle(make_bundle, run_cli):
    folder = make_bundle("demo", metadata={"version": "one"})
    done = no_traceback(run_cli("inspect", folder))
    assert done.returncode == 1
    assert "error TTB034" in done.stderr


def test_version_and_python_dash_m(run_cli, tmp_path):
    from importlib.metadata import version

    done = run_cli("--version")
    assert done.returncode == 0 and done.stdout.strip() == f"ttbundle {version('ttbundles')}"
    # cwd elsewhere: `python -m` puts the current folder first on sys.path.
    module = subprocess.run(
        [sys.executable, "-m", "ttbundles", "--version"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert module.returncode == 0 and module.stdout == done.stdout


def test_python_dash_m_from_the_source_tree_runs_its_cli():
    """The checkout's ttbundles/ has its CLI (ttbundles/cli links to the top-level cli/):
    `python -m` from the repository root, which puts that tree first on sys.path, runs
    the same command as the console script."""
    module = subprocess.run(
        [sys.executable, "-m", "ttbundles", "--version"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).parents[1],
    )
    assert module.returncode == 0, module.stderr
    assert module.stdout.startswith("ttbundle "), module.stdout
