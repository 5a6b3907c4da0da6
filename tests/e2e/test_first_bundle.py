"""A new author's first bundle, as the docs' first-bundle page walks it: `ttbundle init
--reference` for LlamaForCausalLM, then validate --strict, pack, test, install and `vllm
serve`, each typed as a shell command line, on a machine without a card (issue 35)."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import _TTBUNDLE_ENV
from tests.e2e.conftest import Reference
from ttbundles.demo.server import free_port

BIN = str(Path(sys.executable).parent)
PROMPTS = ["The capital of France is", "Once upon a time, there was a"]
MAX_TOKENS = 12


def shell_environment(home: Path) -> dict[str, str]:
    """A user's shell: the environment's commands first on PATH, none of the session's
    ttbundle variables, no model hub, and the host mesh asked for as the docs say."""
    env = {k: v for k, v in os.environ.items() if k not in _TTBUNDLE_ENV}
    env.pop("VLLM_PLUGINS", None)
    env.update(
        PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}",
        NO_COLOR="1",
        TERM="dumb",
        HF_HUB_OFFLINE="1",
        MESH_DEVICE="HOST",
        XDG_CACHE_HOME=str(home / ".cache"),
    )
    return env


def typed(line: str, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """Run `line` as a shell runs what a user types; its stdout (a failure shows both)."""
    done = subprocess.run(
        ["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"$ {line}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


@contextlib.contextmanager
def typed_server(cwd: Path, env: dict[str, str], args: str = "") -> Iterator[tuple[int, Path]]:
    """`vllm serve ckpt` of the bundles in `cwd/models`, typed as a user types it, its
    output in `cwd/serve.log`: (its port, the log) once it answers /health; stopped
    (its whole process group) on the way out."""
    port = free_port()
    log = cwd / "serve.log"
    line = f"EXTRA_MODELS_DIR=models vllm serve ckpt --served-model-name ckpt --port {port} {args}"
    with log.open("w") as sink:
        server = subprocess.Popen(
            ["bash", "-c", line],
            cwd=cwd,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while True:
            assert server.poll() is None, log.read_text()[-4000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < deadline, log.read_text()[-4000:]
                time.sleep(1)
        yield port, log
    finally:
        # Its own session: the group holds the shell, vllm and the engine core.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            server.wait()


@contextlib.contextmanager
def forked_server(
    cwd: Path, env: dict[str, str], args: str = "", log_name: str = "serve.log"
) -> Iterator[tuple[int, Path]]:
    """`typed_server`'s server (`vllm serve ckpt` of the bundles in `cwd/models`, its log
    `cwd/serve.log`) forked from the session's zygote (`tests/zygote.py`): the same
    `main()` with the same arguments and environment (its log `cwd/log_name`), without
    the two imports of vLLM a
    typed one pays (its command and its spawned engine core). For the whole-way tests
    whose point is the bundle's path, not the shell's; `test_first_bundle` types it."""
    from tests.zygote import start_server

    server = start_server(
        cwd / "ckpt",
        vllm_args=["--served-model-name", "ckpt", *shlex.split(args)],
        env={**env, "EXTRA_MODELS_DIR": str(cwd / "models")},
        log_path=cwd / log_name,
    )
    try:
        server.wait_ready()
        yield int(server.base_url.rsplit(":", 1)[1]), cwd / log_name
    finally:
        server.stop()


def completion(port: int, prompt: str) -> tuple[list[int], list[int] | None]:
    """Greedy token ids of one completion (temperature 0), and the prompt's ids."""
    body = {
        "model": "ckpt",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 0,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as answer:
        choice = json.load(answer)["choices"][0]
    return choice["token_ids"], choice.get("prompt_token_ids")


@pytest.mark.server
def test_a_reference_bundle_from_init_to_vllm_serve(tmp_path):
    env = shell_environment(tmp_path)
    typed("ttbundle demo --write-checkpoint ckpt", tmp_path, env, timeout=300)
    created = typed("ttbundle init my-llama --arch LlamaForCausalLM --reference", tmp_path, env)
    assert created.strip() == "my-llama"
    assert "valid (0 errors, 0 warnings" in typed(
        "ttbundle validate --strict my-llama", tmp_path, env
    )
    assert typed("ttbundle pack my-llama -o dist", tmp_path, env).strip() == (
        "dist/my-llama-0.1.0.ttbundle"
    )
    tested = typed("ttbundle test my-llama --model ckpt --golden transformers", tmp_path, env)
    assert "PASSED" in tested and "FAIL" not in tested
    typed("ttbundle install dist/my-llama-0.1.0.ttbundle --models-dir models", tmp_path, env)

    with typed_server(tmp_path, env) as (port, log):
        assert "my-llama@0.1.0" in log.read_text(), "the installed bundle serves, not the demo"
        reference = Reference(tmp_path / "ckpt")
        for prompt in PROMPTS:
            served, prompt_ids = completion(port, prompt)
            prompt_ids = prompt_ids or reference.tokenizer(prompt)["input_ids"]
            assert served == reference.greedy(list(prompt_ids), MAX_TOKENS), prompt
