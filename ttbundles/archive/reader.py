"""Reading `.ttbundle` archives: streaming verification and verified extraction.

An archive is untrusted input. `scan_archive` streams through every entry, recomputes
every digest and names each problem; nothing is written until that pass is clean.
`extract_into` is pass two: it re-checks every entry as it writes (the file could change
between the two reads), so only regular files at safe relative paths, listed in the
manifest, with exactly the listed size and digest, are written. Validation of an archive
and installation both extract through here.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import shutil
import tarfile
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO

from ttbundles.archive.files import MANIFEST_FILE, unsafe_reason
from ttbundles.archive.manifest import (
    CHUNK_SIZE,
    Manifest,
    check_identity,
    compare_files,
    parse_manifest,
    verify_dir,
)
from ttbundles.errors import (
    ArchiveError,
    Diagnostic,
    InstallError,
    Report,
    Severity,
    TTBundleError,
)
from ttbundles.format.metadata import METADATA_FILE

# Upper bounds on what is read into memory from an untrusted archive: the manifest, and
# any single header read (a PAX header or GNU long name claiming gigabytes).
MAX_MANIFEST_SIZE = 64 << 20
MAX_HEADER_READ = 16 << 20
# The metadata file is kept in memory while verifying to check the manifest's name.
MAX_METADATA_SIZE = 1 << 20
# Modes of extracted files before the umask lowers them, as for any new file.
CREATE_FILE_MODE = 0o666
CREATE_EXECUTABLE_MODE = 0o777

# What a damaged or foreign file raises from inside gzip (BadGzipFile is an OSError).
_READ_ERRORS = (OSError, EOFError, zlib.error)

__all__ = [
    "extract_into",
    "extract_verified",
    "is_plain_file",
    "member_problem",
    "open_archive",
    "read_archive",
    "scan_archive",
    "verified_manifest",
    "verify",
    "verify_archive",
]


def extraction_failed(exc: OSError, where: Path) -> TTBundleError:
    """A file-system failure while extracting: nothing was left behind."""
    return InstallError.single(
        "TTB093",
        f"install failed; nothing was changed: {exc.strerror or exc}",
        file=exc.filename or where,
        hint="check that the models folder is writable and has room",
    )


def _unreadable(source: str, exc: BaseException) -> TTBundleError:
    return ArchiveError.single(
        "TTB080",
        f"not a readable .ttbundle (gzip'd tar): {_describe(exc)}",
        file=source,
        hint="get the archive again; a download may have been cut short",
    )


class _ArchiveReader:
    """The decompressed stream as tarfile sees it: read errors become TTB080 here.

    Converting at the source keeps a damaged archive apart from a failure of whoever
    consumes it (a full disk while extracting is not a corrupt archive). Also refuses any
    single read over a limit: tarfile reads a PAX header or GNU long name whole,
    trusting the size its header claims; member data is read in CHUNK_SIZE pieces, well
    under the limit, so only such headers are refused.
    """

    def __init__(self, fileobj: BinaryIO, limit: int, source: str):
        self._fileobj = fileobj
        self._limit = limit
        self._source = source

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self._limit:
            raise ArchiveError.single(
                "TTB080",
                f"an entry header claims {size} bytes, over the {self._limit} allowed",
                file=self._source,
                hint="the archive was not written by 'ttbundle pack'",
            )
        try:
            return self._fileobj.read(size)
        except _READ_ERRORS as exc:
            raise _unreadable(self._source, exc) from None

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        try:
            return self._fileobj.seek(offset, whence)
        except _READ_ERRORS as exc:
            raise _unreadable(self._source, exc) from None

    def tell(self) -> int:
        return self._fileobj.tell()

    def seekable(self) -> bool:
        return True

    def drain(self) -> None:
        """Read to the end: checks gzip's CRC and length, and that nothing hides there."""
        while chunk := self.read(CHUNK_SIZE):
            if chunk.strip(b"\0"):
                raise ArchiveError.single(
                    "TTB080",
                    "data after the end of the tar archive (damaged entry header?)",
                    file=self._source,
                    hint="get the archive again from its source",
                )


@contextmanager
def open_archive(path: Path) -> Iterator[tarfile.TarFile]:
    """The archive as a tarfile to iterate once, front to back.

    Damage anywhere (not gzip, not tar, truncated, bad CRC, data after the end of the
    tar) raises `ArchiveError` TTB080; errors of the caller's own (writing files) pass
    through unchanged. On leaving normally, the rest of the stream is read and checked.
    """
    source = str(path)
    try:
        raw = open(path, "rb")  # noqa: SIM115 - closed by the with below
    except OSError as exc:
        raise _unreadable(source, exc) from None
    with raw, gzip.GzipFile(fileobj=raw, mode="rb") as gz:
        reader = _ArchiveReader(gz, MAX_HEADER_READ, source)  # type: ignore[arg-type]
        try:
            tar = tarfile.TarFile(fileobj=reader, mode="r", encoding="utf-8")  # type: ignore[arg-type]
            yield tar
        # What tarfile itself raises on bad headers, also while the caller iterates.
        except (tarfile.TarError, EOFError, zlib.error, UnicodeDecodeError) as exc:
            raise _unreadable(source, exc) from None
        reader.drain()


def _describe(exc: BaseException) -> str:
    if isinstance(exc, EOFError):
        return "truncated"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _member_kind(member: tarfile.TarInfo) -> str:
    if member.issym():
        return f"symbolic link to {member.linkname!r}"
    if member.islnk():
        return f"hard link to {member.linkname!r}"
    if member.ischr():
        return "character device"
    if member.isblk():
        return "block device"
    if member.isfifo():
        return "fifo"
    if member.issparse():
        return "sparse file"
    return f"entry of type {member.type!r}"


def is_plain_file(member: tarfile.TarInfo) -> bool:
    """Only these are extracted: no links, devices, sparse or vendor-specific entries."""
    return member.type in (tarfile.REGTYPE, tarfile.AREGTYPE) and not member.issparse()


def member_problem(member: tarfile.TarInfo) -> tuple[str, str] | None:
    """(code, message) when an entry is unsafe to extract; directories are harmless."""
    reason = unsafe_reason(member.name)
    if reason is not None:
        return "TTB085", f"{member.name}: unsafe entry: {reason}"
    if member.isdir() or is_plain_file(member):
        return None
    return "TTB085", f"{member.name}: unsafe entry: {_member_kind(member)}"


def _hash_member(tar: tarfile.TarFile, member: tarfile.TarInfo, keep: bool) -> tuple[str, bytes]:
    handle = tar.extractfile(member)
    assert handle is not None  # a plain file always has data
    digest = hashlib.sha256()
    kept = []
    while chunk := handle.read(CHUNK_SIZE):
        digest.update(chunk)
        if keep:
            kept.append(chunk)
    return digest.hexdigest(), b"".join(kept)


def scan_archive(path: Path) -> tuple[Manifest | None, Report]:
    """Read the whole archive once: its manifest (None when unusable) and every problem.

    The manifest comes last, so entries are hashed first and compared at the end; only
    (path, size, digest) per entry is kept, never file data.
    """
    path = Path(path)
    source = str(path)
    report = Report()

    def add(code: str, message: str, hint: str | None = None) -> None:
        report.add(Diagnostic(code, Severity.ERROR, message, file=source, hint=hint))

    found: dict[str, tuple[int, str]] = {}
    skip: set[str] = set()
    seen: set[str] = set()
    manifest_seen = False
    manifest_data: bytes | None = None
    metadata: bytes | None = None
    try:
        with open_archive(path) as tar:
            for member in tar:
                name = member.name
                if manifest_seen:
                    add("TTB081", f"{name}: entry after {MANIFEST_FILE}, which must be last")
                if name in seen:
                    add("TTB086", f"{name}: duplicate entry", "each path may appear once")
                    skip.add(name)
                    continue
                seen.add(name)
                problem = member_problem(member)
                if problem is not None:
                    add(*problem, hint="bundles hold regular files at relative paths only")
                    skip.add(name)
                    continue
                if member.isdir():
                    continue
                if name == MANIFEST_FILE:
                    manifest_seen = True
                    if member.size > MAX_MANIFEST_SIZE:
                        add("TTB081", f"{MANIFEST_FILE} is {member.size} bytes, too large")
                        continue
                    _, manifest_data = _hash_member(tar, member, keep=True)
                    continue
                keep = name == METADATA_FILE and member.size <= MAX_METADATA_SIZE
                sha256, data = _hash_member(tar, member, keep=keep)
                found[name] = (member.size, sha256)
                if keep:
                    metadata = data
    except TTBundleError as exc:
        report.extend(exc.diagnostics)
        return None, report
    if not manifest_seen:
        add(
            "TTB081",
            f"no {MANIFEST_FILE} entry",
            "archives written by 'ttbundle pack' end with one; pack the bundle again",
        )
    if manifest_data is None:
        return None, report
    try:
        manifest = parse_manifest(manifest_data, source=f"{source}:{MANIFEST_FILE}")
    except TTBundleError as exc:
        report.extend(exc.diagnostics)
        return None, report
    report.extend(
        compare_files(
            manifest, found, locate=lambda _rel: source, oversize_code="TTB087", skip=skip
        )
    )
    report.extend(check_identity(manifest, metadata, file=source))
    return manifest, report


def verify_archive(path: Path) -> Report:
    """Every problem with an archive, each naming its entry; an empty report means intact."""
    return scan_archive(path)[1]


def read_archive(path: Path) -> Manifest:
    """The manifest of an archive whose content checks out; raises `ArchiveError` if not.

    Hashes the whole archive: a manifest is only worth reading if the files match it.
    """
    manifest, report = scan_archive(path)
    if report.errors or manifest is None:
        raise ArchiveError(report.errors)
    return manifest


def verify(path: Path) -> Report:
    """Verify an archive file or an installed bundle folder, whichever `path` is."""
    path = Path(path)
    if path.is_dir():
        return verify_dir(path)
    if path.is_file():
        return verify_archive(path)
    report = Report()
    report.add(
        Diagnostic(
            "TTB001",
            Severity.ERROR,
            "no such archive or folder",
            file=str(path),
            hint="give a .ttbundle file or an installed bundle folder",
        )
    )
    return report


def extract_into(archive: Path, manifest: Manifest, dest: Path) -> None:
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
        path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), CREATE_FILE_MODE
    )
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _copy_capped(tar: tarfile.TarFile, member: tarfile.TarInfo, target: str, cap: int) -> str:
    """Copy an entry's data to a new file, never more than `cap` bytes; its sha256."""
    mode = CREATE_EXECUTABLE_MODE if member.mode & 0o111 else CREATE_FILE_MODE
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


def verified_manifest(archive: Path) -> Manifest:
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
    manifest = verified_manifest(archive)
    folder = dest / manifest.name
    try:
        folder.mkdir()
    except OSError as exc:
        raise extraction_failed(exc, dest) from None
    try:
        extract_into(archive, manifest, folder)
    except BaseException as exc:
        shutil.rmtree(folder, ignore_errors=True)
        if isinstance(exc, OSError):
            raise extraction_failed(exc, dest) from None
        raise
    return folder
