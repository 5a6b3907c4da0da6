"""Speculative decoding's host parts: the n-gram proposer, accepting drafts (greedy and by
rejection sampling; the cases ported from vLLM's tests/v1/sample/test_rejection_sampler.py
and tests/v1/spec_decode/test_ngram.py), the reference generator's verify against its
own one-token decodes, admission at configuration time and the per-request refusals."""

from __future__ import annotations

import json
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from vllm.engine.arg_utils import EngineArgs
from vllm.sampling_params import SamplingParams

from ttbundles.errors import ConfigurationError
from ttbundles.format import speculative as spec
from ttbundles.serving.planning.plan import SpeculativePlan
from ttbundles.serving.planning.spec_admission import refusal_message, request_refusal
from ttbundles.serving.runner.ngram import NgramProposer
from ttbundles.serving.runner.rejection import accept_row, target_probs
from ttbundles.serving.stats import STATS

PLACEHOLDER = spec.PLACEHOLDER_TOKEN_ID


def proposer(style, min_n=2, max_n=3, k=4, max_model_len=1024):
    return NgramProposer(min_n=min_n, max_n=max_n, k=k, max_model_len=max_model_len, style=style)


# --- the n-gram proposer ---------------------------------------------------------------


def test_ngram_docstring_example_of_vllms_proposer():
    # vLLM NgramProposer.propose's example: [2, 3] matches at 1, three tokens follow.
    tokens = np.array([1, 2, 3, 4, 2, 3])
    assert proposer("earliest").propose(tokens) == [4, 2, 3]
    # 0.34.0's speculator pads to K with the last token.
    assert proposer("latest_padded").propose(tokens) == [4, 2, 3, 3]


def test_ngram_prefers_the_longest_match_then_the_earliest_or_latest_occurrence():
    # Suffix [5, 6, 7]: a 3-gram at 0 and at 5; a 2-gram [6, 7] also at 10.
    tokens = np.array([5, 6, 7, 1, 9, 5, 6, 7, 2, 8, 6, 7, 3, 5, 6, 7])
    assert proposer("earliest", k=2).propose(tokens) == [1, 9]
    assert proposer("latest_padded", k=2).propose(tokens) == [2, 8]


def test_ngram_without_a_match():
    tokens = np.array([1, 2, 3, 4, 5])
    assert proposer("earliest").propose(tokens) == []
    assert proposer("latest_padded").propose(tokens) == [5, 5, 5, 5]


def test_ngram_respects_min_n_and_max_model_len():
    tokens = np.array([7, 8, 1, 7, 8])
    assert proposer("earliest", min_n=3, max_n=3).propose(tokens) == []
    assert proposer("earliest", min_n=2, max_n=2).propose(tokens) == [1, 7, 8]
    # k is capped by the room left under max_model_len (0.33.0's rule).
    assert proposer("earliest", min_n=2, max_n=2, max_model_len=6).propose(tokens) == [1]
    assert proposer("earliest", min_n=2, max_n=2, max_model_len=5).propose(tokens) == []


def test_ngram_matches_vllms_kmp_on_random_sequences():
    """Our windows agree with vLLM 0.33.0's KMP search (re-implemented here as its loop)
    on random short sequences over a small alphabet, where matches are frequent."""

    def kmp(origin, min_n, max_n, k):
        total = len(origin)
        if total < min_n:
            return []
        tokens = origin[::-1]
        lps = [0] * max_n
        longest, position, prev, i = 0, 0, 0, 1
        while i < total:
            if tokens[prev] == tokens[i]:
                prev += 1
                if prev >= longest:
                    longest, position = prev, i
                if i < max_n:
                    lps[i] = prev
                if prev == max_n:
                    prev = lps[max_n - 1]
                i += 1
            elif prev != 0:
                prev = lps[prev - 1]
            else:
                i += 1
        if longest < min_n:
            return []
        start = total - 1 - position + longest
        return list(origin[start : start + min(k, total - start)])

    rng = np.random.default_rng(0)
    for _ in range(300):
        tokens = rng.integers(0, 4, size=int(rng.integers(1, 30)))
        mine = proposer("earliest", min_n=2, max_n=4, k=3).propose(tokens)
        assert mine == [int(t) for t in kmp(tokens.tolist(), 2, 4, 3)], tokens.tolist()


# --- accepting drafts: greedy ----------------------------------------------------------


def one_hot_logits(chosen: list[int], vocab: int = 100) -> torch.Tensor:
    """Logits whose argmax at candidate position j is chosen[j] (vLLM's
    create_logits_tensor)."""
    logits = torch.full((len(chosen), vocab), -100.0)
    for j, token in enumerate(chosen):
        logits[j, token] = 100.0
    return logits


GREEDY = SimpleNamespace(temperature=0.0, top_k=0, top_p=1.0, seed=None)


@pytest.mark.parametrize(
    ("drafts", "target", "expected"),
    [
        ([1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 4]),  # perfect match, bonus 4
        ([1, 2, 3], [1, 5, 3, 4], [1, 5]),  # early mismatch
        ([1, 2], [1, 2, 5], [1, 2, 5]),  # multiple sequences, row 0
        ([3], [3, 4], [3, 4]),  # row 1
        ([1], [1, 2], [1, 2]),  # single token
        ([], [5], [5]),  # no drafts: the bonus alone
        ([1, 2, 3], [1, 2, 7, 6], [1, 2, 7]),  # multiple mismatches
        ([4, 5, 6], [4, 8, 6, 9], [4, 8]),
        ([1], [2, 3], [2]),  # first mismatch
    ],
)
def test_greedy_acceptance_as_vllms_rejection_sampler(drafts, target, expected):
    assert accept_row(drafts, one_hot_logits(target), GREEDY, position=0) == expected


# --- accepting drafts: sampled ---------------------------------------------------------


def sampled(seed=None, temperature=1.0, top_k=0, top_p=1.0):
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, seed=seed)


def test_seeded_rows_are_deterministic():
    torch.manual_seed(0)
    logits = torch.rand(6, 1000)
    drafts = torch.randint(0, 1000, (5,)).tolist()
    runs = {tuple(accept_row(drafts, logits, sampled(seed=3), position=11)) for _ in range(20)}
    assert len(runs) == 1
    other = {tuple(accept_row(drafts, logits, sampled(seed=4), position=11)) for _ in range(20)}
    assert len(other) == 1


def test_a_certain_draft_is_always_accepted_and_an_impossible_one_never():
    logits = torch.full((3, 10), -1e9)
    logits[:, 4] = 0.0  # the target puts all its mass on token 4
    assert accept_row([4, 4], logits, sampled(), position=0) == [4, 4, 4]
    logits[:, 5] = 0.0  # 4 and 5 equally likely: a draft of 7 (probability 0) is rejected
    for _ in range(20):
        out = accept_row([7, 7], logits, sampled(), position=0)
        assert len(out) == 1 and out[0] in (4, 5)


def test_top_k_and_top_p_as_vllm_applies_them():
    logits = torch.tensor([[1.0, 4.0, 3.0, 2.0]])
    probs = target_probs(logits, sampled(top_k=2))
    assert (probs[0, [0, 3]] == 0).all() and abs(float(probs.sum()) - 1) < 1e-6
    # top_p=0.5: the largest token holds ~0.64 of the mass, so only it stays.
    probs = target_probs(logits, sampled(top_p=0.5))
    assert float(probs[0, 1]) == pytest.approx(1.0)


def test_rejection_sampling_keeps_the_target_distribution():
    """The first committed token of a row with one n-gram draft (draft probability 1)
    is distributed as the target: 10,000 seeded draws, total variation distance under
    0.03 (the sampling error at this size is about 0.01; a rule that over-accepts the
    draft moves tenths of the mass onto it)."""
    torch.manual_seed(1234)
    vocab = 8
    logits = torch.randn(2, vocab)
    target = target_probs(logits[:1], sampled())[0]
    counts = torch.zeros(vocab)
    draws = 10_000
    for i in range(draws):
        out = accept_row([3], logits, sampled(seed=i), position=0)
        counts[out[0]] += 1
    distance = 0.5 * float((counts / draws - target).abs().sum())
    assert distance < 0.03, (counts / draws, target)


# --- the reference generator's verify --------------------------------------------------


@pytest.fixture(scope="module")
def generator(demo_checkpoint):
    from transformers import AutoConfig

    from ttbundles.format.contract import HostMesh
    from ttbundles.reference.generator import ReferenceLlamaGenerator

    hf_config = AutoConfig.from_pretrained(demo_checkpoint)
    return ReferenceLlamaGenerator.initialize_vllm_model(
        hf_config, HostMesh(), max_batch_size=2, max_seq_len=128
    )


def prefilled(generator):
    """A cache of 8 blocks of 16 and two 6-token prompts prefilled in slots 0 and 1."""
    cache = generator.allocate_kv_cache(
        (8, generator.dims.num_kv_heads, 16, generator.dims.head_dim),
        torch.float32,
        generator.dims.num_layers,
    )
    table = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    prompt = torch.tensor([[5, 9, 13, 2, 7, 0], [3, 3, 4, 8, 1, 6]])
    generator.prefill_forward(prompt, table, cache, prompt_lens=[6, 6], empty_slots=[0, 1])
    return cache, table


def test_the_reference_verify_equals_its_one_token_decodes(generator):
    """One verify over [last, d1, d2] gives, at each column, the logits the ordinary
    decode gives when the same tokens are fed one at a time."""
    cache, table = prefilled(generator)
    fed = [[11, 12, 13], [21, 22, 23]]  # column 0 the last committed token, then drafts
    out = generator.decode_forward(
        torch.tensor(fed),
        torch.tensor([[6, 7, 8], [6, 7, 8]]),
        table,
        cache,
        num_valid_drafts=torch.tensor([2, 1], dtype=torch.int32),
        accepted_counts=torch.tensor([1, 1], dtype=torch.int32),
        spec_mode=spec.ACCEPT_MODE_LOGITS,
    )
    assert isinstance(out, spec.VerifyOutput) and out.logits.shape[:2] == (2, 3)
    for column in range(3):
        positions = torch.tensor([6 + column, 6 + column if column < 2 else -1])
        tokens = torch.tensor([[fed[0][column]], [fed[1][column]]])
        logits, _ = generator.decode_forward(tokens, positions, table, cache)
        assert torch.allclose(out.logits[0, column], logits[0, 0], atol=1e-4)
        if column < 2:
            assert torch.allclose(out.logits[1, column], logits[1, 0], atol=1e-4)
    ids = generator.decode_forward(
        torch.tensor(fed),
        torch.tensor([[6, 7, 8], [6, 7, 8]]),
        table,
        cache,
        num_valid_drafts=torch.tensor([2, 1], dtype=torch.int32),
        accepted_counts=torch.tensor([1, 1], dtype=torch.int32),
        spec_mode=spec.ACCEPT_MODE_ARGMAX_IDS,
    ).argmax_ids
    assert ids[1, 2] == PLACEHOLDER and ids[0, 2] == int(out.logits[0, 2].argmax())


def test_a_deferred_reference_verify_is_read_back_as_the_synchronous_one(generator):
    """read_from_device=False (asynchronous scheduling, supports_async_spec_decode): the
    VerifyOutput holds a device block; read_decode_output and process_decode_output_host
    give the same `[B, 1+K]` ids and `[B, 1+K, V]` logits as the synchronous verify."""
    cache, table = prefilled(generator)
    args = (torch.tensor([[11, 12, 13], [21, 22, 23]]), torch.tensor([[6, 7, 8], [6, 7, 8]]))
    keywords = dict(
        num_valid_drafts=torch.tensor([2, 1], dtype=torch.int32),
        accepted_counts=torch.tensor([1, 1], dtype=torch.int32),
    )
    for mode, field, is_tokens in (
        (spec.ACCEPT_MODE_ARGMAX_IDS, "argmax_ids", True),
        (spec.ACCEPT_MODE_LOGITS, "logits", False),
    ):
        now = generator.decode_forward(*args, table, cache, spec_mode=mode, **keywords)
        later = generator.decode_forward(
            *args, table, cache, spec_mode=mode, read_from_device=False, **keywords
        )
        assert isinstance(later, spec.VerifyOutput) and later.spec_mode == mode
        host, events = generator.read_decode_output(getattr(later, field), async_read=True)
        for event in events:
            event.wait()
        block_out, _ = generator.process_decode_output_host(host, is_tokens=is_tokens)
        expected = getattr(now, field)
        assert block_out.shape == expected.shape
        assert torch.allclose(block_out.float(), expected.float(), atol=1e-4)


def test_the_lanes_speculative_counts_are_summed():
    from vllm.v1.spec_decode.metrics import SpecDecodingStats

    from ttbundles.serving.lanes import _sum_spec_stats

    first, second = SpecDecodingStats.new(4), SpecDecodingStats.new(4)
    first.observe_draft(num_draft_tokens=4, num_accepted_tokens=2)
    second.observe_draft(num_draft_tokens=3, num_accepted_tokens=3)
    total = _sum_spec_stats([first, None, second])
    assert (total.num_drafts, total.num_draft_tokens, total.num_accepted_tokens) == (2, 7, 5)
    assert total.num_accepted_tokens_per_pos == [2, 2, 1, 0]
    assert total.num_draft_tokens_per_pos == [2, 2, 2, 1]
    assert _sum_spec_stats([None, None]) is None


# --- the reference generator's own drafter (custom_class) -------------------------------


def test_the_reference_drafter_drafts_what_its_first_layers_decode_greedily(demo_checkpoint):
    """propose_draft_tokens after a prefill and after a verify: each row's drafts are the
    greedy continuation of the model cut to its first `draft_layers` layers, computed
    from scratch (its own cache, whole sequence): the drafter's reuse of the target's
    cache and its scratch K/V change nothing."""
    from transformers import AutoConfig

    from ttbundles.format.contract import HostMesh
    from ttbundles.reference.generator import ReferenceLlamaGenerator

    hf_config = AutoConfig.from_pretrained(demo_checkpoint)
    target = ReferenceLlamaGenerator.initialize_vllm_model(
        hf_config, HostMesh(), max_batch_size=3, max_seq_len=128
    )
    layers = target.draft_layers
    assert 1 <= layers < target.dims.num_layers
    early = ReferenceLlamaGenerator.initialize_vllm_model(
        hf_config, HostMesh(), max_batch_size=1, max_seq_len=128, n_layers=layers
    )
    block, k = 4, 3
    dims = target.dims
    cache = target.allocate_kv_cache(
        (16, dims.num_kv_heads, block, dims.head_dim), None, dims.num_layers
    )
    table = torch.tensor([[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]], dtype=torch.int32)
    prompts = [[5, 9, 13, 2, 7], [3, 3, 4, 8, 1, 6, 2], [1]]
    tokens = torch.zeros(3, 7, dtype=torch.int64)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)] = torch.tensor(p)
    # Slot 2 holds no request: a padding row.
    target.prefill_forward(tokens[:2], table[:2], cache, prompt_lens=[5, 7], empty_slots=[0, 1])

    def expected(history: list[int]) -> list[int]:
        """Greedy continuation of the cut model from scratch."""
        own = early.allocate_kv_cache((16, dims.num_kv_heads, block, dims.head_dim), None, layers)
        row_table = torch.arange(16, dtype=torch.int32)[None]
        seq = list(history)
        out = []
        logits = early.prefill_forward(torch.tensor([seq]), row_table, own, prompt_lens=[len(seq)])[
            0, 0
        ]
        for _ in range(k):
            out.append(int(logits.argmax()))
            logits, _ = early.decode_forward(
                torch.tensor([[out[-1]]]), torch.tensor([len(seq) + len(out) - 1]), row_table, own
            )
            logits = logits[0, 0]
        return out

    def propose(committed: list[list[int]], first_positions: list[int]) -> spec.DraftOutput:
        width = 1 + k
        block_tokens = torch.full((3, width), PLACEHOLDER, dtype=torch.int32)
        block_positions = torch.full((3, width), -1, dtype=torch.int32)
        counts = torch.ones(3, dtype=torch.int32)
        for row, (row_tokens, start) in enumerate(zip(committed, first_positions)):
            n = len(row_tokens)
            block_tokens[row, :n] = torch.tensor(row_tokens, dtype=torch.int32)
            block_positions[row, :n] = torch.arange(start, start + n, dtype=torch.int32)
            counts[row] = n
        return target.propose_draft_tokens(k, block_tokens, block_positions, counts)

    # After the prefill: each row committed its first token at its prompt length.
    first = [17, 23]
    out = propose([[first[0]], [first[1]]], [5, 7])
    assert out.num_valid.tolist() == [k, k, 0]
    for row in range(2):
        assert out.draft_token_ids[row].tolist() == expected(prompts[row] + [first[row]])
    # A verify of [first, d1, d2] for row 0 and [first] for row 1; row 0 commits two
    # tokens (d1 and its correction), row 1 one.
    drafts = [out.draft_token_ids[0, :2].tolist(), []]
    target.decode_forward(
        torch.tensor([[first[0], *drafts[0]], [first[1], PLACEHOLDER, PLACEHOLDER]]),
        torch.tensor([[5, 6, 7], [7, -1, -1]]),
        table[:2],
        cache,
        num_valid_drafts=torch.tensor([2, 0], dtype=torch.int32),
        accepted_counts=torch.tensor([1, 1], dtype=torch.int32),
        spec_mode=spec.ACCEPT_MODE_ARGMAX_IDS,
    )
    committed = [[drafts[0][0], 41], [42]]
    out = propose(committed, [6, 8])
    assert out.draft_token_ids[0].tolist() == expected(prompts[0] + [first[0], *committed[0]])
    assert out.draft_token_ids[1].tolist() == expected(prompts[1] + [first[1], *committed[1]])
    assert out.num_valid.tolist() == [k, k, 0]


def test_the_reference_drafter_reads_each_lanes_own_cache(demo_checkpoint):
    """With lanes (tt_data_parallel=2, single-execute), slot 3 is lane 1's: its drafts
    read lane 1's cache through its lane-local page table, and equal the drafts of the
    same prompt in a generator without lanes."""
    from transformers import AutoConfig

    from ttbundles.format.contract import HostMesh
    from ttbundles.reference.generator import ReferenceLlamaGenerator

    hf_config = AutoConfig.from_pretrained(demo_checkpoint)
    k, prompt, first = 3, [5, 9, 13, 2, 7, 4], 17

    def drafts(lanes: int, slot: int) -> list[int]:
        gen = ReferenceLlamaGenerator.initialize_vllm_model(
            hf_config, HostMesh(), max_batch_size=4, max_seq_len=64, tt_data_parallel=lanes
        )
        dims = gen.dims
        cache = gen.allocate_kv_cache(
            (8, dims.num_kv_heads, 4, dims.head_dim), None, dims.num_layers
        )
        # Lane 0's slot 1 holds another prompt in the same lane-local blocks 0-1.
        gen.prefill_forward(
            torch.tensor([prompt, [3, 3, 4, 8, 1, 6]]),
            torch.tensor([[0, 1], [0, 1] if lanes > 1 else [2, 3]], dtype=torch.int32),
            cache,
            prompt_lens=[6, 6],
            empty_slots=[slot, 1],
        )
        tokens = torch.full((4, 1 + k), PLACEHOLDER, dtype=torch.int32)
        positions = torch.full((4, 1 + k), -1, dtype=torch.int32)
        tokens[slot, 0], positions[slot, 0] = first, len(prompt)
        out = gen.propose_draft_tokens(k, tokens, positions, torch.ones(4, dtype=torch.int32))
        assert out.num_valid.tolist() == [k if s == slot else 0 for s in range(4)]
        return out.draft_token_ids[slot].tolist()

    assert drafts(2, 3) == drafts(1, 0)


# --- admission and per-request refusals -------------------------------------------------


def configure(checkpoint, speculative, **kwargs):
    kwargs.setdefault("max_model_len", 256)
    kwargs.setdefault("async_scheduling", False)
    config = EngineArgs(
        model=str(checkpoint), speculative_config=speculative, **kwargs
    ).create_engine_config()
    plan = config.additional_config["ttbundles"]
    return config, {d["setting"]: d for d in plan["decisions"]}, plan


NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}


def test_ngram_is_admitted_as_a_plan_decision(demo_checkpoint):
    _, decisions, plan = configure(demo_checkpoint, NGRAM)
    assert decisions["speculative"]["effective"] == "ngram, k=3"
    assert "spec_plan admitted it" in decisions["speculative"]["reason"]
    assert plan["speculative"]["accept_modes"] == ["argmax_ids", "logits"]
    assert plan["speculative"]["prompt_lookup_max"] == 3


@pytest.mark.parametrize(
    ("speculative", "extra", "code", "words"),
    [
        ({**NGRAM, "num_speculative_tokens": 12}, {}, "TTB235", "supported_k"),
        # (Both releases know ngram_gpu; suffix needs a package that 0.33.0 imports first.)
        ({"method": "ngram_gpu", "num_speculative_tokens": 3}, {}, "TTB235", "not supported yet"),
    ],
)
def test_what_cannot_speculate_is_refused(demo_checkpoint, speculative, extra, code, words):
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, speculative, **extra)
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.code == code
    text = f"{diagnostic.message} {diagnostic.hint}"
    assert (words in text) if words != "supported_k" else ("would take" in text), text


def without_async_spec_decode(models_dir):
    """The demo bundle, its class and metadata without supports_async_spec_decode, in
    `models_dir` (it shadows the built-in for the architecture)."""
    from ttbundles.paths import builtin_bundles_dir

    source = builtin_bundles_dir() / "demo"
    target = models_dir / "demo-sync-spec"
    target.mkdir(parents=True)
    document = json.loads((source / "vllm_metadata.json").read_text())
    document["name"] = "demo-sync-spec"
    del document["capabilities"]["async_spec_decode"]
    (target / "vllm_metadata.json").write_text(json.dumps(document))
    adapter = (source / "adapter.py").read_text()
    adapter = adapter.replace(
        "class DemoGenerator(ReferenceLlamaGenerator):",
        "class DemoGenerator(ReferenceLlamaGenerator):  # noqa",
    ).replace('        "supports_async_spec_decode": True,\n', "")
    (target / "adapter.py").write_text(
        adapter + "\n\nDemoGenerator.model_capabilities = {k: v for k, v in "
        "DemoGenerator.model_capabilities.items() if k != 'supports_async_spec_decode'}\n"
    )
    return target


def test_speculation_with_asynchronous_scheduling_needs_async_spec_decode(
    demo_checkpoint, tmp_path, monkeypatch
):
    """The demo bundle declares async_spec_decode: speculation keeps vLLM's asynchronous
    scheduling (0.34.0's default). A bundle that does not is refused with the fix. 0.33.0
    decides first itself: its V1 runner protocol takes ngram only synchronously, so it
    refuses an explicit --async-scheduling and turns its default off."""
    from pydantic import ValidationError

    from ttbundles.serving import compat

    if compat.V1_RUNNER_PARTS:
        with pytest.raises(ValidationError, match="Async scheduling is not supported"):
            configure(demo_checkpoint, NGRAM, async_scheduling=True)
        config, decisions, _ = configure(demo_checkpoint, NGRAM, async_scheduling=None)
        assert config.scheduler_config.async_scheduling is False
        assert decisions["speculative"]["effective"] == "ngram, k=3"
        return
    config, decisions, plan = configure(demo_checkpoint, NGRAM, async_scheduling=None)
    assert config.scheduler_config.async_scheduling is True
    assert plan["speculative"]["async"] is True
    assert "asynchronous scheduling" in decisions["speculative"]["reason"]
    assert config.scheduler_config.scheduler_cls == "ttbundles.serving.scheduler.TTAsyncScheduler"
    without_async_spec_decode(tmp_path)
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tmp_path))
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, NGRAM, async_scheduling=True)
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.code == "TTB236" and "--no-async-scheduling" in diagnostic.hint
    assert "demo-sync-spec@1.0.0 does not" in diagnostic.message
    # Synchronous, the same bundle speculates.
    _, decisions, _ = configure(demo_checkpoint, NGRAM, async_scheduling=False)
    assert decisions["speculative"]["effective"] == "ngram, k=3"


def test_speculation_with_lanes_is_admitted(demo_checkpoint, tmp_path, monkeypatch):
    """In-process lanes speculate: the plan has 4 lanes and the speculative decision
    says how (drafts per request in its lane, one verify per step)."""
    from ttbundles.demo.variants import write_lanes_bundle

    write_lanes_bundle(tmp_path)
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(tmp_path))
    config, decisions, plan = configure(
        demo_checkpoint, NGRAM, data_parallel_size=4, max_num_seqs=2, async_scheduling=None
    )
    assert plan["lanes"] == 4
    assert plan["speculative"]["k"] == 3
    assert "4 lanes: drafts per request in its lane" in decisions["speculative"]["reason"]
    assert config.scheduler_config.scheduler_cls == "ttbundles.serving.lanes.TTLaneCoordinator"


def test_plan_command_says_what_the_server_serves(run_cli, demo_checkpoint, tmp_path):
    """`ttbundle plan` runs the server's admission: lanes with speculation admitted (and
    asynchronous where the release keeps it on), a bundle without async_spec_decode
    refused with TTB236 and its fix."""
    from ttbundles.demo.variants import write_lanes_bundle
    from ttbundles.serving import compat

    write_lanes_bundle(tmp_path / "lanes")
    args = ["--model", demo_checkpoint, "--max-model-len", "256", "--format", "json"]
    args += ["--speculative-config", json.dumps(NGRAM)]
    env = {"EXTRA_MODELS_DIR": str(tmp_path / "lanes"), "MESH_DEVICE": "HOST"}
    # Each plan imports vLLM: minutes on a loaded machine.
    run = run_cli(
        "plan", *args, "--data-parallel-size", "2", "--max-num-seqs", "4", env=env, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    plan = json.loads(run.stdout)
    plan = plan.get("plan", plan)
    decisions = {d["setting"]: d for d in plan["decisions"]}
    assert plan["lanes"] == 2
    reason = decisions["speculative"]["reason"]
    assert decisions["speculative"]["effective"] == "ngram, k=3"
    assert "2 lanes: drafts per request in its lane" in reason
    assert ("asynchronous scheduling" in reason) == (not compat.V1_RUNNER_PARTS), reason
    if compat.V1_RUNNER_PARTS:  # 0.33.0 turns asynchronous scheduling off itself
        return
    without_async_spec_decode(tmp_path / "sync")
    env["EXTRA_MODELS_DIR"] = str(tmp_path / "sync")
    run = run_cli("plan", *args, env=env, timeout=300)
    output = run.stdout + run.stderr
    assert run.returncode == 1 and "TTB236" in output and "--no-async-scheduling" in output


DRAFTER = {
    "method": "custom_class",
    "model": "vllm_tt_plugin.model_owned_drafter",
    "num_speculative_tokens": 3,
}


def test_the_models_own_drafter_is_admitted_for_a_bundle_declaring_it(demo_checkpoint, monkeypatch):
    """custom_class (built into 0.33.0's SpeculativeConfig, registered by our general
    plugin on 0.34.0) on the demo-drafter variant: the class's plan is the decision."""
    monkeypatch.setenv("TT_DEMO_VARIANT", "drafter")
    _, decisions, plan = configure(demo_checkpoint, DRAFTER)
    assert decisions["speculative"]["effective"] == "custom_class, k=3"
    assert "DemoDrafterGenerator.spec_plan admitted it" in decisions["speculative"]["reason"]
    assert plan["speculative"]["method"] == "custom_class"
    assert plan["speculative"]["plan"]["drafter_state"] == "shared_with_target"


@pytest.mark.parametrize(
    ("variant", "speculative", "words"),
    [
        # The demo serves n-gram speculation only.
        (None, DRAFTER, "does not declare speculative method 'custom_class'"),
        # vLLM would import another class as the proposer; the TT runner asks the model.
        ("drafter", {**DRAFTER, "model": "mypkg.Drafter"}, "must be the marker"),
    ],
)
def test_the_models_own_drafter_is_refused_where_it_cannot_serve(
    demo_checkpoint, monkeypatch, variant, speculative, words
):
    if variant is not None:
        monkeypatch.setenv("TT_DEMO_VARIANT", variant)
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, speculative)
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.code == "TTB235" and words in diagnostic.message, diagnostic.message


def test_another_methods_refusal_names_the_served_methods(demo_checkpoint):
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, {"method": "ngram_gpu", "num_speculative_tokens": 3})
    assert "custom_class, ngram" in excinfo.value.diagnostics[0].message


SPECULATING = SpeculativePlan(
    method="ngram", k=3, accept_modes=("argmax_ids", "logits"), narrow=False
)


@pytest.mark.parametrize(
    ("params", "expected"),
    [
        (SamplingParams(temperature=0), None),
        (SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=3), None),
        (SamplingParams(logprobs=0), None),  # served: read off the verify's logits
        (SamplingParams(temperature=0.7, logprobs=5), None),
        (SamplingParams(min_tokens=4), ("TTB237", "min_tokens")),
        (SamplingParams(bad_words=["x"]), ("TTB237", "bad_words")),
        (SamplingParams(presence_penalty=0.5), ("TTB237", "presence_penalty")),
        (SamplingParams(repetition_penalty=1.2), ("TTB237", "repetition_penalty")),
        (SamplingParams(min_p=0.1), ("TTB237", "min_p")),
        (SamplingParams(logit_bias={3: 1.0}), ("TTB237", "logit_bias")),
    ],
)
def test_requests_refused_while_speculating(params, expected):
    refusal = request_refusal(SPECULATING, params)
    assert (refusal[:2] if refusal else None) == expected


TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


def _chat_params(**fields):
    """The SamplingParams vLLM's own chat endpoint makes of a request body (a forced
    tool choice becomes a JSON schema as its tool parser does: `adjust_request`)."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    request = ChatCompletionRequest(
        model="m", messages=[{"role": "user", "content": "hi"}], **fields
    )
    if request.tools:
        schema = get_json_schema_from_tools(request.tool_choice, request.tools)
        if schema is not None:
            request.structured_outputs = StructuredOutputsParams(json=schema)
            request.response_format = None
    return request.to_sampling_params(8, {})


@pytest.mark.parametrize(
    ("fields", "names"),
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": {"type": "object"}},
                }
            },
            "response_format json_schema",
        ),
        ({"response_format": {"type": "json_object"}}, "response_format"),
        ({"tools": [TOOL], "tool_choice": "required"}, 'tool_choice "required"'),
        (
            {"tools": [TOOL], "tool_choice": {"type": "function", "function": TOOL["function"]}},
            "named tool_choice",
        ),
        ({"structured_outputs": {"choice": ["yes", "no"]}}, "structured_outputs.choice"),
        ({"structured_outputs": {"regex": "[a-z]+"}}, "structured_outputs.regex"),
        ({"bad_words": ["x"] * 50}, "bad_words="),
        ({"min_tokens": 3}, "min_tokens=3"),
        ({"presence_penalty": 0.5}, "presence_penalty=0.5"),
    ],
)
def test_a_refusal_names_what_the_client_sent_in_one_short_line(fields, names):
    message = refusal_message(SPECULATING, request_refusal(SPECULATING, _chat_params(**fields)))
    assert message.startswith("TTB237: ") and names in message, message
    assert "\n" not in message and len(message) < 260, (len(message), message)
    assert "Params(" not in message, message


def test_a_choice_made_a_grammar_by_vllms_check_is_named_choice():
    """vLLM's xgrammar check replaces `choice` with its grammar before the platform
    sees the request: the refusal still names the field the client sent."""
    from vllm.v1.structured_output.backend_xgrammar import validate_xgrammar_grammar

    params = _chat_params(structured_outputs={"choice": ["yes", 'say "no"']})
    validate_xgrammar_grammar(params)
    assert params.structured_outputs.choice is None and params.structured_outputs.grammar
    message = refusal_message(SPECULATING, request_refusal(SPECULATING, params))
    assert "structured_outputs.choice" in message and "grammar" not in message, message
    written = _chat_params(structured_outputs={"grammar": 'root ::= "a" | b\nb ::= "c"'})
    message = refusal_message(SPECULATING, request_refusal(SPECULATING, written))
    assert "structured_outputs.grammar" in message, message


def test_sampled_requests_need_the_logits_accept_mode():
    greedy_only = replace(SPECULATING, accept_modes=("argmax_ids",))
    assert request_refusal(greedy_only, SamplingParams(temperature=0.7))[:2] == (
        "TTB237",
        "temperature",
    )
    assert request_refusal(greedy_only, SamplingParams(temperature=0)) is None


def test_logprobs_need_the_logits_accept_mode_and_the_refusal_says_why():
    greedy_only = replace(SPECULATING, accept_modes=("argmax_ids",))
    code, parameter, value, why = request_refusal(greedy_only, SamplingParams(logprobs=2))
    assert (code, parameter, value) == ("TTB238", "logprobs", 2)
    assert "'logits' accept mode" in why and "verify's logits" in why
    assert request_refusal(SPECULATING, SamplingParams(logprobs=2)) is None


def test_plans_and_rejections_check_their_fields():
    with pytest.raises(ValueError):
        spec.SpecPlan(0, 1, 0, 0, ("argmax_ids",), "internal")
    with pytest.raises(ValueError):
        spec.SpecPlan(2, 1, 0, 0, "argmax_ids", "internal")  # one string, not a sequence
    with pytest.raises(ValueError):
        spec.SpecReject("  ")
    with pytest.raises(ValueError):
        spec.VerifyOutput("argmax_ids")  # no argmax_ids
    assert json.loads(json.dumps(spec.SpecPlan(2, 1, 0, 0, ["logits"], "internal").to_dict()))


# --- logprobs while speculating: the runner and vLLM's scheduler, in this process ------


def drive(scheduler, runner, requests):
    """The engine core's synchronous loop with speculation (`EngineCore.step` then
    `post_step`: the runner's drafts go to the scheduler after each step). Returns each
    request's tokens and the logprobs rows vLLM's scheduler sliced for it
    (`LogprobsLists.slice_request`), one per token, as (ids, values, rank) tuples."""
    for request in requests:
        scheduler.add_request(request)
    tokens = {r.request_id: [] for r in requests}
    rows = {r.request_id: [] for r in requests}
    for _ in range(500):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        runner.execute_model(output)
        result = runner.sample_tokens(None)
        for outputs in scheduler.update_from_output(output, result).values():
            for out in outputs.outputs:
                tokens[out.request_id].extend(out.new_token_ids)
                lists = out.new_logprobs
                if lists is None:
                    continue
                assert len(lists.logprobs) == len(out.new_token_ids)
                for ids, values, rank in zip(
                    lists.logprob_token_ids, lists.logprobs, lists.sampled_token_ranks
                ):
                    rows[out.request_id].append((ids.tolist(), values.tolist(), int(rank)))
        drafts = runner.take_draft_token_ids()
        if drafts is not None:
            scheduler.update_draft_token_ids(drafts)
    return tokens, rows


def speculating_and_plain(checkpoint):
    from tests.test_runner_steps import build

    speculating = build(
        checkpoint,
        async_decode=False,
        speculative_config={
            "method": "ngram",
            "num_speculative_tokens": 4,
            "prompt_lookup_max": 3,
            "prompt_lookup_min": 1,
        },
    )
    plain = build(checkpoint, async_decode=False)
    return speculating, plain


REPEATING = [7, 8, 9, 10] * 6
RANDOM_IDS = [
    int(t) for t in torch.randint(3, 250, (24,), generator=torch.Generator().manual_seed(5))
]


def assert_same_logprobs(got, want, tolerance=1e-4):
    """Row by row: the sampled token, its logprob and rank, the top ids and logprobs."""
    assert len(got) == len(want)
    for (ids, values, rank), (ids_w, values_w, rank_w) in zip(got, want):
        assert ids[0] == ids_w[0]
        assert values == pytest.approx(values_w, abs=tolerance)
        assert ids[1:] == ids_w[1:], (values, values_w)
        assert rank == rank_w


def test_greedy_logprobs_while_speculating_equal_those_without(demo_checkpoint):
    """Greedy requests with logprobs=5 on a repeating prompt (drafts accepted) and on
    random ids, speculating and not, through vLLM's scheduler: the same tokens and, per
    token, the same logprob, rank and top 5 (float32 tolerance). A request without
    logprobs in the same batch gets none."""
    from tests.test_runner_steps import request

    (scheduler, runner), (plain_scheduler, plain_runner) = speculating_and_plain(demo_checkpoint)
    before = STATS.snapshot()

    def requests():
        return [
            request("rep", REPEATING, 24, temperature=0.0, logprobs=5),
            request("rand", RANDOM_IDS, 24, temperature=0.0, logprobs=5),
            request("none", REPEATING[:10], 12, temperature=0.0),
        ]

    tokens, rows = drive(scheduler, runner, requests())
    after = STATS.snapshot()
    want_tokens, want_rows = drive(plain_scheduler, plain_runner, requests())
    assert tokens == want_tokens
    for name in ("rep", "rand"):
        assert len(rows[name]) == 24
        assert_same_logprobs(rows[name], want_rows[name])
    assert rows["none"] == []
    verified = after.get("step.verify", 0) - before.get("step.verify", 0)
    committed = after.get("speculative.committed_tokens", 0) - before.get(
        "speculative.committed_tokens", 0
    )
    assert verified > 0 and committed > verified, "no verify committed more than one token"


def test_sampled_logprobs_while_speculating_are_the_targets(demo_checkpoint):
    """A sampled request (temperature 0.9, seeded) with logprobs=3 while speculating:
    each committed token's logprob, rank and top 3 are the log-softmax of the target's
    raw logits at its position (transformers on the checkpoint, float32)."""
    from transformers import AutoModelForCausalLM

    from tests.test_runner_steps import request

    (scheduler, runner), _ = speculating_and_plain(demo_checkpoint)
    model = AutoModelForCausalLM.from_pretrained(demo_checkpoint, dtype=torch.float32).eval()
    before = STATS.snapshot().get("step.verify", 0)
    tokens, rows = drive(
        scheduler,
        runner,
        [request("s", REPEATING, 20, temperature=0.9, top_k=8, seed=11, logprobs=3)],
    )
    assert STATS.snapshot().get("step.verify", 0) > before
    out = tokens["s"]
    with torch.no_grad():
        logits = model(torch.tensor([REPEATING + out])).logits[0].float()
    target = torch.log_softmax(logits[len(REPEATING) - 1 : -1], dim=-1)
    assert len(rows["s"]) == len(out) == 20
    for j, ((ids, values, rank), token) in enumerate(zip(rows["s"], out)):
        assert ids[0] == token
        assert values[0] == pytest.approx(float(target[j, token]), abs=1e-4)
        top = target[j].topk(3)
        assert ids[1:] == top.indices.tolist()
        assert values[1:] == pytest.approx(top.values.tolist(), abs=1e-4)
        assert rank == int((target[j] >= target[j, token]).sum())


def test_verify_logprobs_are_laid_out_one_row_per_committed_token(demo_checkpoint):
    """`Speculation.logprobs` over a verify's logits by slot: rows in request order, each
    request's committed tokens scored at their own candidate positions, and
    `cu_num_generated_tokens` where vLLM's scheduler starts each request's slice."""
    from ttbundles.serving import compat
    from ttbundles.serving.runner.speculation import Speculation

    config, _, _ = configure(demo_checkpoint, NGRAM, max_num_seqs=3)
    batch = compat.host_batch(config, torch.device("cpu"))
    vocab = 50
    speculation = Speculation(
        "ngram", 3, ("argmax_ids", "logits"), True, capacity=3, vocab_size=vocab
    )
    logits = torch.randn(3, 4, vocab, generator=torch.Generator().manual_seed(2))
    out = spec.VerifyOutput(spec.ACCEPT_MODE_LOGITS, logits=logits)
    slots = np.array([2, 0])
    committed = [[4, 9, 1], [7]]
    params = [SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=0)]
    lists = speculation.logprobs(out, slots, committed, params, batch.logprobs, processed=False)
    assert lists.cu_num_generated_tokens == [0, 3, 4]
    cells = [(2, 0, 4), (2, 1, 9), (2, 2, 1), (0, 0, 7)]
    for row, (slot, column, token) in enumerate(cells):
        scores = torch.log_softmax(logits[slot, column], dim=-1)
        assert lists.logprob_token_ids[row][0] == token
        assert lists.logprobs[row][0] == pytest.approx(float(scores[token]), abs=1e-6)
        assert list(lists.logprob_token_ids[row][1:]) == scores.topk(2).indices.tolist()
    second = lists.slice_request(1, 1)
    assert second.logprob_token_ids[0][0] == 7
    assert (
        speculation.logprobs(out, slots, committed, params[1:] * 2, batch.logprobs, processed=False)
        is None
    )
    # Logprobs pick the logits accept mode even for a greedy batch.
    assert speculation.spec_mode(params) == spec.ACCEPT_MODE_LOGITS
    assert speculation.spec_mode(params[1:]) == spec.ACCEPT_MODE_ARGMAX_IDS
