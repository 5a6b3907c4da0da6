"""Shared fixtures: a bundle factory and a runner for the installed `ttbundle` command."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bundle_factory import contract_adapter, metadata

# The whole session runs with the TT platform on the host mesh, with only our vLLM plugins
# and no model hub. Set before anything imports vLLM: the platform is chosen once per
# process.
os.environ["MESH_DEVICE"] = "HOST"
os.environ["VLLM_PLUGINS"] = "tt,tt_model_registry"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# Registration keeps its index of checked bundles in the user cache: a session's own.
if "TTBUNDLES_TEST_KEEP_CACHE" not in os.environ:
    import tempfile

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="ttbundles-test-cache-")

# A generator that satisfies the whole contract, statically and at import.
ADAPTER = contract_adapter(
    "DemoGenerator",
    attributes="""\
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": False,
        "supports_sample_on_device": False,
    }
""",
)


def base_metadata(name: str) -> dict:
    """A valid v1 document whose main class is ADAPTER's (the one default document)."""
    return metadata(name, main_class="adapter:DemoGenerator", main_class_source="bundle")


@pytest.fixture
def make_bundle(tmp_path):
    """`make_bundle(name="demo", metadata=None, adapter=ADAPTER, files=None, parent=None)`.

    Writes `<parent or tmp_path>/<name>/` with vllm_metadata.json (base_metadata updated
    with `metadata`; a value of `...` removes the key; a `str` replaces the whole file),
    `adapter.py` (None: none) and `files` ({relative path: text}). Returns the folder.
    """

    def make(name="demo", *, metadata=None, adapter=ADAPTER, files=None, parent=None):
        folder = Path(parent or tmp_path) / name
        folder.mkdir(parents=True)
        if isinstance(metadata, str):
            text = metadata
        else:
            document = {**base_metadata(name), **(metadata or {})}
            document = {k: v for k, v in document.items() if v is not ...}
            text = json.dumps(document, indent=2) + "\n"
        (folder / "vllm_metadata.json").write_text(text, encoding="utf-8")
        if adapter is not None:
            (folder / "adapter.py").write_text(adapter, encoding="utf-8")
        for rel, content in (files or {}).items():
            (folder / rel).parent.mkdir(parents=True, exist_ok=True)
            (folder / rel).write_text(content, encoding="utf-8")
        return folder

    make.adapter = ADAPTER
    make.base_metadata = base_metadata
    return make


# Variables that change what ttbundle does; cleared so the caller's shell cannot leak in.
_TTBUNDLE_ENV = (
    "EXTRA_MODELS_DIR",
    "TT_VLLM_BUILTIN_MODELS",
    "TT_BUNDLES_STRICT",
    "MESH_DEVICE",
    "TT_BUNDLES_DEBUG",
    "TTBUNDLE_DEBUG",
    "TT_LLAMA_TEXT_VER",
    "TT_QWEN3_TEXT_VER",
    "TT_QWEN35_TEXT_VER",
    "TT_GEMMA4_TEXT_VER",
    "TT_MODEL_CLASS_OVERRIDES",
    "TT_BUNDLES_TRUST",
    "TT_BUNDLES_REGISTRY_USERNAME",
    "TT_BUNDLES_REGISTRY_PASSWORD",
    "TT_BUNDLES_REGISTRY_TIMEOUT",
    "DOCKER_CONFIG",
)
# The console script next to this interpreter: it imports the installed package, never the
# source tree (which `python -m` from the repo root would put first on sys.path).
TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")


def _run_cli(*args, env=None, cwd=None, timeout=60, stdin=subprocess.DEVNULL):
    environ = {k: v for k, v in os.environ.items() if k not in _TTBUNDLE_ENV}
    environ.update({"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"})
    environ.update(env or {})
    return subprocess.run(
        [TTBUNDLE, *map(str, args)],
        capture_output=True,
        text=True,
        env=environ,
        cwd=cwd,
        timeout=timeout,
        stdin=stdin,  # by default not a terminal: nothing may wait for an answer
    )


@pytest.fixture
def run_cli():
    """`run_cli(*args, env=None, cwd=None, stdin=DEVNULL)` -> CompletedProcess (text, captured)."""
    return _run_cli


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory) -> Path:
    """The demo checkpoint (a tiny Llama with tokenizer), written once per session."""
    from ttbundles.demo.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny-llama")


WINDOW = 8
"""The sliding window of `window_checkpoint`."""


@pytest.fixture(scope="session")
def window_checkpoint(tmp_path_factory) -> Path:
    """A tiny Mistral with `sliding_window=8` (the demo's tokenizer, its sizes): tokens
    past position 8 differ from full attention's."""
    from transformers import MistralConfig, MistralForCausalLM

    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    out = tmp_path_factory.mktemp("checkpoint") / "tiny-mistral-window"
    out.mkdir(parents=True)
    tokenizer = build_tokenizer(out)
    config = MistralConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        sliding_window=WINDOW,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    save_random(MistralForCausalLM(config), "MistralForCausalLM", out)
    return out


@pytest.fixture(scope="session")
def vision_golden(vision_checkpoint):
    """transformers' Qwen2.5-VL on the tiny vision checkpoint (`reference.vl_golden`)."""
    from ttbundles.reference.vl_golden import VisionGolden

    return VisionGolden(vision_checkpoint)


@pytest.fixture(scope="session")
def vision_checkpoint(tmp_path_factory) -> Path:
    """The tiny Qwen2.5-VL checkpoint (random weights, Qwen's special tokens, chat
    template, processor files), written once per session."""
    from ttbundles.demo.vision_checkpoint import write_vision_checkpoint

    return write_vision_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny-qwen2_5-vl")


@pytest.fixture(scope="session")
def moe_checkpoint(demo_checkpoint, tmp_path_factory) -> Path:
    """The demo checkpoint relabelled as a Mixtral (a mixture-of-experts config), for the
    refusals that look only at the config."""
    import shutil

    moe = tmp_path_factory.mktemp("checkpoint") / "tiny-mixtral"
    shutil.copytree(demo_checkpoint, moe)
    config = json.loads((moe / "config.json").read_text())
    config.update(
        {
            "architectures": ["MixtralForCausalLM"],
            "model_type": "mixtral",
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
        }
    )
    (moe / "config.json").write_text(json.dumps(config))
    return moe


def time_wait_port() -> int:
    """A loopback port held only by a closed connection in TIME_WAIT, as a server that
    just stopped leaves its port: its side closed first (checked in /proc/net/tcp)."""
    import socket

    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as vllm serve's listener
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    client = socket.create_connection(("127.0.0.1", port))
    accepted, _ = server.accept()
    accepted.close()  # the server side closes first: its end waits in TIME_WAIT
    client.close()
    server.close()
    local = f"0100007F:{port:04X}"
    states = [
        fields[3]
        for fields in (line.split() for line in Path("/proc/net/tcp").read_text().splitlines()[1:])
        if fields[1] == local
    ]
    assert states == ["06"], f"port {port} is not (only) in TIME_WAIT: {states}"
    return port
