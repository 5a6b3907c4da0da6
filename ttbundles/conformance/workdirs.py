"""The temporary folders of `ttbundle test` runs, and the removal of orphaned ones.

A run removes its own folder on every way out it can see (a pass, a failure, Ctrl-C,
SIGTERM). `kill -9` runs no clean-up at all, so a run holds a lock on a file in its
folder for as long as it lives (`RunFolder`), which the kernel releases when the
process ends however it ends, and every run first removes the folders nobody holds:
the leftover of a killed run lasts until the next run. A lock, not the pid in the name,
decides: it also holds across processes that share the temporary folder but not their
pids (containers), and a recycled pid cannot make a dead run look alive.

Only this user's folders are touched (the name says which process made it, for people
looking at the folder).
"""

from __future__ import annotations

import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path

PREFIX = "ttbundle-test-"
LOCK = ".running"


class RunFolder:
    """A run's folder, locked until `remove()` or the end of the process."""

    def __init__(self) -> None:
        sweep_orphans()
        self.path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))
        self._lock = open(self.path / LOCK, "wb")  # noqa: SIM115 - held for the run
        fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        self._lock.close()


def sweep_orphans(root: Path | None = None) -> list[Path]:
    """Remove the run folders under `root` (default: the temporary root) whose lock
    nobody holds; the folders removed. Never raises: what it cannot read, lock or
    remove stays. A folder without the lock file (one just being made, or made by a
    version before the lock) is left alone."""
    root = Path(tempfile.gettempdir()) if root is None else root
    try:
        entries = [e for e in root.iterdir() if e.name.startswith(PREFIX)]
    except OSError:
        return []
    removed = []
    for entry in entries:
        try:
            info = entry.lstat()
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid():
                continue
            with open(entry / LOCK, "rb") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # held: OSError
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:
            continue
        if not entry.exists():
            removed.append(entry)
    return removed
