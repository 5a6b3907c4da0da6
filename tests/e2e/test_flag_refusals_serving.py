"""A real `vllm serve` refused by its flags alone: the one line `ttbundle plan` gives
(tests/test_flag_refusals.py), before vLLM's own checks and before its engine starts (no
engine core, no traceback: a KV connector used to end in three tracebacks after 35 s,
sleep mode in vLLM's pydantic error)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from tests import zygote

pytestmark = pytest.mark.server

VLLM = str(Path(sys.executable).parent / "vllm")


@pytest.mark.parametrize(
    "flags,line",
    [
        pytest.param(
            [
                "--kv-transfer-config",
                json.dumps({"kv_connector": "ExampleConnector", "kv_role": "kv_both"}),
            ],
            "error TTB202: --kv-transfer-config (ExampleConnector): moving KV caches between "
            "instances is not supported yet on Tenstorrent",
            id="kv-transfer",
        ),
        pytest.param(
            ["--enable-sleep-mode"],
            "error TTB202: --enable-sleep-mode: sleep mode",
            id="sleep-mode",
        ),
    ],
)
def test_vllm_serve_refuses_a_flag_in_one_line_before_its_engine(demo_checkpoint, flags, line):
    env = {
        k: v for k, v in os.environ.items() if k not in ("EXTRA_MODELS_DIR", "VLLM_LOGGING_LEVEL")
    }
    env.update({"NO_COLOR": "1", "MESH_DEVICE": "HOST"})
    command = [VLLM, "serve", str(demo_checkpoint), "--port", "0", *flags]
    code, output = zygote.run(command, env, timeout=300)
    assert code == 1, output
    [only] = [x for x in output.splitlines() if x.strip()]
    assert only.startswith(line), only
    assert "(fix: drop " in only
