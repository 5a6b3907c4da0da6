"""Installs under faults: replaces readers never miss, the link layout, killed installs.

A reader polling a bundle during replaces must always find it, whole (RENAME_EXCHANGE, or
the link layout where it is missing); an install killed with SIGKILL leaves leftovers that
`ttbundle list` reports and the next install removes, while a live install's folders are
never touched.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from filelock import FileLock

import ttbundles.installer.publish as publish_module
from tests.bundle_factory import write_bundle
from ttbundles.archive.manifest import verify_dir
from ttbundles.archive.reader import verify
from ttbundles.build import pack
from ttbundles.installer.leftovers import LOCK_FILE, leftover_diagnostics
from ttbundles.installer.operations import install, uninstall
from ttbundles.registry.index import INDEX_FILE
from ttbundles.registry.registry import Status, compute

TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")  # the installed console script


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("EXTRA_MODELS_DIR", raising=False)


def make_archive(root: Path, version: str = "1.0.0", name: str = "demo", **files: bytes) -> Path:
    folder = write_bundle(
        root / f"src-{name}-{version}",
        name=name,
        version=version,
        files={"docs/notes.txt": f"{name} {version}\n", **files},
    )
    return pack(folder, root / "dist")


def names(models: Path) -> list[str]:
    """The folder's entries but the registry's index, which every install rewrites (its
    own tests are in test_startup_checks.py)."""
    return sorted(p.name for p in models.iterdir() if p.name != INDEX_FILE)


def leftovers(models: Path) -> list[str]:
    return [n for n in names(models) if n != LOCK_FILE and n.startswith(".")]


@pytest.fixture
def no_exchange(monkeypatch):
    """A file system without RENAME_EXCHANGE (NFS, older ZFS, not Linux)."""

    def unsupported(a, b):
        raise publish_module.ExchangeUnsupported(22, "Invalid argument", str(a))

    monkeypatch.setattr(publish_module, "exchange", unsupported)


# --- renameat2 --------------------------------------------------------------------------


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="renameat2 is Linux's")
def test_exchange_swaps_two_folders(tmp_path: Path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "one").write_text("1")
    (tmp_path / "b").mkdir()
    publish_module.exchange(tmp_path / "a", tmp_path / "b")
    assert names(tmp_path / "b") == ["one"] and names(tmp_path / "a") == []
    with pytest.raises(FileNotFoundError):
        publish_module.exchange(tmp_path / "a", tmp_path / "missing")


def test_replace_uses_the_exchange_where_it_exists(tmp_path: Path):
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    result = install(make_archive(tmp_path, "2.0.0"), models, replace=True)
    expected = "exchange" if publish_module._renameat2() else "symlink"
    assert (result.swap, result.previous_version, result.version) == (expected, "1.0.0", "2.0.0")


# --- readers during replaces ----------------------------------------------------------


def _poll(path: str, started, stop, results) -> None:
    """Look at `path` until told to stop: (whole reads, misses, torn reads, versions seen).

    Mostly `stat` (cheap, so a gap of microseconds between two renames is seen), and
    every so often a whole read, whose JSON must parse.
    """
    reads = missing = torn = 0
    versions: set[str] = set()
    stat = os.stat
    while not stop.is_set():
        for _ in range(200):
            try:
                stat(path)
            except (FileNotFoundError, NotADirectoryError):
                missing += 1
        try:
            with open(path, "rb") as handle:
                data = handle.read()
        except (FileNotFoundError, NotADirectoryError):
            missing += 1
            continue
        try:
            versions.add(json.loads(data)["version"])
        except (ValueError, KeyError):
            torn += 1
            continue
        reads += 1
        if reads == 20:
            started.set()
    results.put((reads, missing, torn, sorted(versions)))


@pytest.fixture
def cpu_burner():
    """A process spinning on a core beside the test, as on a loaded machine (the reader
    missed the bundle in a full run on a busy 2-core machine, issue 34). It stops by
    itself after 10 minutes if the test could not stop it."""
    burner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass",
        ]
    )
    try:
        yield burner
    finally:
        burner.kill()
        burner.wait(30)


def _replace_while_polling(models: Path, archives: list[Path], times: int) -> tuple:
    """Replace the bundle `times` times, alternating archives, while another process polls
    it: (how each replace swapped, whole reads, misses, torn reads, versions seen)."""
    context = multiprocessing.get_context("fork")
    started, stop, results = context.Event(), context.Event(), context.Queue()
    reader = context.Process(
        target=_poll, args=(str(models / "demo" / "vllm_metadata.json"), started, stop, results)
    )
    reader.start()
    try:
        assert started.wait(30)
        swaps = {
            install(archives[(i + 1) % len(archives)], models, replace=True).swap
            for i in range(times)
        }
    finally:
        stop.set()
        polled = results.get(timeout=30)
        reader.join(30)
    return (swaps, *polled)


@pytest.fixture(params=["exchange", "link"])
def layout(request) -> str:
    """Both ways a replace is atomic: RENAME_EXCHANGE, and the link layout without it."""
    if request.param == "link":
        request.getfixturevalue("no_exchange")
    elif not publish_module._renameat2():
        pytest.skip("no renameat2 here")
    return request.param


def test_a_reader_never_misses_the_bundle_during_replaces(layout: str, tmp_path: Path, cpu_burner):
    """20 replaces while another process polls the bundle, with a core kept busy: every
    look finds it, whole; the replaced versions are removed, one at a time, by the next
    replace, and one stays (the last one replaced)."""
    archives = [make_archive(tmp_path, "1.0.0"), make_archive(tmp_path, "2.0.0")]
    models = tmp_path / "models"
    assert install(archives[0], models).layout == ("link" if layout == "link" else "folder")
    swaps, reads, missing, torn, versions = _replace_while_polling(models, archives, 20)
    assert swaps == {"exchange" if layout == "exchange" else "symlink"}
    assert (missing, torn) == (0, 0), f"{missing} misses and {torn} torn reads in {reads}"
    assert versions == ["1.0.0", "2.0.0"]
    assert verify_dir(models / "demo").ok()
    assert installed(models)["version"] == "1.0.0"  # 20 replaces: back to the first
    (kept,) = kept_versions(models)  # at most one old version
    assert installed(models / kept)["version"] == "2.0.0" and verify_dir(models / kept).ok()
    if layout == "link":
        expected = [kept, _version_folder(models), os.readlink(models / kept)]
    else:
        expected = [kept]
    assert sorted(leftovers(models)) == sorted(expected)


def test_a_walk_inside_the_old_version_finds_it_whole_until_the_next_install(
    layout: str, tmp_path: Path
):
    """What the reader above relies on, step by step: a walk that looked `demo` up (a
    folder's handle, or the link's text) just before a replace still finds every file of
    the old version after it; the next operation in the folder removes it."""
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    handle = os.open(models / "demo", os.O_RDONLY | os.O_DIRECTORY)
    inside = os.readlink(models / "demo") if layout == "link" else None

    def read_old() -> str:
        """The rest of the walk: the metadata file inside what `demo` was."""
        if inside is not None:  # the link's text, looked up in the folder
            fd = os.open(models / inside / "vllm_metadata.json", os.O_RDONLY)
        else:  # a look-up inside the folder `demo` named
            fd = os.open("vllm_metadata.json", os.O_RDONLY, dir_fd=handle)
        with os.fdopen(fd, "rb") as old:
            return json.loads(old.read())["version"]

    try:
        result = install(make_archive(tmp_path, "2.0.0"), models, replace=True)
        assert result.kept is not None and result.kept.name.startswith(".prev-demo-")
        assert installed(models)["version"] == "2.0.0"
        assert read_old() == "1.0.0"
        assert verify_dir(result.kept).ok()
        after = install(make_archive(tmp_path, name="other"), models)
        assert after.removed_kept == (result.kept,) and not os.path.lexists(result.kept)
        with pytest.raises(FileNotFoundError):
            read_old()
    finally:
        os.close(handle)
    assert kept_versions(models) == [] and not [n for n in leftovers(models) if "tmp" in n]
    assert [n for n in leftovers(models) if "demo" in n] == (
        [_version_folder(models)] if layout == "link" else []
    )


def test_the_reader_does_see_the_gap_of_two_renames(tmp_path: Path, no_exchange, monkeypatch):
    """The control: the last fallback (no exchange, no links) leaves the name missing
    between its two renames, and the same reader notices (the gap widened to 50 ms, so
    that it always does)."""
    archives = [make_archive(tmp_path, "1.0.0"), make_archive(tmp_path, "2.0.0")]
    models = tmp_path / "models"
    real_rename = os.rename

    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    def slow_rename(src, dst):
        real_rename(src, dst)
        if Path(dst).name.startswith(".old-"):
            time.sleep(0.05)

    monkeypatch.setattr(publish_module.os, "symlink", no_links)
    install(archives[0], models)
    monkeypatch.setattr(publish_module.os, "rename", slow_rename)
    swaps, reads, missing, torn, versions = _replace_while_polling(models, archives, 4)
    assert swaps == {"rename"} and torn == 0
    assert missing > 0, f"no miss in {reads} reads"


def installed(models: Path) -> dict:
    """The metadata of `models/demo`, or of `models` itself when it is a bundle."""
    folder = models if (models / "vllm_metadata.json").exists() else models / "demo"
    return json.loads((folder / "vllm_metadata.json").read_text())


def kept_versions(models: Path) -> list[str]:
    return [n for n in names(models) if n.startswith(".prev-")]


def _version_folder(models: Path) -> str:
    return os.readlink(models / "demo")


# --- the link layout --------------------------------------------------------------------


def test_without_exchange_bundles_use_the_link_layout(tmp_path: Path, no_exchange, run_cli):
    models = tmp_path / "models"
    result = install(make_archive(tmp_path, "1.0.0"), models)
    target = models / "demo"
    assert (result.action, result.layout) == ("installed", "link")
    assert target.is_symlink() and _version_folder(models).startswith(".ver-demo-")
    assert names(models) == [LOCK_FILE, _version_folder(models), "demo"]
    assert verify(target).ok() and verify_dir(target).ok()
    done = run_cli("verify", target)
    assert done.returncode == 0 and "verified" in done.stdout, done.stderr
    registry = compute({"TT_VLLM_BUILTIN_MODELS": "0"}, models_dirs=[models])
    (entry,) = registry.entries
    assert entry.status is Status.REGISTERED and entry.path == target
    assert leftover_diagnostics([models]) == []  # the linked version folder is in use


def test_link_layout_replace_keeps_the_old_version_until_the_next_install(
    tmp_path: Path, no_exchange
):
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    old = _version_folder(models)
    result = install(make_archive(tmp_path, "2.0.0"), models, replace=True)
    assert (result.swap, result.previous_version, result.version) == ("symlink", "1.0.0", "2.0.0")
    assert _version_folder(models) != old
    (kept,) = kept_versions(models)
    assert result.kept == models / kept and os.readlink(models / kept) == old
    assert names(models) == sorted([LOCK_FILE, kept, _version_folder(models), old, "demo"])
    assert installed(models)["version"] == "2.0.0"
    assert installed(models / old)["version"] == "1.0.0"
    install(make_archive(tmp_path, "1.0.0", name="other"), models)
    other = os.readlink(models / "other")
    assert names(models) == sorted([LOCK_FILE, _version_folder(models), other, "demo", "other"])


def test_link_layout_uninstall_removes_the_link_and_its_version(tmp_path: Path, no_exchange):
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    result = uninstall("demo", models)
    assert (result.action, result.version) == ("uninstalled", "1.0.0")
    assert names(models) == [LOCK_FILE]


def test_an_exchange_over_a_link_layout_bundle_removes_its_version(tmp_path: Path, monkeypatch):
    if not publish_module._renameat2():
        pytest.skip("no renameat2 here")
    models = tmp_path / "models"
    real_exchange = publish_module.exchange

    def unsupported(a, b):
        raise publish_module.ExchangeUnsupported(22, "Invalid argument", str(a))

    monkeypatch.setattr(publish_module, "exchange", unsupported)
    install(make_archive(tmp_path, "1.0.0"), models)  # made where there was no exchange
    monkeypatch.setattr(publish_module, "exchange", real_exchange)
    old = _version_folder(models)
    result = install(make_archive(tmp_path, "2.0.0"), models, replace=True)
    assert (result.swap, result.layout) == ("exchange", "folder")
    (kept,) = kept_versions(models)  # the old link, pointing at the old version still
    assert os.readlink(models / kept) == old
    assert names(models) == sorted([LOCK_FILE, kept, old, "demo"])
    uninstall("demo", models)
    assert names(models) == [LOCK_FILE]


def test_a_folder_without_exchange_is_replaced_once_by_two_renames(tmp_path: Path, monkeypatch):
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)  # a plain folder
    assert not (models / "demo").is_symlink()

    def unsupported(a, b):
        raise publish_module.ExchangeUnsupported(22, "Invalid argument", str(a))

    monkeypatch.setattr(publish_module, "exchange", unsupported)
    result = install(make_archive(tmp_path, "2.0.0"), models, replace=True)
    assert (result.swap, result.layout) == ("rename", "link")
    (kept,) = kept_versions(models)  # the old folder, moved there
    assert installed(models / kept)["version"] == "1.0.0"
    assert names(models) == sorted([LOCK_FILE, kept, _version_folder(models), "demo"])
    second = _version_folder(models)
    again = install(make_archive(tmp_path, "3.0.0"), models, replace=True)
    assert again.swap == "symlink" and installed(models)["version"] == "3.0.0"
    assert again.removed_kept == (models / kept,)
    (kept,) = kept_versions(models)
    assert os.readlink(models / kept) == second
    assert names(models) == sorted([LOCK_FILE, kept, second, _version_folder(models), "demo"])


def test_a_replaced_link_to_elsewhere_leaves_its_target(tmp_path: Path):
    elsewhere = install(make_archive(tmp_path, "1.0.0"), tmp_path / "elsewhere").path
    models = tmp_path / "models"
    models.mkdir()
    (models / "demo").symlink_to(elsewhere)
    result = install(make_archive(tmp_path, "2.0.0"), models, replace=True)
    assert os.readlink(result.kept) == str(elsewhere)  # kept: the old link
    install(make_archive(tmp_path, "1.0.0", name="other"), models)  # removes it, not its target
    assert verify_dir(elsewhere).ok() and installed(tmp_path / "elsewhere")["version"] == "1.0.0"
    assert installed(models)["version"] == "2.0.0"
    assert leftovers(models) == ([] if publish_module._renameat2() else [_version_folder(models)])


def test_list_notes_a_kept_version_and_uninstall_removes_it(tmp_path: Path, run_cli):
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    kept = install(make_archive(tmp_path, "2.0.0"), models, replace=True).kept
    listed = run_cli("list", "--models-dir", models)
    assert listed.returncode == 0, listed.stderr
    (line,) = [n for n in listed.stdout.splitlines() if "TTB144" in n]
    assert line.startswith(f"{kept}: info TTB144 stale copy: the old version 1.0.0 of demo")
    assert (
        "fix: the next 'ttbundle install' or 'ttbundle uninstall' in this folder" in listed.stdout
    )
    as_json = json.loads(run_cli("list", "--models-dir", models, "--format", "json").stdout)
    (note,) = [p for p in as_json["diagnostics"] if p["code"] == "TTB144"]
    assert (note["file"], note["severity"]) == (str(kept), "info")
    done = run_cli("uninstall", "demo", "--models-dir", models, "--format", "json")
    assert json.loads(done.stdout)["removed_kept"] == [str(kept)]
    assert names(models) == [LOCK_FILE]
    assert "TTB144" not in run_cli("list", "--models-dir", models).stdout


# --- the folder lock is a filelock ------------------------------------------------------


def test_installs_wait_for_the_folder_lock(tmp_path: Path):
    archive = make_archive(tmp_path)
    models = tmp_path / "models"
    models.mkdir()
    outcome: list = []
    lock = FileLock(models / LOCK_FILE)
    with lock:
        worker = threading.Thread(target=lambda: outcome.append(install(archive, models)))
        worker.start()
        worker.join(1.0)
        assert worker.is_alive() and not (models / "demo").exists()
    worker.join(30)
    assert outcome and outcome[0].path == models / "demo"


# --- leftovers --------------------------------------------------------------------------


def test_leftovers_without_a_lock_are_removed_by_the_next_install(tmp_path: Path):
    """As an older release, which had no per-install locks, leaves them."""
    models = tmp_path / "models"
    models.mkdir()
    junk = [models / ".tmp-demo-0123abcd", models / ".old-other-89abcdef"]
    for folder in junk:
        (folder / "weights").mkdir(parents=True)
        (folder / "weights" / "w.bin").write_bytes(b"partial")
    (models / "other").mkdir()  # so the .old- one is not a cut replace to put back
    result = install(make_archive(tmp_path), models)
    assert sorted(result.removed_leftovers) == sorted(junk)
    assert names(models) == [LOCK_FILE, "demo", "other"]


def test_a_registry_index_write_cut_short_is_reported_then_removed(tmp_path: Path):
    """Install writes the folder's index under the folder lock: a temporary index file
    found with that lock free is a killed write's. `list` reports it; the next install
    removes it; the index itself is whole."""
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    temp = models / f".{INDEX_FILE}.k1ll3d.tmp"
    temp.write_text('{"format": 2, "bund')  # what a write killed midway leaves
    (diagnostic,) = leftover_diagnostics([models])
    assert diagnostic.code == "TTB094" and diagnostic.file == str(temp)
    assert "registry index" in diagnostic.message
    result = install(make_archive(tmp_path, "1.0.0", name="other"), models)
    assert temp in result.removed_leftovers and not temp.exists()
    assert leftover_diagnostics([models]) == []
    assert sorted(json.loads((models / INDEX_FILE).read_text())["bundles"]) == ["demo", "other"]


def test_a_replace_cut_between_its_renames_is_put_back(tmp_path: Path):
    """`.old-<name>-*` with `<name>` missing: the old bundle, complete: restored, not lost."""
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    os.rename(models / "demo", models / ".old-demo-0123456789abcdef")
    (diagnostic,) = leftover_diagnostics([models])
    assert diagnostic.code == "TTB094" and "puts it back" in diagnostic.hint
    result = install(make_archive(tmp_path, "1.0.0", name="other"), models)
    assert result.restored == (models / "demo",) and result.removed_leftovers == ()
    assert installed(models)["version"] == "1.0.0" and verify_dir(models / "demo").ok()


def test_an_incomplete_old_folder_is_removed_not_restored(tmp_path: Path):
    models = tmp_path / "models"
    install(make_archive(tmp_path, "1.0.0"), models)
    os.rename(models / "demo", models / ".old-demo-0123456789abcdef")
    (models / ".old-demo-0123456789abcdef" / "adapter.py").unlink()  # an uninstall cut short
    result = install(make_archive(tmp_path, "1.0.0", name="other"), models)
    assert result.restored == () and len(result.removed_leftovers) == 1
    assert names(models) == [LOCK_FILE, "other"]


def test_a_live_operation_is_not_a_leftover(tmp_path: Path):
    models = tmp_path / "models"
    models.mkdir()
    (models / ".tmp-demo-0123456789abcdef").mkdir()
    with FileLock(models / ".ttbundle-0123456789abcdef.lock"):
        assert leftover_diagnostics([models]) == []
        result = install(make_archive(tmp_path, name="other"), models)
        assert result.removed_leftovers == ()
        assert (models / ".tmp-demo-0123456789abcdef").is_dir()
    (diagnostic,) = leftover_diagnostics([models])
    assert diagnostic.file == str(models / ".tmp-demo-0123456789abcdef")


# --- killed installs (SIGKILL), as processes of their own -------------------------------

# Installs `archive` into `models`, pausing after the first file it extracts: it writes
# `ready`, then waits for `go` (if it is ever made).
PAUSED_INSTALL = """
import sys, time
from pathlib import Path
import ttbundles.archive.reader as reader
from ttbundles.installer.operations import install

archive, models, ready, go = sys.argv[1:5]
real_copy = reader._copy_capped

def paused_copy(*args, **kwargs):
    digest = real_copy(*args, **kwargs)
    if not Path(ready).exists():
        Path(ready).write_text("extracting")
        while not Path(go).exists():
            time.sleep(0.02)
    return digest

reader._copy_capped = paused_copy
print(install(archive, Path(models)).path)
"""


def _paused_install(archive: Path, models: Path, tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    ready, go = tmp_path / "ready", tmp_path / "go"
    process = subprocess.Popen(
        [sys.executable, "-c", PAUSED_INSTALL, str(archive), str(models), str(ready), str(go)],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the install never started extracting"
        time.sleep(0.02)
    return process, go


def _killed(process: subprocess.Popen) -> None:
    os.kill(process.pid, signal.SIGKILL)
    process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL


def test_an_install_killed_mid_extraction_is_cleaned_up_by_the_next(tmp_path: Path, run_cli):
    models = tmp_path / "models"
    big = {"weights/a.bin": os.urandom(1 << 20), "weights/b.bin": os.urandom(1 << 20)}
    process, _ = _paused_install(make_archive(tmp_path, **big), models, tmp_path)
    _killed(process)
    (tmp,) = [n for n in leftovers(models) if n.startswith(".tmp-demo-")]
    token = tmp.rsplit("-", 1)[1]
    assert names(models) == sorted([LOCK_FILE, tmp, f".ttbundle-{token}.lock"])

    listed = run_cli("list", "--models-dir", models)
    assert listed.returncode == 0, listed.stderr
    assert f"{models / tmp}: warning TTB094" in listed.stdout
    assert "fix: the next 'ttbundle install' or 'ttbundle uninstall'" in listed.stdout
    as_json = json.loads(run_cli("list", "--models-dir", models, "--format", "json").stdout)
    (problem,) = [p for p in as_json["diagnostics"] if p["code"] == "TTB094"]
    assert problem["file"] == str(models / tmp) and problem["severity"] == "warning"

    done = run_cli("install", make_archive(tmp_path, name="other"), "--models-dir", models)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"removed {models / tmp}: leftover of an interrupted install or uninstall",
        f"installed other 1.0.0 at {models / 'other'}",
    ]
    assert names(models) == [LOCK_FILE, "other"]
    assert "TTB094" not in run_cli("list", "--models-dir", models).stdout


def test_an_uninstall_removes_leftovers_too(tmp_path: Path, run_cli):
    models = tmp_path / "models"
    install(make_archive(tmp_path, name="other"), models)
    process, _ = _paused_install(make_archive(tmp_path), models, tmp_path)
    _killed(process)
    done = run_cli("uninstall", "other", "--models-dir", models)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"removed {models}/.tmp-demo-")
    assert names(models) == [LOCK_FILE]


def test_an_install_that_changes_nothing_removes_leftovers_too(tmp_path: Path, run_cli):
    """Installing what is installed already ("up to date") still sweeps (issue 34)."""
    models = tmp_path / "models"
    other = make_archive(tmp_path, name="other")
    install(other, models)
    process, _ = _paused_install(make_archive(tmp_path), models, tmp_path)
    _killed(process)
    (tmp,) = [n for n in leftovers(models) if n.startswith(".tmp-demo-")]
    done = run_cli("install", other, "--models-dir", models)
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    assert lines[0] == f"removed {models / tmp}: leftover of an interrupted install or uninstall"
    assert lines[1].startswith("up to date: other 1.0.0 ") and len(lines) == 2
    assert names(models) == [LOCK_FILE, "other"]
    again = install(other, models)  # nothing left to sweep
    assert (again.action, again.removed_leftovers) == ("up to date", ())


def test_a_live_install_is_never_cleaned_up(tmp_path: Path, run_cli):
    models = tmp_path / "models"
    process, go = _paused_install(make_archive(tmp_path), models, tmp_path)
    try:
        (tmp,) = [n for n in leftovers(models) if n.startswith(".tmp-demo-")]
        other = make_archive(tmp_path, name="other")
        done = run_cli("install", other, "--models-dir", models)
        assert done.returncode == 0 and "removed" not in done.stdout, done.stdout + done.stderr
        assert "TTB094" not in run_cli("list", "--models-dir", models).stdout
        done = run_cli("uninstall", "other", "--models-dir", models)
        assert done.returncode == 0 and "removed" not in done.stdout
        assert (models / tmp).is_dir()
    finally:
        go.write_text("go")
    out, err = process.communicate(timeout=60)
    assert process.returncode == 0, err
    assert out.strip() == str(models / "demo")
    assert names(models) == [LOCK_FILE, "demo"] and verify_dir(models / "demo").ok()


def test_a_killed_install_of_a_large_archive(tmp_path: Path, run_cli):
    """No hook: SIGKILL at a real moment of extracting 64 MiB of incompressible data."""
    models = tmp_path / "models"
    archive = make_archive(tmp_path, **{"weights/big.bin": os.urandom(64 << 20)})
    process = subprocess.Popen(
        [TTBUNDLE, "install", str(archive), "--models-dir", str(models)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not any(p.stat().st_size > (4 << 20) for p in models.glob(".tmp-demo-*/weights/big.bin")):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.01)
    _killed(process)
    assert [n for n in leftovers(models) if n.startswith(".tmp-demo-")]
    done = run_cli("install", make_archive(tmp_path, name="other"), "--models-dir", models)
    assert done.returncode == 0 and done.stdout.startswith("removed "), done.stderr
    assert names(models) == [LOCK_FILE, "other"]
