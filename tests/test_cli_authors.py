"""The bundle author's commands as users run them: init, migrate, validate's diagnoses,
help, JSON on every path and tables (issue 12). Each test runs the installed `ttbundle`
in a subprocess and checks the exit code, stdout and stderr."""

from __future__ import annotations

import json
import os
import stat
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.bundle_factory import contract_adapter
from tests.test_cli import DIAGNOSTIC_KEYS, META, as_json, no_traceback


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@contextmanager
def umask(mask: int):
    """The umask the CLI's subprocess inherits."""
    old = os.umask(mask)
    try:
        yield
    finally:
        os.umask(old)


def legacy_bundle(make_bundle, name: str = "old", *, document: dict | None = None, **kw) -> Path:
    doc = document or {"arch": "DemoForCausalLM", "main_class": "adapter:DemoGenerator"}
    return make_bundle(name, metadata=json.dumps(doc) + "\n", **kw)


# --- 1. files honour the umask ------------------------------------------------------------


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_init_honours_the_umask(run_cli, tmp_path, mask):
    folder = tmp_path / "new"
    with umask(mask):
        done = no_traceback(run_cli("init", folder, "--arch", "MyForCausalLM"))
    assert done.returncode == 0, done.stderr
    assert mode(folder) == 0o777 & ~mask
    assert mode(folder / META) == 0o666 & ~mask
    assert mode(folder / "adapter.py") == 0o666 & ~mask


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_migrate_keeps_the_files_mode(make_bundle, run_cli, mask):
    folder = legacy_bundle(make_bundle)
    os.chmod(folder / META, 0o640)
    with umask(mask):
        done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 0, done.stderr
    assert json.loads((folder / META).read_text())["schema_version"] == 1
    assert mode(folder / META) == 0o640
    # No temporary file left beside it.
    assert sorted(p.name for p in folder.iterdir()) == ["adapter.py", META]


@pytest.mark.parametrize("mask", [0o022, 0o077])
def test_demo_checkpoint_honours_the_umask(run_cli, tmp_path, mask):
    folder = tmp_path / "cache" / "ckpt"
    with umask(mask):
        done = no_traceback(run_cli("demo", "--write-checkpoint", folder, timeout=300))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(folder)
    assert mode(folder) == 0o777 & ~mask
    files = [p for p in folder.iterdir()]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in files}
    assert {p.name: mode(p) for p in files} == {p.name: 0o666 & ~mask for p in files}


# --- 2. migrate: capabilities, unknown keys, --dry-run -----------------------------------

PREFIX_CLASS = contract_adapter(
    "DemoGenerator",
    attributes="""\
    model_capabilities = {"supports_prefix_caching": True, "supports_async_decode": False}
""",
)


def test_migrate_declares_the_class_capabilities(make_bundle, run_cli):
    """A class declaring prefix caching stays valid after migration (strictly: the v1
    capabilities say what the class says, so not even TTB059)."""
    folder = legacy_bundle(make_bundle, adapter=PREFIX_CLASS)
    done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 0, done.stderr
    assert f"{folder}: capabilities from the class: prefix_caching" in done.stdout
    assert json.loads((folder / META).read_text())["capabilities"] == {"prefix_caching": True}
    done = no_traceback(run_cli("validate", "--strict", folder))
    assert done.returncode == 0, done.stdout
    assert "0 errors, 0 warnings" in done.stdout


def test_migrate_keeps_unknown_keys_as_extensions(make_bundle, run_cli):
    doc = {
        "arch": "DemoForCausalLM",
        "main_class": "adapter:DemoGenerator",
        "notes": {"owner": "me"},
        "x-kept": 1,
    }
    folder = legacy_bundle(make_bundle, document=doc)
    done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 0, done.stderr
    assert f"{folder}: kept 'notes' as 'x-notes' (legacy metadata has no such key)" in (done.stdout)
    meta = json.loads((folder / META).read_text())
    assert meta["x-notes"] == {"owner": "me"} and meta["x-kept"] == 1 and "notes" not in meta
    assert no_traceback(run_cli("validate", "--strict", folder)).returncode == 0


def test_migrate_refuses_a_key_it_cannot_keep(make_bundle, run_cli):
    doc = {"arch": "DemoForCausalLM", "main_class": "adapter:DemoGenerator", "a": 1, "x-a": 2}
    folder = legacy_bundle(make_bundle, document=doc)
    before = (folder / META).read_text()
    done = no_traceback(run_cli("migrate", folder))
    assert done.returncode == 1
    assert (
        f"{folder / META} /a: error TTB030 legacy key 'a' cannot be kept as 'x-a': "
        "the file has that key too"
    ) in done.stderr
    assert "fix: rename or remove one of 'a' and 'x-a', then migrate again" in done.stderr
    assert (folder / META).read_text() == before


def test_migrate_dry_run_shows_the_diff_and_writes_nothing(make_bundle, run_cli, tmp_path):
    folder = legacy_bundle(make_bundle, adapter=PREFIX_CLASS)
    before = (folder / META).read_text()
    done = no_traceback(run_cli("migrate", "--dry-run", folder))
    assert done.returncode == 0, done.stderr
    assert (folder / META).read_text() == before
    lines = done.stdout.splitlines()
    assert lines[:3] == [f"--- a/{folder / META}", f"+++ b/{folder / META}", "@@ -1 +1,11 @@"]
    assert f"-{before.rstrip()}" in lines
    assert '+  "schema_version": 1,' in lines and '+    "prefix_caching": true' in lines
    assert lines[-1] == f"{folder}: would migrate to schema_version 1 (dry run: nothing written)"
    # The diff is a real one: applied to the old file it gives what migrate writes.
    patch = "\n".join(line for line in lines if not line.startswith(f"{folder}:")) + "\n"
    applied = subprocess.run(
        ["patch", "-p1", "-o", "-", "-i", "-"],
        input=patch.replace(f"a/{folder}", "a/old").replace(f"b/{folder}", "b/old"),
        capture_output=True,
        text=True,
        cwd=folder.parent,
    )
    assert applied.returncode == 0, applied.stderr
    assert no_traceback(run_cli("migrate", folder)).returncode == 0
    assert applied.stdout == (folder / META).read_text()

    data = as_json(run_cli("migrate", "--dry-run", "--format", "json", folder))
    assert (data["ok"], data["changed"], data["written"], data["diagnostics"]) == (
        True,
        False,
        False,
        [],
    )


# --- 3. the static check follows aliases --------------------------------------------------

ALIASED = '''"""Methods bound by assignment, as TT-Metal's generators do."""


def _decode(self, tokens, start_pos, page_table, kv_cache, **kwargs):
    return None


class DemoGenerator:
    model_capabilities = {"supports_prefix_caching": False}

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len, **kw):
        return cls()

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def _prefill(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return None

    prefill_forward = _prefill
    decode_forward = _decode
'''


def test_validate_follows_simple_aliases(make_bundle, run_cli):
    folder = make_bundle("aliased", adapter=ALIASED)
    done = no_traceback(run_cli("validate", "--strict", folder))
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == f"{folder}: valid (0 errors, 0 warnings; bundles: aliased)"
    # The alias's signature is read: decode_forward = _decode has no sampling_params.
    broken = make_bundle(
        "no-sampling",
        adapter=ALIASED.replace(
            "**kwargs):\n    return None\n\n\nclass", "):\n    return None\n\n\nclass"
        ),
        metadata={"capabilities": {"sample_on_device": ["all"]}},
    )
    done = no_traceback(run_cli("validate", broken))
    assert done.returncode == 1
    assert (
        "error TTB055 sample_on_device is declared but decode_forward takes no sampling_params"
        in (done.stdout)
    )


# --- 4. init --from-hf --------------------------------------------------------------------


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    folder = tmp_path / "ckpt"
    folder.mkdir()
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "_name_or_path": "meta-llama/Llama-3.2-1B",
    }
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_init_says_when_arch_overrides_the_checkpoint(run_cli, tmp_path, checkpoint):
    folder = tmp_path / "b"
    done = no_traceback(run_cli("init", folder, "--from-hf", checkpoint, "--arch", "MyForCausalLM"))
    assert done.returncode == 0, done.stderr
    assert done.stdout == f"{folder}\n"  # stdout stays the path alone
    assert (
        "note: --arch MyForCausalLM overrides the checkpoint's architectures (LlamaForCausalLM)"
        in done.stderr
    )
    assert json.loads((folder / META).read_text())["arch"] == "MyForCausalLM"


@pytest.mark.parametrize("with_checkpoint", [True, False])
def test_init_refuses_a_model_type_as_arch(run_cli, tmp_path, checkpoint, with_checkpoint):
    folder = tmp_path / "b"
    args = ["--from-hf", checkpoint] if with_checkpoint else []
    done = no_traceback(run_cli("init", folder, "--arch", "llama", *args))
    assert done.returncode == 1
    assert "error TTB033 'llama' is a model_type, not an architecture" in done.stderr
    assert "fix: did you mean --arch LlamaForCausalLM?" in done.stderr
    assert not folder.exists()


def test_init_models_from_a_hub_cache_folder(run_cli, tmp_path, checkpoint):
    snapshot = tmp_path / "hub" / "models--org--tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((checkpoint / "config.json").read_text())
    folder = tmp_path / "b"
    done = no_traceback(run_cli("init", folder, "--from-hf", snapshot))
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    meta = json.loads((folder / META).read_text())
    assert meta["models"] == [{"repo": "org/tiny", "revision": "0123abcd"}]
    assert no_traceback(run_cli("validate", folder)).returncode == 0  # --strict: TTB065


def test_init_says_why_models_is_not_written(run_cli, tmp_path, checkpoint):
    folder = tmp_path / "b"
    done = no_traceback(run_cli("init", folder, "--from-hf", checkpoint))
    assert done.returncode == 0, done.stderr
    assert "models" not in json.loads((folder / META).read_text())
    assert (
        "note: models not written: ckpt is a local folder, which names no hub repository or "
        'revision; add {"repo": "meta-llama/Llama-3.2-1B", "revision": "<commit sha>"}'
    ) in done.stderr


def test_init_a_mistyped_path_is_a_clear_error(run_cli, tmp_path, checkpoint):
    folder = tmp_path / "b"
    done = no_traceback(run_cli("init", folder, "--from-hf", "./ckpt-typo", cwd=tmp_path))
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "ckpt-typo: error TTB001 no such checkpoint folder",
        "    fix: did you mean ckpt? (see docs/reference/codes.md#ttb001)",
    ]
    # A hub id not in the cache (offline): our words, not huggingface-hub's exception.
    done = no_traceback(run_cli("init", folder, "--from-hf", "org/not-cached", cwd=tmp_path))
    assert done.returncode == 1
    assert "error TTB208 'org/not-cached' is not a folder here, and its config.json" in (
        done.stderr
    )
    assert "LocalEntryNotFoundError" not in done.stderr and "Repo id" not in done.stderr


def test_init_without_a_network_answers_from_the_cache_at_once(
    run_cli_process, tmp_path, checkpoint
):
    """Online mode (no HF_HUB_OFFLINE) and a hub that cannot be reached (here a closed
    port): the cached config is used, a repository not in the cache is TTB208, both
    without huggingface_hub's retries (about 23 s; the timeout below is shorter)."""
    import socket

    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cache = tmp_path / "hub"
    snapshot = cache / "models--org--cached" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((checkpoint / "config.json").read_text())
    (cache / "models--org--cached" / "refs").mkdir()
    (cache / "models--org--cached" / "refs" / "main").write_text("0123abcd")
    env = {
        "HF_HUB_OFFLINE": "",
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HF_HUB_CACHE": str(cache),
    }
    done = no_traceback(
        run_cli_process("init", tmp_path / "a", "--from-hf", "org/cached", env=env, timeout=15)
    )
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "a" / META).read_text())
    assert meta["models"] == [{"repo": "org/cached", "revision": "0123abcd"}]
    done = no_traceback(
        run_cli_process("init", tmp_path / "b", "--from-hf", "org/not-cached", env=env, timeout=15)
    )
    assert done.returncode == 1
    assert "error TTB208 'org/not-cached' is not a folder here" in done.stderr


# --- 5. diagnoses -------------------------------------------------------------------------


def test_validate_the_metadata_file_means_its_bundle(make_bundle, run_cli):
    folder = make_bundle("demo")
    done = no_traceback(run_cli("validate", folder / META))
    assert done.returncode == 0, done.stdout
    assert done.stdout.strip() == f"{folder / META}: valid (0 errors, 0 warnings; bundles: demo)"
    done = no_traceback(run_cli("validate", folder / "adapter.py"))
    assert done.returncode == 1
    assert (
        f"{folder / 'adapter.py'}: error TTB001 a file that is not a .ttbundle archive; "
        "a bundle is a folder"
    ) in done.stdout
    assert f"fix: pass the bundle's folder ({folder}), or a .ttbundle archive" in done.stdout
    assert "cut short" not in done.stdout


def test_one_ambiguity_one_error(make_bundle, run_cli, tmp_path):
    models = tmp_path / "models"
    for name in ("a", "b", "c", "d"):
        make_bundle(name, parent=models)
    done = no_traceback(run_cli("validate", models))
    assert done.returncode == 1
    errors = [line for line in done.stdout.splitlines() if "TTB071" in line]
    assert len(errors) == 1
    assert all(f"{name} ({models / name})" in errors[0] for name in "abcd")
    assert "all 4 register TTDemoForCausalLM" in errors[0]


@pytest.mark.parametrize("spec", [">=0.33,,<0.34", ">=0.33;python_version>'3'", "[x]>=1"])
def test_requires_specifiers_are_read_as_pep_508(make_bundle, run_cli, spec):
    folder = make_bundle("demo", metadata={"requires": {"vllm": spec}})
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 1
    assert f"/requires/vllm: error TTB034 '{spec}' is not a PEP 440 version specifier" in (
        done.stdout
    )


# --- 6. help ------------------------------------------------------------------------------

COMMANDS = [
    "validate",
    "pack",
    "verify",
    "install",
    "uninstall",
    "list",
    "inspect",
    "schema",
    "init",
    "migrate",
    "demo",
    "test",
    "plan",
    "doctor",
]


def test_the_root_help_shows_examples(run_cli):
    done = no_traceback(run_cli("-h", env={"COLUMNS": "80"}))
    assert done.returncode == 0
    assert "Example: ttbundle validate ./my-bundle" in done.stdout
    assert "Example: ttbundle demo --query" in done.stdout


@pytest.mark.parametrize("command", COMMANDS)
def test_help_names_values_and_shows_an_example(run_cli, command):
    done = no_traceback(run_cli(command, "-h", env={"COLUMNS": "80"}))
    assert done.returncode == 0
    examples = ("Example: ttbundle ", "Example: EXTRA_MODELS_DIR=", "Example: MESH_DEVICE=")
    assert any(example in done.stdout for example in examples)
    for python_type in ("<bool>", "<str>", "<int>", "<float", "<path>", "list[", "<Path"):
        assert python_type not in done.stdout, python_type
    assert max(len(line) for line in done.stdout.splitlines()) <= 80


def test_help_value_names(run_cli):
    done = no_traceback(run_cli("list", "-h", env={"COLUMNS": "100"}))
    rows = {line.split()[1]: line for line in done.stdout.splitlines() if "--" in line}
    assert "DIR" in rows["--models-dir"] and "MESH" in rows["--mesh"]
    assert "human|json" in rows["--format"]
    done = no_traceback(run_cli("validate", "-h", env={"COLUMNS": "100"}))
    assert "ttbundle validate [OPTIONS] {PATH}..." in done.stdout
    assert "SECONDS" in done.stdout


# --- 7. JSON on every path ----------------------------------------------------------------


def _envelope(done, code: int) -> dict:
    assert done.returncode == code, (done.stdout, done.stderr)
    data = as_json(done)
    assert list(data)[0] == "ok" and list(data)[-1] == "diagnostics"
    for d in data["diagnostics"]:
        assert set(d) == DIAGNOSTIC_KEYS
    return data


@pytest.mark.parametrize(
    ("args", "code", "ttb"),
    [
        # A missing path is TTB001 whatever the command (one code per condition).
        (["validate", "{missing}"], 1, "TTB001"),
        (["verify", "{missing}"], 1, "TTB001"),
        (["inspect", "{missing}"], 1, "TTB001"),
        (["install", "{missing}", "--models-dir", "{tmp}"], 1, "TTB001"),
        (["pack", "{missing}"], 1, "TTB001"),
        (["migrate", "{missing}"], 1, "TTB001"),
        (["plan", "{missing}", "--mesh", "HOST"], 1, "TTB001"),
        (["test", "{missing}", "--model", "{tmp}"], 1, "TTB001"),
        (["uninstall", "nothing-here", "--models-dir", "{tmp}"], 1, "TTB092"),
        (["list", "--bogus"], 2, "TTB004"),
        (["validate"], 2, "TTB004"),
        (["inspect", "{missing}", "--no-such-flag"], 2, "TTB004"),
    ],
)
def test_json_on_error_paths(run_cli, tmp_path, args, code, ttb):
    args = [a.format(missing=tmp_path / "missing", tmp=tmp_path) for a in args]
    data = _envelope(run_cli(*args, "--format", "json"), code)
    assert data["ok"] is False and data["diagnostics"]
    assert all(d["severity"] == "error" for d in data["diagnostics"] if d["code"] == ttb)
    if ttb is not None:
        assert [d["code"] for d in data["diagnostics"]] == [ttb]
    if ttb == "TTB004":
        assert data["diagnostics"][0]["hint"].startswith("see ttbundle ")


def test_json_on_success_has_the_same_shape(make_bundle, run_cli, tmp_path):
    folder = make_bundle("demo")
    assert _envelope(run_cli("validate", folder, "-f", "json"), 0)["ok"] is True
    packed = no_traceback(run_cli("pack", folder, "-o", tmp_path / "dist"))
    archive = packed.stdout.strip().splitlines()[-1]
    assert _envelope(run_cli("verify", archive, "--format=json"), 0)["valid"] is True
    inspected = _envelope(run_cli("inspect", folder, "--format", "json"), 0)
    assert inspected["metadata"]["name"] == "demo"
    listed = _envelope(
        run_cli(
            "list",
            "--models-dir",
            folder.parent,
            "--format",
            "json",
            env={"TT_VLLM_BUILTIN_MODELS": "0"},
        ),
        0,
    )
    assert [e["bundle"] for e in listed["entries"]] == ["demo"]


def test_no_internal_package_names_in_output(make_bundle, run_cli):
    adapter = "from .missing_helper import thing\n" + make_bundle.adapter
    folder = make_bundle("rel", adapter=adapter)
    done = no_traceback(run_cli("validate", "--import", folder))
    assert done.returncode == 1
    assert "No module named 'missing_helper'" in done.stdout
    assert "_ttb_" not in done.stdout + done.stderr
    data = as_json(run_cli("validate", "--import", "--format", "json", folder))
    assert "_ttb_" not in json.dumps(data)


# --- 8. tables ----------------------------------------------------------------------------


def test_list_piped_is_plain(make_bundle, run_cli, tmp_path):
    models = tmp_path / ("a-rather-long-folder-name-" * 3) / "models"
    make_bundle("demo", parent=models)
    env = {"TT_VLLM_BUILTIN_MODELS": "0", "EXTRA_MODELS_DIR": str(models)}
    done = no_traceback(run_cli("list", env=env))
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert lines[0] == "TT architectures (mesh: any)"
    assert lines[1].split() == [
        "architecture",
        "bundle",
        "source",
        "status",
        "capabilities",
        "signer",
        "path",
        "/",
        "reason",
    ]
    row = lines[2].split()
    assert row[:6] == ["TTDemoForCausalLM", "demo@1.0.0", "extra", "registered", "-", "unsigned"]
    assert len(row[6]) <= 40 and row[6].endswith("/models/demo") and "..." in row[6]
    assert not any(ch in done.stdout for ch in "│─┃━╭")
    whole = no_traceback(run_cli("list", "-v", env=env)).stdout.splitlines()[2].split()
    assert whole[6] == str(models / "demo")


def test_a_shortened_path_keeps_whole_folder_names():
    """A path too long for its column loses its first folders, never part of a name:
    the bundle's own folder always shows whole."""
    from cli.output import short_path

    long = "/opt/site-packages/ttbundles/_data/bundles/tt-gemma-4-26b-a4b"
    assert short_path(long) == ".../_data/bundles/tt-gemma-4-26b-a4b"
    assert short_path("/x/" + "a-very-long-bundle-folder-name-" * 2) == (
        ".../" + "a-very-long-bundle-folder-name-" * 2
    )
    assert short_path("/opt/b/demo") == "/opt/b/demo"
    assert short_path(long, verbose=True) == long


def test_list_on_an_80_column_terminal(run_cli):
    """The built-ins' table on a terminal 80 wide: no line longer, no word split."""
    env = {"TTY_COMPATIBLE": "1", "COLUMNS": "80", "NO_COLOR": "1"}
    done = no_traceback(run_cli("list", env=env))
    assert done.returncode == 0
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    words = set(done.stdout.replace(",", " ").split())
    for name in ("TTQwen2_5_VLForConditionalGeneration", "sample_on_device=decode_only+all"):
        assert name in words  # whole, never broken across lines
    assert "…" not in done.stdout


# --- issue 35: what a new author meets ----------------------------------------------------

REPO = Path(__file__).resolve().parents[1]


def test_validate_refuses_what_python_cannot_compile(run_cli, tmp_path):
    """`import os` above `from __future__` parses (ast) but does not compile: static
    validate says so at the future import's line (TTB051), and pack refuses the bundle;
    nothing is imported."""
    import shutil

    bundle = shutil.copytree(REPO / "bundles" / "demo", tmp_path / "mine")
    adapter = bundle / "adapter.py"
    adapter.write_text("import os\n" + adapter.read_text())
    future = adapter.read_text().splitlines().index("from __future__ import annotations") + 1
    done = no_traceback(run_cli("validate", bundle))
    assert done.returncode == 1, done.stdout
    assert f"{adapter}:{future}:1: error TTB051 syntax error: from __future__ imports" in (
        done.stdout
    )
    packed = no_traceback(run_cli("pack", bundle, "-o", tmp_path / "dist"))
    assert packed.returncode == 1 and "TTB051" in packed.stderr + packed.stdout


def test_validate_compiles_every_module_of_the_bundle(make_bundle, run_cli):
    """A helper module the class's file does not import at the top is imported when
    served too: `return` outside a function in it is TTB051 at its line."""
    bundle = make_bundle("helpers", files={"helpers/util.py": "x = 1\nreturn x\n"})
    done = no_traceback(run_cli("validate", bundle))
    assert done.returncode == 1
    assert f"{bundle / 'helpers' / 'util.py'}:2:1: error TTB051 syntax error: 'return'" in (
        done.stdout
    )


def test_the_validate_help_example_validates_in_the_repository(run_cli):
    """The folders `validate --help`'s example names that exist in a checkout validate
    strictly, and `bundles/` as a whole, the repository's own bundles, validates (exit 0:
    warnings only, for the TT-Metal classes not importable here)."""
    [example] = [
        line.strip()
        for line in run_cli("validate", "--help").stdout.splitlines()
        if "Example:" in line
    ]
    paths = [p for p in example.split("ttbundle validate", 1)[1].split() if (REPO / p).exists()]
    assert paths, example
    done = no_traceback(run_cli("validate", "--strict", *paths, cwd=REPO))
    assert done.returncode == 0, done.stdout
    done = no_traceback(run_cli("validate", "bundles/", cwd=REPO))
    assert done.returncode == 0 and "0 errors" in done.stdout, done.stdout


def test_legacy_metadata_gets_the_verdict_list_gives(make_bundle, run_cli, tmp_path):
    """A legacy bundle whose class supports prefix caching: `list` serves it with prefix
    caching on (the class's capabilities), and `validate` says the same thing: legacy
    (TTB021), not "declared below the class, stays off" (TTB059)."""
    models = tmp_path / "models"
    folder = legacy_bundle(make_bundle, parent=models, adapter=PREFIX_CLASS)
    done = no_traceback(run_cli("validate", folder))
    assert done.returncode == 0, done.stdout
    assert "TTB059" not in done.stdout and "warning TTB021" in done.stdout
    listed = as_json(run_cli("list", "--models-dir", models, "--format", "json"))
    [row] = [r for r in listed["entries"] if r["path"] == str(folder)]
    assert row["capabilities"]["prefix_caching"] is True


def test_init_keep_adapter_reads_the_class_capabilities(run_cli, tmp_path):
    """`init --keep-adapter` declares what the kept class's model_capabilities says (as
    `migrate` does), so the new bundle validates strictly: no TTB059."""
    folder = tmp_path / "kept"
    folder.mkdir()
    (folder / "adapter.py").write_text(PREFIX_CLASS)
    done = no_traceback(run_cli("init", folder, "--arch", "DemoForCausalLM", "--keep-adapter"))
    assert done.returncode == 0, done.stderr
    assert "note: capabilities from the class: prefix_caching" in done.stderr
    caps = json.loads((folder / META).read_text())["capabilities"]
    assert caps["prefix_caching"] is True and caps["async_decode"] is False
    done = no_traceback(run_cli("validate", "--strict", folder))
    assert done.returncode == 0, done.stdout


def test_init_reference_validates_strictly_and_packs(run_cli, tmp_path):
    """`init --reference` writes a bundle on the torch reference generator: it validates
    strictly (every capability the reference has, in agreement with the class) and
    packs; its adapter says where TT-NN code replaces it."""
    done = no_traceback(
        run_cli("init", "my-llama", "--arch", "LlamaForCausalLM", "--reference", cwd=tmp_path)
    )
    assert done.returncode == 0, done.stderr
    bundle = tmp_path / "my-llama"
    source = (bundle / "adapter.py").read_text()
    assert "from ttbundles.reference.generator import ReferenceLlamaGenerator" in source
    assert source.count('"""TT-NN: ') == 10 and "NotImplementedError" not in source
    meta = json.loads((bundle / META).read_text())
    assert meta["capabilities"]["sample_on_device"] == ["decode_only", "all"]
    # what the reference serves beyond TT-Metal's keys, as the demo bundle declares it
    assert meta["capabilities"]["spec_decode"] == ["ngram"]
    assert meta["capabilities"]["prompt_logprobs"] is True
    assert "return_prompt_logits=return_prompt_logits" in source and "spec_mode=" in source
    assert list(meta["targets"]) == ["HOST"]
    done = no_traceback(run_cli("validate", "--strict", "-v", bundle))
    assert done.returncode == 0 and "(0 errors, 0 warnings;" in done.stdout, done.stdout
    packed = no_traceback(run_cli("pack", bundle, "-o", tmp_path / "dist"))
    assert packed.returncode == 0, packed.stderr


def test_init_reference_gives_the_host_mesh_the_checkpoints_own_length(
    run_cli, tmp_path, models_dir, gemma3_checkpoint, monkeypatch
):
    """The host target's max_model_len is the checkpoint's own (1,024 positions), so
    `--max-model-len 1024` is served as asked, not lowered to 512 (TTB246); the note says
    where the number comes from, and why 512 where no checkpoint was read."""
    from tests.test_platform_config import configure
    from ttbundles.serving.planning import command_line

    done = no_traceback(
        run_cli("init", models_dir / "g3", "--reference", "--from-hf", gemma3_checkpoint)
    )
    assert done.returncode == 0, done.stderr
    meta = json.loads((models_dir / "g3" / META).read_text())
    assert meta["targets"]["HOST"]["max_model_len"] == 1024
    assert "targets.HOST.max_model_len is 1,024, the checkpoint's own" in done.stderr
    monkeypatch.setattr(command_line, "COMMAND_LINE", {"max_model_len": 1024})
    config, decisions, plan = configure(gemma3_checkpoint, max_model_len=1024)
    assert config.model_config.max_model_len == 1024
    assert decisions["max_model_len"]["effective"] == 1024
    assert not [w for w in plan["warnings"] if w["code"] == "TTB246"]

    bare = no_traceback(
        run_cli("init", tmp_path / "bare", "--arch", "LlamaForCausalLM", "--reference")
    )
    assert json.loads((tmp_path / "bare" / META).read_text())["targets"]["HOST"] == {
        "max_model_len": 512,
        "max_num_seqs": 32,
    }
    assert "max_model_len is 512: no checkpoint was read (--arch alone)" in bare.stderr


def test_init_reference_names_the_families_it_covers(run_cli, tmp_path):
    done = no_traceback(
        run_cli("init", tmp_path / "g", "--arch", "GemmaForCausalLM", "--reference")
    )
    assert done.returncode == 1 and not (tmp_path / "g").exists()
    assert "error TTB041 the torch reference generator does not cover GemmaForCausalLM" in (
        done.stderr
    )
    assert (
        "LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
        "Gemma3ForCausalLM" in done.stderr
    )
    # Gemma 4 is covered, on its own reference generator.
    done = no_traceback(
        run_cli("init", tmp_path / "g4", "--arch", "Gemma4ForCausalLM", "--reference")
    )
    assert done.returncode == 0, done.stderr
    adapter = (tmp_path / "g4" / "adapter.py").read_text()
    assert "from ttbundles.reference.gemma4 import ReferenceGemma4Generator" in adapter
    done = no_traceback(
        run_cli(
            "init", tmp_path / "k", "--arch", "LlamaForCausalLM", "--reference", "--keep-adapter"
        )
    )
    assert done.returncode == 2 and "pick one" in done.stderr


@pytest.mark.parametrize(
    ("arch", "tasks"),
    [
        ("Qwen3ForCausalLM", ["embed", "token_embed"]),
        ("Qwen3ForSequenceClassification", ["classify"]),
    ],
)
def test_init_reference_declares_the_pooling_the_reference_serves(run_cli, tmp_path, arch, tasks):
    """The reference returns hidden states from prefill (the form prefill_hidden): a
    decoder's bundle serves embeddings, a sequence classifier's its classifier."""
    done = no_traceback(run_cli("init", tmp_path / "b", "--arch", arch, "--reference"))
    assert done.returncode == 0, done.stderr
    meta = json.loads((tmp_path / "b" / META).read_text())
    assert meta["schema_version"] == 5
    assert meta["capabilities"]["pooling"] == {"tasks": tasks, "form": "prefill_hidden"}
    source = (tmp_path / "b" / "adapter.py").read_text()
    assert "return_hidden_states=True" in source  # said where prefill is replaced
    done = no_traceback(run_cli("validate", "--strict", tmp_path / "b"))
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize("arch", ["BertModel", "XLMRobertaForSequenceClassification"])
def test_init_reference_refuses_an_encoder_and_says_so(run_cli, tmp_path, arch):
    done = no_traceback(run_cli("init", tmp_path / "e", "--arch", arch, "--reference"))
    assert done.returncode == 1 and not (tmp_path / "e").exists()
    assert f"error TTB041 the torch reference generator does not cover {arch}" in done.stderr
    assert "an encoder (bidirectional attention" in done.stderr
    assert "the pooling form 'forward'" in done.stderr


def test_the_reference_families_are_the_reference_generators():
    """scaffold.reference and validate's table list them without importing torch; they
    must stay the same, and name classes that exist."""
    import importlib

    from ttbundles.check.reference_archs import (
        GEMMA4_ARCHITECTURES,
        QWEN3_5_ARCHITECTURES,
        REFERENCE_GENERATORS,
        TEXT_ARCHITECTURES,
    )
    from ttbundles.reference.families import FAMILIES, SUPPORTED_ARCHITECTURES
    from ttbundles.scaffold.reference import REFERENCE_BASES

    static = TEXT_ARCHITECTURES + QWEN3_5_ARCHITECTURES + GEMMA4_ARCHITECTURES
    assert sorted(REFERENCE_BASES) == sorted(SUPPORTED_ARCHITECTURES) == sorted(static)
    # Each family's generator is the class validate and init name for its architectures.
    for family in FAMILIES:
        assert set(family.architectures) <= set(REFERENCE_GENERATORS[family.generator])
        for arch in family.architectures:
            assert ":".join(REFERENCE_BASES[arch]) == family.generator, arch
    for name in REFERENCE_GENERATORS:
        module, cls = name.split(":")
        assert isinstance(getattr(importlib.import_module(module), cls), type), name


def test_validate_refuses_an_arch_the_reference_base_does_not_read(run_cli, tmp_path):
    """A reference bundle with another arch: validate says so statically (TTB041, the code
    init --reference uses), not the server at load; the VL reference keeps its own."""
    done = no_traceback(
        run_cli("init", "b", "--arch", "Qwen3ForCausalLM", "--reference", cwd=tmp_path)
    )
    assert done.returncode == 0, done.stderr
    bundle = tmp_path / "b"
    meta = json.loads((bundle / META).read_text())
    meta["arch"] = "Gemma4ForCausalLM"
    (bundle / META).write_text(json.dumps(meta))
    for strict in ([], ["--strict"]):
        done = no_traceback(run_cli("validate", *strict, bundle))
        assert done.returncode == 1, done.stdout
        [line] = [x for x in done.stdout.splitlines() if "TTB041" in x]
        assert "/arch" in line and "Gemma4ForCausalLM" in line and "Qwen3ForCausalLM" in line
    # the class's nearest reference decides: the VL generator reads its own architecture
    (bundle / "adapter.py").write_text(
        "from ttbundles.reference.vl_generator import ReferenceQwen2_5_VLGenerator\n\n\n"
        f"class {meta['main_class'].split(':')[1]}(ReferenceQwen2_5_VLGenerator):\n"
        "    pass\n"
    )
    meta["arch"] = "Qwen3ForCausalLM"
    (bundle / META).write_text(json.dumps(meta))
    done = no_traceback(run_cli("validate", bundle))
    assert "TTB041" in done.stdout and "Qwen2_5_VLForConditionalGeneration" in done.stdout
    meta["arch"] = "Qwen2_5_VLForConditionalGeneration"
    (bundle / META).write_text(json.dumps(meta))
    done = no_traceback(run_cli("validate", bundle))
    assert "TTB041" not in done.stdout, done.stdout


def test_errors_name_the_users_paths_not_our_work_folders(tmp_path):
    """A diagnostic raised inside one of our work folders names what the user gave: a
    file inside an archive as ARCHIVE!/path, the folder itself (a command's argument) as
    the archive, a registry reference as typed."""
    from ttbundles.errors import Diagnostic, Severity, relocated

    work = tmp_path / "ttbundle-test-1-abc" / "models" / "mine"
    found = Diagnostic(
        "TTB060",
        Severity.ERROR,
        f"importing {work}/adapter.py failed",
        file=f"{work}/adapter.py",
        hint=f"reproduce with: ttbundle validate --import {work}",
    )
    [archive] = relocated([found], work, "dist/mine-1.0.0.ttbundle!")
    assert archive.file == "dist/mine-1.0.0.ttbundle!/adapter.py"
    assert archive.hint == "reproduce with: ttbundle validate --import dist/mine-1.0.0.ttbundle"
    [folder] = relocated([found], work, "mine")
    assert (folder.file, folder.message) == ("mine/adapter.py", "importing mine/adapter.py failed")


IMPORT_FAILS = "raise ImportError('ttnn is not installed here')\n"


@pytest.mark.server
def test_test_names_the_bundle_as_typed_when_serving_fails(make_bundle, run_cli, tmp_path):
    """`ttbundle test` of a bundle whose adapter cannot be imported: the hint to reproduce
    names the bundle folder the user typed, not the run's temporary copy."""
    bundle = make_bundle(
        "importfail",
        metadata={"arch": "LlamaForCausalLM"},
        adapter=IMPORT_FAILS + make_bundle.adapter,
    )
    ckpt = tmp_path / "ckpt"
    assert run_cli("demo", "--write-checkpoint", ckpt, timeout=300).returncode == 0
    done = no_traceback(
        run_cli(
            "test",
            "importfail",
            "--model",
            ckpt,
            "--path",
            "prefill",
            cwd=bundle.parent,
            timeout=600,
        )
    )
    assert done.returncode == 1, done.stdout
    assert "ttbundle-test-" not in done.stderr + done.stdout
    assert "ttbundle validate --import importfail" in done.stderr, done.stderr


def test_a_bound_is_said_in_our_words_with_a_fix(make_bundle, run_cli):
    """pydantic's "Input should be greater than 0" never reaches the user: what the value
    is, what it must be, and a fix line."""
    bundle = make_bundle("bounds", metadata={"targets": {"HOST": {"max_model_len": 0}}})
    done = no_traceback(run_cli("validate", bundle))
    assert done.returncode == 1
    assert "Input should" not in done.stdout
    assert "error TTB033 max_model_len is 0; it must be greater than 0" in done.stdout
    assert "fix: set max_model_len to a number greater than 0, or remove it" in done.stdout


def test_one_spelling_and_one_code_across_commands(make_bundle, run_cli, tmp_path):
    """sign takes --certificate-chain as verify does; a --key file that is not there is
    TTB001 (a missing path, as everywhere), not TTB142 (a key that cannot sign); push's
    help says the tag is optional; test's --mesh defaults to $MESH_DEVICE as elsewhere."""
    assert "--certificate-chain" in run_cli("sign", "--help").stdout
    assert "--chain " not in run_cli("sign", "--help").stdout
    bundle = make_bundle("signme")
    done = no_traceback(run_cli("sign", bundle, "--key", tmp_path / "nope.pem"))
    assert done.returncode == 1
    assert f"{tmp_path / 'nope.pem'}: error TTB001 no such file" in done.stderr
    assert "REPOSITORY[:TAG] (no tag: latest)" in run_cli("push", "--help").stdout
    assert "Default: $MESH_DEVICE, else HOST" in run_cli("test", "--help").stdout


def test_plan_answers_a_slip_in_its_own_options_at_once(run_cli, tmp_path):
    """`plan ./ckpt --fromat json` is a usage error (exit 2) before vLLM is imported:
    well under the 15 s vLLM's import and parser cost (timeout below)."""
    import time

    began = time.monotonic()
    done = no_traceback(run_cli("plan", "./ckpt", "--fromat", "json", cwd=tmp_path, timeout=10))
    assert done.returncode == 2
    assert "ttbundle plan: error: no such option --fromat; did you mean --format?" in done.stderr
    assert time.monotonic() - began < 8
    done = run_cli("plan", "./ckpt", "--modls-dir", "x", "-f", "json", cwd=tmp_path, timeout=10)
    assert done.returncode == 2 and as_json(done)["diagnostics"][0]["code"] == "TTB004"


def test_one_meaning_for_verbose():
    """-v is --verbose everywhere, and only adds detail; plan's vLLM log is --vllm-log."""
    from ttbundles.cli.app import command

    root = command()
    for name, sub in root.commands.items():
        for param in sub.params:
            if "-v" in getattr(param, "opts", []):
                assert "--verbose" in param.opts and param.help.startswith("More detail"), name
    plan_options = {o for p in root.commands["plan"].params for o in getattr(p, "opts", [])}
    assert "--vllm-log" in plan_options


@pytest.mark.parametrize("command", ["plan", "test"])
def test_without_a_network_plan_and_test_answer_as_init_does(run_cli, tmp_path, command):
    """Online mode and a hub that cannot be reached (a closed port): a hub id not in the
    cache is TTB208 at once from plan and test, as from init --from-hf, one code for one
    condition, without the hub's or vLLM's retries (the timeout is shorter)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "HF_HUB_OFFLINE": "",
        "HF_ENDPOINT": f"http://127.0.0.1:{port}",
        "HF_HUB_CACHE": str(tmp_path / "hub"),
    }
    args = {
        "plan": ["plan", "org/not-cached", "--mesh", "HOST"],
        "test": ["test", str(REPO / "bundles" / "demo"), "--model", "org/not-cached"],
    }[command]
    done = no_traceback(run_cli(*args, env=env, timeout=15))
    assert done.returncode == 1, done.stderr
    assert "error TTB208 'org/not-cached' is not in the hub cache, and the hub cannot" in (
        done.stderr
    )
    init = no_traceback(
        run_cli("init", tmp_path / "b", "--from-hf", "org/not-cached", env=env, timeout=15)
    )
    assert "error TTB208" in init.stderr


def test_list_and_doctor_agree_and_list_folds_what_cannot_serve_here(run_cli, tmp_path):
    """On HOST without TT-Metal: list folds the built-ins that cannot be served here into
    one line (--all shows their rows), with the same count and split doctor gives; a
    --models-dir that is not there is an error (exit 1) before any table; a missing
    EXTRA_MODELS_DIR folder is a warning on stderr, before the table on stdout."""
    env = {"MESH_DEVICE": "HOST"}
    folded = no_traceback(run_cli("list", env=env))
    assert folded.returncode == 0, folded.stderr
    [line] = [x for x in folded.stdout.splitlines() if "not servable here" in x]
    count, split = line.split(" built-ins not servable here (")
    split = split.split("):")[0]
    assert "not servable" not in "".join(
        x for x in folded.stdout.splitlines()[1:] if x.startswith("TT")
    )
    every = no_traceback(run_cli("list", "--all", env=env))
    rows = [x for x in every.stdout.splitlines() if x.startswith("TT")]
    assert sum("  not servable  " in x for x in rows) == int(count)
    doctor = no_traceback(run_cli("doctor", env=env))
    assert f"{count} registered but not servable here: {split}" in doctor.stdout
    for command in (["list"], ["plan", "./ckpt"]):
        missing = no_traceback(
            run_cli(*command, "--models-dir", tmp_path / "nope", env=env, timeout=10)
        )
        assert missing.returncode == 1 and missing.stdout == ""
        assert f"{tmp_path / 'nope'}: error TTB001 no such models folder" in missing.stderr
    unset = no_traceback(run_cli("list", env={**env, "EXTRA_MODELS_DIR": str(tmp_path / "no")}))
    assert unset.returncode == 0
    assert unset.stderr.startswith(f"{tmp_path / 'no'}: warning TTB001 models folder")
    assert "TTB001" not in unset.stdout


def test_demo_prepare_without_a_network_is_ttb208_at_once(run_cli, tmp_path):
    """`demo --prepare` with a package index that cannot be reached: TTB208 (the code
    plan, test and init --from-hf give offline), without pip's retries (timeout below)."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {
        "XDG_CACHE_HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": f"http://127.0.0.1:{port}/simple",
        "PIP_FIND_LINKS": "",
    }
    done = no_traceback(run_cli("demo", "--prepare", env=env, timeout=30))
    assert done.returncode == 1, done.stdout
    assert "error TTB208 cannot download the demo model" in done.stderr
