"""Files written the way any other program writes them: permissions from the umask.

`tempfile.mkstemp` and `mkdtemp` create 0600 files and 0700 folders, which is right for
secrets and wrong for a bundle or a checkpoint that a vLLM service account must read. So
what ttbundles writes for users (`init`, `migrate`, the demo checkpoint) is created with
0666 / 0777 lowered by the umask, like `open()` and `mkdir`, and an existing file being
rewritten keeps its own mode.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


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


def write_text_atomic(path: Path, text: str, *, keep_mode: bool = True) -> None:
    """Write `path` so that a reader sees the old file or the new one, never a part.

    The new file gets the mode an `open()` would give it (0666 lowered by the umask);
    with `keep_mode`, a file that already exists keeps its mode instead.
    """
    path = Path(path)
    mode = None
    if keep_mode:
        try:
            mode = path.stat().st_mode & 0o7777
        except FileNotFoundError:
            mode = None
    while True:
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(6)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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


__all__ = ["apply_umask", "current_umask", "write_text_atomic"]
