"""Shared fixtures: a bundle factory and a runner for the installed `ttbundle` command."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.bundle_factory import contract_adapter, metadata

# The whole session runs with the TT platform on the host mesh, with only our vLLM plugins
# and no model hub. Set before anything imports vLLM: the platform is chosen once per
# process.
os.environ["MESH_DEVICE"] = "HOST"
os.environ["VLLM_PLUGINS"] = "tt,tt_model_registry"
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
# The servers the tests start fork vLLM's engine core from the API server (vLLM's own
# default method) instead of spawning a fresh interpreter that imports vLLM again (the
# `vllm` command's default): about 8 s less per server start on 2 cores. The `ttbundle
# demo` tests run without it, as users run it (tests/e2e/test_serving.py).
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "fork")
# A shell without job control starts background commands (`.ci/run &`) with SIGINT
# ignored, and every process they start inherits that: a test sending Ctrl-C to a
# command would find it deaf. The session handles it as Python does by default, so the
# processes it starts get SIGINT's default again (a handler, unlike "ignore", is reset
# at exec).
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
# What the runs keep between sessions and share between their processes: the real model
# (tests/e2e/conftest.py) and vLLM's cache. vLLM learns what a model class is (its
# `_ModelInfo`) in a new interpreter that imports vLLM again, about 10 s of CPU, unless
# its cache under VLLM_CACHE_ROOT holds the answer (keyed by the class's source): kept
# per release (the record differs between them), every configuration and server of the
# run, on any worker, asks once per class, and a later run not at all.
TEST_STORE = Path(
    os.environ.get("TTBUNDLES_TEST_MODELS") or Path(__file__).parents[1] / ".test-models"
)


def _vllm_release() -> str | None:
    """The installed vLLM's release (without a local build tag), or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("vllm").split("+")[0]
    except PackageNotFoundError:
        return None


os.environ.setdefault("VLLM_CACHE_ROOT", str(TEST_STORE / f"vllm-cache-{_vllm_release()}"))
# Registration keeps its index of checked bundles in the user cache: a session's own.
# Removed when the session's process ends (the real model lives elsewhere: e2e/conftest).
if "TTBUNDLES_TEST_KEEP_CACHE" not in os.environ:
    import atexit
    import shutil
    import tempfile

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="ttbundles-test-cache-")
    atexit.register(shutil.rmtree, os.environ["XDG_CACHE_HOME"], ignore_errors=True)

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
# The console script next to this interpreter, for the tests of what only a process shows
# (the console script itself, exit codes, a terminal, signals): `run_cli_process`.
TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")


def _cli_environment(env: dict[str, str] | None) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if k not in _TTBUNDLE_ENV}
    environ.update({"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb"})
    environ.update(env or {})
    return environ


def _run_cli_process(*args, env=None, cwd=None, timeout=60, stdin=subprocess.DEVNULL):
    return subprocess.run(
        [TTBUNDLE, *map(str, args)],
        capture_output=True,
        text=True,
        env=_cli_environment(env),
        cwd=cwd,
        timeout=timeout,
        stdin=stdin,  # by default not a terminal: nothing may wait for an answer
    )


class _Captured(io.StringIO):
    """A captured standard stream: not a terminal, as a pipe to a test is not."""

    def isatty(self) -> bool:
        return False


def _run_cli_in_process(*args, env=None, cwd=None, timeout=None, stdin=subprocess.DEVNULL):
    """`ttbundle ARGS` in this process, as the console script runs it (the app's own
    entry, `answer`: its error presentation and exit codes), with the environment, the
    working folder, the standard streams and the signal handlers it would have had in a
    process of its own, and all of them put back after.

    `timeout` is accepted for the callers' sake and not enforced: a command that hangs
    hangs the test, which pytest's own report shows. Only an empty standard input can be
    given (`subprocess.DEVNULL`); a test that needs a terminal or a pipe uses
    `run_cli_process`.
    """
    from ttbundles.cli.app import answer

    assert stdin is subprocess.DEVNULL, "in-process: stdin is empty; use run_cli_process"
    argv = [str(a) for a in args]
    saved_env = dict(os.environ)
    saved_cwd = os.getcwd()
    saved_streams = (sys.stdin, sys.stdout, sys.stderr)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    out, err = _Captured(), _Captured()
    os.environ.clear()
    os.environ.update(_cli_environment(env))
    code: int | str | None = 0
    try:
        if cwd is not None:
            os.chdir(cwd)
        sys.stdin, sys.stdout, sys.stderr = io.StringIO(""), out, err
        try:
            answer(argv)
        except SystemExit as exc:
            code = exc.code
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved_streams
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for number, handler in saved_signals.items():
            signal.signal(number, handler)
    if code is None:
        code = 0
    elif not isinstance(code, int):  # sys.exit("message"): printed, status 1, as Python does
        err.write(f"{code}\n")
        code = 1
    return subprocess.CompletedProcess(["ttbundle", *argv], code, out.getvalue(), err.getvalue())


@pytest.fixture
def run_cli():
    """`run_cli(*args, env=None, cwd=None)` -> CompletedProcess (text, captured): the
    command run in this process (`_run_cli_in_process`)."""
    return _run_cli_in_process


@pytest.fixture
def run_cli_process():
    """`run_cli_process(*args, env=None, cwd=None, timeout=60, stdin=DEVNULL)`: the
    installed console script in a process of its own, for what only a process shows."""
    return _run_cli_process


@pytest.fixture
def models_dir(tmp_path, monkeypatch):
    """An empty EXTRA_MODELS_DIR, the built-in bundles off, and `tmp_path/lib` on
    sys.path (where a test puts an environment bundle's class)."""
    folder = tmp_path / "models"
    folder.mkdir()
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(folder))
    monkeypatch.setenv("TT_VLLM_BUILTIN_MODELS", "0")
    (tmp_path / "lib").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    return folder


@pytest.fixture(scope="session")
def demo_checkpoint(tmp_path_factory) -> Path:
    """The demo checkpoint (a tiny Llama with tokenizer), written once per session."""
    from ttbundles.demo.checkpoint import write_checkpoint

    return write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny-llama")


@pytest.fixture(scope="session")
def classifier_checkpoint(demo_checkpoint, tmp_path_factory) -> Path:
    """The demo checkpoint's shape as a one-label `LlamaForSequenceClassification`
    (`tests.pooling_bundles`), written once per session."""
    from tests.pooling_bundles import write_classifier_checkpoint

    folder = tmp_path_factory.mktemp("checkpoint") / "tiny-llama-cls"
    return write_classifier_checkpoint(demo_checkpoint, folder)


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


GEMMA3_WINDOW = 32
GEMMA3_LAYER_TYPES = (["sliding_attention"] * 5 + ["full_attention"]) * 2


def write_gemma3_checkpoint(out: Path) -> Path:
    """A tiny Gemma 3 text checkpoint (the demo's tokenizer): 12 layers, 10 local with
    `sliding_window=32` and 2 global, a local and a scaled global RoPE, head size and
    query scalar of their own, tied embeddings, a final soft cap."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    config = Gemma3TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(GEMMA3_LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        query_pre_attn_scalar=24,
        max_position_embeddings=1024,
        sliding_window=GEMMA3_WINDOW,
        layer_types=list(GEMMA3_LAYER_TYPES),
        rope_parameters={
            "full_attention": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1_000_000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        },
        final_logit_softcapping=30.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    save_random(Gemma3ForCausalLM(config), "Gemma3ForCausalLM", out)
    return out


GEMMA4_WINDOW = 16
GEMMA4_LAYER_TYPES = (["sliding_attention"] * 2 + ["full_attention"]) * 2


def gemma4_text_config(tokenizer: Any, **overrides: Any) -> Any:
    """A tiny `Gemma4TextConfig`: 6 layers, 4 local with `sliding_window=16` (KV heads 2
    of size 16) and 2 global ones with their own shape (1 KV head of size 32, keys
    doubling as values: `attention_k_eq_v`) and a partial ("proportional") RoPE, a
    final soft cap; no per-layer embeddings, no KV sharing, no experts. The global KV
    heads times head size equal the local ones', so a block of either group has one
    page size (vLLM then keeps one block size for both groups)."""
    from transformers import Gemma4TextConfig

    values: dict[str, Any] = dict(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=len(GEMMA4_LAYER_TYPES),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        global_head_dim=32,
        num_global_key_value_heads=1,
        attention_k_eq_v=True,
        hidden_size_per_layer_input=0,
        max_position_embeddings=1024,
        sliding_window=GEMMA4_WINDOW,
        layer_types=list(GEMMA4_LAYER_TYPES),
        final_logit_softcapping=30.0,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=True,
    )
    values.update(overrides)
    return Gemma4TextConfig(**values)


def scale_gemma4_layers(model: Any) -> None:
    """Give each decoder layer a `layer_scalar` other than 1 (a buffer the checkpoint
    keeps, which random filling leaves at 1), so that reading it is tested."""
    import torch

    text = getattr(model.model, "language_model", model.model)
    with torch.no_grad():
        for index, layer in enumerate(text.layers):
            layer.layer_scalar.fill_(0.75 + 0.1 * index)


def write_gemma4_checkpoint(out: Path, *, conditional: bool = False, **overrides: Any) -> Path:
    """A tiny Gemma 4 text checkpoint (`gemma4_text_config`, the demo's tokenizer):
    `Gemma4ForCausalLM`, or with `conditional` the text part of a
    `Gemma4ForConditionalGeneration` (a tiny vision tower beside it, weights under
    `model.language_model.`)."""
    from transformers import Gemma4Config, Gemma4ForCausalLM, Gemma4ForConditionalGeneration

    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    text = gemma4_text_config(tokenizer, **overrides)
    if conditional:
        config = Gemma4Config(
            text_config=text.to_dict(),
            vision_config=dict(
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=1,
                num_attention_heads=2,
                num_key_value_heads=2,
                head_dim=16,
            ),
            audio_config=None,
        )
        model, architecture = (
            Gemma4ForConditionalGeneration(config),
            "Gemma4ForConditionalGeneration",
        )
    else:
        model, architecture = Gemma4ForCausalLM(text), "Gemma4ForCausalLM"
    scale_gemma4_layers(model)  # a buffer: save_random fills the parameters only
    save_random(model, architecture, out)
    return out


@pytest.fixture(scope="session")
def gemma4_checkpoint(tmp_path_factory) -> Path:
    """`write_gemma4_checkpoint` (`Gemma4ForCausalLM`), once per session."""
    return write_gemma4_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny-gemma4")


@pytest.fixture(scope="session")
def gemma3_checkpoint(tmp_path_factory) -> Path:
    """`write_gemma3_checkpoint`, once per session."""
    return write_gemma3_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny-gemma3")


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


def _on_the_default_release() -> bool:
    from ttbundles.vllm_window import DEFAULT_VLLM

    return _vllm_release() in (DEFAULT_VLLM, None)


def pytest_collection_modifyitems(config, items):
    """Mark what can differ between vLLM releases (`tests/release_marks.py`); on a release
    other than the default, run only that (TTBUNDLES_ALL_TESTS=1 runs everything)."""
    from tests.release_marks import MARK, mark_release_dependent

    everything = _on_the_default_release() or os.environ.get("TTBUNDLES_ALL_TESTS") == "1"
    # Reading the sources takes seconds in every xdist worker: where every test runs
    # anyway, only a selection by the marker (`-m vllm`) needs it.
    if everything and MARK not in (config.option.markexpr or ""):
        return
    mark_release_dependent(items)
    if everything:
        return
    keep = [item for item in items if item.get_closest_marker(MARK)]
    dropped = [item for item in items if not item.get_closest_marker(MARK)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    config._ttbundles_release_selection = (len(keep), len(keep) + len(dropped))


# Which tests start the `ttbundle` command as a process (the console script or
# `python -m ttbundles`): the summary counts them, so that in-process stays the rule.
_CLI_PROCESS_TESTS: set[str] = set()
_CURRENT_TEST: list[str] = []


# Which tests start a process that runs vLLM: the fast tier must not (`_tiers_hold`).
_VLLM_PROCESS_TESTS: dict[str, str] = {}
# vLLM, or the serving side, which imports it (all but the plugin's cheap entry point).
_VLLM_MODULE = r"(vllm|ttbundles\.serving(?!\.plugin\b))\b"
_IMPORTS_VLLM = re.compile(r"\b(import|from)\s+" + _VLLM_MODULE)


# vLLM's own inspection of a model class (`_ModelInfo`), which vLLM runs in a process
# of its own where its cache (VLLM_CACHE_ROOT) has no answer yet: a configuration built
# in the test process starts it on a clean clone, and not again after.
_VLLM_INSPECTION = "vllm.model_executor.models.registry"


def _starts_vllm(argv: list[str]) -> bool:
    """A process that runs vLLM: the `vllm` command, `python -m` a module of vLLM or of
    the serving side, or Python code that imports one (not vLLM's cached inspection)."""
    if argv and os.path.basename(argv[0]) == "vllm":
        return True
    return any(
        (a == "-m" and b != _VLLM_INSPECTION and re.match(_VLLM_MODULE, b))
        or (a == "-c" and _IMPORTS_VLLM.search(b))
        for a, b in zip(argv, argv[1:])
    )


def _watch_cli_processes(event: str, args: tuple) -> None:
    if event != "subprocess.Popen" or not _CURRENT_TEST:
        return
    argv = [str(a) for a in (args[1] if isinstance(args[1], (list, tuple)) else [args[1]])]
    if argv and (
        os.path.basename(argv[0]) == "ttbundle"
        or any(a == "-m" and b == "ttbundles" for a, b in zip(argv, argv[1:]))
    ):
        _CLI_PROCESS_TESTS.add(_CURRENT_TEST[-1].split("[")[0])
    if _starts_vllm(argv):
        _VLLM_PROCESS_TESTS.setdefault(_CURRENT_TEST[-1], " ".join(argv)[:120])


sys.addaudithook(_watch_cli_processes)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _CURRENT_TEST.append(item.nodeid)
    try:
        return (yield)
    finally:
        _CURRENT_TEST.pop()


@pytest.fixture(autouse=True)
def _fresh_command_line(monkeypatch):
    """Each test starts with no command line recorded: the record is per process (one
    `vllm serve` parses once), and a test that parsed one (an in-process `ttbundle plan`)
    must not make a later test's in-code configuration read as typed."""
    from ttbundles.serving.planning import command_line

    monkeypatch.setattr(command_line, "COMMAND_LINE", {})


@pytest.fixture(autouse=True)
def _tiers_hold(request):
    """A test that starts vLLM processes belongs to the server tier: the fast tier stays
    fast only if none of its tests does (each such process imports vLLM, seconds)."""
    yield
    started = _VLLM_PROCESS_TESTS.get(request.node.nodeid)
    if started and not request.node.get_closest_marker("server"):
        pytest.fail(
            f"this test starts a vLLM process ({started!r}) but is not in the server tier: "
            "mark it @pytest.mark.server",
            pytrace=False,
        )


def pytest_sessionfinish(session):
    """Under pytest-xdist (the fast tier runs on every core), a worker hands what it saw
    to the controller, which prints the summary."""
    output = getattr(session.config, "workeroutput", None)
    if output is not None:
        output["ttbundles_cli_processes"] = sorted(_CLI_PROCESS_TESTS)
        output["ttbundles_release_selection"] = getattr(
            session.config, "_ttbundles_release_selection", None
        )


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    output = getattr(node, "workeroutput", None) or {}
    _CLI_PROCESS_TESTS.update(output.get("ttbundles_cli_processes", ()))
    selection = output.get("ttbundles_release_selection")
    if selection:  # every worker collects the same items: one worker's count is the run's
        node.config._ttbundles_release_selection = tuple(selection)


def pytest_terminal_summary(terminalreporter, config):
    if _CLI_PROCESS_TESTS:
        terminalreporter.write_line(
            f"{len(_CLI_PROCESS_TESTS)} test functions started the ttbundle command as a "
            "process (the rest ran it in-process)"
        )
    selection = getattr(config, "_ttbundles_release_selection", None)
    if selection:
        from importlib.metadata import version

        terminalreporter.write_line(
            f"vLLM {version('vllm')}: {selection[0]} of {selection[1]} collected tests can "
            "differ between releases and ran here; the rest run on the default release "
            "(TTBUNDLES_ALL_TESTS=1 runs all)"
        )
