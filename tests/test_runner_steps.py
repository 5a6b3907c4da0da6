"""The model runner driven step by step, in this process: vLLM's configuration (with the
platform's plan), the phase scheduler, the runner and a recording reference generator,
looped as the engine core loops them. A failure here points at a step, not a server log.
"""

from __future__ import annotations

import inspect
from concurrent.futures import Future

import pytest
import torch  # required: a missing or broken torch fails, never skips
import vllm  # noqa: F401 - required: a missing or broken vllm fails
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams
from vllm.v1.core.sched.output import SchedulerOutput
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
)
from vllm.v1.outputs import AsyncModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from ttbundles.format.contract import HostMesh
from ttbundles.reference.generator import ReferenceLlamaGenerator, ReferenceLlamaGeneratorLegacy
from ttbundles.reference.readback import DeviceOutput
from ttbundles.serving.lanes import TTLaneCoordinator
from ttbundles.serving.planning.plan import PLAN_KEY, served_plan
from ttbundles.serving.runner import TTModelRunner
from ttbundles.serving.scheduler import TTScheduler
from ttbundles.serving.stats import STATS

BLOCK = 16
NUM_BLOCKS = 64


class Recording(ReferenceLlamaGenerator):
    """The reference generator, keeping what each decode was told."""

    decodes: list[dict]
    prefills: list[dict]

    def prefill_forward(self, *args, **kwargs):
        self.prefills.append(
            {
                "ends": kwargs["prompt_lens"].tolist(),
                "start": kwargs["start_pos"].tolist(),
            }
        )
        self.prefill_slots.append(list(kwargs["empty_slots"]))
        return super().prefill_forward(*args, **kwargs)

    def decode_forward(self, *args, **kwargs):
        self.decodes.append(
            {
                "device": kwargs.get("sampling_params") is not None,
                "read": kwargs.get("read_from_device"),
                "live": int((kwargs["start_pos"] >= 0).sum()),
                "rows": len(kwargs["start_pos"]),
                "slots": (kwargs["start_pos"] >= 0).nonzero().flatten().tolist(),
                "table": kwargs["page_table"].clone(),
                "grammar": kwargs.get("grammar_bitmask") is not None,
                "history": {
                    k: kwargs[k].clone() for k in ("prompt_tokens", "output_tokens") if k in kwargs
                },
                **{k: kwargs[k] for k in kwargs if k.startswith(("reload", "reset"))},
            }
        )
        return super().decode_forward(*args, **kwargs)


def build(
    checkpoint,
    *,
    async_decode: bool,
    tt: dict | None = None,
    lanes: int = 1,
    num_blocks: int = NUM_BLOCKS,
    generator: type = None,
    **engine_args,
):
    """`lanes`: the plan a single-execute bundle gets from `--data-parallel-size lanes`
    (max_num_seqs 4 per lane), served by the lane coordinator."""
    config = EngineArgs(
        model=str(checkpoint),
        max_model_len=128,
        max_num_seqs=4,
        block_size=BLOCK,
        async_scheduling=async_decode,
        additional_config={"tt": {"sample_on_device_mode": "all", **(tt or {})}},
        **engine_args,
    ).create_engine_config()
    config.cache_config.num_gpu_blocks = num_blocks  # what the engine sets after profiling
    if lanes > 1:
        config.additional_config[PLAN_KEY]["lanes"] = lanes
        config.scheduler_config.max_num_seqs = 4 * lanes
    hf = config.model_config.hf_config
    spec = FullAttentionSpec(
        block_size=BLOCK,
        num_kv_heads=hf.num_key_value_heads,
        head_size=hf.hidden_size // hf.num_attention_heads,
        dtype=torch.float32,
    )
    kv_config = KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["model.layers.0.self_attn"], spec)],
    )
    scheduler = (TTLaneCoordinator if lanes > 1 else TTScheduler)(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    runner = TTModelRunner(  # as the worker
        config, generator or Recording, HostMesh(), served_plan(config)
    )
    runner.load_model()
    runner.generator.decodes = []
    runner.generator.prefills = []
    runner.generator.prefill_slots = []
    runner.allocate_kv_cache(
        num_blocks, spec.num_kv_heads, spec.head_size, hf.num_hidden_layers, torch.float32
    )
    return scheduler, runner


def run(
    scheduler, runner, requests: dict[int, list[Request]], logprobs: dict | None = None
) -> dict[str, list[int]]:
    """The engine core's loop (one batch in flight); requests arrive at their step, a
    structured one's grammar compiled as the engine's input processing does, and each
    step's grammar bitmask handed to sample_tokens. `logprobs`: filled with each
    request's sampled-token log-probs per step, `(ids, values)` (vLLM's output rows)."""
    everything = [r for batch in requests.values() for r in batch]
    step = 0
    while step < 500:
        for request in requests.pop(step, []):
            scheduler.structured_output_manager.grammar_init(request)
            _grammar_compiled(request)
            scheduler.add_request(request)
        if not requests and not scheduler.has_requests():
            break
        output: SchedulerOutput = scheduler.schedule()
        runner.execute_model(output)
        result = runner.sample_tokens(scheduler.get_grammar_bitmask(output))
        if isinstance(result, AsyncModelRunnerOutput):
            result = result.get_output()
        if logprobs is not None and result.logprobs is not None:
            lists = result.logprobs
            for row, req_id in enumerate(result.req_ids):
                logprobs.setdefault(req_id, []).append(
                    (list(lists.logprob_token_ids[row]), list(lists.logprobs[row]))
                )
        scheduler.update_from_output(output, result)
        step += 1
    return {r.request_id: list(r.output_token_ids) for r in everything}


def _grammar_compiled(request: Request, timeout: float = 120.0) -> None:
    """Wait for a structured request's grammar, which vLLM compiles in a thread: a
    request whose grammar is not ready is not scheduled, so the steps' batches (and what
    the tests count of them) would depend on how fast the machine compiled it."""
    import time

    structured = request.structured_output_request
    deadline = time.monotonic() + timeout
    while structured is not None and not structured.is_grammar_ready:
        assert time.monotonic() < deadline, f"{request.request_id}'s grammar never compiled"
        time.sleep(0.005)


def request(
    name: str, prompt: list[int], max_tokens: int, *, cached: bool = False, **params
) -> Request:
    """`cached`: hash its blocks, as the engine does with prefix caching on."""
    hasher = None
    if cached:
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        init_none_hash(sha256)
        hasher = get_request_block_hasher(BLOCK, sha256)
    return Request(
        request_id=name,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True, **params),
        pooling_params=None,
        block_hasher=hasher,
    )


@pytest.fixture(scope="module")
def greedy(demo_checkpoint):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_checkpoint, dtype=torch.float32)

    def continuation(prompt: list[int], count: int) -> list[int]:
        out = model.generate(
            torch.tensor([prompt]), max_new_tokens=count, min_new_tokens=count, do_sample=False
        )
        return out[0, len(prompt) :].tolist()

    return continuation


PROMPT_A = list(range(20, 34))  # 14 tokens: the third decode crosses into a second block
PROMPT_B = [50, 51, 52, 53, 54, 55]


@pytest.mark.parametrize("async_decode", [False, True])
def test_steps_follow_the_decode_contract(demo_checkpoint, greedy, async_decode):
    scheduler, runner = build(demo_checkpoint, async_decode=async_decode)
    before = STATS.snapshot().get("bookkeeping.steady", 0)
    out = run(
        scheduler,
        runner,
        {
            0: [request("a", PROMPT_A, 8, temperature=0.0)],
            5: [request("b", PROMPT_B, 3, temperature=0.0)],
        },
    )
    assert out["a"] == greedy(PROMPT_A, 8)
    assert out["b"] == greedy(PROMPT_B, 3)
    decodes = runner.generator.decodes
    assert all(d["device"] for d in decodes)
    # The first decode of each layout reloads and resets; steady ones stay resident.
    transitions = [i for i, d in enumerate(decodes) if d["reset_sampling_state"]]
    assert transitions[0] == 0 and len(transitions) >= 3  # a alone, a+b, a alone again
    for i in transitions:
        assert decodes[i]["reload_inputs"] and decodes[i]["reload_sampling_params"]
    steady = [d for d in decodes if not d["reload_inputs"]]
    assert steady and not any(d["reset_sampling_state"] for d in steady)
    # a's context reaches 16 tokens during a steady run: only the page table is reloaded.
    assert any(d["reload_page_table"] for d in steady)
    assert all(d["read"] is (not async_decode) for d in decodes)
    # Steps that only continue the batch's requests took the whole-array bookkeeping
    # (and the outputs above, equal to transformers', show it kept the states right,
    # through b's arrival, a's return to the batch and b's end).
    assert STATS.snapshot().get("bookkeeping.steady", 0) - before >= len(steady)


def test_rows_that_gain_a_block_in_the_same_step_are_staged_as_whole_arrays(
    demo_checkpoint, greedy
):
    """Prompts of one length cross a block boundary in the same steady decode: the new
    blocks go into the requests' block lists and the runner's per-slot page table as
    whole-array writes, leaving both exactly as the per-row path would (each slot's row its
    request's block ids, nothing after them), and the tokens equal transformers'."""
    scheduler, runner = build(demo_checkpoint, async_decode=True)
    checked = []
    states = runner.states
    original = states.append_one_block_each

    def checking(req_ids, new_blocks, grown):
        took = original(req_ids, new_blocks, grown)
        if took:
            for i in grown:
                blocks = runner.requests[req_ids[i]].block_ids[0]
                slot = runner.slots.slot_of[req_ids[i]]
                assert runner.tables.count(slot) == len(blocks)
                row = runner.tables.row(slot)
                assert row == blocks + [0] * (len(row) - len(blocks))
            checked.append(len(grown))
        return took

    states.append_one_block_each = checking
    prompts = {
        name: [start + i for i in range(14)] for name, start in (("a", 20), ("b", 60), ("c", 90))
    }
    out = run(
        scheduler,
        runner,
        {0: [request(name, prompt, 8, temperature=0.0) for name, prompt in prompts.items()]},
    )
    for name, prompt in prompts.items():
        assert out[name] == greedy(prompt, 8)
    assert checked and max(checked) == 3  # all three rows grew in one step
    assert any(d["reload_page_table"] for d in runner.generator.decodes)


def test_a_host_only_request_takes_its_batches_to_the_host(demo_checkpoint, greedy):
    scheduler, runner = build(demo_checkpoint, async_decode=False)
    out = run(scheduler, runner, {0: [request("a", PROMPT_A, 4, temperature=0.0, min_tokens=2)]})
    assert out["a"] == greedy(PROMPT_A, 4)
    decodes = runner.generator.decodes
    assert decodes and not any(d["device"] for d in decodes)
    assert all(d["reload_inputs"] and not d["reset_sampling_state"] for d in decodes)


def test_penalties_stay_on_the_device_and_only_change_their_request(demo_checkpoint, greedy):
    scheduler, runner = build(demo_checkpoint, async_decode=True)
    out = run(
        scheduler,
        runner,
        {
            0: [
                request("plain", PROMPT_A, 6, temperature=0.0),
                request("penalised", PROMPT_A, 6, temperature=0.0, repetition_penalty=3.0),
            ]
        },
    )
    assert out["plain"] == greedy(PROMPT_A, 6)
    assert out["penalised"] != out["plain"]
    assert all(d["device"] for d in runner.generator.decodes)


def test_no_penalty_history_is_built_for_a_batch_without_penalties(demo_checkpoint, greedy):
    """The generator takes device penalties, but no request asks: no history is assembled
    and no decode carries one (as the reference plugin sends it only then)."""
    scheduler, runner = build(demo_checkpoint, async_decode=True)
    assert runner.device_support.penalties
    out = run(
        scheduler,
        runner,
        {
            0: [
                request("a", PROMPT_A, 5, temperature=0.0),
                request("b", PROMPT_B, 5, temperature=0.0),
            ]
        },
    )
    assert out["a"] == greedy(PROMPT_A, 5) and out["b"] == greedy(PROMPT_B, 5)
    decodes = runner.generator.decodes
    assert decodes and all(d["device"] and not d["history"] for d in decodes)
    assert runner.history.builds == 0


def test_a_penalty_batch_carries_each_slots_history(demo_checkpoint):
    """With a penalised request in the batch every decode carries the history of every
    slot: the prompt and the output tokens known on the host, -1 padded, empty slots -1."""
    scheduler, runner = build(demo_checkpoint, async_decode=False)
    out = run(
        scheduler,
        runner,
        {
            0: [
                request("plain", PROMPT_B, 4, temperature=0.0),
                request("penalised", PROMPT_A, 4, temperature=0.0, presence_penalty=1.5),
            ]
        },
    )
    decodes = runner.generator.decodes
    assert decodes and all(d["history"] for d in decodes)
    assert runner.history.builds == len(decodes)
    for step, decode in enumerate(decodes):
        prompt, output = decode["history"]["prompt_tokens"], decode["history"]["output_tokens"]
        assert prompt.shape == (4, len(PROMPT_A)) and output.shape[0] == 4
        slots = decode["slots"]
        assert len(slots) == 2
        rows = {tuple(r[r >= 0].tolist()): i for i, r in enumerate(prompt)}
        assert set(rows) == {tuple(PROMPT_A), tuple(PROMPT_B), ()}
        for prompt_ids, name in ((PROMPT_A, "penalised"), (PROMPT_B, "plain")):
            row = output[rows[tuple(prompt_ids)]]
            assert row[row >= 0].tolist() == out[name][: step + 1]
        idle = [i for i in range(4) if i not in slots]
        assert (prompt[idle] == -1).all() and (output[idle] == -1).all()


def test_a_seed_gives_the_same_tokens_alone_and_in_a_changing_batch(demo_checkpoint):
    seeded = {"temperature": 1.1, "top_k": 30, "seed": 42}
    scheduler, runner = build(demo_checkpoint, async_decode=True)
    alone = run(scheduler, runner, {0: [request("s", PROMPT_B, 10, **seeded)]})["s"]
    scheduler, runner = build(demo_checkpoint, async_decode=True)
    crowd = run(
        scheduler,
        runner,
        {
            0: [request("x", PROMPT_A, 3, temperature=0.7), request("s", PROMPT_B, 10, **seeded)],
            4: [request("y", PROMPT_A[::-1], 2, temperature=0.9)],
        },
    )
    assert crowd["s"] == alone


def test_a_seed_draws_the_same_tokens_on_the_device_and_on_the_host(demo_checkpoint):
    """Both paths draw position p's token from (seed, p) with vLLM's exponential race, so
    a neighbour that sends the batch to the host (min_tokens) changes nothing."""
    seeded = {"temperature": 1.1, "top_k": 30, "top_p": 0.9, "seed": 7}
    scheduler, runner = build(demo_checkpoint, async_decode=False)
    device = run(scheduler, runner, {0: [request("s", PROMPT_B, 10, **seeded)]})["s"]
    assert all(d["device"] for d in runner.generator.decodes)
    scheduler, runner = build(demo_checkpoint, async_decode=False)
    host = run(
        scheduler,
        runner,
        {0: [request("s", PROMPT_B, 10, **seeded), request("h", PROMPT_A, 10, min_tokens=5)]},
    )["s"]
    assert not any(d["device"] for d in runner.generator.decodes)
    assert host == device


@pytest.mark.parametrize("async_decode", [False, True])
def test_a_final_prompt_chunk_of_one_token_runs_as_a_prefill(demo_checkpoint, greedy, async_decode):
    """The scheduler puts a one-token final chunk in a prefill step (the prompt is not
    complete); the runner runs that step as a prefill, not as a decode of one slot."""
    scheduler, runner = build(
        demo_checkpoint,
        async_decode=async_decode,
        enable_chunked_prefill=True,
        max_num_batched_tokens=16,
    )
    prompt_b = list(range(40, 57))  # 17 tokens: chunks of 16 and 1
    out = run(
        scheduler,
        runner,
        {
            0: [request("a", PROMPT_A, 6, temperature=0.0)],
            2: [request("b", prompt_b, 3, temperature=0.0)],
        },
    )
    assert out["a"] == greedy(PROMPT_A, 6)
    assert out["b"] == greedy(prompt_b, 3)
    prefills = runner.generator.prefills
    assert {"ends": [16], "start": [0]} in prefills
    assert {"ends": [17], "start": [16]} in prefills  # b's last prompt token
    assert all(d["live"] >= 1 for d in runner.generator.decodes)


def test_a_prompt_cached_to_its_last_token_is_admitted_by_a_prefill(demo_checkpoint, greedy):
    """A new request whose prompt is in the prefix cache up to its last token computes one
    token; it is still an admission, which the scheduler makes in a prefill step, and the
    runner prefills it from the cached position."""
    scheduler, runner = build(demo_checkpoint, async_decode=False)
    prompt = list(range(40, 57))  # 17 tokens: one full cached block, then one token
    out = run(
        scheduler,
        runner,
        {
            0: [request("first", prompt, 2, cached=True, temperature=0.0)],
            4: [request("again", prompt, 3, cached=True, temperature=0.0)],
        },
    )
    assert out["again"] == greedy(prompt, 3)
    assert out["first"] == greedy(prompt, 2)
    assert runner.generator.prefills[-1] == {"ends": [17], "start": [16]}


# --- in-process lanes -------------------------------------------------------------------


@pytest.mark.parametrize("async_decode", [False, True])
def test_lanes_give_each_request_its_lanes_rows_and_the_same_tokens(
    demo_checkpoint, greedy, async_decode
):
    """4 lanes x 4 rows: 8 requests spread over the lanes, each in a row of its lane
    (lane x 4 + slot) for life, decode calls padded to all 16 rows, each lane's page
    table rows in its own block space (ids repeat across lanes), the reference's one
    KV cache per lane; and every request gets transformers' greedy tokens."""
    scheduler, runner = build(
        demo_checkpoint, async_decode=async_decode, lanes=4, num_blocks=4 * 16
    )
    assert runner.slots.per_lane == 4 and runner.generator.lanes == 4
    assert len(runner.kv_cache) == 4 and runner.kv_cache[0][0][0].shape[0] == 16
    prompts = {f"r{i}": [30 + i, *PROMPT_B, 60 + i] for i in range(8)}
    slots: dict[str, set[int]] = {name: set() for name in prompts}
    original = runner.slots.take

    def watch(req_id):
        taken = original(req_id)
        slot = runner.slots.slot_of[req_id]
        assert slot // 4 == runner.slots.lane_of[req_id] == scheduler.lane_of_request(req_id)
        slots[req_id].add(slot)
        return taken

    runner.slots.take = watch
    out = run(
        scheduler,
        runner,
        {0: [request(name, p, 5, temperature=0.0) for name, p in prompts.items()]},
    )
    for name, prompt in prompts.items():
        assert out[name] == greedy(prompt, 5), name
        assert len(slots[name]) == 1, slots[name]  # one row for life
    lanes_of_rows = {name: next(iter(rows)) // 4 for name, rows in slots.items()}
    assert sorted(lanes_of_rows.values()) == [0, 0, 1, 1, 2, 2, 3, 3]
    decodes = runner.generator.decodes
    assert decodes and all(d["rows"] == 16 for d in decodes)
    first = decodes[0]
    assert len(first["slots"]) == 8
    # Lane-local block ids: every lane's first request starts at the same block.
    starts = {int(first["table"][slot, 0]) for slot in first["slots"] if slot % 4 == 0}
    assert len(starts) == 1
    assert runner.slots.slot_of == {}
    assert all(len(runner.slots.free_slots(lane)) == 4 for lane in range(4))


def test_a_lane_under_kv_pressure_preempts_inside_itself(demo_checkpoint, greedy):
    """2 lanes with 9 blocks each (144 tokens): two 60-token prompts generating 40 tokens
    bound to lane 0 cannot both stay; preemption and the retry rule happen inside lane 0
    while lane 1 runs on, and every request still gets its greedy tokens."""
    scheduler, runner = build(demo_checkpoint, async_decode=False, lanes=2, num_blocks=18)
    prompts = {
        "a": list(range(100, 160)),
        "b": list(range(200, 210)),
        "c": list(range(300, 360)),
    }
    requests = [request(name, p, 40, temperature=0.0) for name, p in prompts.items()]
    out = run(scheduler, runner, {0: requests})
    for name, prompt in prompts.items():
        assert out[name] == greedy(prompt, 40), name
    preempted = {r.request_id for r in requests if r.num_preemptions}
    assert preempted and preempted <= {"a", "c"}  # lane 0's; b ran alone in lane 1
    assert scheduler.assigned == [2, 1]
    assert scheduler.get_kv_cache_usage() == 0.0


def test_the_host_sampler_applies_every_per_request_parameter_in_one_batch(demo_checkpoint, greedy):
    """Four requests with different host-only parameters share each host-sampled step
    (vLLM's V1 sampler on 0.33.0, ours on 0.34.0's parts): each parameter holds for its
    own row, whatever its neighbours ask."""
    scheduler, runner = build(demo_checkpoint, async_decode=False)
    plain = greedy(PROMPT_A, 6)
    banned, biased = plain[0], (plain[0] + 7) % 300
    bad = request("bad", PROMPT_A, 3, temperature=0.0)
    bad.sampling_params._bad_words_token_ids = [[banned]]  # what the tokenizer step makes
    out = run(
        scheduler,
        runner,
        {
            0: [
                # min_p near 1 keeps only the most likely token: greedy, though sampled.
                request("min_p", PROMPT_A, 6, temperature=1.0, min_p=0.999, seed=3),
                request("allowed", PROMPT_B, 6, temperature=0.8, allowed_token_ids=[5, 9]),
                request("bias", PROMPT_A, 6, temperature=0.0, logit_bias={biased: 100.0}),
                bad,
            ]
        },
    )
    assert not any(d["device"] for d in runner.generator.decodes)  # the host sampled
    assert out["min_p"] == plain
    assert set(out["allowed"]) <= {5, 9} and len(out["allowed"]) == 6
    assert out["bias"] == [biased] * 6
    assert banned not in out["bad"] and len(out["bad"]) == 3


def test_async_decode_comes_from_the_bundle_and_a_class_that_disagrees_is_refused(
    demo_checkpoint,
):
    """One source: the plan (the demo bundle declares async_decode) decides resident
    inputs; a class whose model_capabilities does not support async decode is refused
    before any weight loads (TTB056, as `validate --import` calls it)."""
    from ttbundles.serving.binding import GeneratorContractError

    config = EngineArgs(
        model=str(demo_checkpoint), max_model_len=128, max_num_seqs=4, block_size=BLOCK
    ).create_engine_config()
    plan = served_plan(config)
    assert plan is not None and plan.async_decode
    runner = TTModelRunner(config, Recording, HostMesh(), plan)
    assert runner.resident_inputs  # declared, and decode is traced (trace_mode "all")

    class NoAsync(ReferenceLlamaGenerator):
        model_capabilities = {
            **ReferenceLlamaGenerator.model_capabilities,
            "supports_async_decode": False,
        }

    with pytest.raises(GeneratorContractError) as info:
        TTModelRunner(config, NoAsync, HostMesh(), plan)
    (problem,) = info.value.diagnostics
    assert problem.code == "TTB056"
    assert problem.message.startswith("the bundle declares capabilities.async_decode, but ")
    assert problem.message.endswith(
        "NoAsync.model_capabilities does not support it (supports_async_decode is False)"
    )


def stats_delta(before: dict) -> dict:
    """The counters that moved since `before` (a STATS snapshot)."""
    now = STATS.snapshot()
    return {k: v - before.get(k, 0) for k, v in now.items() if v != before.get(k, 0)}


# A JSON schema the tiny model completes in a few tokens: one key, one of two values.
ANSWER_SCHEMA = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}},
    "required": ["answer"],
    "additionalProperties": False,
}


def structured(name: str, prompt: list[int], **params) -> Request:
    """A request whose output must match ANSWER_SCHEMA (xgrammar, as vLLM's input
    processing picks it); it stops at EOS, where the grammar ends."""
    import json

    from vllm.sampling_params import StructuredOutputsParams

    schema = StructuredOutputsParams(json=json.dumps(ANSWER_SCHEMA))
    schema._backend = "xgrammar"
    return Request(
        request_id=name,
        prompt_token_ids=prompt,
        sampling_params=SamplingParams(max_tokens=48, structured_outputs=schema, **params),
        pooling_params=None,
    )


def answer(runner, tokens: list[int]) -> dict:
    import json

    from vllm.tokenizers import get_tokenizer

    tokenizer = get_tokenizer(str(runner.model_config.tokenizer))
    # The grammar ends at EOS (the request, built without the engine's input processing,
    # does not know its EOS and goes on).
    assert tokenizer.eos_token_id in tokens, tokens
    text = tokenizer.decode(tokens[: tokens.index(tokenizer.eos_token_id)])
    value = json.loads(text)
    assert set(value) == {"answer"} and value["answer"] in ("yes", "no"), text
    return value


@pytest.mark.parametrize("async_decode", [False, True])
def test_a_device_grammar_samples_structured_decodes_on_the_device(
    demo_checkpoint, greedy, async_decode
):
    """The reference declares supports_device_grammar: a structured request's decodes get
    its bitmask (per slot) and sample on the device, asynchronously where async decode is
    on, without draining the steps in flight; its prefill samples on the host. The output
    is valid JSON of the schema and the same tokens the host sampler gives (greedy, and
    seeded at a temperature); a plain request beside it keeps transformers' tokens."""
    prompts = {"g": PROMPT_A, "s": PROMPT_B}
    params = {"g": {"temperature": 0.0}, "s": {"temperature": 0.9, "seed": 5}}
    outs = {}
    for path, tt in (("device", None), ("host", {"always_compat_sampling": True})):
        scheduler, runner = build(demo_checkpoint, async_decode=async_decode, tt=tt)
        # No free whitespace (vLLM's --structured-outputs-config.disable_any_whitespace):
        # the tiny random model would pad the object until max_tokens.
        manager = scheduler.structured_output_manager
        manager.vllm_config.structured_outputs_config.disable_any_whitespace = True
        before = STATS.snapshot()
        outs[path] = run(
            scheduler,
            runner,
            {
                0: [structured(n, prompts[n], **params[n]) for n in prompts]
                + [request("plain", PROMPT_A, 6, temperature=0.0)]
            },
        )
        delta = {
            k: v - before.get(k, 0) for k, v in STATS.snapshot().items() if v != before.get(k, 0)
        }
        decodes = runner.generator.decodes
        plan = {d.setting: d for d in served_plan(runner.vllm_config).decisions}
        if path == "device":
            # The plan says it before the class is imported: device grammar, async kept.
            said = plan["sampling.structured_output"]
            assert said.effective == "device" and "keep async decode" in said.reason
            assert plan["sampling.logprobs"].effective == "device"
            assert all(d["device"] for d in decodes) and decodes
            assert all(d["grammar"] for d in decodes[:5])  # the structured rows decode
            assert delta["sampling.device.grammar"] >= 5
            assert delta.get("sampling.host.structured_output") == 1  # the one prefill
            assert "decode.drain.structured_output" not in delta
            assert all(d["read"] is (not async_decode) for d in decodes)
            if async_decode:
                assert delta["decode.async"] == len(decodes)
        else:  # always_compat_sampling: every batch on the host, as the plan says
            assert "sampling.structured_output" not in plan
            assert not any(d["grammar"] for d in decodes)
    assert outs["device"] == outs["host"]
    for name in prompts:
        answer(runner, outs["device"][name])
    assert outs["device"]["plain"] == greedy(PROMPT_A, 6)


def test_device_logprobs_are_the_host_samplers_within_float32(demo_checkpoint):
    """A request for 5 log-probs (the reference returns its top 20) is served from the
    device sampler's top log-probs: the same ids as vLLM's host sampler, the values
    equal within float32 rounding."""
    got = {}
    for path, tt in (("device", None), ("host", {"always_compat_sampling": True})):
        scheduler, runner = build(demo_checkpoint, async_decode=True, tt=tt)
        before = STATS.snapshot()
        logprobs: dict = {}
        run(
            scheduler,
            runner,
            {0: [request("a", PROMPT_A, 6, temperature=0.0, logprobs=5)]},
            logprobs,
        )
        delta = {
            k: v - before.get(k, 0) for k, v in STATS.snapshot().items() if v != before.get(k, 0)
        }
        assert ("sampling.host" in delta) is (path == "host"), delta
        got[path] = logprobs["a"]
    assert len(got["device"]) == len(got["host"]) == 6
    for (device_ids, device_values), (host_ids, host_values) in zip(got["device"], got["host"]):
        assert device_ids == host_ids
        assert torch.allclose(
            torch.tensor(device_values), torch.tensor(host_values), rtol=0, atol=1e-5
        ), (device_values, host_values)


def _first_rows(out, rows: int):
    """A decode's output cut to its first `rows` rows, on the host or still queued."""
    if isinstance(out, DeviceOutput):
        short: Future = Future()

        def cut(done: Future) -> None:
            primary, logprobs = done.result()
            short.set_result((primary[:rows], logprobs))

        out._future.add_done_callback(cut)
        return DeviceOutput(short, out.is_tokens)
    if isinstance(out, tuple):
        return (out[0][:rows], *out[1:])
    return out[:rows]


class PrefixOnly(ReferenceLlamaGeneratorLegacy):
    """A legacy-form class written as TT-Metal's traced ones are (the Gemma 4 31B
    autoport's decode): its active rows must be a contiguous prefix, as the reference
    plugin's condensed batch gives them, and only those rows come back."""

    def decode_forward(self, **kwargs):
        start = kwargs["start_pos"]
        active = start >= 0
        live = int(active.sum())
        if not bool(active[:live].all()):
            raise ValueError(f"active requests must be a contiguous prefix: {start.tolist()}")
        self.decodes.append({"live": live, "reset": kwargs["reset_batch"]})
        taken = inspect.signature(super().decode_forward).parameters
        out = super().decode_forward(**{k: v for k, v in kwargs.items() if k in taken})
        return _first_rows(out, live)


@pytest.mark.parametrize("async_decode", [False, True])
def test_a_legacy_class_gets_its_active_rows_first_when_a_middle_request_ends(
    demo_checkpoint, greedy, async_decode
):
    """The first request (slot 0) ends while the later ones (slots 1 and 2) go on: the
    class sees them as rows 0 and 1 (told by reset_batch), returns those two rows, and
    every request gets transformers' tokens."""
    scheduler, runner = build(demo_checkpoint, async_decode=async_decode, generator=PrefixOnly)
    before = STATS.snapshot().get("decode.compacted", 0)
    out = run(
        scheduler,
        runner,
        {
            0: [request("a", PROMPT_A, 2, temperature=0.0)],
            1: [request("b", PROMPT_B, 9, temperature=0.0)],
            2: [request("c", PROMPT_A[::-1], 7, temperature=0.0)],
            6: [request("d", PROMPT_B[::-1], 4, temperature=0.0)],
        },
    )
    assert out == {
        "a": greedy(PROMPT_A, 2),
        "b": greedy(PROMPT_B, 9),
        "c": greedy(PROMPT_A[::-1], 7),
        "d": greedy(PROMPT_B[::-1], 4),
    }
    assert STATS.snapshot().get("decode.compacted", 0) > before  # a hole was compacted
    decodes = runner.generator.decodes
    assert {d["live"] for d in decodes} >= {2, 3}
