"""Install a `.ttbundle` into a models folder, and uninstall it, safely and atomically.

An archive is untrusted input. `tarfile.extractall` would follow its word on paths, links
and sizes; here nothing is written until the whole archive has been verified against its
manifest, and the extraction re-checks every entry as it writes (the file could change
between the two reads). Only regular files at safe relative paths, listed in the
manifest, with exactly the listed size and digest, are written.

Atomicity: the bundle is extracted into `.tmp-<name>-<random>` inside the models folder
(same file system, so a rename publishes it), then renamed to `<name>`. A failure at any
point removes the temporary folder and leaves an existing install untouched. Replacing
renames the old folder aside first and restores it if the new one cannot take its place.
The final step runs under an advisory lock (`.ttbundle.lock`), so concurrent installs into
one folder serialise their swaps. Names starting with '.' are never bundles (the
registry skips them), so a leftover of a killed process is harmless.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import shutil
import tarfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ttbundles import envs
from ttbundles.archive import (
    MAX_MANIFEST_SIZE,
    member_problem,
    open_archive,
    scan_archive,
)
from ttbundles.errors import ArchiveError, InstallError, TTBundleError
from ttbundles.files import MANIFEST_FILE
from ttbundles.manifest import CHUNK_SIZE, Manifest, parse_manifest
from ttbundles.metadata import METADATA_FILE, NAME_PATTERN
from ttbundles.suggest import hint_for

try:  # POSIX only; elsewhere installs are not serialised (documented limitation)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MODELS_DIR_ENV = "EXTRA_MODELS_DIR"
LOCK_FILE = ".ttbundle.lock"
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"
FILE_MODE = 0o666
EXECUTABLE_MODE = 0o777  # both lowered by the umask, as for any new file

__all__ = ["extract_verified", "install", "resolve_models_dir", "uninstall"]


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


def _failed(exc: OSError, where: Path) -> TTBundleError:
    return InstallError.single(
        "TTB093",
        f"install failed; nothing was changed: {exc.strerror or exc}",
        file=exc.filename or where,
        hint="check that the models folder is writable and has room",
    )


def _new_dir(parent: Path, prefix: str) -> Path:
    """A fresh folder with permissions from the umask (mkdtemp would make it 0o700)."""
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue


def _aside_name(parent: Path, prefix: str) -> Path:
    while True:
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        if not os.path.lexists(path):
            return path


def _remove(path: Path) -> None:
    """Best effort: the bundle is already out of sight under a dot-name."""
    if path.is_symlink() or not path.is_dir():
        with suppress(OSError):
            path.unlink()
    else:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def _locked(models_dir: Path) -> Iterator[None]:
    """Hold the models folder's advisory lock; released when the descriptor closes."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(models_dir / LOCK_FILE, flags, 0o666)
    try:
        if fcntl is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _extract(archive: Path, manifest: Manifest, dest: Path) -> None:
    """Write the verified archive's files under `dest`, re-checking every entry.

    Pass two of two: `manifest` comes from pass one, so sizes are known before a byte
    is written and each copy is capped at the listed size. Raises on the first problem;
    pass one already reported them all.
    """
    source = str(archive)
    expected = manifest.by_path()
    written: set[str] = set()
    manifest_seen = False
    root = os.path.abspath(dest)

    def refuse(code: str, message: str) -> TTBundleError:
        return ArchiveError.single(
            code,
            message,
            file=source,
            hint="the archive changed or was crafted; get it again from its source",
        )

    with open_archive(archive) as tar:
        for member in tar:
            name = member.name
            if manifest_seen:
                raise refuse("TTB081", f"{name}: entry after {MANIFEST_FILE}")
            if name in written:
                raise refuse("TTB086", f"{name}: duplicate entry")
            problem = member_problem(member)
            if problem is not None:
                raise refuse(*problem)
            if member.isdir():
                continue  # folders come from the files' paths
            if name == MANIFEST_FILE:
                manifest_seen = True
                if member.size > MAX_MANIFEST_SIZE:
                    raise refuse("TTB081", f"{name}: {member.size} bytes, too large")
                handle = tar.extractfile(member)
                assert handle is not None  # a plain file always has data
                data = handle.read()
                if parse_manifest(data, source=f"{source}:{MANIFEST_FILE}") != manifest:
                    raise refuse("TTB081", f"{MANIFEST_FILE} changed since it was verified")
                _write_new(dest / MANIFEST_FILE, data)
                continue
            entry = expected.get(name)
            if entry is None:
                raise refuse("TTB084", f"{name}: not listed in the manifest")
            if member.size > entry.size:
                raise refuse(
                    "TTB087", f"{name}: {member.size} bytes, larger than the {entry.size} listed"
                )
            if member.size != entry.size:
                raise refuse("TTB082", f"{name}: {member.size} bytes, {entry.size} listed")
            target = os.path.abspath(os.path.join(root, *name.split("/")))
            if os.path.commonpath([root, target]) != root:  # unreachable after member_problem
                raise refuse("TTB085", f"{name}: resolves outside the bundle folder")
            os.makedirs(os.path.dirname(target), exist_ok=True)
            sha256 = _copy_capped(tar, member, target, entry.size)
            if sha256 != entry.sha256:
                raise refuse("TTB082", f"{name}: sha256 {sha256} differs from the manifest")
            written.add(name)
    missing = sorted(set(expected) - written)
    if missing:
        raise refuse("TTB083", f"missing from the archive: {', '.join(missing)}")
    if not manifest_seen:
        raise refuse("TTB081", f"no {MANIFEST_FILE} entry")


def _write_new(path: Path, data: bytes) -> None:
    fd = os.open(
        path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), FILE_MODE
    )
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _copy_capped(tar: tarfile.TarFile, member: tarfile.TarInfo, target: str, cap: int) -> str:
    """Copy an entry's data to a new file, never more than `cap` bytes; its sha256."""
    mode = EXECUTABLE_MODE if member.mode & 0o111 else FILE_MODE
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
    handle = tar.extractfile(member)
    assert handle is not None
    digest = hashlib.sha256()
    remaining = cap
    with os.fdopen(os.open(target, flags, mode), "wb") as out:
        while remaining > 0:
            chunk = handle.read(min(CHUNK_SIZE, remaining))
            if not chunk:
                break
            digest.update(chunk)
            out.write(chunk)
            remaining -= len(chunk)
    return digest.hexdigest()


def _verified_manifest(archive: Path) -> Manifest:
    manifest, report = scan_archive(archive)
    if report.errors or manifest is None:
        raise ArchiveError(report.errors)
    return manifest


def extract_verified(archive: Path, dest: Path) -> Path:
    """Verify `archive`, then extract it into a new folder `dest/<name>`; that folder.

    For looking inside an archive (validation) without installing it; `dest` must exist.
    On failure nothing is left in `dest`.
    """
    archive, dest = Path(archive), Path(dest)
    manifest = _verified_manifest(archive)
    folder = dest / manifest.name
    try:
        folder.mkdir()
    except OSError as exc:
        raise _failed(exc, dest) from None
    try:
        _extract(archive, manifest, folder)
    except BaseException as exc:
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _failed(exc, dest) from None
        raise
    return folder


def _already_installed(target: Path) -> TTBundleError:
    return InstallError.single(
        "TTB090",
        f"{target.name} is already installed",
        file=target,
        hint="pass --replace to replace it",
    )


def install(archive: Path, models_dir: Path | None, *, replace: bool = False) -> Path:
    """Verify `archive` and install it as `models_dir/<name>`; that folder.

    `models_dir` None means `$EXTRA_MODELS_DIR` (see `resolve_models_dir`); it is created
    when missing. The installed folder keeps `MANIFEST.json`, so `ttbundle verify` works
    on it and packing it again gives the same archive, byte for byte.
    """
    archive = Path(archive)
    models_dir = resolve_models_dir(models_dir)
    manifest = _verified_manifest(archive)
    target = models_dir / manifest.name
    if not replace and os.path.lexists(target):
        raise _already_installed(target)  # early: spare the extraction
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        tmp = _new_dir(models_dir, f"{TEMP_PREFIX}{manifest.name}-")
    except OSError as exc:
        raise _failed(exc, models_dir) from None
    old: Path | None = None
    try:
        _extract(archive, manifest, tmp)
        with _locked(models_dir):
            if os.path.lexists(target):
                if not replace:
                    raise _already_installed(target)
                old = _aside_name(models_dir, f"{OLD_PREFIX}{manifest.name}-")
                os.rename(target, old)
                try:
                    os.rename(tmp, target)
                except BaseException:
                    os.rename(old, target)
                    old = None
                    raise
            else:
                os.rename(tmp, target)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError):
            raise _failed(exc, models_dir) from None
        raise
    if old is not None:
        _remove(old)
    return target


def uninstall(name: str, models_dir: Path | None) -> Path:
    """Remove the installed bundle `name` from `models_dir`; the path it had.

    Only a folder holding `vllm_metadata.json` (or a link to one) is removed, never an
    arbitrary path: `name` must be a bundle name, not a path. The folder is renamed
    away first, so the registry never sees a half-deleted bundle.
    """
    models_dir = resolve_models_dir(models_dir)
    target = models_dir / name

    def not_installed(message: str, hint: str | None = None) -> TTBundleError:
        return InstallError.single("TTB092", message, file=target, hint=hint)

    if not re.fullmatch(NAME_PATTERN, name):
        raise not_installed(f"{name!r} is not a bundle name", "give the name, not a path")
    if not models_dir.is_dir():
        raise not_installed(f"{name} is not installed: {models_dir} does not exist")
    try:
        old = _move_aside(name, models_dir, target, not_installed)
    except OSError as exc:
        raise InstallError.single(
            "TTB093", f"cannot remove {name}: {exc.strerror or exc}", file=target
        ) from None
    if old is not None:
        _remove(old)
    return target


def _move_aside(
    name: str, models_dir: Path, target: Path, not_installed: Callable[..., TTBundleError]
) -> Path | None:
    """Rename an installed bundle out of sight (None: it was a link, now gone)."""
    with _locked(models_dir):
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
        if target.is_symlink():
            target.unlink()
            return None
        old = _aside_name(models_dir, f"{OLD_PREFIX}{name}-")
        os.rename(target, old)
        return old
