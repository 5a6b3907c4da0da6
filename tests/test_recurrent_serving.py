"""A recurrent-state hybrid (Qwen3.5: gated delta net layers beside full attention) served
by the runner in the generator-owned form, in-process: vLLM's scheduler and KV manager
see only the attention layers; the generator keeps one state slot per request, filled by
prefill (`empty_slots`), continued across chunks, read by decode, released when the slot
is given back (`release_request`). Greedy tokens equal transformers' for prompts longer
than two prefill chunks, with requests arriving mid-way and under KV pressure."""

from __future__ import annotations

import pytest
import torch
import transformers
from vllm.v1.attention.backends.utils import resolve_kv_cache_layout
from vllm.v1.core.kv_cache_planning import get_global_kv_cache_groups, get_kv_cache_configs
from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
from vllm.v1.structured_output import StructuredOutputManager

from tests.test_qwen3_5_reference import VOCAB, write_tiny_qwen3_5
from tests.test_runner_steps import request, run
from tests.vllm_config import vllm_config
from ttbundles.format.contract import HostMesh
from ttbundles.format.layer_kinds import layer_kinds
from ttbundles.reference.qwen3_5 import (
    ReferenceQwen3_5Generator,
    ReferenceQwen3_5VllmStateGenerator,
)
from ttbundles.serving.planning.plan import BundleRef, Plan
from ttbundles.serving.planning.recurrent import align_state_pages
from ttbundles.serving.runner import TTModelRunner
from ttbundles.serving.runner.kv import kinds
from ttbundles.serving.scheduler import TTScheduler

BLOCK = 16
CHUNK = 24  # --max-num-batched-tokens: a 60-token prompt takes three prefill steps


class Releases(ReferenceQwen3_5Generator):
    """The reference, counting the slots the runner gives back."""

    def release_request(self, slot):
        self.released = [*getattr(self, "released", []), slot]
        super().release_request(slot)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    folder = write_tiny_qwen3_5(tmp_path_factory.mktemp("qwen3_5_serving"))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()

    def greedy(prompt: list[int], n: int) -> list[int]:
        with torch.no_grad():
            out = model.generate(
                torch.tensor([prompt]), max_new_tokens=n, do_sample=False, min_new_tokens=n
            )
        return out[0, len(prompt) :].tolist()

    return folder, greedy


def build(checkpoint, *, blocks: int = 64, max_num_seqs: int = 4, prompt_logprobs: bool = False):
    """The scheduler and runner as the engine core builds them, through the runner's own
    interface (its specs, vLLM's groups, `initialize_kv_cache`); `prompt_logprobs`: the
    plan's decision for a bundle declaring them."""
    config = vllm_config(
        checkpoint,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=CHUNK,
        max_model_len=128,
        block_size=BLOCK,
    )
    plan = None
    if prompt_logprobs:
        bundle = BundleRef("gdn", "1.0.0", "built-in", "", "adapter:Releases")
        plan = Plan(tt_arch="TTQwen3_5ForCausalLM", bundle=bundle, mesh="HOST", options={})
        plan.prompt_logprobs = True
    runner = TTModelRunner(config, Releases, HostMesh(), plan=plan)
    runner.load_model()
    specs = runner.get_kv_cache_spec()
    resolve_kv_cache_layout(config, [["LBHNC"]], specs.values())
    groups = get_global_kv_cache_groups(config, [specs])
    page = next(iter(specs.values())).page_size_bytes
    kv_config = get_kv_cache_configs(config, [specs], [blocks * page * len(specs)], groups)[0]
    config.cache_config.num_gpu_blocks = kv_config.num_blocks
    runner.initialize_kv_cache(kv_config)
    scheduler = TTScheduler(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=BLOCK,
    )
    return scheduler, runner, specs


def prompt(seed: int, n: int) -> list[int]:
    return torch.randint(1, VOCAB, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_only_the_attention_layers_reach_vllms_kv_manager(qwen):
    _, runner, specs = build(qwen[0])
    assert list(specs) == ["model.layers.3.self_attn", "model.layers.7.self_attn"]
    assert runner.kv_layers == (3, 7) and len(runner.kv_cache) == 2


def test_chunked_prompts_and_a_late_arrival_give_transformers_tokens(qwen):
    checkpoint, greedy = qwen
    scheduler, runner, _ = build(checkpoint)
    a, b = prompt(1, 60), prompt(2, 41)
    out = run(
        scheduler,
        runner,
        {0: [request("a", a, 16, temperature=0.0)], 2: [request("b", b, 12, temperature=0.0)]},
    )
    assert out["a"] == greedy(a, 16)
    assert out["b"] == greedy(b, 12)
    # Each finished request's slot was given back to the generator.
    assert sorted(runner.generator.released) == sorted({0, 1})


def test_a_slot_reused_after_a_request_starts_from_nothing(qwen):
    """One slot: the second request prefills into the slot the first held."""
    checkpoint, greedy = qwen
    scheduler, runner, _ = build(checkpoint, max_num_seqs=1)
    a, b = prompt(3, 30), prompt(4, 30)
    out = run(
        scheduler,
        runner,
        {0: [request("a", a, 6, temperature=0.0), request("b", b, 6, temperature=0.0)]},
    )
    assert out["a"] == greedy(a, 6) and out["b"] == greedy(b, 6)
    assert runner.generator.released == [0, 0]


def test_kv_pressure_preempts_and_every_request_gets_transformers_tokens(qwen):
    """A pool too small for four long requests at once: vLLM preempts, the preempted
    request's slot is released and it re-prefills into a zeroed one."""
    checkpoint, greedy = qwen
    scheduler, runner, _ = build(checkpoint, blocks=12)
    prompts = {f"r{i}": prompt(10 + i, 40) for i in range(4)}
    out = run(
        scheduler,
        runner,
        {0: [request(name, p, 20, temperature=0.0) for name, p in prompts.items()]},
    )
    for name, p in prompts.items():
        assert out[name] == greedy(p, 20), name
    assert len(runner.generator.released) > len(prompts)  # preemptions released slots too


# --- the snapshot index of the prefix cache (serving.recurrent_prefix) ----------------------


class _Request:
    """What the index reads of vLLM's Request: its block hashes."""

    def __init__(self, hashes: list[str]):
        self.block_hashes = hashes


def test_the_snapshot_index_finds_the_longest_held_prefix_and_frees_what_it_lets_go():
    from ttbundles.serving.recurrent_prefix import SnapshotIndex

    index = SnapshotIndex(capacity=2, block_size=16)
    request = _Request(["a", "b", "c", "d"])
    index.add(request, 16, 101)
    index.add(request, 48, 103)
    assert index.longest(request, 63) == 48 and index.longest(request, 47) == 16
    assert index.handle(request, 48) == 103 and index.handle(request, 32) is None
    index.add(request, 40, 104)  # not on a block boundary: not keyable
    index.add(request, 16, 105)  # already held: the new copy goes, 16 is used last
    index.add(None, 16, 106)  # the request is gone
    assert index.take_frees() == [104, 105, 106] and index.take_frees() == []
    index.add(request, 32, 102)  # a third: the least recently used (48) goes
    assert index.take_frees() == [103] and len(index) == 2
    assert index.longest(_Request(["a", "b", "x"]), 47) == 32
    assert index.longest(_Request(["z"]), 15) == 0


# --- the vLLM-owned form: MambaSpec groups in vLLM's hybrid manager -------------------------


class VllmOwned(ReferenceQwen3_5VllmStateGenerator):
    """The reference whose state vLLM's KV manager owns, recording each decode's indices."""

    def decode_forward(self, *args, gdn_state_indices=None, **kwargs):
        self.indices = [*getattr(self, "indices", []), gdn_state_indices]
        return super().decode_forward(*args, gdn_state_indices=gdn_state_indices, **kwargs)

    def release_request(self, slot):
        self.released = [*getattr(self, "released", []), slot]
        super().release_request(slot)

    def copy_recurrent_state(self, sources, targets):
        self.copies = [*getattr(self, "copies", []), *zip(sources, targets)]
        super().copy_recurrent_state(sources, targets)


def build_vllm_owned(
    checkpoint,
    *,
    blocks: int = 64,
    max_num_seqs: int = 4,
    prefix_caching: bool = False,
    dense: bool = False,
    prompt_logprobs: bool = False,
):
    """As `build`, with the plan the platform makes for owner 'vllm': the hybrid manager
    on, vLLM's "none" mode (`prefix_caching`: its "align" mode), the attention block
    grown to hold a Mamba page. `dense`: vLLM keeps the Mamba state of every block
    boundary cached (`prefix_cache_retention_interval` None), not only the latest.
    `prompt_logprobs`: the plan's decision for a bundle declaring them."""
    config = vllm_config(
        checkpoint,
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=CHUNK,
        max_model_len=128,
        block_size=BLOCK,
        prefix_caching=prefix_caching,
    )
    config.scheduler_config.disable_hybrid_kv_cache_manager = False
    if dense:
        config.cache_config.prefix_cache_retention_interval = None
    bundle = BundleRef("gdn", "1.0.0", "built-in", "", "adapter:VllmOwned")
    plan = Plan(tt_arch="TTQwen3_5ForCausalLM", bundle=bundle, mesh="HOST", options={})
    kinds = layer_kinds(config.model_config.hf_config)
    block, page, state_page = align_state_pages(config, plan, kinds, align=prefix_caching)
    plan.recurrent_owner = "vllm"
    plan.kv_groups = True
    plan.prompt_logprobs = prompt_logprobs
    runner = TTModelRunner(config, VllmOwned, HostMesh(), plan=plan)
    runner.load_model()
    specs = runner.get_kv_cache_spec()
    resolve_kv_cache_layout(config, [["LBHNC"]], specs.values())
    groups = get_global_kv_cache_groups(config, [specs])
    kv_config = get_kv_cache_configs(config, [specs], [blocks * page * 2], groups)[0]
    config.cache_config.num_gpu_blocks = kv_config.num_blocks
    runner.initialize_kv_cache(kv_config)
    # The engine core's block sizes for the scheduler (the lcm of the groups', the Mamba
    # group's a whole context in "none" mode).
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(kv_config, config)
    scheduler = TTScheduler(
        vllm_config=config,
        kv_cache_config=kv_config,
        structured_output_manager=StructuredOutputManager(config),
        block_size=scheduler_block,
        hash_block_size=hash_block,
    )
    return scheduler, runner, specs, (block, page, state_page), kv_config


def test_vllm_owned_state_is_a_mamba_spec_per_gdn_layer_padded_to_the_attention_page(qwen):
    """The tiny Qwen3.5: 6 GDN layers of conv 3 x 64 and state 4 x 8 x 8 (float32 on the
    host): 1,792 B a layer; 2 attention layers of 2 KV heads x 16 x 2 x 4 B = 256 B a
    token: a block of 16 holds 4,096 B, so the Mamba page is padded to it."""
    _, runner, specs, (block, page, state_page), kv_config = build_vllm_owned(qwen[0])
    assert (block, page, state_page) == (16, 4096, 1792)
    assert [name for name in specs] == [
        f"model.layers.{i}.{'self_attn' if i in (3, 7) else 'linear_attn'}" for i in range(8)
    ]
    gdn = specs["model.layers.0.linear_attn"]
    assert gdn.shapes == ((3, 64), (4, 8, 8)) and gdn.dtypes == (torch.float32,) * 2
    assert gdn.mamba_type.name == "GDN_ATTN" and gdn.mamba_cache_mode == "none"
    assert gdn.page_size_bytes == specs["model.layers.3.self_attn"].page_size_bytes == 4096
    assert gdn.block_size == 128  # "none": a Mamba block of the whole context
    # vLLM's groups: 6 GDN layers in 3 Mamba groups of 2, the 2 attention layers in one.
    kinds_ = sorted(type(g.kv_cache_spec).__name__ for g in kv_config.kv_cache_groups)
    assert kinds_ == ["FullAttentionSpec", "MambaSpec", "MambaSpec", "MambaSpec"]
    assert runner.kv_groups.main == next(
        g
        for g, group in enumerate(kv_config.kv_cache_groups)
        if "self_attn" in group.layer_names[0]
    )
    # The per-layer allocation: GDN layers from their descriptors, a state per slot.
    conv, recurrent = runner.kv_cache[0]
    assert conv.shape == (4, 3, 64) and recurrent.shape == (4, 4, 8, 8)
    assert runner.kv_cache[3][0].shape[2] == 16  # the attention layers' blocks of 16


def test_vllm_owned_state_gives_transformers_tokens_over_chunks_and_a_late_arrival(qwen):
    checkpoint, greedy = qwen
    scheduler, runner, *_ = build_vllm_owned(checkpoint)
    a, b = prompt(1, 60), prompt(2, 41)
    out = run(
        scheduler,
        runner,
        {0: [request("a", a, 16, temperature=0.0)], 2: [request("b", b, 12, temperature=0.0)]},
    )
    assert out["a"] == greedy(a, 16)
    assert out["b"] == greedy(b, 12)
    # Every decode said each row's state: int32, in row order (row i is slot i).
    sent = runner.generator.indices
    assert sent and all(i.dtype == torch.int32 and i.tolist() == [0, 1, 2, 3] for i in sent)


def test_vllm_owned_state_under_kv_pressure_re_prefills_into_a_zeroed_state(qwen):
    """Few blocks: vLLM preempts; the preempted request's re-prefill starts at position 0
    and so from a zero state whatever its slot held."""
    checkpoint, greedy = qwen
    scheduler, runner, *_ = build_vllm_owned(checkpoint, blocks=14)
    prompts = {f"r{i}": prompt(10 + i, 40) for i in range(4)}
    out = run(
        scheduler,
        runner,
        {0: [request(name, p, 20, temperature=0.0) for name, p in prompts.items()]},
    )
    for name, p in prompts.items():
        assert out[name] == greedy(p, 20), name
    assert len(runner.generator.released) > len(prompts)  # preemptions gave slots back


# --- vLLM's "align" mode: the prefix cache over position-indexed Mamba blocks ----------------


def test_align_mode_plans_a_mamba_block_of_one_attention_block_and_a_state_per_block(qwen):
    _, runner, specs, (block, *_), kv_config = build_vllm_owned(qwen[0], prefix_caching=True)
    cache = runner.vllm_config.cache_config
    assert (cache.mamba_cache_mode, cache.mamba_block_size, block) == ("align", 16, 16)
    gdn = specs["model.layers.0.linear_attn"]
    assert gdn.mamba_cache_mode == "align" and gdn.block_size == 16
    # A state per block id of the shared pool: vLLM's block ids index them.
    conv, recurrent = runner.kv_cache[0]
    assert conv.shape[0] == recurrent.shape[0] == kv_config.num_blocks
    # What a request keeps, as vLLM sizes its pool: two Mamba blocks (the live column and
    # the one copied on), not its row as wide as the context (8 blocks of 16 in 128).
    config = runner.vllm_config
    assert kinds.held_blocks(gdn, config) == 2 < gdn.max_num_blocks_per_req(config, 128) == 8


def test_align_mode_chunks_end_on_block_boundaries_and_a_repeat_hits(qwen):
    """Chunks of at most 24 tokens are clipped to end on the 16-token blocks (16, 32, 48,
    then the prompt's last 12); the same prompt again hits 48 tokens (its last block
    boundary below the prompt's last token), a prompt sharing 40 tokens hits 32 (vLLM
    keeping every boundary's state: `dense`), and every request gives transformers'
    tokens: the hit continues the state its cached Mamba block kept."""
    checkpoint, greedy = qwen
    scheduler, runner, *_ = build_vllm_owned(checkpoint, prefix_caching=True, dense=True)
    a = prompt(21, 60)
    shares = a[:40] + prompt(22, 20)
    chunks: list[int] = []
    hits: dict[str, int] = {}
    schedule = scheduler.schedule

    def recording():
        output = schedule()
        if "a" in output.num_scheduled_tokens:
            chunks.append(output.num_scheduled_tokens["a"])
        hits.update({new.req_id: new.num_computed_tokens for new in output.scheduled_new_reqs})
        return output

    scheduler.schedule = recording
    first = run(scheduler, runner, {0: [request("a", a, 8, cached=True, temperature=0.0)]})
    assert first["a"] == greedy(a, 8)
    assert chunks[:4] == [16, 16, 16, 12], chunks
    requests = {
        0: [request("again", a, 8, cached=True, temperature=0.0)],
        1: [request("shares", shares, 8, cached=True, temperature=0.0)],
    }
    out = run(scheduler, runner, requests)
    assert out["again"] == greedy(a, 8) and out["shares"] == greedy(shares, 8)
    assert (hits["a"], hits["again"], hits["shares"]) == (0, 48, 32), hits
    # Boundary crossings copied states between distinct blocks; nothing was released
    # (the state lives in vLLM's blocks, which a hit may still need).
    copies = runner.generator.copies
    assert copies and all(src != dst for src, dst in copies)
    assert not getattr(runner.generator, "released", [])


def test_align_mode_under_kv_pressure_and_two_children_give_transformers_tokens(qwen):
    """Few blocks: vLLM preempts; a resumed request re-prefills from zero (or from a hit).
    Two requests of one prompt (vLLM's n=2 children) each keep their own blocks."""
    checkpoint, greedy = qwen
    scheduler, runner, *_ = build_vllm_owned(checkpoint, blocks=20, prefix_caching=True)
    prompts = {f"r{i}": prompt(30 + i, 40) for i in range(4)}
    batch = [request(name, p, 24, cached=True, temperature=0.0) for name, p in prompts.items()]
    batch += [request(f"child{i}", prompts["r0"], 24, cached=True, temperature=0.0) for i in (0, 1)]
    out = run(scheduler, runner, {0: batch})
    for r in batch:
        assert out[r.request_id] == greedy(list(r.prompt_token_ids), 24), r.request_id
    assert any(r.num_preemptions for r in batch), "the pool was meant to preempt"


def test_align_mode_without_the_copy_method_is_refused(qwen, monkeypatch):
    from ttbundles.errors import ConfigurationError
    from ttbundles.serving.planning import recurrent

    class NoCopy:
        pass

    monkeypatch.setattr(
        "ttbundles.serving.planning.generator_class.load_generator_class", lambda bundle: NoCopy
    )
    bundle = BundleRef("gdn", "1.0.0", "built-in", "", "adapter:NoCopy")
    plan = Plan(tt_arch="TTQwen3_5ForCausalLM", bundle=bundle, mesh="HOST", options={})
    with pytest.raises(ConfigurationError) as refused:
        recurrent._refuse_without_copy(plan, "gdn@1.0.0 serves Qwen3.5")
    assert "TTB274" in str(refused.value) and "copy_recurrent_state" in str(refused.value)
