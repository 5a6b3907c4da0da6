"""Which files make up a bundle: the one listing that packing, hashing and verifying share.

A bundle's identity is the digest of its files, so every tool must agree on what "its
files" are. This module is that agreement:

- paths are relative, POSIX (`/`), and sorted by code point, so the order never depends
  on the file system or the locale;
- never listed: `__pycache__/` folders, `*.pyc` files, VCS folders (`.git`, `.hg`,
  `.svn`, `.bzr`) and `MANIFEST.json` at the root (it describes the files, so it is
  regenerated, never hashed);
- a root `.ttbundleignore` leaves out more (see `IgnoreRules`); the file itself is listed,
  like a `.gitignore`, so an installed bundle lists the same files as its source;
- only regular files are listed: directories are implied by the paths (an empty folder is
  not part of a bundle); a symbolic link or a special file (fifo, socket, device) is
  refused, because what it points to would escape the digest and, once extracted, could
  point anywhere.

Ignored paths are skipped before they are looked at, so a `.venv/` full of symlinks can
be left out with one line.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from ttbundles.errors import ArchiveError, Diagnostic, InvalidBundleError, Severity

MANIFEST_FILE = "MANIFEST.json"
ARCHIVE_SUFFIX = ".ttbundle"
IGNORE_FILE = ".ttbundleignore"
VCS_DIRS = frozenset({".git", ".hg", ".svn", ".bzr"})
CACHE_DIR = "__pycache__"
BYTECODE_SUFFIX = ".pyc"
# Where install and pull record where an installed bundle came from (ttbundles.trust.
# provenance): about the installed copy, not part of the bundle, so never packed.
PROVENANCE_FILE = ".ttbundle-provenance.json"
# The signature `ttbundle sign` writes into the bundle (model-signing's Sigstore bundle,
# `trust.signature`): a file of the bundle, packed and listed like any other.
SIGNATURE_FILE = "model.sig"


@dataclass(frozen=True)
class IgnorePattern:
    """One line of `.ttbundleignore`."""

    pattern: str
    anchored: bool  # matched against the whole relative path, not only the last part
    dir_only: bool  # written with a trailing '/': matches folders only

    def matches(self, path: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        subject = path if self.anchored else path.rpartition("/")[2]
        return fnmatch.fnmatchcase(subject, self.pattern)


@dataclass(frozen=True)
class IgnoreRules:
    """The patterns of a root `.ttbundleignore`: a deliberately small subset of gitignore.

    - one pattern a line; blank lines and lines starting with `#` are skipped; trailing
      spaces are dropped;
    - `name` or `*.ext` (no `/`): matches a file or folder of that name at any depth;
    - `dir/` (trailing `/`): matches folders only;
    - `sub/path` or `/name` (a `/` before the end): matched against the whole path
      relative to the bundle root;
    - patterns use `fnmatch`, case-sensitively, so `*` also matches `/`
      (`weights/*.bin` leaves out `weights/a/b.bin` too); there is no `**`;
    - a folder that matches is left out with everything in it;
    - negation (`!pattern`) is not supported and is reported as an error rather than
      silently doing something other than what gitignore would.
    """

    patterns: tuple[IgnorePattern, ...] = ()

    @classmethod
    def parse(cls, text: str, *, source: str = IGNORE_FILE) -> IgnoreRules:
        patterns: list[IgnorePattern] = []
        problems: list[Diagnostic] = []
        for number, raw in enumerate(text.splitlines(), start=1):
            line = raw.rstrip()
            if not line or line.startswith("#"):
                continue
            if line.startswith("!"):
                problems.append(
                    Diagnostic(
                        code="TTB033",
                        severity=Severity.ERROR,
                        message=f"negated pattern {line!r} is not supported",
                        file=source,
                        line=number,
                        hint="list only what to leave out; remove the broader pattern instead",
                    )
                )
                continue
            dir_only = line.endswith("/")
            body = line.rstrip("/")
            anchored = "/" in body
            body = body.lstrip("/")
            if body:
                patterns.append(IgnorePattern(body, anchored, dir_only))
        if problems:
            raise InvalidBundleError(problems)
        return cls(tuple(patterns))

    @classmethod
    def load(cls, bundle_dir: Path) -> IgnoreRules:
        """The rules of `bundle_dir`'s `.ttbundleignore`; none when it is absent."""
        path = bundle_dir / IGNORE_FILE
        if not path.is_file():
            return cls()
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise InvalidBundleError(
                Diagnostic(
                    code="TTB003",
                    severity=Severity.ERROR,
                    message=f"cannot read {IGNORE_FILE}: {exc}",
                    file=str(path),
                    hint="make it a readable UTF-8 text file",
                )
            ) from None
        return cls.parse(text, source=str(path))

    def matches(self, path: str, is_dir: bool) -> bool:
        return any(p.matches(path, is_dir) for p in self.patterns)


def always_skipped(path: str, is_dir: bool) -> bool:
    """What no bundle ever contains, whatever its `.ttbundleignore` says."""
    base = path.rpartition("/")[2]
    if base in VCS_DIRS:
        return True
    if is_dir:
        return base == CACHE_DIR
    return base.endswith(BYTECODE_SUFFIX) or path in (MANIFEST_FILE, PROVENANCE_FILE)


def unsafe_reason(name: str) -> str | None:
    """Why `name` cannot be a path inside a bundle, or None when it can.

    Shared by packing (refuse to write it) and extraction (refuse to trust it), so an
    archive that `pack` writes is always one that `install` accepts.
    """
    if not name:
        return "empty path"
    if "\x00" in name:
        return "NUL byte in path"
    if "\\" in name:
        return "backslash in path"
    if name.startswith("/"):
        return "absolute path"
    parts = name.split("/")
    if ".." in parts:
        return "'..' component"
    if any(part in ("", ".") for part in parts):
        return "empty or '.' component"
    if len(parts[0]) >= 2 and parts[0][1] == ":":
        return "drive-letter path"
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "name is not valid UTF-8"
    return None


def scan_files(bundle_dir: Path) -> tuple[list[str], list[Diagnostic]]:
    """The bundle's files, and every entry that prevents packing it (none are skipped).

    Returned together so `verify` can report all problems at once while `list_files`
    raises them.
    """
    rules = IgnoreRules.load(bundle_dir)
    files: list[str] = []
    problems: list[Diagnostic] = []

    def refuse(code: str, rel: str, message: str, hint: str | None = None) -> None:
        problems.append(
            Diagnostic(
                code=code,
                severity=Severity.ERROR,
                message=f"{rel}: {message}",
                file=str(bundle_dir / rel),
                hint=hint,
            )
        )

    def walk(directory: Path, prefix: str) -> None:
        try:
            with os.scandir(directory) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            refuse("TTB003", prefix.rstrip("/") or ".", f"cannot list folder: {exc}")
            return
        for entry in entries:
            rel = prefix + entry.name
            try:
                mode = entry.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                refuse("TTB003", rel, f"cannot be read: {exc}", "check its permissions")
                continue
            is_dir = stat.S_ISDIR(mode)
            if always_skipped(rel, is_dir) or rules.matches(rel, is_dir):
                continue
            reason = unsafe_reason(rel)
            if reason is not None:
                refuse("TTB085", rel, f"cannot be packed: {reason}", "rename it")
            elif stat.S_ISLNK(mode):
                refuse(
                    "TTB085",
                    rel,
                    "is a symbolic link; bundles hold regular files only",
                    f"replace it with a copy of its target, or list it in {IGNORE_FILE}",
                )
            elif is_dir:
                walk(Path(entry.path), rel + "/")
            elif stat.S_ISREG(mode):
                files.append(rel)
            else:
                refuse(
                    "TTB085",
                    rel,
                    "is a special file (fifo, socket or device); bundles hold regular files only",
                    f"remove it or list it in {IGNORE_FILE}",
                )

    walk(bundle_dir, "")
    # Walking sorted names is not the same as sorting paths ('a-b' < 'a/c' but the folder
    # 'a' is visited first), and the listing order is part of the archive bytes.
    files.sort()
    return files, problems


def list_files(bundle_dir: Path) -> list[str]:
    """Sorted relative POSIX paths of the bundle's files; raises on any unsafe entry."""
    files, problems = scan_files(Path(bundle_dir))
    if problems:
        raise ArchiveError(problems)
    return files


def archive_name(name: str, version: str) -> str:
    """The file name a bundle packs to: `<name>-<version>.ttbundle`."""
    return f"{name}-{version}{ARCHIVE_SUFFIX}"
