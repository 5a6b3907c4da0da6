"""The test servers' zygote (tests/zygote.py) reports what a real process would.

The server tier forks most of its `vllm serve` processes from one that imported vLLM
once; these hold that a forked server's exit status, signal and log are what the tests
read from a real one, and that a server the zygote cannot stand for is a real process.
"""

from __future__ import annotations

import signal
import subprocess

import pytest

from tests import zygote
from tests.e2e.conftest import _environment

pytestmark = pytest.mark.server


def test_a_forked_server_exits_with_vllm_serves_status_and_logs_its_error(
    demo_checkpoint, tmp_path
):
    log = tmp_path / "server.log"
    server = zygote.start_server(
        demo_checkpoint, vllm_args=["--max-model-len", "-5"], env=_environment({}), log_path=log
    )
    assert isinstance(server.process, zygote.ForkedProcess)
    assert server.process.wait(120) != 0
    assert server.process.poll() == server.process.returncode
    text = log.read_text()
    assert "max_model_len" in text or "max-model-len" in text, text[-2000:]


def test_a_killed_forked_server_reports_the_signal_and_stop_is_idempotent(
    demo_checkpoint, tmp_path
):
    server = zygote.start_server(
        demo_checkpoint, env=_environment({}), log_path=tmp_path / "server.log"
    )
    process = server.process
    with pytest.raises(subprocess.TimeoutExpired):
        process.wait(0.1)
    process.send_signal(signal.SIGKILL)
    assert process.wait(60) == -signal.SIGKILL
    assert server.stop(5) == -signal.SIGKILL


def test_only_servers_on_the_zygotes_platform_are_forked():
    assert zygote.forkable(_environment({}))
    assert zygote.forkable(_environment({"EXTRA_MODELS_DIR": "/elsewhere"}))
    assert not zygote.forkable(_environment({"MESH_DEVICE": "N150"}))
    assert not zygote.forkable(_environment({"VLLM_PLUGINS": "tt"}))
