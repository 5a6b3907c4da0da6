"""Listing, manifests, deterministic packing and verification of `.ttbundle` archives."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
import tracemalloc
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ttbundles.archive.reader as reader_module
import ttbundles.archive.writer as archive_module
from tests.bundle_factory import (
    CRAFTED_CASES,
    Entry,
    crafted_corpus,
    metadata,
    read_entries,
    write_bundle,
    write_entries,
)
from ttbundles.archive.files import IgnoreRules, list_files, unsafe_reason
from ttbundles.archive.manifest import (
    MANIFEST_FILE,
    FileEntry,
    Manifest,
    build_manifest,
    parse_manifest,
    read_manifest,
    root_digest,
    verify_dir,
)
from ttbundles.archive.reader import read_archive, verify, verify_archive
from ttbundles.archive.writer import DEFAULT_MTIME, source_date_epoch
from ttbundles.build import pack
from ttbundles.errors import ArchiveError, InvalidBundleError, TTBundleError

WEIGHTS = bytes(range(256)) * 4096 + b"tail"  # ~1 MiB: more than one hashing chunk


@pytest.fixture(autouse=True)
def _no_source_date_epoch(monkeypatch):
    monkeypatch.delenv("SOURCE_DATE_EPOCH", raising=False)


@pytest.fixture
def bundle(tmp_path: Path) -> Path:
    return write_bundle(
        tmp_path / "src",
        files={"weights/w.bin": WEIGHTS, "tokenizer/vocab.txt": "a\nb\n", "README.md": "hi\n"},
    )


@pytest.fixture
def archive(bundle: Path, tmp_path: Path) -> Path:
    return pack(bundle, tmp_path / "dist")


def codes(diagnostics) -> set[str]:
    return {d.code for d in diagnostics}


def find(diagnostics, code: str) -> list[str]:
    return [d.message for d in diagnostics if d.code == code]


# --- which files a bundle has ----------------------------------------------------------


def test_listing_is_sorted_posix_and_skips_what_no_bundle_holds(tmp_path: Path):
    folder = write_bundle(
        tmp_path / "b",
        files={
            "a-b.txt": "1",
            "a/c.txt": "2",
            "a/__pycache__/m.cpython-311.pyc": "x",
            "stale.pyc": "x",
            ".git/config": "x",
            ".hg/store": "x",
            ".svn/entries": "x",
            ".bzr/branch": "x",
            "sub/.git": "gitdir: elsewhere",  # a submodule's .git file
            "MANIFEST.json": "{}",  # regenerated, never hashed
            "sub/MANIFEST.json": "{}",  # only the root one is special
        },
    )
    assert list_files(folder) == [
        "a-b.txt",
        "a/c.txt",
        "adapter.py",
        "sub/MANIFEST.json",
        "vllm_metadata.json",
    ]


def test_ttbundleignore_patterns(tmp_path: Path):
    folder = write_bundle(
        tmp_path / "b",
        files={
            ".ttbundleignore": "\n".join(
                [
                    "# comment line",
                    "",
                    "notes.txt   ",  # a name, at any depth; trailing spaces dropped
                    "build/",  # folders only
                    "*.log",
                    "data/raw",  # anchored: a path from the root
                    "/top.tmp",  # anchored by a leading slash
                ]
            ),
            "notes.txt": "x",
            "deep/notes.txt": "x",
            "build/out.bin": "x",
            "deep/build/out.bin": "x",
            "build.txt": "kept",
            "docs/build": "a file named build is kept: 'build/' means folders",
            "run.log": "x",
            "deep/run.log": "x",
            "data/raw/a.bin": "x",
            "data/rawish/a.bin": "kept",
            "other/data/raw/a.bin": "kept: anchored patterns match from the root only",
            "top.tmp": "x",
            "deep/top.tmp": "kept",
        },
    )
    assert list_files(folder) == [
        ".ttbundleignore",
        "adapter.py",
        "build.txt",
        "data/rawish/a.bin",
        "deep/top.tmp",
        "docs/build",
        "other/data/raw/a.bin",
        "vllm_metadata.json",
    ]


def test_ignore_negation_is_refused_not_misread():
    with pytest.raises(InvalidBundleError) as info:
        IgnoreRules.parse("*.bin\n!keep.bin\n")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB033" and diagnostic.line == 2


def test_symlinks_and_special_files_are_refused_by_name(tmp_path: Path):
    folder = write_bundle(tmp_path / "b", files={"real.txt": "x"})
    (folder / "link.txt").symlink_to(folder / "real.txt")
    (folder / "linkdir").symlink_to(tmp_path)
    os.mkfifo(folder / "pipe")
    with pytest.raises(ArchiveError) as info:
        list_files(folder)
    problems = info.value.diagnostics
    assert codes(problems) == {"TTB085"}
    named = sorted(d.message.split(":")[0] for d in problems)
    assert named == ["link.txt", "linkdir", "pipe"]  # every one, not only the first
    assert all(d.hint for d in problems)


def test_ignored_links_are_never_looked_at(tmp_path: Path):
    folder = write_bundle(tmp_path / "b", files={".ttbundleignore": ".venv/\n"})
    (folder / ".venv").mkdir()
    (folder / ".venv" / "python").symlink_to("/usr/bin/python3")
    assert ".venv/python" not in list_files(folder)


@pytest.mark.parametrize(
    ("name", "unsafe"),
    [
        ("a/b.txt", False),
        ("é/ü.bin", False),
        ("/abs", True),
        ("../x", True),
        ("a/../../x", True),
        ("a//b", True),
        ("./a", True),
        ("a\\b", True),
        ("C:/x", True),
        ("", True),
        ("a\x00b", True),
        ("bad-\udcff", True),
    ],
)
def test_unsafe_reason(name: str, unsafe: bool):
    assert (unsafe_reason(name) is not None) is unsafe


# --- manifests --------------------------------------------------------------------------


def test_manifest_lists_sizes_and_digests_and_a_recomputable_root_digest(bundle: Path):
    manifest = build_manifest(bundle)
    assert (manifest.manifest_version, manifest.name, manifest.version) == (1, "demo", "1.0.0")
    files = {f.path: f for f in manifest.files}
    assert list(files) == sorted(files)
    assert files["weights/w.bin"].size == len(WEIGHTS)
    assert files["weights/w.bin"].sha256 == hashlib.sha256(WEIGHTS).hexdigest()
    # The identity, recomputed the way any other tool would.
    listing = [{"path": f.path, "size": f.size, "sha256": f.sha256} for f in manifest.files]
    canonical = json.dumps(listing, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    expected = "sha256:" + hashlib.sha256(canonical.encode()).hexdigest()
    assert manifest.root_digest == expected == root_digest(reversed(manifest.files))


def test_manifest_serialisation_round_trips_and_is_stable(bundle: Path):
    manifest = build_manifest(bundle)
    data = manifest.to_bytes()
    assert data.endswith(b"\n")
    assert list(json.loads(data)) == [
        "manifest_version",
        "name",
        "version",
        "files",
        "root_digest",
    ]
    assert parse_manifest(data, source="m") == manifest
    assert parse_manifest(data, source="m").to_bytes() == data


def _manifest_document(**changes) -> bytes:
    entry = {"path": "a.txt", "size": 1, "sha256": "0" * 64}
    document = {
        "manifest_version": 1,
        "name": "demo",
        "version": "1",
        "files": [entry],
        "root_digest": "sha256:" + "0" * 64,
        **changes,
    }
    return json.dumps(document).encode()


@pytest.mark.parametrize(
    "data",
    [
        b"{not json",
        b"[]",
        b"\xff\xfe",
        _manifest_document(manifest_version=2),
        _manifest_document(unknown="x"),
        _manifest_document(name="../escape"),
        _manifest_document(root_digest="md5:abc"),
        _manifest_document(files=[{"path": "../x", "size": 1, "sha256": "0" * 64}]),
        _manifest_document(files=[{"path": "MANIFEST.json", "size": 1, "sha256": "0" * 64}]),
        _manifest_document(files=[{"path": "a", "size": -1, "sha256": "0" * 64}]),
        _manifest_document(files=[{"path": "a", "size": "1", "sha256": "0" * 64}]),
        _manifest_document(manifest_version=True),
        _manifest_document(
            files=[{"path": "a", "size": 1, "sha256": "0" * 64}] * 2,
        ),
    ],
    ids=[
        "syntax",
        "not-object",
        "not-utf8",
        "version",
        "extra-key",
        "bad-name",
        "bad-digest",
        "unsafe-path",
        "lists-itself",
        "negative-size",
        "string-size",
        "boolean-version",
        "duplicate-path",
    ],
)
def test_invalid_manifests_are_ttb081(data: bytes):
    with pytest.raises(ArchiveError) as info:
        parse_manifest(data, source="x/MANIFEST.json")
    assert codes(info.value.diagnostics) == {"TTB081"}
    assert all(d.file == "x/MANIFEST.json" for d in info.value.diagnostics)


def test_unsupported_manifest_version_says_what_to_do():
    with pytest.raises(ArchiveError) as info:
        parse_manifest(_manifest_document(manifest_version=2), source="m")
    (diagnostic,) = info.value.diagnostics
    assert "manifest_version 2" in diagnostic.message and "upgrade" in diagnostic.hint


def _with_manifest(folder: Path) -> Path:
    (folder / MANIFEST_FILE).write_bytes(build_manifest(folder).to_bytes())
    return folder


def test_verify_dir_accepts_an_intact_folder_and_ignores_pycache(bundle: Path):
    _with_manifest(bundle)
    (bundle / "__pycache__").mkdir()
    (bundle / "__pycache__" / "adapter.cpython-311.pyc").write_bytes(b"bytecode")
    assert verify_dir(bundle).diagnostics == []
    assert verify(bundle).diagnostics == []


def test_verify_dir_names_every_mismatch_at_once(bundle: Path):
    _with_manifest(bundle)
    data = bytearray((bundle / "weights/w.bin").read_bytes())
    data[12345] ^= 0xFF
    (bundle / "weights/w.bin").write_bytes(bytes(data))  # same size, other digest
    (bundle / "README.md").write_text("longer than before\n")
    (bundle / "tokenizer/vocab.txt").unlink()
    (bundle / "new.py").write_text("x = 1\n")
    document = json.loads((bundle / MANIFEST_FILE).read_text())
    document["root_digest"] = "sha256:" + "1" * 64
    (bundle / MANIFEST_FILE).write_text(json.dumps(document))

    report = verify_dir(bundle)
    assert not report.ok()
    by_code = {code: find(report.diagnostics, code) for code in codes(report.diagnostics)}
    assert sorted(by_code) == ["TTB082", "TTB083", "TTB084", "TTB088"]
    assert sorted(m.split(":")[0] for m in by_code["TTB082"]) == ["README.md", "weights/w.bin"]
    assert by_code["TTB083"][0].startswith("tokenizer/vocab.txt")
    assert by_code["TTB084"][0].startswith("new.py")


def test_verify_dir_without_manifest_and_missing_paths(tmp_path: Path, bundle: Path):
    assert codes(verify_dir(bundle).diagnostics) == {"TTB081"}
    assert codes(verify(tmp_path / "nowhere").diagnostics) == {"TTB001"}
    with pytest.raises(ArchiveError):
        read_manifest(bundle)


def test_verify_dir_catches_a_renamed_manifest(bundle: Path):
    _with_manifest(bundle)
    document = json.loads((bundle / MANIFEST_FILE).read_text())
    document["name"] = "other"  # the root digest does not cover the name
    (bundle / MANIFEST_FILE).write_text(json.dumps(document))
    assert find(verify_dir(bundle).diagnostics, "TTB081")


# --- packing: layout ------------------------------------------------------------------


def test_archive_layout(bundle: Path, archive: Path):
    os.chmod(bundle / "adapter.py", 0o700)
    archive = pack(bundle, archive.parent)
    assert archive.name == "demo-1.0.0.ttbundle"
    raw = archive.read_bytes()
    # gzip header: magic, deflate, no flags (no file name), mtime 0, "fastest", OS unknown.
    assert raw[:4] == b"\x1f\x8b\x08\x00" and raw[4:8] == b"\0\0\0\0"
    assert raw[8] == 4 and raw[9] == 255
    with tarfile.open(archive, "r:gz") as tar:
        members = tar.getmembers()
    names = [m.name for m in members]
    files = names[:-1]
    assert names[-1] == MANIFEST_FILE
    assert files == sorted(files) == list_files(bundle)
    for m in members:
        assert m.isreg() and m.type == tarfile.REGTYPE  # no directory entries
        assert (m.uid, m.gid, m.uname, m.gname, m.mtime) == (0, 0, "", "", DEFAULT_MTIME)
        assert m.mode == (0o755 if m.name == "adapter.py" else 0o644)
        assert m.pax_headers == {}
    manifest = read_archive(archive)
    assert manifest == build_manifest(bundle)


def test_long_and_non_ascii_paths_use_minimal_pax_headers(tmp_path: Path):
    long_name = "/".join(["deep" * 10] * 4) + "/weights.bin"
    folder = write_bundle(tmp_path / "b", files={long_name: "x", "naïve/ünï.txt": "y"})
    archive = pack(folder, tmp_path / "out")
    with tarfile.open(archive, "r:gz") as tar:
        members = {m.name: m for m in tar}
    assert long_name in members and "naïve/ünï.txt" in members
    assert set(members[long_name].pax_headers) == {"path"}
    assert set(members["naïve/ünï.txt"].pax_headers) == {"path"}
    plain = gzip.decompress(archive.read_bytes())
    assert b"atime" not in plain and b"ctime" not in plain and b"mtime=" not in plain
    assert verify_archive(archive).ok()


def test_source_date_epoch_sets_every_mtime(bundle: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1700000000")
    archive = pack(bundle, tmp_path / "out")
    with tarfile.open(archive, "r:gz") as tar:
        assert {m.mtime for m in tar} == {1700000000}
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "yesterday")
    with pytest.raises(ArchiveError) as info:
        source_date_epoch()
    assert "SOURCE_DATE_EPOCH" in info.value.diagnostics[0].message


def test_progress_reports_every_byte_in_order(bundle: Path, tmp_path: Path):
    calls: list[tuple[int, int]] = []
    pack(bundle, tmp_path / "out", progress=lambda done, total: calls.append((done, total)))
    total = sum((bundle / rel).stat().st_size for rel in list_files(bundle))
    assert calls[0] == (0, total) and calls[-1] == (total, total)
    assert [d for d, _ in calls] == sorted(d for d, _ in calls)


def test_packing_into_the_bundle_itself_is_stable(bundle: Path):
    first = pack(bundle, bundle).read_bytes()
    second = pack(bundle, bundle)
    assert second.read_bytes() == first  # the previous archive was not packed
    assert [p.name for p in bundle.iterdir() if p.name.endswith(".part")] == []


# --- packing: refusals -------------------------------------------------------------------


def test_an_invalid_bundle_is_refused_before_anything_is_written(tmp_path: Path):
    document = metadata()
    del document["arch"]
    folder = write_bundle(tmp_path / "b", document=document)
    with pytest.raises(InvalidBundleError) as info:
        pack(folder, tmp_path / "out")
    assert any("arch" in d.message or d.pointer == "/arch" for d in info.value.diagnostics)
    assert not (tmp_path / "out").exists()


def test_a_symlink_is_refused_and_an_existing_archive_survives(
    bundle: Path, archive: Path, tmp_path: Path
):
    before = archive.read_bytes()
    (bundle / "README.md").write_text("changed\n")
    (bundle / "escape").symlink_to("/etc/passwd")
    with pytest.raises(ArchiveError) as info:
        pack(bundle, archive.parent)
    assert find(info.value.diagnostics, "TTB085")[0].startswith("escape")
    assert archive.read_bytes() == before
    assert sorted(p.name for p in archive.parent.iterdir()) == [archive.name]


def test_metadata_left_out_by_the_ignore_file_is_refused(tmp_path: Path):
    folder = write_bundle(tmp_path / "b", files={".ttbundleignore": "*.json\n"})
    with pytest.raises(InvalidBundleError) as info:
        pack(folder, tmp_path / "out")
    assert codes(info.value.diagnostics) == {"TTB002"}


@pytest.mark.parametrize("change", ["grow", "shrink"])
def test_a_file_changing_while_packed_is_an_error(tmp_path: Path, change: str):
    folder = write_bundle(tmp_path / "b", files={"big.bin": b"\1" * (3 << 20)})
    out = tmp_path / "out"
    done_once = []

    def meddle(done: int, total: int) -> None:
        if done >= (1 << 20) and not done_once:
            done_once.append(True)
            with open(folder / "big.bin", "r+b") as handle:
                if change == "grow":
                    handle.seek(0, os.SEEK_END)
                    handle.write(b"more")
                else:
                    handle.truncate(2 << 20)

    with pytest.raises(ArchiveError) as info:
        pack(folder, out, progress=meddle)
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB082" and "big.bin" in diagnostic.message
    assert list(out.iterdir()) == []  # no archive, no temporary file


def test_an_unwritable_output_folder_is_a_typed_error(bundle: Path, tmp_path: Path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    with pytest.raises(TTBundleError):
        pack(bundle, blocker / "out")


def _peak_memory_packing(tmp_path: Path, size: int) -> int:
    folder = write_bundle(tmp_path / f"b{size}")
    block = os.urandom(4096) * 256  # 1 MiB that compresses quickly
    with open(folder / "weights.bin", "wb") as handle:
        for _ in range(size >> 20):
            handle.write(block)
    tracemalloc.start()
    try:
        archive = pack(folder, tmp_path / f"out{size}")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert read_archive(archive).by_path()["weights.bin"].size == size
    return peak


def test_memory_stays_flat_however_large_the_file(tmp_path: Path):
    small = _peak_memory_packing(tmp_path, 8 << 20)
    large = _peak_memory_packing(tmp_path, 64 << 20)
    # Bounded by the blocks in flight (a few MiB, timing-dependent), not by the file.
    assert large < small + (4 << 20), (small, large)
    assert large < 16 << 20, large


def test_bytes_do_not_depend_on_the_number_of_compression_threads(
    bundle: Path, tmp_path: Path, monkeypatch
):
    (bundle / "weights/more.bin").write_bytes(os.urandom(3 << 20))
    outputs = []
    for threads in (1, 2, 5):
        monkeypatch.setattr(archive_module, "_compress_threads", lambda t=threads: t)
        outputs.append(pack(bundle, tmp_path / f"t{threads}").read_bytes())
    assert outputs[0] == outputs[1] == outputs[2]


def test_the_blockwise_gzip_stream_is_ordinary_gzip(tmp_path: Path):
    text = "".join(f"line {i}: the same words again and again\n" for i in range(120_000))
    folder = write_bundle(tmp_path / "b", files={"corpus.txt": text})  # ~5 MiB, 5+ blocks
    archive = pack(folder, tmp_path / "out")
    plain = gzip.decompress(archive.read_bytes())
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        assert tar.extractfile("corpus.txt").read() == text.encode()
    # Matches still reach across block boundaries: compressed like one stream would be.
    assert archive.stat().st_size < 1.2 * len(gzip.compress(plain, compresslevel=1))
    if shutil.which("gzip"):
        subprocess.run(["gzip", "-t", str(archive)], check=True)


# --- determinism ------------------------------------------------------------------------

paths = st.lists(
    st.from_regex(r"[a-z][a-z0-9_.-]{0,6}(/[a-z][a-z0-9_.-]{0,6}){0,2}", fullmatch=True).filter(
        lambda p: (
            not p.endswith((".pyc", ".json", ".py"))
            and not any(part in {".git", "__pycache__"} for part in p.split("/"))
        )
    ),
    min_size=1,
    max_size=6,
    unique=True,
).filter(
    # No path may be a folder of another ("a" and "a/b").
    lambda ps: not any(q.startswith(p + "/") for p in ps for q in ps)
)


@st.composite
def bundle_contents(draw):
    names = draw(paths)
    return {
        name: (draw(st.binary(max_size=3000)), draw(st.booleans())) for name in names
    }  # path: (data, executable)


def _materialise(root: Path, contents: dict, *, order: list[str], mtime: int, perms: int) -> Path:
    folder = write_bundle(root)
    for rel in order:
        data, executable = contents[rel]
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        os.chmod(path, (0o700 | perms) if executable else (0o600 | (perms & 0o666)))
    for path in sorted(root.rglob("*")):
        os.utime(path, (mtime, mtime))
    return folder


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    contents=bundle_contents(),
    perms=st.sampled_from([0o000, 0o044, 0o055, 0o077]),
    umask=st.sampled_from([0o022, 0o077, 0o002]),
    mtimes=st.tuples(st.integers(0, 2**31), st.integers(0, 2**31)),
    shuffle=st.randoms(use_true_random=False),
)
def test_same_content_packs_to_the_same_bytes(contents, perms, umask, mtimes, shuffle):
    with tempfile.TemporaryDirectory() as tmp:
        tmp_path = Path(tmp)
        order = sorted(contents)
        reordered = list(order)
        shuffle.shuffle(reordered)
        first = _materialise(tmp_path / "one", contents, order=order, mtime=mtimes[0], perms=0)
        old_umask = os.umask(umask)
        try:
            second = _materialise(
                tmp_path / "two", contents, order=reordered, mtime=mtimes[1], perms=perms
            )
            a = pack(first, tmp_path / "out1")
            b = pack(second, tmp_path / "out2")
        finally:
            os.umask(old_umask)
        assert a.read_bytes() == b.read_bytes()
        with tarfile.open(b, "r:gz") as tar:
            modes = {m.name: m.mode for m in tar}
        for rel, (_, executable) in contents.items():
            assert modes[rel] == (0o755 if executable else 0o644)


def test_source_date_epoch_changes_bytes_not_identity(bundle: Path, tmp_path: Path, monkeypatch):
    default = pack(bundle, tmp_path / "a")
    monkeypatch.setenv("SOURCE_DATE_EPOCH", "1234567890")
    dated = pack(bundle, tmp_path / "b")
    again = pack(bundle, tmp_path / "c")
    assert dated.read_bytes() == again.read_bytes() != default.read_bytes()
    assert read_archive(dated).root_digest == read_archive(default).root_digest


# --- verifying archives -----------------------------------------------------------------


def test_an_intact_archive_verifies(archive: Path):
    assert verify_archive(archive).diagnostics == []
    assert verify(archive).diagnostics == []


def _tamper(archive: Path, out: Path, edit) -> Path:
    entries = read_entries(archive)
    return write_entries(out, edit(entries))


def _manifest_edit(entries: list[Entry], change) -> list[Entry]:
    manifest = entries[-1]
    document = json.loads(manifest.data)
    change(document)
    manifest.data = json.dumps(document).encode()
    return entries


def _flip_byte(entries: list[Entry]) -> list[Entry]:
    for e in entries:
        if e.name == "weights/w.bin":
            data = bytearray(e.data)
            data[100] ^= 1
            e.data = bytes(data)
    return entries


@pytest.mark.parametrize(
    ("edit", "code", "entry"),
    [
        (_flip_byte, "TTB082", "weights/w.bin"),
        (lambda es: [*es[:-1], Entry("added.txt", b"x"), es[-1]], "TTB084", "added.txt"),
        (lambda es: [e for e in es if e.name != "README.md"], "TTB083", "README.md"),
        (
            lambda es: [
                Entry(e.name, e.data[:-1], mode=e.mode) if e.name == "README.md" else e for e in es
            ],
            "TTB082",
            "README.md",
        ),
        (
            lambda es: _manifest_edit(es, lambda d: d.update(root_digest="sha256:" + "2" * 64)),
            "TTB088",
            None,
        ),
        (
            lambda es: _manifest_edit(es, lambda d: d["files"][0].update(sha256="3" * 64)),
            "TTB082",
            "README.md",
        ),
        (lambda es: _manifest_edit(es, lambda d: d.update(version="9")), "TTB081", None),
        (lambda es: [*es[:-1], Entry("MANIFEST.json", b"{oops")], "TTB081", None),
        (lambda es: [*es[:-1], Entry("MANIFEST.json", b"")], "TTB081", None),
    ],
    ids=[
        "byte-flipped",
        "file-added",
        "file-dropped",
        "file-shortened",
        "root-digest-edited",
        "digest-edited",
        "version-edited",
        "manifest-garbled",
        "manifest-empty",
    ],
)
def test_tampering_is_named(archive: Path, tmp_path: Path, edit, code: str, entry: str | None):
    tampered = _tamper(archive, tmp_path / "t.ttbundle", edit)
    report = verify_archive(tampered)
    assert not report.ok()
    messages = find(report.diagnostics, code)
    assert messages, report.diagnostics
    if entry is not None:
        assert any(m.startswith(entry) for m in messages)
    with pytest.raises(ArchiveError):
        read_archive(tampered)


def test_an_oversized_manifest_is_not_read(archive: Path, monkeypatch):
    monkeypatch.setattr(reader_module, "MAX_MANIFEST_SIZE", 100)
    report = verify_archive(archive)
    assert [m for m in find(report.diagnostics, "TTB081") if "too large" in m]
    with pytest.raises(ArchiveError):
        read_archive(archive)


def test_every_tampering_is_reported_together(archive: Path, tmp_path: Path):
    def edit(entries):
        entries = _flip_byte(entries)
        entries = [e for e in entries if e.name != "README.md"]
        return [*entries[:-1], Entry("added.txt", b"x"), entries[-1]]

    report = verify_archive(_tamper(archive, tmp_path / "t.ttbundle", edit))
    assert {"TTB082", "TTB083", "TTB084"} <= codes(report.diagnostics)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return crafted_corpus(tmp_path_factory.mktemp("corpus"), WEIGHTS)


CORPUS_IDS = CRAFTED_CASES


@pytest.mark.parametrize("case", CORPUS_IDS)
def test_crafted_archives_fail_verification_with_the_right_code(corpus, case: str):
    good, crafted = corpus
    assert verify_archive(good).ok()
    item = crafted[case]
    report = verify_archive(item.path)
    messages = find(report.diagnostics, item.code)
    assert messages, report.diagnostics
    if item.entry is not None:
        assert any(m.startswith(item.entry + ":") for m in messages), messages
    assert all(d.file == str(item.path) for d in report.diagnostics)


def test_corpus_ids_cover_the_corpus(corpus):
    assert sorted(CORPUS_IDS) == sorted(corpus[1])


def test_data_hidden_after_the_archive_is_refused(archive: Path, tmp_path: Path):
    plain = gzip.decompress(archive.read_bytes())
    hidden = tmp_path / "hidden.ttbundle"
    hidden.write_bytes(gzip.compress(plain + b"secret payload" + b"\0" * 498, mtime=0))
    assert codes(verify_archive(hidden).diagnostics) == {"TTB080"}
    appended = tmp_path / "appended.ttbundle"
    appended.write_bytes(archive.read_bytes() + b"trailing junk")
    assert codes(verify_archive(appended).diagnostics) == {"TTB080"}
    corrupt = bytearray(archive.read_bytes())
    corrupt[-6] ^= 0xFF  # inside the gzip CRC
    crc = tmp_path / "crc.ttbundle"
    crc.write_bytes(bytes(corrupt))
    assert codes(verify_archive(crc).diagnostics) == {"TTB080"}


def test_a_huge_header_is_refused_without_reading_it_into_memory(tmp_path: Path):
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo("a.txt")
        info.pax_headers = {"comment": "x" * (20 << 20)}
        tar.addfile(info, io.BytesIO(b""))
    path = tmp_path / "huge.ttbundle"
    path.write_bytes(gzip.compress(buffer.getvalue(), compresslevel=1))
    report = verify_archive(path)
    assert codes(report.diagnostics) == {"TTB080"}
    assert "claims" in report.diagnostics[0].message


def test_directory_entries_from_other_tools_are_tolerated(archive: Path, tmp_path: Path):
    def add_dirs(entries):
        return [Entry("weights", type=tarfile.DIRTYPE, mode=0o755), *entries]

    assert verify_archive(_tamper(archive, tmp_path / "d.ttbundle", add_dirs)).ok()


def test_manifest_entries_are_typed():
    entry = FileEntry(path="a", size=0, sha256=hashlib.sha256(b"").hexdigest())
    manifest = Manifest.create("demo", "1", [entry])
    assert manifest.total_size == 0 and manifest.by_path() == {"a": entry}
