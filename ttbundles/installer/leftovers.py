"""Locks, and the leftovers of installs and uninstalls that died.

`.ttbundle.lock` (a `filelock.FileLock`) serialises the short steps that change
names in the folder. Every install and uninstall also holds a lock of its own,
`.ttbundle-<token>.lock`, for its whole life; it is created and taken under the folder
lock before any of the operation's folders exist. So a `.tmp-`, `.old-` or unreferenced
`.ver-` entry whose operation lock is free belongs to a process that died (`kill -9`,
power loss), and the next install or uninstall removes it; a live install's folders are
never touched. A dead `.old-<name>-<token>` with `<name>` missing is the old bundle of a
two-rename replace cut in the middle: it is put back (when complete), not deleted.
Names starting with '.' are never bundles (the registry skips them), so leftovers are
harmless until then, and `ttbundle list` reports them (TTB094).

A replace keeps the version it replaced as `.prev-<name>-<token>` (the old folder, or a
link to the old `.ver-` folder of the link layout): a reader whose path walk went into the
old version just before the swap must still find its files there. The next install or
uninstall in the folder removes it once it has been replaced for `RETIRED_GRACE` seconds
(waiting for the rest of that time if it must), so a bundle has at most one old version
when no operation is running; `ttbundle list` notes each one kept (TTB144).
"""

from __future__ import annotations

import os
import re
import shutil
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

from filelock import FileLock, Timeout, lock_descriptor

from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.format.metadata import METADATA_FILE

LOCK_FILE = ".ttbundle.lock"
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
VERSION_PREFIX = ".ver-"
PREV_PREFIX = ".prev-"
# How long a replaced version stays whole at least: far longer than any path walk that
# went into it before the swap can take, even on a loaded machine (issue 34).
RETIRED_GRACE = 0.5
# `.tmp-`, `.old-`, `.ver-` + name + token; the token names the operation's lock.
_ENTRY = re.compile(r"^\.(?P<kind>tmp|old|ver)-(?P<name>.+)-(?P<token>[0-9a-f]{8,32})$")
_PREV = re.compile(r"^\.prev-(?P<name>.+)-(?P<token>[0-9a-f]{8,32})$")
_OP_LOCK = re.compile(r"^\.ttbundle-(?P<token>[0-9a-f]{8,32})\.lock$")


@contextmanager
def _locked(models_dir: Path) -> Iterator[None]:
    """Hold the models folder's lock (waits for it)."""
    with FileLock(models_dir / LOCK_FILE):
        yield


def _op_lock_path(models_dir: Path, token: str) -> Path:
    return models_dir / f".ttbundle-{token}.lock"


def _lock_state(path: Path) -> tuple[str, str]:
    """("held" | "free" | "missing" | "unknown", why unknown), without creating anything.

    Read-only (it works where `ttbundle list` may not write); the probe lock it may win is
    released when its descriptor closes.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return "missing", ""
    except OSError as exc:
        return "unknown", exc.strerror or str(exc)
    try:
        return ("free" if lock_descriptor(fd, blocking=False) else "held"), ""
    except OSError as exc:
        return "unknown", exc.strerror or str(exc)
    finally:
        os.close(fd)


class _Hold:
    """An operation's lock, held: a new install's or uninstall's, or a dead one's adopted.

    The operation's entries are `<prefix><name>-<token>` in the models folder.
    """

    def __init__(self, models_dir: Path, token: str, lock: FileLock):
        self.models_dir = models_dir
        self.token = token
        self._lock = lock

    @classmethod
    def start(cls, models_dir: Path) -> _Hold:
        """A new operation (under the folder lock: before any of its entries exist)."""
        while True:
            token = os.urandom(8).hex()
            path = _op_lock_path(models_dir, token)
            if not os.path.lexists(path):
                break
        lock = FileLock(path)
        lock.acquire(blocking=False)
        return cls(models_dir, token, lock)

    @classmethod
    def adopt(cls, models_dir: Path, token: str) -> _Hold | None:
        """Take a dead operation's lock (under the folder lock); None if it is held."""
        lock = FileLock(_op_lock_path(models_dir, token))
        try:
            lock.acquire(blocking=False)
        except (Timeout, OSError):
            return None
        return cls(models_dir, token, lock)

    def path(self, prefix: str, name: str) -> Path:
        return self.models_dir / f"{prefix}{name}-{self.token}"

    def close(self) -> None:
        """Remove the lock file, then let go: its entries are gone or handed over."""
        with suppress(OSError):
            _op_lock_path(self.models_dir, self.token).unlink()
        self._lock.release()


def _remove(path: Path) -> bool:
    """Remove a leftover, a link without following it; whether it is gone."""
    if path.is_symlink() or (os.path.lexists(path) and not path.is_dir()):
        with suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)
    return not os.path.lexists(path)


def _link_target(link: Path) -> str | None:
    try:
        return os.readlink(link)
    except OSError:
        return None


def _managed_version(target: Path, name: str) -> Path | None:
    """The `.ver-<name>-*` folder `target` links to, when it is a link of the link layout."""
    pointed = _link_target(target)
    if pointed is None:
        return None
    match = _ENTRY.fullmatch(pointed)
    if match is None or match["kind"] != "ver" or match["name"] != name:
        return None
    return target.parent / pointed


def _entries(models_dir: Path) -> dict[str, list[tuple[str, str, Path]]]:
    """Operation entries by token: (kind, name, path); unreferenced `.ver-` only.

    Orphan operation lock files (their process died before making a folder, or after
    removing its folders) appear with no entries.
    """
    found: dict[str, list[tuple[str, str, Path]]] = {}
    with os.scandir(models_dir) as it:
        names = [e.name for e in it if e.name.startswith(".")]
    kept = {_link_target(models_dir / n) for n in names if _PREV.fullmatch(n)}
    for entry in names:
        match = _ENTRY.fullmatch(entry)
        if match is not None:
            kind, name, token = match["kind"], match["name"], match["token"]
            if kind == "ver" and (entry in kept or _link_target(models_dir / name) == entry):
                continue  # the installed or the kept old version of a link-layout bundle
            found.setdefault(token, []).append((kind, name, models_dir / entry))
        elif (lock := _OP_LOCK.fullmatch(entry)) is not None:
            found.setdefault(lock["token"], [])
    return found


def _complete(folder: Path) -> bool:
    """Whether a bundle folder holds every file its manifest lists, at the listed size."""
    from ttbundles.archive.manifest import read_manifest

    try:
        manifest = read_manifest(folder)
        if not (folder / METADATA_FILE).is_file():
            return False
        return all(os.path.getsize(folder / f.path) == f.size for f in manifest.files)
    except (TTBundleError, OSError):
        return False


def _index_temps(models_dir: Path) -> list[Path]:
    """Temporary files of a registry index write (`registry.index`): an install or
    uninstall writes the folder's index under the folder lock, so one found while that
    lock is held or free is left by a process that died mid-write."""
    from ttbundles.registry.index import INDEX_FILE

    prefix = f".{INDEX_FILE}."
    with os.scandir(models_dir) as it:
        return sorted(
            models_dir / e.name
            for e in it
            if e.name.startswith(prefix) and e.name.endswith(".tmp") and not e.is_dir()
        )


@dataclass
class _Sweep:
    """Dead operations claimed under the folder lock; removed after it is released."""

    claims: list[tuple[_Hold, list[Path]]] = field(default_factory=list)
    restored: list[Path] = field(default_factory=list)
    # Index writes cut short: no operation lock, dead because the folder lock is ours.
    temps: list[Path] = field(default_factory=list)

    def finish(self) -> list[Path]:
        """Remove what was claimed; the entries removed."""
        removed = [p for p in self.temps if _remove(p)]
        self.temps = []
        for hold, paths in self.claims:
            try:
                removed.extend(p for p in paths if _remove(p))
            finally:
                hold.close()
        self.claims = []
        return removed


def _sweep(models_dir: Path) -> _Sweep:
    """Claim every entry of a dead operation (call under the folder lock).

    A dead `.old-<name>-*` whose `<name>` is missing and which holds a complete bundle is
    put back: a replace was cut between its two renames.
    """
    sweep = _Sweep(temps=_index_temps(models_dir))
    for token, entries in _entries(models_dir).items():
        state, _ = _lock_state(_op_lock_path(models_dir, token))
        if state not in ("free", "missing"):
            continue  # a live operation, or one we cannot tell about: left alone
        hold = _Hold.adopt(models_dir, token)
        if hold is None:
            continue
        paths = []
        for kind, name, path in entries:
            target = models_dir / name
            if kind == "old" and not os.path.lexists(target) and _complete(path):
                try:
                    os.rename(path, target)
                    sweep.restored.append(target)
                except OSError:
                    pass  # left for later: never delete the only copy
                continue
            paths.append(path)
        sweep.claims.append((hold, paths))
    return sweep


def _kept_versions(models_dir: Path) -> list[Path]:
    """The `.prev-` entries: versions replaced and kept for readers still inside them."""
    with os.scandir(models_dir) as it:
        return sorted(models_dir / e.name for e in it if _PREV.fullmatch(e.name))


def _stamp(path: Path) -> None:
    """Record when `path` became a kept old version: its own time (a link's, not its
    target's), from this machine's clock (a network file system's server may differ)."""
    now = time.time_ns()
    with suppress(OSError, NotImplementedError):
        os.utime(path, ns=(now, now), follow_symlinks=False)


@dataclass
class _Retired(_Sweep):
    """Kept old versions claimed for removal, and when the newest of them was replaced."""

    newest: float = 0.0
    # The `.prev-` name each claimed entry had; links to nothing of ours, removed at once.
    origins: dict[Path, Path] = field(default_factory=dict)
    unlinked: list[Path] = field(default_factory=list)

    def finish(self) -> list[Path]:
        """Wait until every claimed version was replaced `RETIRED_GRACE` ago, then remove
        them; the `.prev-` entries gone. A clock set back waits `RETIRED_GRACE` at most."""
        if self.claims:
            wait = min(RETIRED_GRACE, self.newest + RETIRED_GRACE - time.time())
            if wait > 0:
                time.sleep(wait)
        gone = self.unlinked + [self.origins.get(p, p) for p in super().finish()]
        self.unlinked = []
        return sorted(gone)


def _claim_kept(models_dir: Path, keep: Path | None) -> _Retired:
    """Claim every kept old version but `keep` (call under the folder lock).

    Its name goes at once (nobody walks a `.prev-` name); its files stay until `finish`.
    A folder becomes a `.tmp-` entry under the adopted lock of the operation that kept it;
    a link is removed, and the `.ver-` folder it points to claimed under the lock of the
    operation that made that folder, unless `<name>` links to it again. A version whose
    lock is held (an operation we cannot tell about) is left alone.
    """
    retired = _Retired()
    for path in _kept_versions(models_dir):
        if path == keep:
            continue
        match = _PREV.fullmatch(path.name)
        assert match is not None
        name = match["name"]
        try:
            replaced_at = os.lstat(path).st_mtime
        except OSError:
            continue
        if path.is_symlink():
            pointed = _link_target(path)
            version = _ENTRY.fullmatch(pointed or "")
            managed = version is not None and version["kind"] == "ver" and version["name"] == name
            if managed and _link_target(models_dir / name) == pointed:
                managed = False  # in use again: only the link goes
            hold = _Hold.adopt(models_dir, version["token"]) if managed and version else None
            if managed and hold is None:
                continue
            try:
                path.unlink()
            except OSError:
                if hold is not None:
                    hold.close()
                continue
            if hold is None:
                retired.unlinked.append(path)
                continue
            retired.claims.append((hold, [models_dir / str(pointed)]))
            retired.origins[models_dir / str(pointed)] = path
        else:
            hold = _Hold.adopt(models_dir, match["token"])
            if hold is None:
                continue
            claimed = hold.path(TEMP_PREFIX, name)
            try:
                os.rename(path, claimed)
            except OSError:
                hold.close()
                continue
            retired.claims.append((hold, [claimed]))
            retired.origins[claimed] = path
        retired.newest = max(retired.newest, replaced_at)
    return retired


def drop_kept(models_dir: Path, keep: Path | None = None) -> list[Path]:
    """Remove every kept old version in the folder but `keep` (the one this operation
    just kept), once it was replaced `RETIRED_GRACE` ago; the entries removed. Best
    effort, as the sweep: a folder that cannot be locked keeps them."""
    retired = _Retired()
    try:
        with _locked(models_dir):
            retired = _claim_kept(models_dir, keep)
    except OSError:
        pass
    return retired.finish()


def leftover_diagnostics(models_dirs: Iterable[Path]) -> list[Diagnostic]:
    """A warning (TTB094) for each leftover of a dead install or uninstall in the folders.

    Read-only: nothing is created or removed (`ttbundle list` runs it).
    """
    found = []
    for models_dir in models_dirs:
        models_dir = Path(models_dir)
        if not models_dir.is_dir():
            continue
        try:
            entries = _entries(models_dir)
        except OSError:
            continue
        for token, items in entries.items():
            state, why = _lock_state(_op_lock_path(models_dir, token))
            if state == "held":
                continue
            for kind, name, path in items:
                if not os.path.lexists(path):
                    continue  # finished meanwhile
                found.append(_leftover_diagnostic(kind, name, path, models_dir, why))
        try:
            kept = _kept_versions(models_dir)
        except OSError:
            kept = []
        found.extend(d for d in map(_kept_diagnostic, kept) if d is not None)
        try:
            temps = _index_temps(models_dir)
        except OSError:
            temps = []
        if temps and _lock_state(models_dir / LOCK_FILE)[0] in ("free", "missing"):
            found.extend(
                Diagnostic(
                    "TTB094",
                    Severity.WARNING,
                    "temporary file of a registry index write cut short (an install or "
                    "uninstall was killed); not read by vLLM",
                    file=str(path),
                    hint="the next 'ttbundle install' or 'ttbundle uninstall' in this "
                    "folder removes it (or delete it)",
                )
                for path in temps
            )
    return sorted(found, key=lambda d: d.file or "")


def _kept_diagnostic(path: Path) -> Diagnostic | None:
    """TTB144 (info) for a kept old version; None when it went meanwhile."""
    import json

    match = _PREV.fullmatch(path.name)
    if match is None or not os.path.lexists(path):
        return None
    try:
        metadata = json.loads((path / METADATA_FILE).read_text(encoding="utf-8"))
        version = f" {metadata['version']}"
    except (OSError, ValueError, TypeError, KeyError):
        version = ""
    size = _size(path)
    return Diagnostic(
        "TTB144",
        Severity.INFO,
        f"stale copy: the old version{version} of {match['name']} a replace took out "
        f"({size / (1 << 20):.1f} MiB), kept for readers that were inside it; ignored by vLLM",
        file=str(path),
        hint="the next 'ttbundle install' or 'ttbundle uninstall' in this folder removes it",
    )


def _size(path: Path) -> int:
    """The bytes of the files under `path` (following `path` itself when a link)."""
    total = 0
    for folder, _, files in os.walk(path):
        for file in files:
            with suppress(OSError):
                total += os.lstat(os.path.join(folder, file)).st_size
    return total


def _leftover_diagnostic(
    kind: str, name: str, path: Path, models_dir: Path, why: str
) -> Diagnostic:
    next_run = "the next 'ttbundle install' or 'ttbundle uninstall' in this folder"
    if why:
        message = (
            f"leftover of an install or uninstall; cannot tell whether it is still running "
            f"({why}); not a bundle, ignored by vLLM"
        )
        hint = "if no install is running in this folder, delete it"
    elif kind == "old" and not os.path.lexists(models_dir / name):
        message = f"{name} moved aside by an interrupted replace, and {name} is missing"
        hint = f"{next_run} puts it back when complete (or rename it to {name})"
    else:
        what = {"tmp": "temporary folder", "old": "old version", "ver": "unused version"}[kind]
        message = f"{what} of {name} left by an interrupted install or uninstall; ignored by vLLM"
        hint = f"{next_run} removes it (or delete it)"
    return Diagnostic("TTB094", Severity.WARNING, message, file=str(path), hint=hint)
