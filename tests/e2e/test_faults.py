"""Faults at the edges, with a real `vllm serve`: broken bundles at startup, an adapter
that fails at import, a generator that raises in a step, and stopping the server.

Each test starts its own server (the faults are process environment, fixed at start).
Bounds stated per test; they are generous for these shared 2-core machines.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests import zygote
from tests.e2e.conftest import LOGGING_CONFIG, _environment, assert_stopped_quietly
from tests.e2e.test_dropin_serving import PROMPT, SERVE_ARGS, serve
from ttbundles.paths import builtin_bundles_dir

pytestmark = pytest.mark.server

STARTUP_TIMEOUT = 300
SYNTAX_ERROR = "class DemoGenerator:\n    def oops(:\n        pass\n"


def demo_copy(models: Path, name: str, *, arch: str | None = None, edit=None) -> Path:
    """The built-in demo bundle copied as `name` (optionally for another `arch`), its
    adapter passed through `edit`; without the demo's evidence, which the edits stale."""
    folder = models / name
    shutil.copytree(
        builtin_bundles_dir() / "demo",
        folder,
        ignore=shutil.ignore_patterns("__pycache__", "evidence"),
    )
    meta = folder / "vllm_metadata.json"
    document = json.loads(meta.read_text())
    document["name"] = name
    if arch is not None:
        document["arch"] = arch
    meta.write_text(json.dumps(document, indent=2))
    if edit is not None:
        adapter = folder / "adapter.py"
        adapter.write_text(edit(adapter.read_text()))
    return folder


def run_to_exit(checkpoint: Path, tmp_path: Path, extra: dict[str, str]) -> tuple[int, str]:
    """`vllm serve` expected to stop by itself: (exit code, its whole output)."""
    logging_config = tmp_path / "logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    env = _environment({"VLLM_LOGGING_CONFIG_PATH": str(logging_config), **extra})
    return zygote.run_to_exit(
        checkpoint,
        vllm_args=SERVE_ARGS,
        env=env,
        log_path=tmp_path / "server.log",
        timeout=STARTUP_TIMEOUT,
    )


def api_server_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if line.startswith("(APIServer")]


# --- broken bundles at startup ------------------------------------------------------------


def test_strict_with_broken_json_stops_with_one_message(tmp_path, demo_checkpoint):
    models = tmp_path / "models"
    (models / "broken").mkdir(parents=True)
    (models / "broken" / "vllm_metadata.json").write_text("{not json")
    code, output = run_to_exit(
        demo_checkpoint, tmp_path, {"EXTRA_MODELS_DIR": str(models), "TT_BUNDLES_STRICT": "1"}
    )
    assert code == 1
    assert f"{models / 'broken' / 'vllm_metadata.json'}:1:2: error TTB010: invalid JSON" in output
    assert "Traceback" not in output


@pytest.mark.parametrize("served", [True, False], ids=["served-arch", "other-arch"])
def test_strict_refuses_a_broken_adapter(tmp_path, demo_checkpoint, served):
    models = tmp_path / "models"
    arch = None if served else "OtherForCausalLM"
    demo_copy(models, "mine", arch=arch, edit=lambda _: SYNTAX_ERROR)
    code, output = run_to_exit(
        demo_checkpoint, tmp_path, {"EXTRA_MODELS_DIR": str(models), "TT_BUNDLES_STRICT": "1"}
    )
    assert code == 1
    assert f"{models / 'mine' / 'adapter.py'}:2:14: error TTB051: syntax error" in output
    assert "Traceback" not in output


def test_broken_adapters_are_skipped_and_the_built_in_serves(tmp_path, demo_checkpoint):
    """Without strict mode: an extra bundle for the served architecture and one for
    another, both with syntax errors, are skipped with one WARNING line each in the API
    server's log; the built-in demo bundle serves, and the table says so."""
    models = tmp_path / "models"
    demo_copy(models, "mine", edit=lambda _: SYNTAX_ERROR)
    demo_copy(models, "other", arch="OtherForCausalLM", edit=lambda _: SYNTAX_ERROR)
    server = serve(tmp_path, demo_checkpoint, {"EXTRA_MODELS_DIR": str(models)}, SERVE_ARGS)
    try:
        with server.client() as client:
            response = client.completions.create(
                model=server.model, prompt=PROMPT, max_tokens=4, temperature=0
            )
        assert response.choices[0].text is not None
        api = api_server_lines(server.log_since(0))
        for name in ("mine", "other"):
            warnings = [
                line
                for line in api
                if " WARNING " in line and f"{models / name / 'adapter.py'}:2:14" in line
            ]
            assert len(warnings) == 1, warnings
            assert "TTB051" in warnings[0] and "fix the Python syntax" in warnings[0]
        (fallback,) = [line for line in api if "serves TTLlamaForCausalLM instead" in line]
        assert " WARNING " in fallback and "extra bundle mine@1.0.0" in fallback
        assert "demo@1.0.0 (built-in" in fallback
        assert any("serving TTLlamaForCausalLM with demo@1.0.0 (built-in" in line for line in api)
    finally:
        server.process.stop()


# --- an adapter that fails at import --------------------------------------------------------


def test_an_adapter_raising_at_import_stops_with_one_line(tmp_path, demo_checkpoint):
    models = tmp_path / "models"

    def raising(text: str) -> str:
        return text.replace(
            "from typing import Any\n",
            'from typing import Any\n\nraise RuntimeError("no device here")\n',
            1,
        )

    demo_copy(models, "mine", edit=raising)
    code, output = run_to_exit(demo_checkpoint, tmp_path, {"EXTRA_MODELS_DIR": str(models)})
    assert code == 1
    assert "Traceback" not in output
    (line,) = [x for x in output.splitlines() if "the engine cannot start" in x]
    assert line.startswith("(EngineCore") and " ERROR " in line
    for part in (
        "TTB060",
        "mine@1.0.0",
        " adapter:DemoGenerator",  # as the bundle wrote it, not its internal package
        "RuntimeError: no device here",
        f"ttbundle validate --import {models / 'mine'}",
    ):
        assert part in line
    assert "_ttb_" not in output
    # The API server ends with the engine's line, not vLLM's traceback.
    assert output.rstrip().splitlines()[-1].startswith("ttbundles: the engine did not start:")


def test_the_scaffolded_template_served_stops_with_one_line_naming_the_bundle(
    tmp_path, demo_checkpoint, run_cli
):
    """`ttbundle init` then `vllm serve` as scaffolded: initialize_vllm_model raises
    NotImplementedError; one line names the bundle by its name, the class and the
    method, with no traceback and no internal package name."""
    models = tmp_path / "models"
    models.mkdir()
    assert run_cli("init", "my-llama", "--arch", "LlamaForCausalLM", cwd=models).returncode == 0
    extra = {"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0"}
    code, output = run_to_exit(demo_checkpoint, tmp_path, extra)
    assert code == 1
    assert "Traceback" not in output and "_ttb_" not in output
    expected = (
        "my-llama@0.1.0: error TTB063: TTLlamaForCausalLMGenerator.initialize_vllm_model "
        "raised NotImplementedError while loading the model"
    )
    (line,) = [x for x in output.splitlines() if "the engine cannot start" in x]
    assert expected in line
    assert (
        output.rstrip()
        .splitlines()[-1]
        .startswith(f"ttbundles: the engine did not start: {expected}")
    )


# --- a generator that raises inside a step ----------------------------------------------------


def test_a_generator_raising_in_decode_is_named_and_the_server_exits(tmp_path, demo_checkpoint):
    """decode_forward raises: one line names bundle, method, step kind and batch size
    before vLLM's report, and `vllm serve` exits non-zero (within 120 s)."""
    models = tmp_path / "models"

    def raising(text: str) -> str:
        call = "    ) -> Any:\n        return super().decode_forward("
        assert call in text
        return text.replace(
            call,
            '    ) -> Any:\n        raise RuntimeError("decode exploded")\n'
            "        return super().decode_forward(",
        )

    demo_copy(models, "mine", edit=raising)
    server = serve(tmp_path, demo_checkpoint, {"EXTRA_MODELS_DIR": str(models)}, SERVE_ARGS)
    try:
        with server.client() as client, pytest.raises(Exception):  # noqa: B017, PT011
            client.completions.create(
                model=server.model, prompt=PROMPT, max_tokens=4, temperature=0
            )
        server.process.process.wait(120)
        assert server.process.process.returncode not in (0, None)
        log = server.log_since(0)
        lines = log.splitlines()
        (named,) = [
            i
            for i, x in enumerate(lines)
            if x.startswith("(EngineCore") and "raised RuntimeError: decode exploded" in x
        ]
        assert "mine@1.0.0: DemoGenerator.decode_forward raised" in lines[named]
        assert "in a decode step of batch size 1" in lines[named]
        report = [i for i, x in enumerate(lines) if "EngineCore encountered a fatal error" in x]
        assert report and report[0] > named
        # The API server repeats it as it exits with status 1 (vLLM's own would be 0).
        assert lines[-1].startswith("ttbundles: the engine failed: mine@1.0.0")
        # Not a requested stop: vLLM's report keeps its tracebacks, and no "stopped" line.
        assert "Traceback" in log and "AsyncLLM output_handler failed" in log
        assert not any(" stopped " in x and x.startswith("ttbundles:") for x in lines)
    finally:
        server.process.stop()


# --- stopping ----------------------------------------------------------------------------------


def _children(pid: int) -> list[int]:
    out = subprocess.run(["ps", "-o", "pid=", "--ppid", str(pid)], capture_output=True, text=True)
    return [int(p) for p in out.stdout.split()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
        return handle.read().split(")")[-1].split()[0] != "Z"


def _engine_pid(api_pid: int) -> int:
    for child in _children(api_pid):
        with open(f"/proc/{child}/cmdline", "rb") as handle:
            if b"resource_tracker" not in handle.read():
                return child
    raise AssertionError("no engine-core process under the API server")


def _wait_gone(pid: int, bound: float) -> float:
    start = time.monotonic()
    while _alive(pid):
        assert time.monotonic() - start < bound, f"pid {pid} still alive after {bound} s"
        time.sleep(0.2)
    return time.monotonic() - start


def _slow_start(text: str) -> str:
    return text.replace(
        "    ) -> DemoGenerator:\n        return super().initialize_vllm_model(",
        "    ) -> DemoGenerator:\n        import time\n\n        time.sleep(600)\n"
        "        return super().initialize_vllm_model(",
        1,
    )


@pytest.mark.parametrize("target", ["api-server", "group"])
def test_sigterm_while_the_engine_starts_stops_everything(tmp_path, demo_checkpoint, target):
    """The generator takes 10 minutes to load; SIGTERM then, to the process group (what
    systemd and `ServerProcess.stop` do) or to the API server alone (what Kubernetes
    does): the API server and the engine are gone within 30 s. Without the platform's
    handlers vLLM's API server waits in a blocking poll for the engine, which keeps
    loading (measured: 30 s to over 2 minutes before the API server acted)."""
    from ttbundles.demo.server import start_server

    models = tmp_path / "models"
    demo_copy(models, "slow", edit=_slow_start)
    logging_config = tmp_path / "logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    env = _environment(
        {"VLLM_LOGGING_CONFIG_PATH": str(logging_config), "EXTRA_MODELS_DIR": str(models)}
    )
    log_path = tmp_path / "server.log"
    process = start_server(demo_checkpoint, vllm_args=SERVE_ARGS, env=env, log_path=log_path)
    bound = 30
    try:
        start = time.monotonic()
        while "ttbundles: opening mesh" not in log_path.read_text(errors="replace"):
            assert process.is_running() and time.monotonic() - start < STARTUP_TIMEOUT
            time.sleep(0.5)
        time.sleep(2)  # inside the generator's load
        engine = _engine_pid(process.process.pid)
        if target == "group":
            os.killpg(process.process.pid, signal.SIGTERM)
        else:
            process.process.send_signal(signal.SIGTERM)
        took = _wait_gone(process.process.pid, bound)
        _wait_gone(engine, bound - took)
        log = log_path.read_text(errors="replace")
        assert "SIGTERM while the engine is starting; stopping it now" in log
        assert "Traceback" not in log and "nanobind" not in log, log[-3000:]
        assert log.rstrip().splitlines()[-1] == (
            "ttbundles: vllm serve stopped by SIGTERM while starting"
        ), log[-3000:]
    finally:
        process.stop()


STEP_SLEEP = 0.2  # per decode step: a 200-token stream takes 40 s, over the 30 s bound


def _slow_decode(text: str) -> str:
    call = "    ) -> Any:\n        return super().decode_forward("
    assert call in text
    return text.replace(
        call,
        f"    ) -> Any:\n        import time\n\n        time.sleep({STEP_SLEEP})\n"
        "        return super().decode_forward(",
        1,
    )


def test_sigterm_under_traffic_finishes_or_closes_responses_promptly(tmp_path, demo_checkpoint):
    """Eight streams in flight (four decoding, each past its first chunk, and four
    waiting for a slot: `--max-num-seqs 4`), then SIGTERM to the API server, and one more
    call right after it: every client call returns within 30 s of the signal, none of the
    eight having run to its length, and the server is gone by then.

    Decode steps are slowed so that no stream can finish by itself within the bound. vLLM
    0.33 alone leaves such streams open for good most of the time (its output handler is
    cancelled before it errors them, `serving/api_server/shutdown.py`): they hung until the client
    timed out, and the API server with them."""
    models = tmp_path / "models"
    demo_copy(models, "slow", edit=_slow_decode)
    server = serve(tmp_path, demo_checkpoint, {"EXTRA_MODELS_DIR": str(models)}, SERVE_ARGS)
    streams = [{} for _ in range(8)]
    late: dict = {}
    bound = 30

    def stream(record: dict) -> None:
        try:
            with server.client() as client:
                chunks = client.completions.create(
                    model=server.model,
                    prompt=PROMPT,
                    max_tokens=200,
                    stream=True,
                    extra_body={"ignore_eos": True},
                )
                record["open"] = True
                for chunk in chunks:
                    record["chunks"] = record.get("chunks", 0) + 1
                    if chunk.choices and chunk.choices[0].finish_reason:
                        record["finish_reason"] = chunk.choices[0].finish_reason
            record["outcome"] = "finished"
        except Exception as exc:  # noqa: BLE001 - closed by the server: what we measure
            record["outcome"] = type(exc).__name__
        record["at"] = time.monotonic()

    def one_more() -> None:
        try:
            with server.client() as client:
                client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4)
            late["outcome"] = "finished"
        except Exception as exc:  # noqa: BLE001 - refused or closed: either is an answer
            late["outcome"] = type(exc).__name__
        late["at"] = time.monotonic()

    threads = [threading.Thread(target=stream, args=(r,), daemon=True) for r in streams]
    try:
        for thread in threads:
            thread.start()
        start = time.monotonic()
        while not (
            all(r.get("open") for r in streams) and sum("chunks" in r for r in streams) >= 4
        ):
            assert time.monotonic() - start < STARTUP_TIMEOUT, f"streams not open: {streams}"
            assert not any("outcome" in r for r in streams), f"a stream ended early: {streams}"
            time.sleep(0.05)
        assert not any("outcome" in r for r in streams), f"a stream ended early: {streams}"
        sent = time.monotonic()
        server.process.process.send_signal(signal.SIGTERM)
        after = threading.Thread(target=one_more, daemon=True)
        after.start()
        for thread in [*threads, after]:
            thread.join(max(0.0, sent + bound - time.monotonic()))
        assert all("at" in r for r in streams), f"streams still open after {bound} s: {streams}"
        assert "at" in late, f"the call made after SIGTERM was still open after {bound} s"
        assert not any(r.get("finish_reason") == "length" for r in streams), streams
        _wait_gone(server.process.process.pid, max(0.0, sent + bound - time.monotonic()))
        # A requested stop, with requests in flight: status 0, no traceback, one line.
        code = server.process.process.wait(5)
        log = server.log_since(0)
        assert code == 0, f"exit status {code}; the server's log ends:\n{log[-4000:]}"
        assert_stopped_quietly(server.log_since(0), "vllm serve", "by SIGTERM")
    finally:
        server.process.stop()


def test_ctrl_c_stops_the_server_quietly(tmp_path, demo_checkpoint):
    """Ctrl-C (SIGINT to the whole process group, the API server and its engine alike)
    after a request: the server exits 0, and its whole output has no traceback, no
    "engine dead" report, no native leak dump, and ends with one line saying why."""
    server = serve(tmp_path, demo_checkpoint, {}, SERVE_ARGS)
    try:
        with server.client() as client:
            client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4)
        os.killpg(server.process.process.pid, signal.SIGINT)
        assert server.process.process.wait(60) == 0
        assert_stopped_quietly(server.log_since(0), "vllm serve", "by SIGINT")
    finally:
        server.process.stop()


def test_a_killed_engine_still_shows_its_traceback(tmp_path, demo_checkpoint):
    """kill -9 of the engine, which nobody asked to stop: the API server reports it as
    vLLM does (the engine-dead traceback) and ends without the "stopped" line."""
    server = serve(tmp_path, demo_checkpoint, {}, SERVE_ARGS)
    try:
        with server.client() as client:  # the output handler runs from the first request
            client.completions.create(model=server.model, prompt=PROMPT, max_tokens=4)
        os.kill(_engine_pid(server.process.process.pid), signal.SIGKILL)
        server.process.process.wait(120)
        log = server.log_since(0)
        assert "AsyncLLM output_handler failed" in log and "Traceback" in log, log[-3000:]
        assert "EngineDeadError" in log
        assert "stopped by" not in log
    finally:
        server.process.stop()


def test_the_engine_stops_when_its_api_server_is_killed(tmp_path, demo_checkpoint):
    """kill -9 of the API server: the engine-core process is gone within 15 s."""
    server = serve(tmp_path, demo_checkpoint, {}, SERVE_ARGS)
    try:
        engine = _engine_pid(server.process.process.pid)
        server.process.process.kill()
        server.process.process.wait(10)
        _wait_gone(engine, 15)
    finally:
        server.process.stop()
