"""Registration checks each bundle's adapter as `validate` does statically, and keeps
what it checked in an index keyed by the bundle's files (`ttbundles.registry.index`)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

import ttbundles
from tests.bundle_factory import write_bundle
from ttbundles.build import pack
from ttbundles.errors import ConfigurationError
from ttbundles.installer.operations import install, uninstall
from ttbundles.paths import user_cache_dir
from ttbundles.registry import index as index_module
from ttbundles.registry.index import INDEX_FILE, Index
from ttbundles.registry.registry import Status, compute
from ttbundles.serving.registration import fallbacks, log_table

LLAMA = "LlamaForCausalLM"


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for name in ("EXTRA_MODELS_DIR", "TT_BUNDLES_STRICT", "TT_MODEL_CLASS_OVERRIDES"):
        monkeypatch.delenv(name, raising=False)


def env(models: Path, **extra: str) -> dict[str, str]:
    base = {"EXTRA_MODELS_DIR": str(models), "MESH_DEVICE": "HOST"}
    return {**base, "TT_VLLM_BUILTIN_MODELS": "0", **extra}


def by_name(registry, name):
    (entry,) = [e for e in registry.entries if e.path.name == name]
    return entry


def broken(make_bundle, models: Path, name: str, adapter: str, arch: str = "BrokenForCausalLM"):
    return make_bundle(name, metadata={"arch": arch}, adapter=adapter, parent=models)


SYNTAX_ERROR = "class DemoGenerator:\n    def oops(:\n        pass\n"


@pytest.mark.parametrize("index", [True, False])
def test_an_adapter_that_does_not_parse_is_skipped_with_its_line(make_bundle, tmp_path, index):
    models = tmp_path / "models"
    broken(make_bundle, models, "bad", SYNTAX_ERROR)
    make_bundle("good", parent=models)
    registry = compute(env(models), index=index)
    bad = by_name(registry, "bad")
    assert bad.status is Status.SKIPPED
    assert bad.reason.startswith("TTB051 syntax error")
    (problem,) = [d for d in registry.problems if d.code == "TTB051"]
    assert problem.file == str(models / "bad" / "adapter.py") and problem.line == 2
    assert "fix the Python syntax" in str(problem)
    assert by_name(registry, "good").status is Status.REGISTERED


def test_a_missing_class_or_module_is_skipped(make_bundle, tmp_path):
    models = tmp_path / "models"
    broken(make_bundle, models, "noclass", "class Other:\n    pass\n")
    make_bundle("nomodule", metadata={"arch": "NoModForCausalLM"}, adapter=None, parent=models)
    registry = compute(env(models))
    assert by_name(registry, "noclass").reason.startswith("TTB052 class 'DemoGenerator'")
    assert by_name(registry, "nomodule").reason.startswith("TTB050 module 'adapter'")


def test_strict_mode_refuses_a_broken_adapter(make_bundle, tmp_path, monkeypatch):
    from ttbundles.serving import registration

    models = tmp_path / "models"
    broken(make_bundle, models, "bad", SYNTAX_ERROR)
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(models))
    monkeypatch.setenv("TT_BUNDLES_STRICT", "1")
    monkeypatch.setattr(registration, "_state", {})
    with pytest.raises(ConfigurationError) as caught:
        registration.register_all()
    assert "TTB051" in str(caught.value) and str(models / "bad" / "adapter.py") in str(caught.value)


def test_a_skipped_extra_bundle_says_which_built_in_serves_instead(make_bundle, tmp_path, caplog):
    models = tmp_path / "models"
    broken(make_bundle, models, "mine", SYNTAX_ERROR, arch=LLAMA)
    registry = compute(env(models, TT_VLLM_BUILTIN_MODELS="1"))
    serving = registry.registered["TTLlamaForCausalLM"]
    assert serving.source.value == "built-in"
    (line,) = fallbacks(registry)
    assert f"extra bundle mine@1.0.0 ({models / 'mine'}) was skipped" in line
    assert f"{serving.label} (built-in, {serving.path}) serves TTLlamaForCausalLM" in line
    with caplog.at_level(logging.INFO, logger="vllm.ttbundles"):
        log_table(registry)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("TTB051" in w and "adapter.py:2" in w for w in warnings)
    assert any("serves TTLlamaForCausalLM instead" in w for w in warnings)
    # One WARNING line per problem; the table itself is one INFO block.
    assert len([w for w in warnings if "TTB051" in w]) == 1


def test_the_table_names_an_invalid_bundle_by_its_folder(make_bundle, tmp_path, caplog):
    models = tmp_path / "models"
    make_bundle("nojson", metadata="{not json", parent=models)
    with caplog.at_level(logging.DEBUG, logger="vllm.ttbundles"):
        log_table(compute(env(models)))
    (table,) = [r.getMessage() for r in caplog.records if "TT architectures" in r.getMessage()]
    (row,) = [line for line in table.splitlines() if "nojson" in line]
    assert "-@-" not in row
    assert "nojson (folder)" in row and "extra" in row and "TTB010" in row


def test_startup_says_one_line_in_lists_words_and_the_table_at_debug(caplog, monkeypatch):
    """The default log: one INFO line of counts, in `ttbundle list`'s words (the TT-Metal
    built-ins are "not servable" without TT-Metal, as list says), and no site-packages
    path; the table itself only at debug level, with built-ins as built-in/<folder>."""
    monkeypatch.setenv("MESH_DEVICE", "HOST")
    registry = compute(dict(os.environ, MESH_DEVICE="HOST"), mesh="HOST")
    with caplog.at_level(logging.INFO, logger="vllm.ttbundles"):
        log_table(registry)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1
    (line,) = infos
    assert re.match(
        r"ttbundles: \d+ bundles for mesh HOST: \d+ registered, \d+ not servable, ", line
    )
    assert "serving TTLlamaForCausalLM (demo@1.0.0)" in line
    assert "site-packages" not in line
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="vllm.ttbundles"):
        log_table(registry)
    (table,) = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    demo = next(row for row in table.splitlines() if "demo@1.0.0" in row)
    assert demo.split()[0] == "registered" and "built-in/demo" in demo
    assert "site-packages" not in table
    gemma = next(row for row in table.splitlines() if "tt-gemma3@" in row)
    assert gemma.split()[:2] == ["not", "servable"]


# --- the index --------------------------------------------------------------------------


def test_a_second_process_takes_unchanged_bundles_from_the_user_cache(make_bundle, tmp_path):
    models = tmp_path / "models"
    make_bundle("good", parent=models)
    first = compute(env(models), mesh="HOST")
    assert by_name(first, "good").record.checked  # checked in this process
    (cache,) = user_cache_dir().glob("index-*.json")
    assert "good" in json.loads(cache.read_text())["bundles"]
    second = compute(env(models), mesh="HOST")
    good = by_name(second, "good")
    assert good.status is Status.REGISTERED and not good.record.checked  # from the index
    assert good._metadata is None  # validated again only when looked into
    # Built when asked, and equal to a fresh validation.
    assert good.metadata == by_name(first, "good").metadata
    assert good.class_ref() == by_name(first, "good").class_ref()


def _rewrite(path: Path, text: str) -> None:
    before = path.stat().st_mtime_ns
    path.write_text(text)
    if path.stat().st_mtime_ns == before:  # a coarse clock: make the change visible
        os.utime(path, ns=(before + 1_000_000, before + 1_000_000))


# Registration in a process of its own: whether bundle `good` was checked there or taken
# from an index, and its status.
REGISTER_CHILD = """
import sys
from ttbundles.registry.registry import compute
env = {"EXTRA_MODELS_DIR": sys.argv[1], "MESH_DEVICE": "HOST", "TT_VLLM_BUILTIN_MODELS": "0"}
(good,) = [e for e in compute(env, mesh="HOST").entries if e.path.name == "good"]
print("checked" if good.record.checked else "kept", good.status.name)
"""


def test_an_edit_of_a_contract_rule_invalidates_the_user_cache(make_bundle, tmp_path):
    """An upgrade that changes any module the check runs (here a rule of the contract)
    makes every process check afresh instead of serving the old code's verdict."""
    lib = tmp_path / "lib"
    shutil.copytree(
        Path(ttbundles.__file__).parent,
        lib / "ttbundles",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    models = tmp_path / "models"
    make_bundle("good", parent=models)

    def register() -> str:
        done = subprocess.run(
            [sys.executable, "-c", REGISTER_CHILD, str(models)],
            capture_output=True,
            text=True,
            env={**os.environ, "PYTHONPATH": str(lib)},
            cwd=tmp_path,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout.strip()

    assert register() == "checked REGISTERED"
    assert register() == "kept REGISTERED"
    contract = lib / "ttbundles" / "format" / "contract.py"
    rule = "FALLBACK_MAX_TOKENS_ALL_USERS = 131_072"
    assert rule in contract.read_text()
    _rewrite(contract, contract.read_text().replace(rule, "FALLBACK_MAX_TOKENS_ALL_USERS = 65_536"))
    assert register() == "checked REGISTERED"
    assert register() == "kept REGISTERED"


def test_a_changed_adapter_is_checked_afresh(make_bundle, tmp_path):
    models = tmp_path / "models"
    folder = make_bundle("good", parent=models)
    assert by_name(compute(env(models)), "good").status is Status.REGISTERED
    _rewrite(folder / "adapter.py", SYNTAX_ERROR)
    assert by_name(compute(env(models)), "good").reason.startswith("TTB051")
    _rewrite(folder / "adapter.py", make_bundle.adapter)
    assert by_name(compute(env(models)), "good").status is Status.REGISTERED


def test_a_changed_metadata_file_or_a_new_module_is_checked_afresh(make_bundle, tmp_path):
    models = tmp_path / "models"
    folder = make_bundle("good", parent=models)
    compute(env(models))
    document = json.loads((folder / "vllm_metadata.json").read_text())
    _rewrite(folder / "vllm_metadata.json", json.dumps({**document, "version": "2.0.0"}))
    assert by_name(compute(env(models)), "good").label == "good@2.0.0"
    # A module the check did not read appears: the folder's own mtime changes.
    (folder / "adapter.py").rename(folder / "other.py")
    assert by_name(compute(env(models)), "good").reason.startswith("TTB050")
    # A record of a module not found watches the folder: the module appearing is seen.
    (folder / "other.py").rename(folder / "adapter.py")
    assert by_name(compute(env(models)), "good").status is Status.REGISTERED


def test_install_and_uninstall_write_the_folder_index(tmp_path):
    models = tmp_path / "models"
    source = write_bundle(tmp_path / "src", name="demo")
    archive = pack(source, tmp_path / "dist")
    install(archive, models)
    data = json.loads((models / INDEX_FILE).read_text())
    assert list(data["bundles"]) == ["demo"]
    assert data["folder"] == str(models.resolve())
    # Read by registration, so no process needs to check the bundle again.
    fresh = Index(models)
    assert fresh.record("demo") is not None and fresh.fresh == 0
    registry = compute(env(models))
    assert by_name(registry, "demo")._metadata is None
    assert not list(user_cache_dir().glob("index-*.json"))  # nothing was checked afresh
    install(archive, models, replace=True)  # a new folder: its record is made again
    assert Index(models).record("demo") is not None
    uninstall("demo", models)
    assert json.loads((models / INDEX_FILE).read_text())["bundles"] == {}


@pytest.mark.parametrize("damage", ["garbage", "other checker", "other folder"])
def test_an_index_that_does_not_apply_is_ignored(make_bundle, tmp_path, damage):
    models = tmp_path / "models"
    folder = make_bundle("good", parent=models)
    index_module.write_folder_index(models)
    path = models / INDEX_FILE
    data = json.loads(path.read_text())
    # A record claiming the bundle is fine while its adapter is not: used only if trusted.
    _rewrite(folder / "adapter.py", SYNTAX_ERROR)
    data["bundles"]["good"][0] = index_module.examine(folder).key
    if damage == "garbage":
        path.write_text("{not json")
    elif damage == "other checker":
        data["checker"] = [[0, 0]]
        path.write_text(json.dumps(data))
    else:
        data["folder"] = "/elsewhere"
        path.write_text(json.dumps(data))
    assert by_name(compute(env(models)), "good").reason.startswith("TTB051")


def test_an_unwritable_cache_only_costs_the_check(make_bundle, tmp_path, monkeypatch):
    models = tmp_path / "models"
    make_bundle("good", parent=models)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    monkeypatch.setenv("XDG_CACHE_HOME", str(blocker))
    assert by_name(compute(env(models)), "good").status is Status.REGISTERED
    assert by_name(compute(env(models)), "good").record.checked  # checked again


def test_the_index_is_replaced_atomically(make_bundle, tmp_path):
    """Readers see a whole index or the previous one: written to a temporary file and
    renamed (no partial file under the index's name at any time)."""
    models = tmp_path / "models"
    for i in range(50):
        make_bundle(f"b{i:02d}", metadata={"arch": f"B{i}ForCausalLM"}, parent=models)
    index_module.write_folder_index(models)
    inode = (models / INDEX_FILE).stat().st_ino
    time.sleep(0.01)
    index_module.write_folder_index(models)
    assert (models / INDEX_FILE).stat().st_ino != inode  # a new file, renamed into place
    assert len(json.loads((models / INDEX_FILE).read_text())["bundles"]) == 50
    assert not [p for p in models.iterdir() if p.name.endswith(".tmp")]


def test_registration_checks_that_the_class_exists_not_its_contract(make_bundle, tmp_path):
    """A class that is found but breaks the contract is `validate`'s to report (TTB053
    and the like): registration only skips a bundle whose class cannot be found, and
    follows an import to where the class is defined (both files key the record)."""
    models = tmp_path / "models"
    make_bundle("thin", adapter="class DemoGenerator:\n    pass\n", parent=models)
    folder = make_bundle(
        "split",
        metadata={"arch": "SplitForCausalLM"},
        adapter="from .impl import DemoGenerator\n",
        files={"impl.py": make_bundle.adapter},
        parent=models,
    )
    registry = compute(env(models))
    assert by_name(registry, "thin").status is Status.REGISTERED
    assert by_name(registry, "split").status is Status.REGISTERED
    assert [k for k in index_module.examine(folder).key if isinstance(k, str)] == [
        "vllm_metadata.json",
        "adapter.py",
        "impl.py",
    ]
    _rewrite(folder / "impl.py", "class Other:\n    pass\n")
    assert by_name(compute(env(models)), "split").reason.startswith("TTB052")


def test_a_class_in_a_package_module_or_a_file_written_while_read(make_bundle, tmp_path):
    """The adapter check's quick path (the class at the top of `module.py`) gives way to
    the general one for a package (`module/__init__.py`), which keys that file; a file
    whose size or mtime changed while it was read keys nothing (`signature`)."""
    models = tmp_path / "models"
    folder = make_bundle(
        "pkg",
        metadata={"main_class": "gen:DemoGenerator"},
        files={"gen/__init__.py": make_bundle.adapter},
        parent=models,
    )
    assert by_name(compute(env(models)), "pkg").status is Status.REGISTERED
    assert [k for k in index_module.examine(folder).key if isinstance(k, str)] == [
        "vllm_metadata.json",
        "gen/__init__.py",
    ]
    _rewrite(folder / "gen" / "__init__.py", "class Other:\n    pass\n")
    assert by_name(compute(env(models)), "pkg").reason.startswith("TTB052")

    from ttbundles.check.static_reader import signature

    one, other = (folder / "vllm_metadata.json").stat(), (folder / "adapter.py").stat()
    assert signature(one, one) == (one.st_size, one.st_mtime_ns, one.st_ino)
    assert signature(one, other) is None


def test_a_bundle_from_the_index_is_read_again_only_when_looked_into(make_bundle, tmp_path):
    """The index keeps a summary of each document, not the document: the served bundle's
    file is read and validated again. If it no longer validates although its size and
    mtime are the same (edited behind the index's back), that is a clean configuration
    error naming the file, not a crash."""
    models = tmp_path / "models"
    folder = make_bundle("good", parent=models)
    index_module.write_folder_index(models)
    raw = (models / INDEX_FILE).read_text()
    assert '"description"' not in raw  # what selection does not read is not kept
    good = by_name(compute(env(models)), "good")
    assert good._metadata is None and good.metadata.name == "good"

    file = folder / "vllm_metadata.json"
    text, stat = file.read_text(), file.stat()
    broken_text = text.replace('"good"', '"GOOD"', 1)  # same length; not a valid name
    assert len(broken_text) == len(text) and broken_text != text
    file.write_text(broken_text)
    os.utime(file, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    good = by_name(compute(env(models)), "good")
    assert good.status is Status.REGISTERED  # the key still matches
    with pytest.raises(ConfigurationError) as raised:
        good.metadata  # noqa: B018
    assert raised.value.diagnostics[0].file == str(file)


def test_requirements_are_checked_from_the_index_without_validating_again(make_bundle, tmp_path):
    models = tmp_path / "models"
    make_bundle("old-python", metadata={"requires": {"python": "<3"}}, parent=models)
    make_bundle(
        "any-python",
        metadata={"arch": "OtherForCausalLM", "requires": {"python": ">=3"}},
        parent=models,
    )
    index_module.write_folder_index(models)
    registry = compute(env(models))
    old, fine = by_name(registry, "old-python"), by_name(registry, "any-python")
    assert old.status is Status.SKIPPED and old.reason.startswith("TTB100 requires python<3")
    assert fine.status is Status.REGISTERED
    assert old._metadata is None and fine._metadata is None  # read from the summary


def test_a_killed_cache_write_is_cleaned_up_by_a_later_one(make_bundle, tmp_path):
    """The user cache has no lock: a temporary file older than a write could take is a
    killed writer's, removed when registration next writes the cache; a fresh one (a
    writer in another process right now) is left alone."""
    models = tmp_path / "models"
    make_bundle("good", parent=models)
    cache = user_cache_dir()
    cache.mkdir(parents=True)
    stale, fresh = cache / ".index-0123.json.dead.tmp", cache / ".index-0123.json.live.tmp"
    for path in (stale, fresh):
        path.write_text('{"format": 2, "bund')
    old = time.time() - index_module.STALE_TEMP_SECONDS - 60
    os.utime(stale, (old, old))
    compute(env(models))  # checks the bundle afresh, so writes the cache
    assert not stale.exists() and fresh.exists()
    assert len(list(cache.glob("index-*.json"))) == 1
