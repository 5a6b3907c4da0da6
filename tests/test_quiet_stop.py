"""A requested stop is quiet (`ttbundles.serving.api_server.shutdown`), each part in a Python of its
own (the state is per process, as in `vllm serve`): real vLLM, real logging, a real exit.
The end-to-end tests (tests/e2e/test_faults.py, test_several_hosts.py) read whole server
outputs; these pin each rule, including what must stay loud."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

LOGGING = """
import logging, sys
handler = logging.StreamHandler(sys.stdout)
handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
logging.getLogger("vllm").addHandler(handler)
"""


def run(*parts: str) -> subprocess.CompletedProcess:
    """The parts (each dedented) run as one script, on the TT platform (host mesh)."""
    env = {**os.environ, "MESH_DEVICE": "HOST", "VLLM_CONFIGURE_LOGGING": "0"}
    return subprocess.run(
        [sys.executable, "-c", "\n".join(textwrap.dedent(part) for part in parts)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )


@pytest.mark.server  # vLLM in a process of its own
def test_the_engine_dead_record_is_dropped_only_after_a_requested_stop():
    done = run(
        LOGGING,
        """
        from vllm.v1.engine.exceptions import EngineDeadError
        from ttbundles.serving import compat
        from ttbundles.serving.api_server import shutdown

        name = "vllm.v1.engine.async_llm"
        (message,) = compat.engine_dead_reports()[name]
        log = logging.getLogger(name)
        assert shutdown.drop_shutdown_echo() and not shutdown.drop_shutdown_echo()

        def fail(error, label):
            try:
                raise error
            except Exception:
                log.exception(message)
            print("after", label)

        fail(EngineDeadError(), "unrequested")  # an engine that died: kept
        shutdown.note_stop("by SIGTERM")
        fail(EngineDeadError(), "requested")  # the stop's own echo: dropped
        fail(RuntimeError("real"), "another error")  # kept
        """,
    )
    assert done.returncode == 0, done.stderr
    out = done.stdout
    first, rest = out.split("after unrequested", 1)
    assert "EngineDeadError" in first and "Traceback" in first
    requested, other = rest.split("after requested", 1)
    assert "ERROR" not in requested and "Traceback" not in requested
    assert "RuntimeError: real" in other


@pytest.mark.server  # vLLM in a process of its own
def test_after_a_requested_stop_the_process_ends_with_one_line_and_status_0():
    done = run(
        """
        import atexit
        from ttbundles.serving.api_server import shutdown

        atexit.register(shutdown.exit_after_requested_stop)
        shutdown.note_stop("by SIGINT")
        shutdown.note_stop("by SIGTERM")  # the first reason stands
        print("served")
        """
    )
    assert done.returncode == 0
    assert done.stdout == "served\n"
    assert done.stderr == "ttbundles: vllm serve stopped by SIGINT; exiting with status 0\n"


@pytest.mark.server  # vLLM in a process of its own
def test_an_error_after_a_requested_stop_keeps_its_traceback_and_status():
    done = run(
        """
        import atexit
        from ttbundles.serving.api_server import shutdown

        atexit.register(shutdown.exit_after_requested_stop)
        shutdown.note_stop("by SIGTERM")
        raise RuntimeError("broke while stopping")
        """
    )
    assert done.returncode == 1
    assert "Traceback" in done.stderr and "RuntimeError: broke while stopping" in done.stderr
    assert "stopped" not in done.stderr


@pytest.mark.server  # vLLM in a process of its own
def test_without_a_requested_stop_the_exit_is_left_alone():
    done = run(
        """
        import atexit, sys
        from ttbundles.serving.api_server import shutdown

        atexit.register(shutdown.exit_after_requested_stop)
        sys.exit(3)
        """
    )
    assert done.returncode == 3 and done.stderr == ""


@pytest.mark.server  # vLLM in a process of its own
def test_the_engine_teardown_passes_only_the_missing_accelerator_error():
    """vLLM's own cleanup on the TT platform with the CPU torch raises; wrapped, it
    ends; another RuntimeError from it still propagates."""
    done = run(
        """
        import torch
        from ttbundles.serving import compat
        from ttbundles.serving.api_server import shutdown

        core = compat.engine_core_module()
        assert not torch.accelerator.is_available()
        try:
            core.cleanup_dist_env_and_memory()
        except RuntimeError as error:
            print("unwrapped:", error)
        assert shutdown.tolerate_no_accelerator_at_cleanup()
        assert not shutdown.tolerate_no_accelerator_at_cleanup()
        core.cleanup_dist_env_and_memory()
        print("wrapped: ended")

        def broken():
            raise RuntimeError("gloo group did not close")

        torch.accelerator.empty_cache = broken
        try:
            core.cleanup_dist_env_and_memory()
        except RuntimeError as error:
            print("other:", error)
        """
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines == [
        f"unwrapped: {shutdown_message()}.",
        "wrapped: ended",
        "other: gloo group did not close",
    ]


def shutdown_message() -> str:
    from ttbundles.serving.api_server.shutdown import NO_ACCELERATOR

    return NO_ACCELERATOR


def test_the_engine_dead_reports_are_where_the_installed_vllm_logs_them():
    """Each (logger, message) of `compat.engine_dead_reports` is a `logger.exception`
    call in the module of that name: a vLLM that moved one fails here, not silently."""
    import importlib
    import inspect
    import re

    from ttbundles.serving import compat

    for name, messages in compat.engine_dead_reports().items():
        source = inspect.getsource(importlib.import_module(name))
        for message in messages:
            call = re.compile(r"logger\.exception\(\s*" + re.escape(f'"{message}"'))
            assert call.search(source), (name, message)
