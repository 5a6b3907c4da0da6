"""Installing archives safely and atomically, and uninstalling them."""

from __future__ import annotations

import json
import multiprocessing
import os
import tarfile
from pathlib import Path

import pytest

import ttbundles.archive.reader as reader_module
import ttbundles.installer.operations as install_module
import ttbundles.installer.publish as publish_module
from tests.bundle_factory import (
    CRAFTED_CASES,
    Entry,
    crafted_corpus,
    read_entries,
    snapshot,
    write_bundle,
    write_entries,
)
from ttbundles.archive.manifest import MANIFEST_FILE, verify_dir
from ttbundles.archive.reader import extract_verified, read_archive, verify
from ttbundles.build import pack
from ttbundles.errors import ArchiveError, InstallError, TTBundleError
from ttbundles.installer.leftovers import LOCK_FILE
from ttbundles.installer.operations import install, resolve_models_dir, uninstall
from ttbundles.registry.index import INDEX_FILE

WEIGHTS = os.urandom(1 << 20) + b"end"


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)
    monkeypatch.delenv("EXTRA_MODELS_DIR", raising=False)


def make_archive(root: Path, version: str = "1.0.0", **files: bytes | str) -> Path:
    folder = write_bundle(
        root / f"src-{version}",
        version=version,
        files={"weights/w.bin": WEIGHTS, "docs/notes.txt": f"version {version}\n", **files},
    )
    os.chmod(folder / "adapter.py", 0o755)
    return pack(folder, root / "dist")


@pytest.fixture
def archive(tmp_path: Path) -> Path:
    return make_archive(tmp_path)


@pytest.fixture
def models(tmp_path: Path) -> Path:
    return tmp_path / "models"


def leftovers(models_dir: Path) -> list[str]:
    return sorted(
        p.name
        for p in models_dir.iterdir()
        if p.name.startswith(".tmp-") or p.name.startswith(".old-")
    )


def installed_version(folder: Path) -> str:
    return json.loads((folder / "vllm_metadata.json").read_text())["version"]


# --- the normal path ------------------------------------------------------------------


def test_install_writes_the_bundle_with_its_manifest(archive: Path, models: Path):
    result = install(archive, models)
    target = result.path
    assert target == models / "demo"
    assert (result.action, result.name, result.version) == ("installed", "demo", "1.0.0")
    assert sorted(p.name for p in models.iterdir()) == [LOCK_FILE, INDEX_FILE, "demo"]
    assert (target / "weights/w.bin").read_bytes() == WEIGHTS
    assert (target / MANIFEST_FILE).is_file()
    assert os.stat(target / "adapter.py").st_mode & 0o100  # execute bit kept
    assert not os.stat(target / "vllm_metadata.json").st_mode & 0o111
    assert oct(os.stat(target).st_mode & 0o777) != oct(0o700)  # not mkdtemp's mode
    assert verify_dir(target).ok() and verify(target).ok()


def test_pack_install_pack_gives_identical_bytes(archive: Path, models: Path, tmp_path: Path):
    target = install(archive, models).path
    (target / "__pycache__").mkdir()  # importing the adapter leaves this behind
    (target / "__pycache__" / "adapter.cpython-311.pyc").write_bytes(b"bytecode")
    again = pack(target, tmp_path / "again")
    assert again.read_bytes() == archive.read_bytes()


def test_pack_install_pack_with_source_date_epoch(tmp_path: Path, models: Path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1600000000")
    archive = make_archive(tmp_path)
    again = pack(install(archive, models).path, tmp_path / "again")
    assert again.read_bytes() == archive.read_bytes()


def test_a_missing_models_folder_is_created(archive: Path, tmp_path: Path):
    models = tmp_path / "deep" / "er" / "models"
    assert install(archive, models).path == models / "demo"


def test_installed_files_respect_the_umask(archive: Path, models: Path):
    old = os.umask(0o027)
    try:
        target = install(archive, models).path
    finally:
        os.umask(old)
    assert os.stat(target / "docs/notes.txt").st_mode & 0o777 == 0o640
    assert os.stat(target / "adapter.py").st_mode & 0o777 == 0o750


def test_extract_verified_is_what_validate_uses(archive: Path, tmp_path: Path):
    dest = tmp_path / "look"
    dest.mkdir()
    folder = extract_verified(archive, dest)
    assert folder == dest / "demo" and verify_dir(folder).ok()


# --- existing installs ---------------------------------------------------------------


def test_refuses_to_overwrite_without_replace(archive: Path, models: Path, tmp_path: Path):
    install(archive, models)
    before = snapshot(models)
    newer = make_archive(tmp_path, "2.0.0")
    with pytest.raises(InstallError) as info:
        install(newer, models)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB090" and "--replace" in diagnostic.hint
    assert snapshot(models) == before


def test_replace_swaps_in_the_new_version(archive: Path, models: Path, tmp_path: Path):
    install(archive, models)
    newer = make_archive(tmp_path, "2.0.0")
    result = install(newer, models, replace=True)
    target = result.path
    assert (result.action, result.previous_version, result.version) == (
        "replaced",
        "1.0.0",
        "2.0.0",
    )
    assert installed_version(target) == "2.0.0"
    assert (target / "docs/notes.txt").read_text() == "version 2.0.0\n"
    assert verify_dir(target).ok()
    assert leftovers(models) == []


def test_replace_leaves_the_old_bundle_when_the_exchange_fails(
    archive: Path, models: Path, tmp_path: Path, monkeypatch
):
    install(archive, models)
    before = snapshot(models)
    newer = make_archive(tmp_path, "2.0.0")

    def failing_exchange(a, b):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(publish_module, "exchange", failing_exchange)
    with pytest.raises(InstallError) as info:
        install(newer, models, replace=True)
    monkeypatch.undo()
    assert info.value.diagnostics[0].code == "TTB093"
    assert snapshot(models) == before
    assert leftovers(models) == []


def test_replace_restores_the_old_bundle_when_the_two_renames_fail(
    archive: Path, models: Path, tmp_path: Path, monkeypatch
):
    """Without exchange nor links (the last fallback), a failed second rename undoes the first."""
    install(archive, models)
    before = snapshot(models)
    newer = make_archive(tmp_path, "2.0.0")
    real_rename = os.rename

    def no_exchange(a, b):
        raise publish_module.ExchangeUnsupported(22, "Invalid argument")

    def no_links(*args, **kwargs):
        raise OSError(1, "Operation not permitted")

    def failing_rename(src, dst):
        if Path(src).name.startswith(".tmp-") and Path(dst).name == "demo":
            raise OSError(28, "No space left on device")
        return real_rename(src, dst)

    monkeypatch.setattr(publish_module, "exchange", no_exchange)
    monkeypatch.setattr(publish_module.os, "symlink", no_links)
    monkeypatch.setattr(publish_module.os, "rename", failing_rename)
    with pytest.raises(InstallError) as info:
        install(newer, models, replace=True)
    monkeypatch.undo()
    assert info.value.diagnostics[0].code == "TTB093"
    assert snapshot(models) == before
    assert leftovers(models) == []


def test_a_failure_while_extracting_leaves_nothing_behind(
    archive: Path, models: Path, tmp_path: Path, monkeypatch
):
    install(archive, models)
    before = snapshot(models)
    newer = make_archive(tmp_path, "2.0.0")
    real_copy = reader_module._copy_capped
    calls = []

    def disk_full(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return real_copy(*args, **kwargs)

    monkeypatch.setattr(reader_module, "_copy_capped", disk_full)
    with pytest.raises(InstallError) as info:
        install(newer, models, replace=True)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB093" and "No space left" in diagnostic.message
    assert snapshot(models) == before


# --- hostile and broken archives -------------------------------------------------------


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return crafted_corpus(tmp_path_factory.mktemp("corpus"), WEIGHTS)


CASES = CRAFTED_CASES


def _assert_refused(exc: TTBundleError, code: str, entry: str | None) -> None:
    messages = [d.message for d in exc.diagnostics if d.code == code]
    assert messages, exc.diagnostics
    if entry is not None:
        assert any(m.startswith(entry + ":") for m in messages), messages


@pytest.mark.parametrize("case", CASES)
def test_crafted_archives_are_refused_and_change_nothing(corpus, case: str, tmp_path: Path):
    good, crafted = corpus
    models = tmp_path / "models"
    install(good, models)  # an existing install that must survive
    before = snapshot(models)
    item = crafted[case]
    with pytest.raises(ArchiveError) as info:
        install(item.path, models, replace=True)
    _assert_refused(info.value, item.code, item.entry)
    assert snapshot(models) == before
    assert not (tmp_path / "etc").exists() and not (tmp_path / "evil").exists()


@pytest.mark.parametrize("case", CASES)
def test_extraction_rechecks_every_entry_by_itself(corpus, case: str, tmp_path: Path, monkeypatch):
    """Were the archive swapped after verification, extraction alone still refuses it."""
    good, crafted = corpus
    manifest = read_archive(good)
    monkeypatch.setattr(install_module, "verified_manifest", lambda _archive: manifest)
    models = tmp_path / "models"
    models.mkdir()
    item = crafted[case]
    with pytest.raises(ArchiveError) as info:
        install(item.path, models)
    _assert_refused(info.value, item.code, None)
    assert sorted(p.name for p in models.iterdir()) == [LOCK_FILE]  # the folder's lock stays
    assert not (tmp_path / "evil").exists()


def test_a_failing_install_into_a_new_folder_creates_nothing(corpus, tmp_path: Path):
    _, crafted = corpus
    models = tmp_path / "models"
    with pytest.raises(ArchiveError):
        install(crafted["dotdot"].path, models)
    assert not models.exists()


def test_a_renamed_manifest_cannot_pick_another_folder(archive: Path, tmp_path: Path):
    entries = read_entries(archive)
    document = json.loads(entries[-1].data)
    document["name"] = "someone-else"  # not covered by the root digest
    entries[-1].data = json.dumps(document).encode()
    renamed = write_entries(tmp_path / "renamed.ttbundle", entries)
    models = tmp_path / "models"
    with pytest.raises(ArchiveError) as info:
        install(renamed, models)
    assert any(d.code == "TTB081" and d.pointer == "/name" for d in info.value.diagnostics)
    assert not models.exists()


def test_directory_entries_are_accepted(archive: Path, tmp_path: Path):
    entries = [Entry("weights", type=tarfile.DIRTYPE, mode=0o755), *read_entries(archive)]
    with_dirs = write_entries(tmp_path / "dirs.ttbundle", entries)
    target = install(with_dirs, tmp_path / "models").path
    assert verify_dir(target).ok()


# --- concurrency ----------------------------------------------------------------------


def _install_worker(archive: str, models: str, replace: bool, barrier, results) -> None:
    barrier.wait()
    try:
        install(Path(archive), Path(models), replace=replace)
        results.put("ok")
    except TTBundleError as exc:
        results.put(exc.diagnostics[0].code)
    except BaseException as exc:  # reported to the test rather than lost in the child
        results.put(repr(exc))


def _race(archives: list[Path], models: Path, replace: bool) -> list[str]:
    context = multiprocessing.get_context("fork")
    barrier = context.Barrier(len(archives))
    results = context.Queue()
    workers = [
        context.Process(
            target=_install_worker, args=(str(a), str(models), replace, barrier, results)
        )
        for a in archives
    ]
    for worker in workers:
        worker.start()
    outcomes = [results.get(timeout=60) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
        assert worker.exitcode == 0
    return sorted(outcomes)


def test_concurrent_replacing_installs_leave_one_consistent_bundle(tmp_path: Path):
    first = make_archive(tmp_path, "1.0.0")
    second = make_archive(tmp_path, "2.0.0")
    models = tmp_path / "models"
    for _ in range(3):
        assert _race([first, second], models, replace=True) == ["ok", "ok"]
        found = sorted(p.name for p in models.iterdir())
        kept = [n for n in found if n.startswith(".prev-demo-")]  # the old version kept
        assert len(kept) <= 1 and all(verify_dir(models / n).ok() for n in kept)
        assert [n for n in found if n not in kept] == [LOCK_FILE, INDEX_FILE, "demo"]
        assert verify_dir(models / "demo").ok()
        assert installed_version(models / "demo") in {"1.0.0", "2.0.0"}


def test_concurrent_first_installs_let_exactly_one_win(tmp_path: Path):
    first = make_archive(tmp_path, "1.0.0")
    second = make_archive(tmp_path, "2.0.0")
    models = tmp_path / "models"
    assert _race([first, second], models, replace=False) == ["TTB090", "ok"]
    assert sorted(p.name for p in models.iterdir()) == [LOCK_FILE, INDEX_FILE, "demo"]
    assert verify_dir(models / "demo").ok()


# --- uninstall ------------------------------------------------------------------------


def test_uninstall_removes_the_bundle(archive: Path, models: Path):
    target = install(archive, models).path
    result = uninstall("demo", models)
    assert (result.action, result.path, result.version) == ("uninstalled", target, "1.0.0")
    assert sorted(p.name for p in models.iterdir()) == [LOCK_FILE, INDEX_FILE]


def test_uninstall_of_a_missing_bundle_suggests_a_name(archive: Path, models: Path):
    install(archive, models)
    with pytest.raises(InstallError) as info:
        uninstall("demi", models)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB092" and "demo" in diagnostic.hint


@pytest.mark.parametrize("name", ["../models", "/etc", "demo/weights", ".", ""])
def test_uninstall_takes_names_not_paths(archive: Path, models: Path, name: str):
    install(archive, models)
    before = snapshot(models)
    with pytest.raises(InstallError) as info:
        uninstall(name, models)
    assert info.value.diagnostics[0].code == "TTB092"
    assert snapshot(models) == before


def test_uninstall_leaves_folders_that_are_not_bundles(models: Path, tmp_path: Path):
    (models / "data").mkdir(parents=True)
    (models / "data" / "precious.txt").write_text("keep me")
    with pytest.raises(InstallError) as info:
        uninstall("data", models)
    assert info.value.diagnostics[0].code == "TTB092"
    assert (models / "data" / "precious.txt").read_text() == "keep me"
    with pytest.raises(InstallError):
        uninstall("demo", tmp_path / "no-such-folder")


def test_uninstall_of_a_linked_bundle_removes_only_the_link(archive: Path, tmp_path: Path):
    elsewhere = install(archive, tmp_path / "elsewhere").path
    models = tmp_path / "models"
    models.mkdir()
    (models / "demo").symlink_to(elsewhere)
    uninstall("demo", models)
    assert not os.path.lexists(models / "demo")
    assert verify_dir(elsewhere).ok()


# --- where the models folder is -----------------------------------------------------


def test_resolve_models_dir(monkeypatch, tmp_path: Path):
    assert resolve_models_dir(tmp_path) == tmp_path
    with pytest.raises(InstallError) as info:
        resolve_models_dir(None)
    assert info.value.diagnostics[0].code == "TTB091"
    monkeypatch.setenv("EXTRA_MODELS_DIR", "")
    with pytest.raises(InstallError):
        resolve_models_dir(None)
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tmp_path / "one"))
    assert resolve_models_dir(None) == tmp_path / "one"
    monkeypatch.setenv(
        "EXTRA_MODELS_DIR", os.pathsep.join(["", str(tmp_path / "a"), str(tmp_path / "b")])
    )
    assert resolve_models_dir(None) == tmp_path / "a"


def test_install_and_uninstall_default_to_extra_models_dir(
    archive: Path, tmp_path: Path, monkeypatch
):
    models = tmp_path / "env-models"
    monkeypatch.setenv("EXTRA_MODELS_DIR", os.pathsep.join([str(models), str(tmp_path)]))
    assert install(archive, None).path == models / "demo"
    assert uninstall("demo", None).path == models / "demo"
