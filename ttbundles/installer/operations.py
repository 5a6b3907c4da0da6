"""Install a `.ttbundle` into a models folder, and uninstall it, safely and atomically.

An archive is untrusted input: `ttbundles.archive.reader` verifies it whole, then
extracts it re-checking every entry, so only files listed in its manifest with exactly
the listed size and digest are written.

Publishing. The bundle is extracted into `.tmp-<name>-<token>` inside the models folder
(same file system, so a rename publishes it). A first install renames it to `<name>`.
`--replace` swaps the two names in one step with Linux `renameat2(RENAME_EXCHANGE)`, so
a reader opening `<name>/...` finds the old bundle or the new one, never nothing; the old
one, now under the temporary name, is then removed. Where the kernel or the file system
cannot exchange names (not Linux, NFS, some FUSE and older ZFS), bundles use the *link
layout*: `<name>` is a symbolic link to a version folder `.ver-<name>-<token>`, and a
replace switches it with one `os.replace` of a new link, which is just as atomic. A
plain folder met on such a file system (installed elsewhere, or by an older release) is
replaced with two renames once, with a moment where `<name>` is missing, and is in the
link layout from then on; the result says so (`swap == "rename"`).

Locks. `.ttbundle.lock` (a `filelock.FileLock`) serialises the short steps that change
names in the folder. Every install and uninstall also holds a lock of its own,
`.ttbundle-<token>.lock`, for its whole life; it is created and taken under the folder
lock before any of the operation's folders exist. So a `.tmp-`, `.old-` or unreferenced
`.ver-` entry whose operation lock is free belongs to a process that died (`kill -9`,
power loss), and the next install or uninstall removes it; a live install's folders are
never touched. A dead `.old-<name>-<token>` with `<name>` missing is the old bundle of a
two-rename replace cut in the middle: it is put back (when complete), not deleted.
Names starting with '.' are never bundles (the registry skips them), so leftovers are
harmless until then, and `ttbundle list` reports them (TTB094).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from filelock import FileLock, Timeout, lock_descriptor

from ttbundles import envs
from ttbundles.archive.reader import extract_into, extraction_failed, verified_manifest
from ttbundles.errors import Diagnostic, InstallError, Severity, TTBundleError
from ttbundles.format.metadata import METADATA_FILE, NAME_PATTERN
from ttbundles.suggest import hint_for

MODELS_DIR_ENV = "EXTRA_MODELS_DIR"
LOCK_FILE = ".ttbundle.lock"
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
VERSION_PREFIX = ".ver-"
# `.tmp-`, `.old-`, `.ver-` + name + token; the token names the operation's lock.
_ENTRY = re.compile(r"^\.(?P<kind>tmp|old|ver)-(?P<name>.+)-(?P<token>[0-9a-f]{8,32})$")
_OP_LOCK = re.compile(r"^\.ttbundle-(?P<token>[0-9a-f]{8,32})\.lock$")
# A scheme of two letters or more, then "://" (so a Windows drive "C:/" is a path).
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")

# renameat2(2): swap two names atomically.
AT_FDCWD = -100
RENAME_EXCHANGE = 2
_EXCHANGE_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}

__all__ = [
    "InstallResult",
    "exchange",
    "find_installed",
    "install",
    "leftover_diagnostics",
    "resolve_models_dir",
    "uninstall",
]


@dataclass(frozen=True)
class InstallResult:
    """What `install`, `install(replace=True)` or `uninstall` did, for the CLI to render.

    `version` is the version now installed (or, after an uninstall, the one removed);
    `previous_version` the version a replace removed (None when it could not be read).
    `swap` is how a replace published: "exchange" (renameat2), "symlink" (the link
    layout), or "rename" (two renames: readers could miss the bundle for a moment).
    `layout` is "folder" (`<name>` is the bundle) or "link" (a link to `.ver-...`).
    """

    action: str  # "installed", "replaced" or "uninstalled"
    name: str
    version: str | None
    path: Path
    models_dir: Path
    previous_version: str | None = None
    swap: str | None = None
    layout: str | None = None
    removed_leftovers: tuple[Path, ...] = ()
    restored: tuple[Path, ...] = ()

    def to_dict(self) -> dict:
        return {
            "action": self.action,
            "name": self.name,
            "version": self.version,
            "previous_version": self.previous_version,
            "path": str(self.path),
            "models_dir": str(self.models_dir),
            "swap": self.swap,
            "layout": self.layout,
            "removed_leftovers": [str(p) for p in self.removed_leftovers],
            "restored": [str(p) for p in self.restored],
        }


def resolve_models_dir(models_dir: Path | None) -> Path:
    """The folder given, else the first entry of `$EXTRA_MODELS_DIR` (an os.pathsep list).

    The registry searches every entry of EXTRA_MODELS_DIR; installing goes to the first,
    the one that wins.
    """
    if models_dir is not None:
        return Path(models_dir).expanduser()
    folders = envs.EXTRA_MODELS_DIR
    if folders:
        return Path(folders[0]).expanduser()
    raise InstallError.single(
        "TTB091",
        f"no models folder given and {MODELS_DIR_ENV} is not set",
        hint=f"pass --models-dir DIR, or set {MODELS_DIR_ENV}",
    )


# --- exchanging two names -------------------------------------------------------------


class ExchangeUnsupported(OSError):
    """The system or the file system cannot exchange two names atomically."""


@cache
def _renameat2() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2  # glibc >= 2.28, musl
    except (OSError, AttributeError):
        return None
    path, fd = ctypes.c_char_p, ctypes.c_int
    function.argtypes = [fd, path, fd, path, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def exchange(a: Path, b: Path) -> None:
    """Swap the names `a` and `b` in one step: `renameat2(RENAME_EXCHANGE)`.

    Raises `ExchangeUnsupported` where the system or the file system cannot (not
    Linux, an old C library or kernel, NFS, ...), another `OSError` on a real failure.
    """
    function = _renameat2()
    if function is None:
        raise ExchangeUnsupported(errno.ENOSYS, "renameat2 is not available", str(a))
    if function(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return
    code = ctypes.get_errno()
    kind = ExchangeUnsupported if code in _EXCHANGE_UNSUPPORTED else OSError
    raise kind(code, os.strerror(code), str(a), None, str(b))


def _exchange_supported(a: Path, b: Path) -> bool:
    """Whether two names can be exchanged: probed with two empty folders made there."""
    a.mkdir()
    try:
        b.mkdir()
        try:
            exchange(a, b)
            return True
        except ExchangeUnsupported:
            return False
        finally:
            b.rmdir()
    finally:
        a.rmdir()


# --- locks ------------------------------------------------------------------------------


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


# --- leftovers of dead operations -----------------------------------------------------


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
    for entry in names:
        match = _ENTRY.fullmatch(entry)
        if match is not None:
            kind, name, token = match["kind"], match["name"], match["token"]
            if kind == "ver" and _link_target(models_dir / name) == entry:
                continue  # the installed version of a link-layout bundle
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


# --- install --------------------------------------------------------------------------


def _already_installed(target: Path) -> TTBundleError:
    return InstallError.single(
        "TTB090",
        f"{target.name} is already installed",
        file=target,
        hint="pass --replace to replace it",
    )


def _refuse_unsupported_source(archive: str | os.PathLike[str]) -> Path:
    text = os.fspath(archive)
    if isinstance(archive, str) and _URL.match(text):
        raise InstallError.single(
            "TTB095",
            "a URL, not a local file: distribution is not supported yet; "
            "download the archive first",
            file=text,
            hint="download it (e.g. curl -fLO URL), then: ttbundle install ./FILE.ttbundle",
        )
    path = Path(archive)
    if path.is_dir():
        raise InstallError.single(
            "TTB001",
            "a folder, not a .ttbundle archive",
            file=path,
            hint=f"pack it first (ttbundle pack {path}), then install the archive",
        )
    return path


def _installed_version(folder: Path) -> str | None:
    try:
        version = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return version if isinstance(version, str) else None


def install(
    archive: str | os.PathLike[str], models_dir: Path | None, *, replace: bool = False
) -> InstallResult:
    """Verify `archive` and install it as `models_dir/<name>`; what was done.

    `models_dir` None means `$EXTRA_MODELS_DIR` (see `resolve_models_dir`); it is created
    when missing. The installed folder keeps `MANIFEST.json`, so `ttbundle verify` works
    on it and packing it again gives the same archive, byte for byte. Leftovers of dead
    installs in the folder are removed first (`removed_leftovers`).
    """
    archive = _refuse_unsupported_source(archive)
    models_dir = resolve_models_dir(models_dir)
    manifest = verified_manifest(archive)
    name = manifest.name
    target = models_dir / name
    if not replace and os.path.lexists(target):
        raise _already_installed(target)  # early: spare the extraction
    sweep = _Sweep()
    hold: _Hold | None = None
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        with _locked(models_dir):
            sweep = _sweep(models_dir)
            if not replace and os.path.lexists(target):
                raise _already_installed(target)  # put back by the sweep
            hold = _Hold.start(models_dir)
            tmp = hold.path(TEMP_PREFIX, name)
            tmp.mkdir()  # permissions from the umask (mkdtemp would make it 0o700)
        removed = tuple(sweep.finish())  # before extracting: a leftover may take the room
        extract_into(archive, manifest, tmp)
        with _locked(models_dir):
            swap, previous, old_version = _publish(hold, tmp, target, name, replace)
    except OSError as exc:
        raise extraction_failed(exc, models_dir) from None
    finally:
        sweep.finish()
        if hold is not None:
            _clean_up(hold, name, target)  # after a replace: the old bundle
    if old_version is not None:
        old_version.finish()
    refresh_index(models_dir)
    return InstallResult(
        action="replaced" if swap else "installed",
        name=name,
        version=manifest.version,
        path=target,
        models_dir=models_dir,
        previous_version=previous,
        swap=swap,
        layout="link" if target.is_symlink() else "folder",
        removed_leftovers=removed,
        restored=tuple(sweep.restored),
    )


def _clean_up(hold: _Hold, name: str, target: Path) -> None:
    """Remove the operation's entries, success or failure, then release its lock.

    After a replace they hold the old bundle. A version folder `target` links to is the
    installed bundle and stays; a `.old-` folder stays when `target` is missing (a failed
    two-rename replace could not put it back): the next sweep restores it.
    """
    try:
        _remove(hold.path(TEMP_PREFIX, name))
        version = hold.path(VERSION_PREFIX, name)
        if os.path.lexists(version) and _link_target(target) != version.name:
            _remove(version)
        old = hold.path(OLD_PREFIX, name)
        if os.path.lexists(old) and os.path.lexists(target):
            _remove(old)
    finally:
        hold.close()


def _as_link(hold: _Hold, tmp: Path, name: str) -> bool:
    """Move the new bundle to its version folder and make `tmp` a link to it.

    False (and the bundle back at `tmp`) where links cannot be made.
    """
    version = hold.path(VERSION_PREFIX, name)
    os.rename(tmp, version)
    try:
        os.symlink(version.name, tmp, target_is_directory=True)
    except OSError:
        os.rename(version, tmp)
        return False
    return True


def _publish(
    hold: _Hold, tmp: Path, target: Path, name: str, replace: bool
) -> tuple[str | None, str | None, _Sweep | None]:
    """Give the extracted bundle its name (under the folder lock).

    (how a replace swapped or None, the replaced version, the claimed old version folder
    of a link-layout bundle). Nothing after the step that publishes can raise.
    """
    if not os.path.lexists(target):
        probes = (hold.path(TEMP_PREFIX, f"{name}.probe-{n}") for n in "ab")  # swept if killed
        if not _exchange_supported(*probes):
            _as_link(hold, tmp, name)  # so that the next replace is atomic too
        os.rename(tmp, target)
        return None, None, None
    if not replace:
        raise _already_installed(target)
    previous = _installed_version(target)
    old_version = _claim_old_version(hold.models_dir, target, name)
    try:
        try:
            exchange(tmp, target)  # `tmp` now holds the old bundle
            return "exchange", previous, old_version
        except ExchangeUnsupported:
            pass
        if _as_link(hold, tmp, name) and target.is_symlink():
            os.replace(tmp, target)
            return "symlink", previous, old_version
        # A folder in place and no exchange: two renames, with a moment where the name is
        # missing. The link layout makes the next replace atomic.
        old = hold.path(OLD_PREFIX, name)
        os.rename(target, old)
        try:
            os.rename(tmp, target)
        except BaseException:
            os.rename(old, target)
            raise
        return "rename", previous, old_version
    except BaseException:
        if old_version is not None:
            for claimed, _ in old_version.claims:
                claimed.close()  # still in use: release the claim, remove nothing
        raise


def _claim_old_version(models_dir: Path, target: Path, name: str) -> _Sweep | None:
    """Claim the version folder a link-layout bundle uses, to remove once replaced.

    None when `target` is not such a link, or its installing operation is still cleaning
    up (it removes the folder itself once it is no longer linked).
    """
    version = _managed_version(target, name)
    match = _ENTRY.fullmatch(version.name) if version is not None else None
    if version is None or match is None:
        return None
    hold = _Hold.adopt(models_dir, match["token"])
    return None if hold is None else _Sweep(claims=[(hold, [version])])


# --- uninstall ------------------------------------------------------------------------


def find_installed(name: str, models_dir: Path | None) -> tuple[Path, str | None]:
    """The installed bundle `name`: (its path, its version); raises TTB092 if there is none.

    Only a folder holding `vllm_metadata.json` (or a link to one) is a bundle: `name`
    must be a bundle name, not a path.
    """
    models_dir = resolve_models_dir(models_dir)
    target = models_dir / name

    def not_installed(message: str, hint: str | None = None) -> TTBundleError:
        return InstallError.single("TTB092", message, file=target, hint=hint)

    if not re.fullmatch(NAME_PATTERN, name):
        raise not_installed(f"{name!r} is not a bundle name", "give the name, not a path")
    if not models_dir.is_dir():
        raise not_installed(f"{name} is not installed: {models_dir} does not exist")
    if not os.path.lexists(target):
        installed = [
            p.name
            for p in models_dir.iterdir()
            if not p.name.startswith(".") and (p / METADATA_FILE).is_file()
        ]
        hint = hint_for(name, installed, what="installed bundles") if installed else None
        raise not_installed(f"{name} is not installed in {models_dir}", hint)
    if not (target / METADATA_FILE).is_file():
        raise not_installed(f"{target} is not a bundle (no {METADATA_FILE}); left alone")
    return target, _installed_version(target)


def uninstall(name: str, models_dir: Path | None) -> InstallResult:
    """Remove the installed bundle `name` from `models_dir`; what was done.

    The bundle is renamed out of sight first, so the registry never sees a half-deleted
    one; a link is removed, never what it points to, except the version folder of the
    link layout. Leftovers of dead installs in the folder are removed too.
    """
    models_dir = resolve_models_dir(models_dir)
    target, version = find_installed(name, models_dir)  # cheap checks before the lock
    sweep = _Sweep()
    hold: _Hold | None = None
    old_version: _Sweep | None = None
    try:
        with _locked(models_dir):
            sweep = _sweep(models_dir)
            target, version = find_installed(name, models_dir)
            hold = _Hold.start(models_dir)
            old_version = _move_aside(hold, target, name)
    except OSError as exc:
        raise InstallError.single(
            "TTB093", f"cannot remove {name}: {exc.strerror or exc}", file=target
        ) from None
    finally:
        removed = sweep.finish()
        if old_version is not None:
            old_version.finish()
        if hold is not None:
            _clean_up(hold, name, target)  # the bundle, now under the operation's name
    refresh_index(models_dir)
    return InstallResult(
        action="uninstalled",
        name=name,
        version=version,
        path=target,
        models_dir=models_dir,
        removed_leftovers=tuple(removed),
        restored=tuple(sweep.restored),
    )


def refresh_index(models_dir: Path) -> bool:
    """Rewrite the folder's registry index (`.ttbundles-index.json`) for what is installed
    now, under the folder lock so that the last writer has seen every change; unchanged
    bundles keep their records. Best effort: a folder whose index cannot be written only
    makes vLLM processes check its bundles themselves."""
    from ttbundles.registry.index import write_folder_index

    try:
        with _locked(models_dir):
            return write_folder_index(models_dir)
    except OSError:
        return False


def _move_aside(hold: _Hold, target: Path, name: str) -> _Sweep | None:
    """Take the bundle's name away (under the folder lock): one rename or unlink.

    A folder becomes the operation's `.tmp-` entry; a link is removed, and the version
    folder of a link-layout bundle claimed for removal.
    """
    if target.is_symlink():
        old_version = _claim_old_version(hold.models_dir, target, name)
        try:
            target.unlink()
        except BaseException:
            if old_version is not None:
                for claimed, _ in old_version.claims:
                    claimed.close()
            raise
        return old_version
    os.rename(target, hold.path(TEMP_PREFIX, name))
    return None
