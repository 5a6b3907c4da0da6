"""Install a `.ttbundle` into a models folder, and uninstall it, safely and atomically.

An archive is untrusted input: `ttbundles.archive.reader` verifies it whole, then
extracts it re-checking every entry, so only files listed in its manifest with exactly
the listed size and digest are written.

Atomicity: the bundle is extracted into `.tmp-<name>-<random>` inside the models folder
(same file system, so a rename publishes it), then renamed to `<name>`. A failure at any
point removes the temporary folder and leaves an existing install untouched. Replacing
renames the old folder aside first and restores it if the new one cannot take its place.
The final step runs under an advisory lock (`.ttbundle.lock`), so concurrent installs into
one folder serialise their swaps. Names starting with '.' are never bundles (the
registry skips them), so a leftover of a killed process is harmless.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ttbundles import envs
from ttbundles.archive.reader import extract_into, extraction_failed, verified_manifest
from ttbundles.errors import InstallError, TTBundleError
from ttbundles.format.metadata import METADATA_FILE, NAME_PATTERN
from ttbundles.suggest import hint_for

try:  # POSIX only; elsewhere installs are not serialised (documented limitation)
    import fcntl
except ImportError:  # pragma: no cover
    fcntl = None  # type: ignore[assignment]

MODELS_DIR_ENV = "EXTRA_MODELS_DIR"
LOCK_FILE = ".ttbundle.lock"
TEMP_PREFIX = ".tmp-"
OLD_PREFIX = ".old-"

__all__ = ["install", "resolve_models_dir", "uninstall"]


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
    manifest = verified_manifest(archive)
    target = models_dir / manifest.name
    if not replace and os.path.lexists(target):
        raise _already_installed(target)  # early: spare the extraction
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        tmp = _new_dir(models_dir, f"{TEMP_PREFIX}{manifest.name}-")
    except OSError as exc:
        raise extraction_failed(exc, models_dir) from None
    old: Path | None = None
    try:
        extract_into(archive, manifest, tmp)
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
            raise extraction_failed(exc, models_dir) from None
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
