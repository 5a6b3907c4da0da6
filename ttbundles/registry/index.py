"""What registration checked, kept between processes: one file read instead of 1,000 parsed.

Registration runs in every vLLM process (API server, engine core, model inspection), and
checking a bundle costs most in its adapter (`ast.parse`) and in strict validation of its
metadata. What that check says depends only on the bundle's files, so it is kept in an
index keyed by them: the bundle folder's own (mtime, inode), then (size, mtime, inode) of
`vllm_metadata.json` and of every adapter source the check parsed. A bundle whose key
still matches is taken from the index without reading its files (a summary of its
document serves selection; the document is read and validated again only for the bundle
a process looks into, such as the one it serves); a changed or unknown one is checked
afresh. What depends on the environment (requirements against installed
versions, `when`, the mesh, selection) is never kept: it is decided in each process.

Two places hold an index for a models folder, both written atomically (a temporary file
renamed over the old one), both ignored when written by other checking code (the
`checker` fingerprint) or for another folder:

- `<folder>/.ttbundles-index.json`, written by `ttbundle install` and `uninstall`;
- `$XDG_CACHE_HOME/ttbundles/index-<hash of the folder>.json` (`~/.cache` by default),
  written by registration whenever it had to check a bundle afresh, so a folder nobody
  installs into is checked once per change, not once per process. A process that wrote
  one sweeps the cache at most hourly (`sweep_user_cache`): an index of a folder that no
  longer exists is removed, and so is one another ttbundles version wrote that nothing
  refreshed for two weeks.

A record says what the check found, never more: an index that cannot be read or written
(read-only folder, no home) only costs the time of checking.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.metadata import METADATA_FILE, NO_EXTENSIONS, BundleMetadata
from ttbundles.format.parse import load_metadata, parse_metadata
from ttbundles.fsutil import write_text_atomic
from ttbundles.paths import user_cache_dir

INDEX_FILE = ".ttbundles-index.json"
FORMAT = 3

# The adapter findings that make registration skip a bundle: its class cannot be found
# (the module is missing, does not parse, cannot be read, or does not define the class).
# The rest of the contract is `ttbundle validate`'s to report.
SKIPPING = frozenset({"TTB003", "TTB050", "TTB051", "TTB052"})

# The code whose outcome an index records: a record from other code is not trusted.
# Every module `examine` runs, at any depth: this module and what it imports, function
# level included (tests/test_architecture.py keeps the list equal to that closure).
_CHECKER_FILES = (
    "check/adapter.py",
    "check/capabilities.py",
    "check/kv_layout.py",
    "check/pooling.py",
    "check/recurrent_state.py",
    "check/reference_archs.py",
    "check/speculative.py",
    "check/static_reader.py",
    "codes.py",
    "envs.py",
    "errors.py",
    "format/capabilities.py",
    "format/contract.py",
    "format/contract_keys.py",
    "format/jsonpos.py",
    "format/layer_kinds.py",
    "format/meshes.py",
    "format/metadata.py",
    "format/modules.py",
    "format/parse.py",
    "format/selection.py",
    "format/speculative.py",
    "format/tt_options.py",
    "fsutil.py",
    "paths.py",
    "registry/index.py",
    "suggest.py",
)


@functools.cache
def checker() -> list[list[int]]:
    """(size, mtime) of the modules that decide a check (`_CHECKER_FILES`): an upgrade
    or an edit of any of them invalidates every index this code wrote. Taken once a
    process: the code that checks is the code loaded (callers do not modify the list)."""
    root = Path(__file__).resolve().parent.parent
    out = []
    for rel in _CHECKER_FILES:
        try:
            st = os.stat(root / rel)
        except OSError:
            out.append([0, 0])
        else:
            out.append([st.st_size, st.st_mtime_ns])
    return out


@dataclass(slots=True)
class Record:
    """What checking one bundle folder found, independent of the environment."""

    key: list | None  # None: the files changed while read; not kept
    document: dict | None  # the metadata document the model was validated from
    legacy: bool = False
    capabilities: dict | None = None  # the validated capabilities, as JSON
    diagnostics: Sequence[Diagnostic] = field(default_factory=list)
    # The architecture the document claims, even when it did not validate (to say which
    # bundle serves in its place).
    arch: str | None = None
    # The model itself, when checked in this process (not stored).
    metadata: BundleMetadata | None = None
    # The metadata validated (kept when `metadata` is not built yet).
    valid: bool = True
    # From an index: what selection reads of the document (`summary`), and the folder
    # the document is read from again when a process looks into the bundle.
    summary: list | None = None
    folder: str | None = None
    # Checked in this process (`examine`), not taken from an index.
    checked: bool = False

    def compact(self, folder: str) -> Record:
        """Keep only what an index would (the summary, not the document and the model),
        as for a record read from one: registration keeps every bundle's record, and a
        thousand documents and models surviving it would make the cyclic collector's
        next pass over them cost more than validating them did. The model is built again
        from the file for the bundles a process looks into (`materialize`)."""
        if self.valid and self.document is not None:
            self.summary = _summary(self.document)
            self.document = None
            self.metadata = None
            self.folder = folder
        return self

    def to_json(self, shared: dict[str, tuple[int, dict]]) -> list:
        """The stored form: a list, not an object, and each distinct capabilities dict
        stored once for the whole index (`shared` maps its repr to its position and
        itself: the models' dumps list their keys in one order), since parsing the index
        is most of what a warm start costs."""
        summary = self.summary
        if summary is None and self.valid and self.document is not None:
            summary = _summary(self.document)
        capabilities = None
        if self.capabilities is not None:
            text = repr(self.capabilities)
            found = shared.get(text)
            if found is None:
                found = shared[text] = (len(shared), self.capabilities)
            capabilities = found[0]
        diagnostics = [d.to_dict() for d in self.diagnostics] if self.diagnostics else 0
        flags = (1 if self.valid else 0) | (2 if self.legacy else 0)
        return [self.key, summary, capabilities, diagnostics, self.arch, flags]

    @classmethod
    def from_json(cls, data: list, shared: list[dict], folder: str) -> Record:
        key, summary, capabilities, found, arch, flags = data
        diagnostics = (
            [Diagnostic(**{**d, "severity": Severity(d["severity"])}) for d in found]
            if found
            else ()  # no list a bundle where there is nothing (see `Entry.diagnostics`)
        )
        record = cls(
            key,
            None,
            bool(flags & 2),
            shared[capabilities] if capabilities is not None else None,
            diagnostics,
            arch,
        )
        record.valid = bool(flags & 1)
        record.summary = summary
        record.folder = folder
        return record

    def materialize(self) -> BundleMetadata | None:
        """The metadata model: for a record from an index, validated again from the
        bundle's file, which is done only for the bundles a process looks into (such as
        the one it serves)."""
        if self.metadata is not None or not self.valid:
            return self.metadata
        if self.document is None and self.folder is not None:
            loaded = load_metadata(Path(self.folder))
            errors = [d for d in loaded.diagnostics if d.is_error]
            if loaded.metadata is None or errors:
                # Valid when indexed, with the same files: it was changed since.
                raise ConfigurationError(
                    errors
                    or [
                        Diagnostic(
                            "TTB003",
                            Severity.ERROR,
                            "the metadata changed while the server was starting",
                            file=f"{self.folder}/{METADATA_FILE}",
                            hint="start the server again once the bundle is in place",
                        )
                    ]
                )
            self.metadata = loaded.metadata
            return self.metadata
        if self.document is not None:
            plain = not _has_extensions(self.document)
            metadata = BundleMetadata.model_validate(self.document, context={NO_EXTENSIONS: plain})
            if self.legacy:
                metadata.legacy_ = True
            self.metadata = metadata
        return self.metadata


# What a summary holds, in order (a list, not an object: parsing the index is most of
# what a warm start costs, and a thousand copies of the same keys with it).
SUMMARY = ("name", "version", "main_class", "main_class_source", "targets", "when", "requires")


def _summary(document: dict) -> list:
    """The part of a valid document that selection reads (`registry.Facts.indexed`), in
    `SUMMARY` order: 0 for what is absent or empty; the targets' mesh names only, the
    `when` as its `env` and `default_for`."""
    when = document.get("when") or {}
    return [
        document["name"],
        document["version"],
        document["main_class"],
        document.get("main_class_source", "bundle"),
        list(document.get("targets") or ()) or 0,
        when.get("env") or 0,
        when.get("default_for") or 0,
        document.get("requires") or 0,
    ]


def _has_extensions(document: Any) -> bool:
    if isinstance(document, dict):
        return any(
            (isinstance(k, str) and k.startswith("x-")) or _has_extensions(v)
            for k, v in document.items()
        )
    if isinstance(document, list):
        return any(_has_extensions(v) for v in document)
    return False


def matches(key: list | None, folder: str) -> bool:
    """Whether a bundle's files are still those its record was made from."""
    if not key:
        return False
    try:
        if key[0] is not None:
            top = os.stat(folder)
            if key[0] != top.st_mtime_ns or key[1] != top.st_ino:
                return False
        for at in range(2, len(key), 4):
            st = os.stat(folder + "/" + key[at])
            if (
                st.st_mtime_ns != key[at + 2]
                or st.st_size != key[at + 1]
                or st.st_ino != key[at + 3]
            ):
                return False
    except OSError:
        return False
    return True


def examine(folder: Path) -> Record | None:
    """Check one bundle folder as registration does: metadata (strictly validated), then
    whether the adapter's class can be found (`SKIPPING`; the rest of the contract is
    `validate`'s); None when the folder holds no metadata.

    Each file is opened once, and what it was when read (`static_reader.signature`, from
    the open file before and after reading) is the record's key: no second look at it.
    The folder is looked at again only where the check looked for a file and missed it.
    """
    from ttbundles.check.adapter import check_adapter
    from ttbundles.check.static_reader import signature

    base = str(folder)
    stamp: tuple[int, int, int] | None = None
    try:
        top = os.stat(base)
        with open(base + "/" + METADATA_FILE, encoding="utf-8") as handle:
            first = os.fstat(handle.fileno())
            text = handle.read()
            stamp = signature(first, os.fstat(handle.fileno()))
    except (OSError, UnicodeDecodeError, ValueError):
        top = None  # not kept: load_metadata says why (none there, unreadable)
        loaded = load_metadata(folder)
    else:
        loaded = parse_metadata(text, file=folder / METADATA_FILE, bundle_dir=folder)
    if loaded.metadata is None and loaded.diagnostics and loaded.diagnostics[0].code == "TTB002":
        return None
    diagnostics = list(loaded.diagnostics)
    meta = loaded.metadata
    document = loaded.document if isinstance(loaded.document, dict) else None
    arch = document.get("arch") if document is not None else None
    record = Record(
        None,
        document,
        legacy=bool(meta is not None and meta.legacy),
        capabilities=meta.capabilities.model_dump(mode="json") if meta is not None else None,
        diagnostics=diagnostics,
        arch=arch if isinstance(arch, str) else None,
        metadata=meta,
    )
    record.valid = meta is not None
    record.checked = True
    clean = meta is not None and not any(d.is_error for d in diagnostics)
    read: list[Path] = []
    signatures: dict[Path, tuple[int, int, int] | None] = {}
    defined = None
    if clean and meta.main_class_source == "bundle":
        defined = _defined_at_top(base, meta)
        if defined is None:
            found = check_adapter(folder, meta, read=read, contract=False, signatures=signatures)
            diagnostics.extend(d for d in found if d.is_error and d.code in SKIPPING)
    if top is None or stamp is None:
        return record
    # The key: (mtime, inode) of the folder, then (name, size, mtime, inode) of each file
    # read, flat. The files' change when they are rewritten or replaced; the folder's when
    # a file appears, goes or is renamed in it, which matters only where the check looked
    # for a file and did not find it (a missing module, a class imported from a missing
    # file; an invalid document may become valid by a file appearing too, a legacy
    # bundle's module). For a bundle whose class was found the outcome depends only on
    # the files read, so the folder's part is blank and not looked at (one system call a
    # bundle less, in every process).
    found_class = clean and not any(d.code in SKIPPING for d in diagnostics)
    key: list = [None, None] if found_class else [top.st_mtime_ns, top.st_ino]
    key += (METADATA_FILE, *stamp)
    if defined is not None:
        if defined[1] is None:
            return record  # written while read
        key += (defined[0], *defined[1])
    inside = base + "/"
    for path in read:
        seen = signatures.get(path)
        if seen is None:  # not opened (missing), or written while read
            return record
        text_path = str(path)
        rel = text_path[len(inside) :] if text_path.startswith(inside) else None
        key += (rel or os.path.relpath(path, base), *seen)
    if not found_class:
        try:
            now = os.stat(base)
        except OSError:
            return record
        if (now.st_mtime_ns, now.st_ino) != (top.st_mtime_ns, top.st_ino):
            return record  # a file appeared or went while checked
    record.key = key
    return record


def _defined_at_top(base: str, meta: BundleMetadata) -> tuple[str, tuple | None] | None:
    """The adapter check's common case, made without the general finder: the main class
    defined at the top level of its module's own file (`a.b` -> `a/b.py`), as
    `check_adapter` would find it. Its file's name in the bundle and what it was when read
    (`static_reader.signature`); None for anything else (a package, a class imported from
    another module, a file that does not read or parse), which the general check then
    looks into and words."""
    import ast

    from ttbundles.check.static_reader import signature

    rel = meta.module.replace(".", "/") + ".py"
    path = base + "/" + rel
    try:
        with open(path, encoding="utf-8") as handle:
            first = os.fstat(handle.fileno())
            source = handle.read()
            seen = signature(first, os.fstat(handle.fileno()))
        tree = ast.parse(source, filename=path)
    except (OSError, SyntaxError, ValueError, UnicodeDecodeError):
        return None
    name = meta.class_name
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return rel, seen
    return None


# --- where indexes live -----------------------------------------------------------------


def _user_file(resolved: str) -> Path:
    digest = hashlib.sha256(resolved.encode()).hexdigest()[:16]
    return user_cache_dir() / f"index-{digest}.json"


def _read(path: Path, resolved: str, fingerprint: list) -> tuple[dict[str, list], list[dict]]:
    """The records of an index, and its shared capabilities; nothing when it is not one
    this code wrote for this folder."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return {}, []
    if (
        not isinstance(data, dict)
        or data.get("format") != FORMAT
        or data.get("folder") != resolved
        or data.get("checker") != fingerprint
        or not isinstance(data.get("bundles"), dict)
        or not isinstance(data.get("capabilities"), list)
    ):
        return {}, []
    return data["bundles"], data["capabilities"]


def _write(path: Path, resolved: str, fingerprint: list, records: dict[str, Record]) -> bool:
    """Write an index atomically (temporary file, then rename); False where it cannot."""
    shared: dict[str, tuple[int, dict]] = {}
    bundles = {name: r.to_json(shared) for name, r in sorted(records.items()) if r.key is not None}
    data = {
        "format": FORMAT,
        "folder": resolved,
        "checker": fingerprint,
        "capabilities": [capabilities for _, capabilities in shared.values()],
        "bundles": bundles,
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # dumps, not dump: only the one-shot encoder is the C one.
        write_text_atomic(
            path, json.dumps(data, separators=(",", ":")), keep_mode=False, mode=0o644
        )
    except OSError:
        return False
    return True


# A temporary cache file older than this was left by a process killed while writing it
# (a write takes milliseconds; processes writing the cache hold no lock to ask).
STALE_TEMP_SECONDS = 600


def _remove_stale_temps(cache_dir: Path) -> None:
    """Remove the user cache's temporary files that killed writers left behind."""
    limit = time.time() - STALE_TEMP_SECONDS
    try:
        with os.scandir(cache_dir) as it:
            stale = [
                e.path
                for e in it
                if e.name.startswith(".index-")
                and e.name.endswith(".tmp")
                and e.stat(follow_symlinks=False).st_mtime < limit
            ]
    except OSError:
        return
    for path in stale:
        with contextlib.suppress(OSError):
            os.unlink(path)


# An index in the user cache is stale when the models folder it describes is gone, or
# when other code wrote it (another format or checker: another ttbundles version) and
# nothing refreshed it for this long. The version that wrote it is no longer run: one
# that is would rewrite its file whenever it checks a bundle afresh.
STALE_INDEX_SECONDS = 14 * 24 * 3600
# A sweep reads the head of every index in the cache: at most once this often (the mtime
# of a stamp file says when the last one ran), and only by a process that wrote one.
SWEEP_INTERVAL_SECONDS = 3600
SWEEP_STAMP = ".index-sweep"
_USER_INDEX = re.compile(r"^index-[0-9a-f]{16}\.json$")
# What `_write` puts first: the format, the folder, then the checker fingerprint.
_HEAD = re.compile(
    rb'^\{"format":(\d+),"folder":("(?:[^"\\]|\\.)*"),"checker":(\[(?:\[\d+,\d+\],?)*\])'
)
_HEAD_BYTES = 8192


def _stale_index(path: str, mtime: float, now: float, fingerprint: list) -> bool:
    """Whether the user cache's index file `path` is stale (see STALE_INDEX_SECONDS)."""
    try:
        with open(path, "rb") as handle:
            head = _HEAD.match(handle.read(_HEAD_BYTES))
        folder = json.loads(head[2]) if head else None
        ours = (
            head is not None
            and int(head[1]) == FORMAT
            and json.loads(head[3]) == fingerprint
            and isinstance(folder, str)
            and _user_file(folder).name == os.path.basename(path)
        )
    except (OSError, ValueError):
        return False  # unreadable now: left alone
    if ours:
        return not os.path.isdir(folder)
    if isinstance(folder, str) and os.path.isabs(folder) and not os.path.isdir(folder):
        return True  # another version's index of a folder that is gone
    return mtime < now - STALE_INDEX_SECONDS


def sweep_user_cache(cache_dir: Path, *, now: float | None = None) -> list[Path]:
    """Remove the user cache's stale index files (`_stale_index`); the paths removed.

    Only files named as `_user_file` names them are looked at, never followed through a
    link; a file that cannot be read is left. Cheap: a directory listing and the first
    bytes of each index (its format, folder and checker come first)."""
    now = time.time() if now is None else now
    fingerprint = checker()
    removed = []
    try:
        with os.scandir(cache_dir) as it:
            entries = [e for e in it if _USER_INDEX.match(e.name)]
        for entry in entries:
            if not entry.is_file(follow_symlinks=False):
                continue
            mtime = entry.stat(follow_symlinks=False).st_mtime
            if _stale_index(entry.path, mtime, now, fingerprint):
                with contextlib.suppress(OSError):
                    os.unlink(entry.path)
                    removed.append(Path(entry.path))
    except OSError:
        pass
    return removed


def _sweep_now(cache_dir: Path) -> bool:
    """Whether this process should sweep: the stamp is older than SWEEP_INTERVAL_SECONDS
    (or missing); it is touched first, so concurrent processes do not all sweep."""
    stamp = cache_dir / SWEEP_STAMP
    now = time.time()
    try:
        if os.stat(stamp).st_mtime > now - SWEEP_INTERVAL_SECONDS:
            return False
    except OSError:
        pass
    try:
        stamp.touch()
    except OSError:
        return False
    return True


class Index:
    """The records of one models folder: its own index, then the user cache."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.resolved = str(folder.resolve())
        self.fingerprint = checker()
        self._sources = [_read(folder / INDEX_FILE, self.resolved, self.fingerprint)]
        self._user_read = False
        self.current: dict[str, Record] = {}
        self.fresh = 0

    def record(self, name: str) -> Record | None:
        """The bundle `name`'s record: kept if its files are unchanged, else checked now.

        The user cache is read only when the folder's own index lacks the bundle (never,
        for a folder `ttbundle install` keeps).
        """
        path = f"{self.folder}/{name}"
        kept = self._kept(self._sources[0], name, path)
        if kept is None and not self._user_read:
            self._user_read = True
            self._sources.append(_read(_user_file(self.resolved), self.resolved, self.fingerprint))
        if kept is None and len(self._sources) > 1:
            kept = self._kept(self._sources[1], name, path)
        if kept is not None:
            self.current[name] = kept
            return kept
        record = examine(self.folder / name)
        if record is not None:
            self.fresh += 1
            self.current[name] = record.compact(path)
        return record

    @staticmethod
    def _kept(source: tuple[dict[str, list], list[dict]], name: str, path: str) -> Record | None:
        """The bundle's record in one index, if its files still match it."""
        records, shared = source
        raw = records.get(name)
        if raw is None or not matches(raw[0], path):
            return None
        try:
            return Record.from_json(raw, shared, path)
        except (TypeError, ValueError, KeyError, IndexError):
            return None  # not a record this code wrote: check afresh

    def save_user(self) -> bool:
        """Keep what was checked afresh in the user cache (nothing to do when all was
        found)."""
        if not self.fresh:
            return True
        path = _user_file(self.resolved)
        saved = _write(path, self.resolved, self.fingerprint, self.current)
        if saved:
            _remove_stale_temps(path.parent)
            if _sweep_now(path.parent):
                sweep_user_cache(path.parent)
        return saved

    def save_folder(self) -> bool:
        """Write the folder's own index (what `install` and `uninstall` do)."""
        return _write(self.folder / INDEX_FILE, self.resolved, self.fingerprint, self.current)


def forget_user_index(folder: Path) -> None:
    """Remove the user cache's index of `folder`: for a models folder about to be
    removed (`ttbundle test`'s own), whose index could never be read again."""
    with contextlib.suppress(OSError):
        os.unlink(_user_file(str(Path(folder).resolve())))


def bundle_names(folder: Path) -> list[os.DirEntry]:
    """The folder's candidate bundle folders, in name order (hidden entries are not)."""
    with os.scandir(folder) as it:
        found = [e for e in it if not e.name.startswith(".") and e.is_dir()]
    return sorted(found, key=lambda e: e.name)


def write_folder_index(folder: Path) -> bool:
    """Check every bundle of `folder` (reusing unchanged records) and write its index."""
    index = Index(folder)
    for entry in bundle_names(folder):
        index.record(entry.name)
    return index.save_folder()


__all__ = [
    "INDEX_FILE",
    "Index",
    "Record",
    "bundle_names",
    "examine",
    "forget_user_index",
    "matches",
    "sweep_user_cache",
    "write_folder_index",
]
