"""The demo model's preparation (`ttbundles.demo.model`): processes that prepare the same
folder at once take turns, and the later one uses what the first one prepared."""

from __future__ import annotations

import fcntl
import threading
from pathlib import Path

from ttbundles.demo import model


def _prepared(folder: Path) -> None:
    """A folder `is_prepared` accepts: the files it requires and their record."""
    folder.mkdir(parents=True)
    for name in model.REQUIRED:
        (folder / name).write_text(f"{name}\n")
    model._write_record(folder)


def test_a_second_preparation_waits_and_takes_the_first_ones_folder(tmp_path, monkeypatch):
    """While another process holds the folder's lock (preparing it), `prepare` waits;
    once the folder is complete and the lock free, it returns the folder as found (not
    prepared now), without downloading or replacing it."""
    folder = tmp_path / "ttbundles" / "smollm2-135m-instruct"
    folder.parent.mkdir(parents=True)

    def no_download(*args, **kwargs):
        raise AssertionError("prepared again: the first process's folder would be replaced")

    monkeypatch.setattr(model, "_prepare", no_download)
    result: dict = {}
    with open(folder.parent / f".{folder.name}.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first process, preparing
        waiter = threading.Thread(target=lambda: result.update(got=model.prepare(folder)))
        waiter.start()
        waiter.join(0.5)
        assert waiter.is_alive(), f"prepare did not wait for the lock: {result}"
        _prepared(folder)
        fcntl.flock(lock, fcntl.LOCK_UN)
    waiter.join(30)
    assert result["got"] == (folder, False)
