"""The reference plugin's deployment surface, served: `vllm serve` started the way a
deployment written for the reference Tenstorrent plugin starts it.

Each test starts its own server, one at a time (not the shared servers of conftest.py):
the plugin filter and the overrides are process environment, fixed at start.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import LOGGING_CONFIG, Server, _environment
from tests.zygote import start_server
from ttbundles.errors import TTBundleError

pytestmark = pytest.mark.server

READY_TIMEOUT = 300.0
SERVE_ARGS = ["--max-model-len", "256", "--max-num-seqs", "4"]
PROMPT = [1, 40, 41, 42, 43, 44, 45, 46]  # token ids: independent of the tokenizer's text
# The startup table, once per process that registers (its pid comes from LOGGING_CONFIG).
TABLE = re.compile(r"pid=(\d+)\) INFO .* ttbundles: \d+ bundles for mesh")

# A generator module outside any bundle, named by TT_MODEL_CLASS_OVERRIDES. Its
# capabilities are read from this source at registration: no async decode declared.
OVERRIDE_MODULE = '''"""The reference generator, chosen at launch for the demo checkpoint."""

from ttbundles.reference.generator import ReferenceLlamaGenerator


class LaunchGenerator(ReferenceLlamaGenerator):
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": 20,
    }
'''


def serve(tmp_path: Path, checkpoint: Path, extra_env: dict[str, str], args: list[str]) -> Server:
    logging_config = tmp_path / "logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    env = _environment({"VLLM_LOGGING_CONFIG_PATH": str(logging_config), **extra_env})
    log_path = tmp_path / "server.log"
    process = start_server(checkpoint, vllm_args=args, env=env, log_path=log_path)
    server = Server("dropin", process, str(checkpoint), log_path, tmp_path / "stats.json")
    try:
        process.wait_ready(READY_TIMEOUT)
    except TTBundleError as exc:
        process.stop()
        pytest.fail(f"the server did not start: {exc}", pytrace=False)
    return server


@pytest.fixture
def reference_plugin_filter(tmp_path, demo_checkpoint) -> Iterator[Server]:
    """The demo checkpoint on the host mesh, with the reference plugin's filter."""
    server = serve(tmp_path, demo_checkpoint, {"VLLM_PLUGINS": "tt_model_registry,tt"}, SERVE_ARGS)
    try:
        yield server
    finally:
        server.process.stop()


def greedy_ids(server: Server, max_tokens: int = 12) -> list[int]:
    with server.client() as client:
        response = client.completions.create(
            model=server.model,
            prompt=PROMPT,
            max_tokens=max_tokens,
            temperature=0.0,
            extra_body={"ignore_eos": True, "return_token_ids": True},
        )
    return list(response.choices[0].model_extra["token_ids"])


def test_reference_plugin_filter_serves_the_demo(reference_plugin_filter, reference):
    server = reference_plugin_filter
    assert server.process.is_running()
    assert greedy_ids(server) == reference.greedy(PROMPT, 12)
    log = server.log_since(0)
    assert "serving TTLlamaForCausalLM with demo@1.0.0 (built-in" in log
    assert TABLE.search(log), "tt_model_registry did not register"


def test_override_registers_and_serves(tmp_path, demo_checkpoint, reference):
    """TT_MODEL_CLASS_OVERRIDES names a generator on PYTHONPATH (no bundle): it wins over
    the built-in demo bundle, its capabilities are those its source declares, and it
    serves. Both registration names are allowed: each process still registers once."""
    modules = tmp_path / "pythonpath"
    modules.mkdir()
    (modules / "launch_override.py").write_text(OVERRIDE_MODULE)
    env = {
        "VLLM_PLUGINS": "tt,tt_model_registry,ttbundles",
        "TT_MODEL_CLASS_OVERRIDES": "LlamaForCausalLM=launch_override:LaunchGenerator",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(modules), os.environ.get("PYTHONPATH")])),
    }
    args = [
        *SERVE_ARGS,
        "--additional-config",
        json.dumps({"tt": {"sample_on_device_mode": "all"}}),
    ]
    server = serve(tmp_path, demo_checkpoint, env, args)
    try:
        assert greedy_ids(server) == reference.greedy(PROMPT, 12)
        log = server.log_since(0)
        assert "serving TTLlamaForCausalLM with override-ttllamaforcausallm@0 (override" in log
        assert "ttbundles: loaded TTLlamaForCausalLM (launch_override:LaunchGenerator" in log
        # No async decode in its model_capabilities: async scheduling is switched off.
        assert "async_scheduling: True -> False" in log
        assert "serving TTLlamaForCausalLM (override-ttllamaforcausallm@0)" in log
        pids = TABLE.findall(log)
        assert pids and len(pids) == len(set(pids)), "a process registered twice"
    finally:
        server.process.stop()


def test_malformed_override_stops_vllm_serve_with_its_message(demo_checkpoint):
    env = _environment({"TT_MODEL_CLASS_OVERRIDES": "LlamaForCausalLM=launch_override"})
    vllm = os.path.join(os.path.dirname(sys.executable), "vllm")
    done = subprocess.run(
        [vllm, "serve", str(demo_checkpoint), "--port", "0"],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    output = done.stdout + done.stderr
    assert done.returncode != 0
    assert (
        "error TTB104: TT_MODEL_CLASS_OVERRIDES item 'LlamaForCausalLM=launch_override'" in output
    )
    assert "Traceback" not in output
