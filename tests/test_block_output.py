"""Block-output decode in this process: vLLM's configuration with the platform's plan, the
phase scheduler, the runner and the reference generator's block mode (4 tokens per row
per decode, `reference.block`), looped as the engine core loops them.

A block reaches vLLM as one step's output; vLLM cuts it at the first stop. So the tokens
equal one-token decode's (and transformers'), requests stop exactly at max_tokens, EOS,
a stop token and the length limit, log-probs are cut the same, and the engine takes one
decode step per block.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from ttbundles.errors import TTBundleError
from ttbundles.format.contract import HostMesh
from ttbundles.reference.block import BLOCK_TOKENS, ReferenceBlockGenerator
from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.serving.planning.plan import PLAN_KEY, served_plan
from ttbundles.serving.runner import TTModelRunner
from ttbundles.serving.scheduler import TTScheduler

BLOCK = 16
NUM_BLOCKS = 64
MAX_MODEL_LEN = 128
PROMPT_A = list(range(20, 34))
PROMPT_B = [50, 51, 52, 53, 54, 55]


@pytest.fixture(scope="module")
def greedy(demo_checkpoint):
    """transformers' greedy continuation of a prompt."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_checkpoint, dtype=torch.float32)

    def continuation(prompt: list[int], count: int) -> list[int]:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=count, min_new_tokens=count, do_sample=False
        )
        return out[0, len(prompt) :].tolist()

    return continuation


class Counting:
    """Counts the generator's decode calls (each one engine decode step)."""

    decode_calls = 0

    def decode_forward(self, *args, **kwargs):
        type(self).decode_calls += 1
        return super().decode_forward(*args, **kwargs)


class OneToken(Counting, ReferenceLlamaGenerator):
    decode_calls = 0


class Blocks(Counting, ReferenceBlockGenerator):
    decode_calls = 0


def build(checkpoint, generator: type, *, block_tokens: int, sample_mode: str = "all"):
    config = EngineArgs(
        model=str(checkpoint),
        max_model_len=MAX_MODEL_LEN,
        max_num_seqs=4,
        block_size=BLOCK,
        async_scheduling=False,
        enable_prefix_caching=False,
        additional_config={"tt": {"sample_on_device_mode": sample_mode}},
    ).create_engine_config()
    config.cache_config.num_gpu_blocks = NUM_BLOCKS
    # What the planner records for a block-output class (`planning.block_output`; the
    # demo bundle's own class is one-token).
    config.additional_config[PLAN_KEY]["output_tokens_per_step"] = block_tokens
    config.additional_config[PLAN_KEY]["async_decode"] = False  # as a block bundle declares
    hf = config.model_config.hf_config
    spec = FullAttentionSpec(
        block_size=BLOCK,
        num_kv_heads=hf.num_key_value_heads,
        head_size=hf.hidden_size // hf.num_attention_heads,
        dtype=torch.float32,
    )
    kv_config = KVCacheConfig(
        num_blocks=NUM_BLOCKS,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)],
    )
    scheduler = TTScheduler(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    runner = TTModelRunner(config, generator, HostMesh(), served_plan(config))
    runner.load_model()
    runner.allocate_kv_cache(
        NUM_BLOCKS, spec.num_kv_heads, spec.head_size, hf.num_hidden_layers, torch.float32
    )
    generator.decode_calls = 0
    return scheduler, runner


def request(name: str, prompt: list[int], max_tokens: int, *, eos: int | None = None, **params):
    sampling = SamplingParams(max_tokens=max_tokens, temperature=0.0, **params)
    sampling.update_from_generation_config({}, eos_token_id=eos)
    return Request(
        request_id=name,
        prompt_token_ids=prompt,
        sampling_params=sampling,
        pooling_params=None,
        block_hasher=None,
    )


def run(scheduler, runner, requests: list[Request]):
    """The engine core's loop; returns each request's tokens, finish reason, log-probs
    (the sampled token's, per token, as vLLM sent them) and the engine's step count."""
    for r in requests:
        scheduler.add_request(r)
    logprobs: dict[str, list[float]] = {r.request_id: [] for r in requests}
    finish: dict[str, str] = {}
    steps = 0
    while scheduler.has_requests() and steps < 500:
        output: SchedulerOutput = scheduler.schedule()
        runner.execute_model(output)
        result = runner.sample_tokens(None)
        for outs in scheduler.update_from_output(output, result).values():
            for out in outs.outputs:
                if out.new_logprobs is not None:
                    logprobs[out.request_id] += [float(v[0]) for v in out.new_logprobs.logprobs]
                    assert len(out.new_logprobs.logprobs) == len(out.new_token_ids)
                if out.finish_reason is not None:
                    finish[out.request_id] = str(out.finish_reason)
        steps += 1
    tokens = {r.request_id: list(r.output_token_ids) for r in requests}
    return tokens, finish, logprobs, steps


def test_blocks_give_one_token_decodes_tokens_in_a_quarter_of_the_decode_steps(
    demo_checkpoint, greedy
):
    """max_tokens 10 and 7 (not multiples of 4): cut exactly there, tokens equal to
    one-token decode and to transformers'; a decode step per block, not per token."""
    one = build(demo_checkpoint, OneToken, block_tokens=1)
    tokens_1, finish_1, _, _ = run(*one, [request("a", PROMPT_A, 10), request("b", PROMPT_B, 7)])
    blocks = build(demo_checkpoint, Blocks, block_tokens=BLOCK_TOKENS)
    tokens_k, finish_k, _, _ = run(*blocks, [request("a", PROMPT_A, 10), request("b", PROMPT_B, 7)])
    assert tokens_k == tokens_1
    assert tokens_k["a"] == greedy(PROMPT_A, 10) and tokens_k["b"] == greedy(PROMPT_B, 7)
    assert finish_k == finish_1 == {"a": "length", "b": "length"}
    # The prefill gives the first token; each decode step then gives one token (k = 1)
    # or a block of 4 for each row still running.
    assert OneToken.decode_calls == 9  # a: 9 decodes for its 9 more tokens
    assert Blocks.decode_calls == 3  # ceil(9 / 4)


def test_a_stop_inside_a_block_cuts_there_and_the_next_request_is_right(demo_checkpoint, greedy):
    """EOS at the 6th token, a stop token at the 3rd: each ends on that token (the rest
    of its block dropped), and a later request decodes in the same KV as one-token."""
    expected = greedy(PROMPT_A, 12)
    eos_at = expected.index(expected[5]) + 1  # the first occurrence ends it
    stop_at = expected.index(expected[2]) + 1
    scheduler, runner = build(demo_checkpoint, Blocks, block_tokens=BLOCK_TOKENS)
    tokens, finish, _, _ = run(
        scheduler,
        runner,
        [
            request("eos", PROMPT_A, 12, eos=expected[5]),
            request("stop", PROMPT_A, 12, stop_token_ids=[expected[2]]),
            request("b", PROMPT_B, 9),
        ],
    )
    assert tokens["eos"] == expected[:eos_at]
    assert tokens["stop"] == expected[:stop_at]
    assert finish["eos"] == finish["stop"] == "stop"
    assert tokens["b"] == greedy(PROMPT_B, 9)


def test_the_length_limit_cuts_a_block_and_log_probs_follow_the_tokens(demo_checkpoint):
    """A request running into max_model_len ends at it, as one-token decode's does (the
    block's tail past the page table is never decoded); log-probs per token, cut alike."""
    prompt = list(range(1, 120))
    results = []
    for generator, k in ((OneToken, 1), (Blocks, BLOCK_TOKENS)):
        scheduler, runner = build(demo_checkpoint, generator, block_tokens=k)
        results.append(run(scheduler, runner, [request("long", prompt, 50, logprobs=2)]))
    (tokens_1, finish_1, logprobs_1, _), (tokens_k, finish_k, logprobs_k, _) = results
    assert len(prompt) + len(tokens_k["long"]) == MAX_MODEL_LEN
    assert tokens_k == tokens_1 and finish_k == finish_1 == {"long": "length"}
    assert len(logprobs_k["long"]) == len(tokens_k["long"])
    assert logprobs_k["long"] == pytest.approx(logprobs_1["long"], abs=1e-5)


def test_a_host_sampled_step_decodes_one_token(demo_checkpoint, greedy):
    """A request the device cannot sample (min_tokens) goes to vLLM's sampler on the host:
    one token per step there, the same tokens."""
    scheduler, runner = build(demo_checkpoint, Blocks, block_tokens=BLOCK_TOKENS)
    tokens, _, _, _ = run(scheduler, runner, [request("a", PROMPT_A, 6, min_tokens=2)])
    assert tokens["a"] == greedy(PROMPT_A, 6)
    assert Blocks.decode_calls == 5


def test_a_class_whose_block_the_plan_did_not_admit_is_refused_at_load(demo_checkpoint):
    with pytest.raises(TTBundleError) as error:
        build(demo_checkpoint, Blocks, block_tokens=1)
    (diagnostic,) = error.value.diagnostics
    assert diagnostic.code == "TTB275" and "output_tokens_per_step=4" in diagnostic.message


# --- the plan (`ttbundle plan`, the same planner as `vllm serve`) ------------------------

FAMILIES = Path(__file__).parent / "twins" / "families.py"
TWIN = {"sample_on_device": ["decode_only", "all"], "chunked_prefill": True}


def _plan(run_cli, tmp_path: Path, checkpoint: Path, capabilities: dict, *extra: str):
    """`ttbundle plan` of a bundle whose class is the block-output twin."""
    models = tmp_path / "models"
    bundle = models / "twin-block"
    bundle.mkdir(parents=True)
    (bundle / "adapter.py").write_text(FAMILIES.read_text())
    document = {
        "schema_version": 1,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": "LlamaForCausalLM",
        "main_class": "adapter:BlockOutputForCausalLM",
        "capabilities": capabilities,
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(document))
    env = {"EXTRA_MODELS_DIR": str(models), "MESH_DEVICE": "HOST", "TT_VLLM_BUILTIN_MODELS": "0"}
    args = ["plan", "--model", checkpoint, "--max-model-len", "128", *extra]
    done = run_cli(*args, env=env, timeout=300)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return done


def test_the_plan_says_the_block_and_chooses_device_sampling(run_cli, tmp_path, demo_checkpoint):
    done = _plan(run_cli, tmp_path, demo_checkpoint, TWIN, "--format", "json")
    assert done.returncode == 0, done.stdout + done.stderr
    plan = json.loads(done.stdout)
    decisions = {d["setting"]: d for d in plan["decisions"]}
    assert plan["output_tokens_per_step"] == 4
    assert decisions["output_tokens_per_step"]["effective"] == 4
    assert "one engine step per block" in decisions["output_tokens_per_step"]["reason"]
    assert decisions["tt.sample_on_device_mode"]["effective"] == "decode_only"


@pytest.mark.parametrize(
    "capabilities,extra,words",
    [
        pytest.param(
            {**TWIN, "async_decode": True},
            [],
            "block output is not served with asynchronous scheduling",
            id="async",
        ),
        pytest.param(
            TWIN,
            ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 2, '
             '"prompt_lookup_max": 3}'],
            "block output is not served with speculative decoding",
            id="speculation",
        ),
        pytest.param(
            {"chunked_prefill": True},
            [],
            "declares no sample_on_device mode",
            id="host-sampling",
        ),
    ],
)  # fmt: skip
def test_the_plan_refuses_what_a_block_cannot_follow(
    run_cli, tmp_path, demo_checkpoint, capabilities, extra, words
):
    done = _plan(run_cli, tmp_path, demo_checkpoint, capabilities, *extra)
    out = done.stdout + done.stderr
    assert done.returncode == 1 and "TTB275" in out, out
    assert words in out, out
