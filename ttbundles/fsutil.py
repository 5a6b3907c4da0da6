"""Files written the way any other program writes them: permissions from the umask.

`tempfile.mkstemp` and `mkdtemp` create 0600 files and 0700 folders, which is right for
secrets and wrong for a bundle or a checkpoint that a vLLM service account must read. So
what ttbundles writes for users (`init`, `migrate`, the demo checkpoint) is created with
0666 / 0777 lowered by the umask, like `open()` and `mkdir`, and an existing file being
rewritten keeps its own mode.

It is also the one atomic writer (`atomic_file`, `write_text_atomic`, `write_bytes_atomic`):
every file ttbundles replaces (bundles' metadata, archives, registry indexes, goldens,
the worker's counters) is written under a fresh temporary name next to it and renamed
over it, so a reader sees the old file or the new one, never a part, and two writers
never share a temporary file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import IO, Any


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (other threads
    never see a umask of 0); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextmanager
def atomic_file(
    path: Path,
    *,
    binary: bool = False,
    keep_mode: bool = False,
    mode: int | None = None,
    suffix: str = ".tmp",
    fsync: bool = False,
) -> Iterator[IO[Any]]:
    """A file to write that replaces `path` when the block ends without an error.

    It is `.<name>.<random><suffix>` in `path`'s folder (the same file system, so the
    rename is atomic; the leading dot keeps it out of listings that skip hidden names),
    created exclusively, and removed when the block raises. It gets the mode an `open()`
    would give it (0666 lowered by the umask); `mode` sets one instead, and with
    `keep_mode` a file that already exists keeps its own. `fsync` flushes it to disk
    before the rename (archives: a crash leaves the old file or the whole new one).
    """
    path = Path(path)
    if keep_mode:
        with suppress(FileNotFoundError):
            mode = path.stat().st_mode & 0o7777
    while True:
        tmp = path.with_name(f".{path.name}.{os.urandom(6).hex()}{suffix}")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "wb" if binary else "w", encoding=None if binary else "utf-8") as f:
            yield f
            if fsync:
                f.flush()
                os.fsync(f.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: Path, text: str, *, keep_mode: bool = True, **options: Any) -> None:
    """Write `text` to `path` with `atomic_file`; by default an existing file keeps its
    mode."""
    with atomic_file(path, keep_mode=keep_mode, **options) as handle:
        handle.write(text)


def write_json_atomic(path: Path, document: dict) -> None:
    """Write `document` as indented JSON with `write_text_atomic` (an existing file keeps
    its mode): the bundle metadata `init` and `migrate` write."""
    write_text_atomic(path, json.dumps(document, indent=2) + "\n")


def write_bytes_atomic(path: Path, data: bytes, **options: Any) -> None:
    """Write `data` to `path` with `atomic_file`."""
    with atomic_file(path, binary=True, **options) as handle:
        handle.write(data)


def apply_umask(root: Path) -> None:
    """Give `root` and everything under it the modes a fresh `mkdir`/`open()` would:
    folders 0777, files 0666 (0777 when executable), lowered by the umask. For trees
    first written under `mkdtemp` or by libraries that create 0600 files."""
    mask = current_umask()
    root = Path(root)
    paths = [root, *root.rglob("*")]
    for path in paths:
        if path.is_symlink():
            continue
        if path.is_dir():
            os.chmod(path, 0o777 & ~mask)
        else:
            executable = path.stat().st_mode & 0o111
            os.chmod(path, (0o777 if executable else 0o666) & ~mask)


__all__ = [
    "apply_umask",
    "atomic_file",
    "current_umask",
    "write_bytes_atomic",
    "write_json_atomic",
    "write_text_atomic",
]


@contextmanager
def folder_kept_on_success(path: Path, *, ours: tuple[str, ...] = ()) -> Iterator[Path]:
    """Make `path` (and missing parents); on failure remove the ones made here again,
    when empty (but for the files named in `ours`, which our own steps leave, such as
    the installer's lock). A refused or unreachable pull must not leave an empty `-o` or
    `--models-dir` behind, which reads as if something had been written."""
    path = Path(path)
    missing = []
    for folder in (path, *path.parents):
        if folder.exists():
            break
        missing.append(folder)
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        if missing:
            for name in ours:
                with suppress(OSError):
                    (path / name).unlink()
        for folder in missing:  # deepest first
            try:
                folder.rmdir()
            except OSError:  # not empty, or not ours to remove any more
                break
        raise
