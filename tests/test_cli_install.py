"""`ttbundle install` and `uninstall` as users call them: what they say, when they ask."""

from __future__ import annotations

import json
import os
import pty
from pathlib import Path

import pytest

from tests.bundle_factory import write_bundle
from ttbundles.build import pack
from ttbundles.registry.index import INDEX_FILE

LOCK_FILE = ".ttbundle.lock"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


def make_archive(root: Path, version: str = "1.0.0", name: str = "demo") -> Path:
    folder = write_bundle(root / f"src-{name}-{version}", name=name, version=version)
    return pack(folder, root / "dist")


@pytest.fixture
def models(tmp_path: Path) -> Path:
    return tmp_path / "models"


def no_traceback(done):
    assert "Traceback" not in done.stderr, done.stderr
    return done


def test_install_says_what_it_did(run_cli, tmp_path: Path, models: Path):
    done = no_traceback(run_cli("install", make_archive(tmp_path), "--models-dir", models))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"installed demo 1.0.0 at {models / 'demo'}\n"


def test_install_goes_to_extra_models_dir(run_cli, tmp_path: Path, models: Path):
    done = run_cli("install", make_archive(tmp_path), env={"EXTRA_MODELS_DIR": str(models)})
    assert done.returncode == 0 and done.stdout.endswith(f" at {models / 'demo'}\n")


def test_replace_says_old_and_new_version(run_cli, tmp_path: Path, models: Path):
    run_cli("install", make_archive(tmp_path, "1.0.0"), "--models-dir", models)
    done = run_cli("install", make_archive(tmp_path, "2.0.0"), "--models-dir", models, "--replace")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith(f"replaced demo 1.0.0 -> 2.0.0 at {models / 'demo'} (upgrade; ")


def test_install_json(run_cli, tmp_path: Path, models: Path):
    run_cli("install", make_archive(tmp_path, "1.0.0"), "--models-dir", models)
    newer = make_archive(tmp_path, "2.0.0")
    done = run_cli("install", newer, "--models-dir", models, "--replace", "--format", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert {k: result[k] for k in ("action", "name", "version", "previous_version", "path")} == {
        "action": "replaced",
        "name": "demo",
        "version": "2.0.0",
        "previous_version": "1.0.0",
        "path": str(models / "demo"),
    }
    assert result["layout"] == "folder" and result["removed_leftovers"] == []


def test_install_over_an_installed_bundle_needs_replace(run_cli, tmp_path: Path, models: Path):
    run_cli("install", make_archive(tmp_path, "1.0.0"), "--models-dir", models)
    done = no_traceback(run_cli("install", make_archive(tmp_path, "2.0.0"), "--models-dir", models))
    assert (done.returncode, done.stdout) == (1, "")
    assert "error TTB090 demo 1.0.0 (sha256:" in done.stderr
    assert "is installed; this archive is demo 2.0.0 (sha256:" in done.stderr
    assert ": an upgrade" in done.stderr
    assert "fix: pass --replace to upgrade" in done.stderr


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/bundles/demo-1.0.0.ttbundle",
        "http://example.com/demo.ttbundle",
        "s3://bucket/demo.ttbundle",
        "file:///tmp/demo.ttbundle",
    ],
)
def test_install_refuses_a_url(run_cli, models: Path, url: str):
    done = no_traceback(run_cli("install", url, "--models-dir", models))
    assert (done.returncode, done.stdout) == (1, "")
    assert f"{url}: error TTB095" in done.stderr  # the URL as given, not mangled into a path
    assert "install takes a file; download the archive first, or pull it" in done.stderr
    assert not models.exists()


def test_install_refuses_a_folder(run_cli, tmp_path: Path, models: Path):
    folder = write_bundle(tmp_path / "my-bundle")
    done = no_traceback(run_cli("install", folder, "--models-dir", models))
    assert done.returncode == 1 and "error TTB001" in done.stderr
    assert f"pack it first (ttbundle pack {folder})" in done.stderr


# --- uninstall ------------------------------------------------------------------------


@pytest.fixture
def installed(run_cli, tmp_path: Path, models: Path) -> Path:
    done = run_cli("install", make_archive(tmp_path), "--models-dir", models)
    assert done.returncode == 0, done.stderr
    return models / "demo"


def test_uninstall_without_a_terminal_does_not_ask(run_cli, models: Path, installed: Path):
    done = no_traceback(run_cli("uninstall", "demo", "--models-dir", models, timeout=30))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"uninstalled demo 1.0.0 from {installed}\n"
    assert sorted(p.name for p in models.iterdir()) == [LOCK_FILE, INDEX_FILE]


def test_uninstall_json(run_cli, models: Path, installed: Path):
    done = run_cli("uninstall", "demo", "--models-dir", models, "-f", "json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert (result["action"], result["name"], result["version"], result["path"]) == (
        "uninstalled",
        "demo",
        "1.0.0",
        str(installed),
    )


def on_a_terminal(run_cli, *args: object, answer: str | None):
    """`ttbundle ARGS` with a terminal as standard input, `answer` typed ahead."""
    controller, terminal = pty.openpty()
    try:
        if answer is not None:
            os.write(controller, answer.encode())
        return no_traceback(run_cli(*args, stdin=terminal, timeout=30))
    finally:
        os.close(terminal)
        os.close(controller)


def test_uninstall_on_a_terminal_asks_and_no_keeps_it(
    run_cli_process, models: Path, installed: Path
):
    done = on_a_terminal(run_cli_process, "uninstall", "demo", "--models-dir", models, answer="n\n")
    assert (done.returncode, done.stdout) == (1, "")
    assert f"Remove demo 1.0.0 at {installed}? [y/N]" in done.stderr
    assert "uninstall cancelled; nothing was removed" in done.stderr
    assert (installed / "vllm_metadata.json").is_file()


def test_uninstall_on_a_terminal_asks_and_yes_removes(
    run_cli_process, models: Path, installed: Path
):
    done = on_a_terminal(run_cli_process, "uninstall", "demo", "--models-dir", models, answer="y\n")
    assert done.returncode == 0 and "Remove demo 1.0.0" in done.stderr
    assert done.stdout == f"uninstalled demo 1.0.0 from {installed}\n"
    assert not os.path.lexists(installed)


@pytest.mark.parametrize("flag", ["--yes", "-y"])
def test_uninstall_yes_does_not_ask(run_cli_process, models: Path, installed: Path, flag: str):
    done = on_a_terminal(
        run_cli_process, "uninstall", "demo", "--models-dir", models, flag, answer=None
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"uninstalled demo 1.0.0 from {installed}\n"


def test_uninstall_of_a_missing_bundle_fails_before_asking(
    run_cli_process, models: Path, installed
):
    done = on_a_terminal(run_cli_process, "uninstall", "demi", "--models-dir", models, answer="y\n")
    assert (done.returncode, done.stdout) == (1, "")
    assert "error TTB092 demi is not installed" in done.stderr and "Remove" not in done.stderr
    assert "demo" in done.stderr  # the did-you-mean


def test_the_question_keeps_stdout_for_json(run_cli_process, models: Path, installed: Path):
    done = on_a_terminal(
        run_cli_process, "uninstall", "demo", "--models-dir", models, "-f", "json", answer="y\n"
    )
    assert done.returncode == 0 and "Remove demo 1.0.0" in done.stderr
    assert json.loads(done.stdout)["action"] == "uninstalled"


@pytest.mark.parametrize(
    ("layout", "said"),
    [("link", "so later replaces are atomic"), ("folder", "every replace will be like this")],
)
def test_a_replace_by_two_renames_is_owned_up_to(capsys, tmp_path: Path, layout: str, said: str):
    """Only without RENAME_EXCHANGE on a plain folder (see test_install_faults)."""
    from ttbundles.cli.archive import _report
    from ttbundles.cli.output import Output
    from ttbundles.installer.operations import InstallResult

    result = InstallResult(
        "replaced", "demo", "2.0.0", tmp_path / "demo", tmp_path, "1.0.0", "rename", layout
    )
    _report(Output(), result)
    note, last = capsys.readouterr().out.splitlines()
    assert note.startswith("note: this file system cannot exchange two names, so demo was")
    assert said in note
    assert last.startswith(f"replaced demo 1.0.0 -> 2.0.0 at {tmp_path / 'demo'} (upgrade; ")
