"""The tested window of vLLM releases: what the plugin, doctor and `ttbundle compat` say
of the installed release, and the one error for a vLLM that lacks a part we serve with.

A vLLM outside the window is never installed here: the window check reads only the
distribution's version metadata, so a `vllm-X.dist-info` folder put first on the path
stands in for another release (vLLM's code stays the real installed one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ttbundles import vllm_window


def fake_vllm_metadata(root: Path, version: str) -> Path:
    """A folder whose only content is vLLM's distribution metadata at `version`."""
    info = root / f"vllm-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {version}\n")
    return root


def python(code: str, *, path: Path | None = None, env: dict | None = None):
    environ = {k: v for k, v in os.environ.items() if not k.startswith("TTBUNDLES_VLLM")}
    environ.update(env or {})
    if path is not None:
        environ["PYTHONPATH"] = str(path)
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environ, timeout=300
    )


def test_the_installed_release_is_in_the_window():
    installed = vllm_window.installed_vllm()
    assert installed in vllm_window.TESTED_VLLM
    assert vllm_window.DEFAULT_VLLM == vllm_window.TESTED_VLLM[-1] == "0.34.0"


@pytest.mark.parametrize(
    ("version", "relation"),
    [
        ("0.33.0", "tested"),
        ("0.34.0+empty", "tested"),
        ("0.32.1", "older"),
        ("0.35.0", "newer"),
        ("0.33.1", "between"),
        ("latest", "invalid"),
    ],
)
def test_a_version_stands_where_it_is_against_the_window(version, relation):
    verdict = vllm_window.verdict(version)
    assert verdict.relation == relation
    assert verdict.tested is (relation == "tested")
    if not verdict.tested and relation != "invalid":
        assert "0.33.0 and 0.34.0" in verdict.line()
        assert "pip install 'vllm==0.34.0'" in verdict.line()


PLUGIN = """
import logging, sys
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(message)s")
from ttbundles.serving.plugin import platform_plugin
print(platform_plugin())
print(platform_plugin())
"""


def test_the_plugin_warns_once_of_a_vllm_outside_the_window(tmp_path):
    result = python(
        PLUGIN, path=fake_vllm_metadata(tmp_path, "0.35.0"), env={"MESH_DEVICE": "HOST"}
    )
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "TTB217" in line]
    assert warnings == [
        "WARNING TTB217 ttbundles: vLLM 0.35.0 is outside the tested window (0.33.0 and "
        "0.34.0): install a tested release (pip install 'vllm==0.34.0') or a ttbundles "
        "release whose window includes it"
    ]
    assert result.stdout.split() == ["ttbundles.serving.platform.TTPlatform"] * 2


def test_the_plugin_is_silent_about_a_tested_release(tmp_path):
    result = python(PLUGIN, env={"MESH_DEVICE": "HOST"})
    assert result.returncode == 0, result.stderr
    assert "TTB217" not in result.stderr


def test_doctor_reports_the_vllm_release_against_the_window(tmp_path, run_cli_process):
    fake = fake_vllm_metadata(tmp_path, "0.32.0")
    result = run_cli_process("doctor", "--format", "json", env={"PYTHONPATH": str(fake)})
    report = json.loads(result.stdout)
    assert report["vllm"] == {
        "version": "0.32.0",
        "tested_window": ["0.33.0", "0.34.0"],
        "in_window": False,
        "relation": "older",
    }
    codes = [d["code"] for d in report["diagnostics"]]
    assert "TTB217" in codes
    ours = run_cli_process("doctor", "--format", "json")
    assert json.loads(ours.stdout)["vllm"]["in_window"] is True


def test_compat_says_which_bundles_register_on_another_release(tmp_path, run_cli):
    from tests.bundle_factory import metadata, write_bundle

    models = tmp_path / "models"
    old = metadata("old", arch="OldForCausalLM", requires={"vllm": "<0.34"})
    write_bundle(models / "old", document=old)
    write_bundle(models / "any", document=metadata("any", arch="AnyForCausalLM"))
    env = {"EXTRA_MODELS_DIR": str(models), "MESH_DEVICE": "HOST"}
    on_33 = json.loads(run_cli("compat", "0.33.0", "--format", "json", env=env).stdout)
    rows = {row["bundle"]: row for row in on_33["bundles"]}
    assert rows["old"]["registers"] and rows["any"]["registers"]
    result = run_cli("compat", "0.34.0", "--format", "json", env=env)
    on_34 = json.loads(result.stdout)
    rows = {row["bundle"]: row for row in on_34["bundles"]}
    assert rows["any"]["registers"]
    assert not rows["old"]["registers"] and rows["old"]["reason"] == "requires vllm<0.34"
    assert on_34["in_window"] is True
    # "old" registers on this machine only where the installed vLLM is 0.33.0.
    lost = rows["old"]["status_now"] == "registered"
    assert result.returncode == (1 if lost else 0)
    assert ("TTB218" in [d["code"] for d in on_34["diagnostics"]]) is lost
    newer = run_cli("compat", "0.35.0", env=env)
    assert "TTB217" in newer.stdout + newer.stderr
    assert "outside the tested window (0.33.0 and 0.34.0)" in newer.stdout + newer.stderr
    bad = run_cli("compat", "soon", env=env)
    assert bad.returncode == 2 and "not a vLLM version" in bad.stderr


def test_compat_agrees_with_list_on_what_is_servable_here(run_cli):
    """A built-in whose TT-Metal class is not importable here is "unservable" in `list`;
    compat says it registers on the release but is not servable here, not "registers"."""
    env = {"MESH_DEVICE": "HOST", "TT_VLLM_BUILTIN_MODELS": "1"}
    listed = json.loads(run_cli("list", "--format", "json", env=env).stdout)
    rows = listed.get("bundles") or listed.get("entries") or listed.get("rows")
    status = {r["bundle"]: r["status"] for r in rows}
    assert status["tt-qwen3"] == "unservable" and status["demo"] == "registered"
    done = run_cli("compat", "0.34.0", "--format", "json", env=env)
    compat_rows = {r["bundle"]: r for r in json.loads(done.stdout)["bundles"]}
    for name, row in compat_rows.items():
        assert row["status_now"] == status[name], name
        assert row["servable"] is (status[name] != "unservable"), name
    assert compat_rows["tt-qwen3"]["reason"].startswith("TTB058")
    human = run_cli("compat", "0.34.0", env=env).stdout
    [line] = [x for x in human.splitlines() if x.split()[1:2] == ["tt-qwen3"]]
    assert "registers, not servable here" in line


def test_a_missing_part_is_one_error_naming_the_release_and_the_window():
    from ttbundles.errors import TTBundleError
    from ttbundles.serving import compat

    error = compat.missing_part(ModuleNotFoundError("no", name="vllm.v1.worker.cpu.sampler"))
    assert isinstance(error, TTBundleError)
    (diagnostic,) = error.diagnostics
    assert diagnostic.code == "TTB216"
    installed = vllm_window.installed_vllm()
    assert diagnostic.message == (
        f"vLLM {installed} lacks vllm.v1.worker.cpu.sampler, which ttbundles serves with; "
        "ttbundles is tested on vLLM 0.33.0 and 0.34.0"
    )
    assert "pip install 'vllm==0.34.0'" in diagnostic.hint


def test_the_scripts_name_the_same_window():
    """scripts/window.sh (which venv a VLLM_VERSION gets) and TESTED_VLLM agree, and
    pyproject's range admits exactly the window's minor releases."""
    root = Path(__file__).resolve().parents[1]
    script = (root / "scripts" / "window.sh").read_text()
    assert f'TESTED_VLLM_VERSIONS="{" ".join(vllm_window.TESTED_VLLM)}"' in script
    assert f"DEFAULT_VLLM_VERSION={vllm_window.DEFAULT_VLLM}" in script
    assert '"vllm>=0.33.0,<0.35",' in (root / "pyproject.toml").read_text()


def _vllm_imports() -> dict[str, str]:
    """Every vLLM module ttbundles imports outside `serving/compat` (which looks before
    it imports), at module level or in a function, type-checking imports aside: module ->
    one file importing it."""
    import ast

    root = Path(__file__).resolve().parents[1] / "ttbundles"
    found: dict[str, str] = {}
    for file in sorted(root.rglob("*.py")):
        if "compat" in file.relative_to(root).parts:
            continue
        tree = ast.parse(file.read_text())
        typing_only = {
            id(inner)
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for inner in ast.walk(node)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                if name.split(".")[0] == "vllm":
                    found.setdefault(name, str(file.relative_to(root)))
    return found


def test_every_vllm_module_ttbundles_imports_is_looked_for_before_an_engine_starts():
    """A vLLM outside the window that lacks one (0.32.0: `vllm.v1.core.kv_cache_planning`,
    imported by the KV sizing in the engine core) is refused at configuration with TTB216
    (`compat.require_modules`), never with a ModuleNotFoundError after the engine started.
    So every import is declared, and on each release of the window every declared module
    is there (CI runs this on both)."""
    from ttbundles.serving import compat

    imported = _vllm_imports()
    undeclared = {m: f for m, f in imported.items() if m not in compat.VLLM_MODULES}
    assert undeclared == {}, "add them to compat.VLLM_MODULES"
    assert "vllm.v1.core.kv_cache_planning" in imported  # the walk sees function imports
    assert compat.absent_modules() == []


def test_a_vllm_lacking_a_module_is_refused_first_in_one_line(demo_checkpoint, monkeypatch):
    """The parse hook looks for the modules before it refuses any flag or imports
    anything of vLLM's that may be missing: TTB216 is the first and only line."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    from ttbundles.errors import TTBundleError
    from ttbundles.serving import compat

    gone = ("vllm.v1.core.kv_cache_planning", "vllm.v1.core.no_such_module")
    assert compat.absent_modules(gone) == ["vllm.v1.core.no_such_module"]
    monkeypatch.setattr(compat, "VLLM_MODULES", (*compat.VLLM_MODULES, gone[1]))
    parser = make_arg_parser(FlexibleArgumentParser())
    with pytest.raises(TTBundleError) as excinfo:
        parser.parse_args([str(demo_checkpoint), "--enable-lora"])
    (diagnostic,) = excinfo.value.diagnostics
    assert diagnostic.code == "TTB216"
    assert f"lacks {gone[1]}, which ttbundles serves with" in diagnostic.message
