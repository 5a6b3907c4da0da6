"""The report file through which an engine tells its API server why it failed
(`ttbundles.serving.faults`): named by the API server's pid, so it must never be taken
from a dead process that had the same pid."""

from __future__ import annotations

import os
import tempfile

from ttbundles.serving import faults


def test_vllm_serve_removes_a_report_left_under_its_pid(tmp_path, monkeypatch):
    """A report (and a stop note) left by an earlier process with this pid would make a
    clean stop exit 1 ("the engine failed"): `vllm serve` removes both when it names its
    report file."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(faults.sys, "argv", ["/venv/bin/vllm", "serve", "model"])
    monkeypatch.setattr(faults.atexit, "register", lambda handler: handler)
    monkeypatch.delenv(faults.REPORT_VARIABLE, raising=False)
    stale = tmp_path / f"ttbundles-engine-{os.getpid()}.report"
    stale.write_text("bundle: an engine failure of another process\n")
    (tmp_path / f"{stale.name}.stop").write_text("as the head is gone\n")
    other = tmp_path / "ttbundles-engine-1.report"  # another live server's: kept
    other.write_text("its own\n")

    path = faults.report_path()

    assert path == str(stale)
    assert os.environ[faults.REPORT_VARIABLE] == path
    assert not stale.exists() and not (tmp_path / f"{stale.name}.stop").exists()
    assert other.read_text() == "its own\n"
    assert faults.take_stop_note() is None
