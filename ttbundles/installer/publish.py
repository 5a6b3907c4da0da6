"""Publishing an extracted bundle under its name, atomically where the system allows.

The bundle is extracted into `.tmp-<name>-<token>` inside the models folder
(same file system, so a rename publishes it). A first install renames it to `<name>`.
`--replace` swaps the two names in one step with Linux `renameat2(RENAME_EXCHANGE)`, so
a reader opening `<name>/...` finds the old bundle or the new one, never nothing. Where
the kernel or the file system cannot exchange names (not Linux, NFS, some FUSE and older
ZFS), bundles use the *link layout*: `<name>` is a symbolic link to a version folder
`.ver-<name>-<token>`, and a replace switches it with one `os.replace` of a new link,
which is just as atomic. A plain folder met on such a file system (installed elsewhere,
or by an older release) is replaced with two renames once, with a moment where `<name>`
is missing, and is in the link layout from then on; the result says so
(`swap == "rename"`).

A path walk that went into the old version just before the swap (it looked up `<name>`,
or read the old link, and is about to look up a file inside) must still find it whole,
so the old version is not removed by the replace: it is kept as `.prev-<name>-<token>`
(the old folder moved there, or a link to the old version folder, whose name must stay),
and the next install or uninstall in the folder removes it (`leftovers.drop_kept`).
"""

from __future__ import annotations

import ctypes
import errno
import json
import os
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

from ttbundles.errors import InstallError, TTBundleError
from ttbundles.format.metadata import METADATA_FILE
from ttbundles.installer.leftovers import (
    _ENTRY,
    OLD_PREFIX,
    PREV_PREFIX,
    TEMP_PREFIX,
    VERSION_PREFIX,
    _Hold,
    _link_target,
    _managed_version,
    _remove,
    _stamp,
    _Sweep,
)

# renameat2(2): swap two names atomically.
AT_FDCWD = -100
RENAME_EXCHANGE = 2
_EXCHANGE_UNSUPPORTED = {errno.ENOSYS, errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP}


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


def _already_installed(target: Path) -> TTBundleError:
    return InstallError.single(
        "TTB090",
        f"{target.name} is already installed",
        file=target,
        hint="pass --replace to replace it",
    )


def _installed_version(folder: Path) -> str | None:
    try:
        version = json.loads((folder / METADATA_FILE).read_text(encoding="utf-8"))["version"]
    except (OSError, ValueError, TypeError, KeyError):
        return None
    return version if isinstance(version, str) else None


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
) -> tuple[str | None, str | None, Path | None]:
    """Give the extracted bundle its name (under the folder lock).

    (how a replace swapped or None, the replaced version, where the replaced version is
    kept or None). Nothing after the step that publishes can raise.
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
    try:
        exchange(tmp, target)  # `tmp` now holds the old bundle (a folder or a link)
        return "exchange", previous, _keep(hold, name, moved=tmp)
    except ExchangeUnsupported:
        pass
    if _as_link(hold, tmp, name) and target.is_symlink():
        replaced = _link_target(target)
        os.replace(tmp, target)
        return "symlink", previous, _keep(hold, name, link_to=replaced)
    # A folder in place and no exchange: two renames, with a moment where the name is
    # missing. The link layout makes the next replace atomic.
    old = hold.path(OLD_PREFIX, name)
    os.rename(target, old)
    try:
        os.rename(tmp, target)
    except BaseException:
        os.rename(old, target)
        raise
    return "rename", previous, _keep(hold, name, moved=old)


def _keep(
    hold: _Hold, name: str, *, moved: Path | None = None, link_to: str | None = None
) -> Path | None:
    """Keep the replaced version as `.prev-<name>-<token>`: the entry `moved` (the old
    folder or link, now under an operation name) renamed there, or a new link to
    `link_to` (a replaced link's target). Never raises: where it cannot, the old version
    is left to `_clean_up` (or to the next sweep), as before there were kept versions."""
    kept = hold.path(PREV_PREFIX, name)
    try:
        if moved is not None:
            os.rename(moved, kept)
        elif link_to is not None:
            os.symlink(link_to, kept)
        else:
            return None
    except OSError:
        return None
    _stamp(kept)
    return kept


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


def _clean_up(hold: _Hold, name: str, target: Path) -> None:
    """Remove the operation's entries, success or failure, then release its lock.

    After a replace whose old version could not be kept they hold it. A version folder
    `target` links to is the installed bundle and stays; a `.old-` folder stays when
    `target` is missing (a failed two-rename replace could not put it back): the next
    sweep restores it.
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
