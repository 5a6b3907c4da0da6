"""Writing `.ttbundle` archives: deterministic, streaming, atomic.

An archive is a gzip'd tar of a bundle's files (`ttbundles.archive.files` decides which) with
`MANIFEST.json` as its last entry. Packing reads each file exactly once, hashing it while
it is compressed, so a multi-GB weight file costs one read and constant memory; the
manifest can only be written once every digest is known, hence last.

The same folder always packs to the same bytes, which lets anyone rebuild an archive and
compare, and makes pack -> install -> pack a fixed point:

- entries: regular files only, in sorted path order, named by their relative POSIX path;
  no directory entries (folders are implied by the paths; empty folders are not part of
  a bundle);
- tar format: POSIX.1-2001 (PAX). Extended headers appear only where USTAR cannot hold a
  value (paths over 100 characters, non-ASCII paths, files of 8 GiB and more) and hold
  nothing but that value: no atime, ctime or global header;
- every entry: mtime `SOURCE_DATE_EPOCH` when set, else 1980-01-01 (315532800); uid and
  gid 0, empty user and group names; mode 0o755 when the file has any execute bit, else
  0o644;
- gzip: one member, header mtime 0, no file name, compression level 1 (archives are
  mostly incompressible weights: speed wins), deflated in fixed 1 MiB blocks of the tar
  stream on several threads (see `_ParallelGzipWriter`); the bytes do not depend on the
  number of threads.

Identical bytes assume the same zlib (a different zlib build may compress differently);
the root digest in the manifest is the identity that never depends on compression.

Reading is `ttbundles.archive.reader`'s job; it trusts nothing written here.
"""

from __future__ import annotations

import hashlib
import io
import os
import stat
import struct
import tarfile
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import suppress
from pathlib import Path
from typing import BinaryIO

from ttbundles import envs
from ttbundles.archive.files import MANIFEST_FILE, archive_name, list_files
from ttbundles.archive.manifest import (
    CHUNK_SIZE,
    FileEntry,
    Manifest,
    bundle_identity,
)
from ttbundles.errors import (
    ArchiveError,
    InvalidBundleError,
    TTBundleError,
)
from ttbundles.format.metadata import METADATA_FILE
from ttbundles.fsutil import atomic_file

# 1980-01-01T00:00:00Z: the earliest date zip can store, the usual reproducible default.
DEFAULT_MTIME = 315532800
COMPRESS_LEVEL = 1
# Compression runs in fixed blocks of the uncompressed stream, on up to this many threads.
GZIP_BLOCK_SIZE = 1 << 20
MAX_COMPRESS_THREADS = 8
# The modes stored in the archive (normalised: only "executable or not" survives).
ARCHIVE_FILE_MODE = 0o644
ARCHIVE_EXECUTABLE_MODE = 0o755

ProgressCallback = Callable[[int, int], None]

__all__ = ["archive_name", "source_date_epoch", "write_archive"]


def source_date_epoch() -> int:
    """The mtime every entry gets: `SOURCE_DATE_EPOCH` when set, else 1980-01-01.

    Following reproducible-builds.org, a malformed value is an error rather than
    silently ignored: whoever set it expects it to be honoured.
    """
    # The reproducible-builds.org variable, read here rather than from `envs`: it is a
    # convention of build tools, not a ttbundles setting.
    value = envs.SOURCE_DATE_EPOCH
    if value is None or not value.strip():
        return DEFAULT_MTIME
    try:
        epoch = int(value.strip())
    except ValueError:
        epoch = -1
    if epoch < 0:
        raise ArchiveError.single(
            "TTB033",
            f"SOURCE_DATE_EPOCH={value!r} is not a non-negative integer",
            hint="set it to seconds since 1970-01-01, e.g. $(git log -1 --format=%ct)",
        )
    return epoch


def _entry_info(name: str, size: int, mode: int, mtime: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.REGTYPE
    info.size = size
    info.mtime = mtime
    info.mode = ARCHIVE_EXECUTABLE_MODE if mode & 0o111 else ARCHIVE_FILE_MODE
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


class _HashingReader:
    """The file object tarfile copies from: hashes each chunk as it passes through.

    Hashing runs on a worker thread while the main thread compresses the same chunk
    (both hashlib and zlib release the GIL), so hashing adds almost nothing to the wall
    time on a machine with two cores. The size is fixed when the entry header is
    written; a file that shrinks or grows meanwhile is an error, not a corrupt archive.
    """

    def __init__(
        self,
        handle: BinaryIO,
        size: int,
        rel: str,
        pool: ThreadPoolExecutor,
        on_bytes: Callable[[int], None],
    ):
        self._handle = handle
        self._size = size
        self._rel = rel
        self._pool = pool
        self._on_bytes = on_bytes
        self._digest = hashlib.sha256()
        self._pending: Future[None] | None = None
        self.done = 0

    def _changed(self, how: str) -> TTBundleError:
        return ArchiveError.single(
            "TTB082",
            f"{self._rel}: {how} while being packed (expected {self._size} bytes)",
            file=self._rel,
            hint="stop whatever writes to it, then pack again",
        )

    def read(self, size: int = -1) -> bytes:
        try:
            data = self._handle.read(size)
        except OSError as exc:
            raise ArchiveError.single(
                "TTB003", f"{self._rel}: cannot be read: {exc.strerror or exc}", file=self._rel
            ) from None
        if len(data) < size and self.done + len(data) < self._size:
            raise self._changed("shrank")
        if self._pending is not None:
            self._pending.result()
        self._pending = self._pool.submit(self._digest.update, data)
        self.done += len(data)
        self._on_bytes(len(data))
        return data

    def hexdigest(self) -> str:
        if self._pending is not None:
            self._pending.result()
            self._pending = None
        if self.done != self._size or self._handle.read(1):
            raise self._changed("grew")
        return self._digest.hexdigest()


def _open_regular(path: Path, rel: str) -> tuple[BinaryIO, os.stat_result]:
    """Open a bundle file without following a link swapped in since it was listed."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_BINARY", 0)
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise ArchiveError.single(
            "TTB003", f"{rel}: cannot be read: {exc.strerror}", file=path
        ) from None
    handle = os.fdopen(fd, "rb", buffering=0)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        handle.close()
        raise ArchiveError.single("TTB085", f"{rel}: no longer a regular file", file=path)
    return handle, st


# gzip member header: deflate, no flags (no file name), mtime 0, XFL 4 ("fastest"), OS 255.
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x04\xff"
_DEFLATE_WINDOW = 32 * 1024


def _compress_threads() -> int:
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_COMPRESS_THREADS))


def _raw_deflater(history: bytes = b"") -> zlib._Compress:
    if history:
        return zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS, zdict=history)
    return zlib.compressobj(COMPRESS_LEVEL, zlib.DEFLATED, -zlib.MAX_WBITS)


def _deflate_block(block: bytes, history: bytes) -> bytes:
    """Raw deflate of one block, primed with the 32 KiB before it, ending byte-aligned."""
    deflater = _raw_deflater(history)
    return deflater.compress(block) + deflater.flush(zlib.Z_SYNC_FLUSH)


class _ParallelGzipWriter:
    """A write-only gzip stream compressed on several threads, with deterministic bytes.

    Compression is where packing spends its time, and `gzip -1` uses one core. Here the
    uncompressed stream is cut into fixed blocks, each deflated on its own but primed
    with the 32 KiB before it (so matches still reach back, as with pigz) and ended with a
    sync flush, then written in order. The output depends only on the input, the block
    size, the level and zlib, never on the number of threads or their timing, and it is
    one ordinary gzip member that any gzip reads. Blocks in flight are bounded, so memory
    stays flat however large the input.
    """

    def __init__(self, raw: BinaryIO, threads: int):
        self._raw = raw
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="ttbundle-gz")
        self._in_flight = threads + 1
        self._pending: deque[Future[bytes]] = deque()
        self._buffer = bytearray()
        self._history = b""
        self._crc = 0
        self._size = 0
        raw.write(_GZIP_HEADER)

    def write(self, data: bytes) -> int:
        self._buffer += data
        if len(self._buffer) >= GZIP_BLOCK_SIZE:
            start = 0
            with memoryview(self._buffer) as view:
                while len(view) - start >= GZIP_BLOCK_SIZE:
                    self._submit(bytes(view[start : start + GZIP_BLOCK_SIZE]))
                    start += GZIP_BLOCK_SIZE
            del self._buffer[:start]
        return len(data)

    def tell(self) -> int:
        return self._size + len(self._buffer)

    def _submit(self, block: bytes) -> None:
        self._crc = zlib.crc32(block, self._crc)
        self._size += len(block)
        self._pending.append(self._pool.submit(_deflate_block, block, self._history))
        self._history = block[-_DEFLATE_WINDOW:]
        while len(self._pending) > self._in_flight:
            self._raw.write(self._pending.popleft().result())

    def finish(self) -> None:
        """Compress what is left and write the final block and the gzip trailer."""
        if self._buffer:
            self._submit(bytes(self._buffer))
            self._buffer.clear()
        while self._pending:
            self._raw.write(self._pending.popleft().result())
        self._raw.write(_raw_deflater().flush(zlib.Z_FINISH))  # an empty final block
        self._raw.write(struct.pack("<II", self._crc & 0xFFFFFFFF, self._size & 0xFFFFFFFF))

    def __enter__(self) -> _ParallelGzipWriter:
        return self

    def __exit__(self, exc_type: object, *_: object) -> None:
        try:
            if exc_type is None:
                self.finish()
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _write_archive(
    raw: BinaryIO,
    bundle_dir: Path,
    files: list[str],
    *,
    name: str,
    version: str,
    mtime: int,
    progress: ProgressCallback | None,
) -> Manifest:
    total = sum((bundle_dir / rel).lstat().st_size for rel in files)
    done = 0

    def on_bytes(count: int) -> None:
        nonlocal done
        done += count
        if progress is not None:
            progress(done, total)

    if progress is not None:
        progress(0, total)
    entries: list[FileEntry] = []
    with (
        _ParallelGzipWriter(raw, _compress_threads()) as gz,
        tarfile.TarFile(
            fileobj=gz,  # type: ignore[arg-type]
            mode="w",
            format=tarfile.PAX_FORMAT,
            encoding="utf-8",
            errors="strict",
            copybufsize=CHUNK_SIZE,
        ) as tar,
        ThreadPoolExecutor(max_workers=1, thread_name_prefix="ttbundle-hash") as pool,
    ):
        for rel in files:
            path = bundle_dir / rel
            handle, st = _open_regular(path, rel)
            with handle:
                reader = _HashingReader(handle, st.st_size, rel, pool, on_bytes)
                tar.addfile(_entry_info(rel, st.st_size, st.st_mode, mtime), reader)
                sha256 = reader.hexdigest()
            entries.append(FileEntry(path=rel, size=st.st_size, sha256=sha256))
        manifest = Manifest.create(name, version, entries)
        data = manifest.to_bytes()
        tar.addfile(
            _entry_info(MANIFEST_FILE, len(data), ARCHIVE_FILE_MODE, mtime), io.BytesIO(data)
        )
    return manifest


def write_archive(
    bundle_dir: Path,
    out_dir: Path,
    *,
    progress: ProgressCallback | None = None,
) -> Path:
    """Write a bundle folder as `out_dir/<name>-<version>.ttbundle`, unchecked.

    Callers validate first (`ttbundles.build.pack` does: every archive in circulation
    passed validation once); this step only writes. The archive appears atomically:
    readers see the previous file or the complete new one, never a partial one.
    `progress` is called with (bytes done, bytes total) as file data goes through; the
    library never prints.
    """
    bundle_dir = Path(bundle_dir)
    out_dir = Path(out_dir)
    name, version = bundle_identity(bundle_dir)
    mtime = source_date_epoch()
    out = out_dir / archive_name(name, version)
    files = list_files(bundle_dir)
    # Packing into the bundle itself must not swallow the previous archive.
    with suppress(ValueError):
        own = out.resolve().relative_to(bundle_dir.resolve()).as_posix()
        files = [rel for rel in files if rel != own]
    if METADATA_FILE not in files:
        raise InvalidBundleError.single(
            "TTB002",
            f"{METADATA_FILE} is left out by .ttbundleignore",
            file=bundle_dir / ".ttbundleignore",
            hint=f"remove the pattern that matches {METADATA_FILE}",
        )

    try:
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_file(out, binary=True, suffix=".part", fsync=True) as raw:
            _write_archive(
                raw,
                bundle_dir,
                files,
                name=name,
                version=version,
                mtime=mtime,
                progress=progress,
            )
    except OSError as exc:
        # Reading the bundle reports its own errors: an OSError here is the output side.
        raise _write_error(out, exc) from None
    return out


def _write_error(out: Path, exc: OSError) -> TTBundleError:
    return ArchiveError.single(
        "TTB089",
        f"cannot write {out.name}: {exc.strerror or exc}",
        file=out,
        hint="check that the output folder is writable and has room",
    )
