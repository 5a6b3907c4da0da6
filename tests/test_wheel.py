"""What users install is the wheel, not the working tree the other tests import (an
editable install): the wheel carries every file `ttbundles.paths` expects (the built-in
bundles and the schema, which the checkout links into `ttbundles/_data/`, and the CLI,
linked into `ttbundles/cli`), and an installed copy finds them and runs its command."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """The wheel pip builds from the checkout (hatchling, from the test extra)."""
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["-w", str(out), str(REPO)],
        check=True,
        capture_output=True,
        text=True,
    )
    (built,) = out.glob("ttbundles-*.whl")
    return built


def test_the_wheel_carries_the_bundles_the_schema_and_the_cli(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    shipped = sorted(p.name for p in (REPO / "bundles").iterdir() if p.is_dir())
    assert shipped, "no built-in bundles in the checkout"
    missing = [b for b in shipped if f"ttbundles/_data/bundles/{b}/vllm_metadata.json" not in names]
    assert missing == []
    assert "ttbundles/_data/schemas/vllm_metadata.schema.json" in names
    cli = sorted(p.name for p in (REPO / "cli").glob("*.py"))
    assert [f for f in cli if f"ttbundles/cli/{f}" not in names] == []
    assert "ttbundles-torchvision-compat.pth" in names
    # Every file of the checkout's bundle folders, not only the metadata.
    for path in (REPO / "bundles").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            rel = path.relative_to(REPO / "bundles").as_posix()
            assert f"ttbundles/_data/bundles/{rel}" in names, rel


def test_an_installed_wheel_finds_its_files_and_runs_its_command(wheel, tmp_path):
    site = tmp_path / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site)]
        + [str(wheel)],
        check=True,
        capture_output=True,
        text=True,
    )
    # -S: no .pth of this environment runs (its editable install would import the
    # checkout first); the installed copy first on sys.path, the dependencies after it.
    script = f"""
import sys
sys.path[:0] = [{str(site)!r}]
sys.path.append({sysconfig.get_paths()["purelib"]!r})
import ttbundles, ttbundles.paths as paths
print(ttbundles.__file__)
print(paths.builtin_bundles_dir())
print(paths.schema_file().is_file())
print(",".join(sorted(p.name for p in paths.builtin_bundles_dir().iterdir())))
from ttbundles.cli.app import main
main(["validate", str(paths.builtin_bundles_dir() / "demo")])
"""
    run = subprocess.run(
        [sys.executable, "-S", "-c", script], capture_output=True, text=True, cwd=tmp_path
    )
    assert run.returncode == 0, run.stderr
    module, bundles_dir, schema_ok, names, *validated = run.stdout.splitlines()
    assert module.startswith(str(site)), module
    assert bundles_dir == str(site / "ttbundles" / "_data" / "bundles")
    assert schema_ok == "True"
    shipped = sorted(p.name for p in (REPO / "bundles").iterdir() if p.is_dir())
    assert names.split(",") == shipped
    assert validated == [f"{bundles_dir}/demo: valid (0 errors, 0 warnings; bundles: demo)"]
