"""Sliding-window attention: which layers slide (`format.attention_window`, against
transformers' own configs and masks), and the reference generator with a window against
transformers on prompts several windows long, through every path that attends: chunked
prefill, a prefix-cache hit, decode, the speculative verify, prompt logits, the drafter.
"""

from __future__ import annotations

import json

import pytest
import torch
import transformers  # required: a missing or broken transformers fails, never skips

from tests.test_reference_generator import (
    _COMMON,
    decode,
    new_cache,
    padded,
    page_table,
    prefill,
    prompt,
)
from ttbundles.format import speculative as spec
from ttbundles.format.attention_window import WINDOW_CAPABILITY_KEY, attention_window
from ttbundles.format.contract import HostMesh
from ttbundles.reference.attention import causal_mask
from ttbundles.reference.generator import ReferenceLlamaGenerator

WINDOW = 8
ATOL = 1e-4
LENGTH = 30  # several windows


# ---- which layers slide -------------------------------------------------------------------


def test_mistral_slides_every_layer_and_llama_none():
    mistral = transformers.MistralConfig(**_COMMON, sliding_window=WINDOW)
    window = attention_window(mistral)
    assert window is not None and window.size == WINDOW
    assert window.layers == {0, 1}
    assert window.describe() == "sliding_window=8 (all 2 layers)"
    assert attention_window(transformers.MistralConfig(**_COMMON, sliding_window=None)) is None
    assert attention_window({"model_type": "llama", "sliding_window": 4}) is None
    assert attention_window({"model_type": "mistral", "sliding_window": 0}) is None


@pytest.mark.parametrize("first", [0, 1, 2])
@pytest.mark.parametrize("cls", ["Qwen2Config", "Qwen3Config"])
def test_qwen_slides_the_layers_transformers_marks(cls, first):
    """transformers derives layer_types from max_window_layers; the raw config.json (no
    layer_types) and the config object agree with it."""
    kwargs = dict(
        **_COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=first
    )
    config = getattr(transformers, cls)(**kwargs)
    expected = {i for i, t in enumerate(config.layer_types) if t == "sliding_attention"}
    model_type = "qwen2" if cls == "Qwen2Config" else "qwen3"
    raw = {"model_type": model_type, **kwargs}
    for source in (config, raw):
        window = attention_window(source)
        if not expected:
            assert window is None
        else:
            assert window is not None and window.layers == expected and window.size == WINDOW
    off = getattr(transformers, cls)(**{**kwargs, "use_sliding_window": False})
    assert attention_window(off) is None
    assert attention_window({**raw, "use_sliding_window": False}) is None


def test_other_families_follow_layer_types():
    config = {
        "model_type": "gemma3_text",
        "sliding_window": 32,
        "num_hidden_layers": 4,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    }
    window = attention_window({"model_type": "gemma3", "text_config": config})
    assert window is not None and window.layers == {0, 1, 2}
    assert window.describe() == "sliding_window=32 (layers 0-2 of 4)"


def test_the_mask_is_transformers_sliding_mask():
    """Query p sees keys p - W < c <= p: the off-by-one of transformers' own mask."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    inner = sliding_window_causal_mask_function(WINDOW)
    length = 3 * WINDOW
    queries = torch.arange(length)[None, :]
    ours = causal_mask(queries, length, WINDOW)[0]
    theirs = torch.tensor(
        [
            [bool(inner(0, 0, torch.tensor(q), torch.tensor(k))) for k in range(length)]
            for q in range(length)
        ]
    )
    assert torch.equal(ours, theirs)
    assert ours[WINDOW, 0].item() is False and ours[WINDOW, 1].item() is True


# ---- the reference with a window, against transformers -------------------------------------

CHECKPOINTS = {
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=WINDOW)),
    # layer 0 full attention, layer 1 sliding: both kinds in one model
    "qwen2": (
        "Qwen2Config",
        "Qwen2ForCausalLM",
        dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1),
    ),
    # layer 0 sliding (local RoPE), layer 1 global; Gemma's own norms, scales and MLP
    "gemma3": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        dict(
            sliding_window=WINDOW,
            head_dim=16,
            query_pre_attn_scalar=24,
            layer_types=["sliding_attention", "full_attention"],
        ),
    ),
}


def build(name: str, folder):
    config_name, model_name, extra = CHECKPOINTS[name]
    config = getattr(transformers, config_name)(**_COMMON, **extra)
    config.architectures = [model_name]
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights large enough that a wrong detail changes the logits
        for _, param in sorted(model.named_parameters()):
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            else:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
    model.save_pretrained(folder, safe_serialization=True)
    return model


def load(folder, cls=ReferenceLlamaGenerator) -> ReferenceLlamaGenerator:
    config = transformers.AutoConfig.from_pretrained(folder)
    return cls.initialize_vllm_model(
        hf_config=config, mesh_device=HostMesh(), max_batch_size=4, max_seq_len=256
    )


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    """Every position's logits `[L, V]`, one contiguous transformers forward."""
    return model(torch.tensor([ids])).logits[0]


@pytest.fixture(scope="module", params=sorted(CHECKPOINTS))
def windowed(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    model = build(request.param, folder)
    return model, load(folder)


def every_logit(gen, ids: list[int]) -> torch.Tensor:
    """The reference's logits at every position `[L, V]`, one prefill (prompt logits)."""
    return gen.prefill_forward(
        tokens=padded([ids], [0]),
        page_table=page_table([list(range(0, 16))]),
        kv_cache=new_cache(gen),
        prompt_lens=torch.tensor([len(ids)]),
        start_pos=torch.tensor([0]),
        enable_trace=False,
        return_prompt_logits=True,
    )[0]


def test_the_window_changes_the_model(windowed):
    """The tests can fail: the reference without its window agrees with transformers up
    to the window and not past it."""
    model, gen = windowed
    ids = prompt(70, LENGTH, gen.dims.vocab_size)
    expected = hf_logits(model, ids)
    torch.testing.assert_close(every_logit(gen, ids), expected, atol=ATOL, rtol=0)
    window, gen.window = gen.window, None
    try:
        unwindowed = every_logit(gen, ids)
    finally:
        gen.window = window
    torch.testing.assert_close(unwindowed[:WINDOW], expected[:WINDOW], atol=ATOL, rtol=0)
    assert not torch.allclose(unwindowed[WINDOW:], expected[WINDOW:], atol=1e-2)


def test_hidden_states_for_pooling_match_transformers_past_the_window(windowed):
    """The pooling form prefill_hidden: every position's final hidden state of a prompt
    several windows long equals transformers' `last_hidden_state` (what vLLM's pooler
    pools), and leaves it past the window without the window."""
    model, gen = windowed
    ids = prompt(74, LENGTH, gen.dims.vocab_size)

    def hidden() -> torch.Tensor:
        return gen.prefill_forward(
            tokens=padded([ids], [0]),
            page_table=page_table([list(range(0, 16))]),
            kv_cache=new_cache(gen),
            prompt_lens=torch.tensor([len(ids)]),
            enable_trace=False,
            return_hidden_states=True,
        )[0]

    with torch.no_grad():
        expected = model.model(torch.tensor([ids])).last_hidden_state[0]
    torch.testing.assert_close(hidden(), expected, atol=ATOL, rtol=0)
    window, gen.window = gen.window, None
    try:
        unwindowed = hidden()
    finally:
        gen.window = window
    assert not torch.allclose(unwindowed[WINDOW:], expected[WINDOW:], atol=1e-2)


def test_chunked_prefill_and_decode_match_transformers(windowed):
    model, gen = windowed
    ids = prompt(71, LENGTH, gen.dims.vocab_size)
    kv = new_cache(gen)
    blocks = [list(range(0, 16))]
    chunk = 7  # not a multiple of the window or the block size
    for start in range(0, LENGTH, chunk):
        logits = prefill(gen, kv, [ids[start : start + chunk]], [start], blocks)
    expected = hf_logits(model, ids)
    torch.testing.assert_close(logits[0, 0], expected[-1], atol=ATOL, rtol=0)
    tokens = list(ids)
    for _ in range(6):  # greedy decode, each step against transformers
        nxt = int(torch.argmax(logits[0, -1] if logits.dim() == 3 else logits[0]).item())
        tokens.append(nxt)
        logits = decode(gen, kv, [nxt], [len(tokens) - 1], blocks)
        torch.testing.assert_close(logits[0, 0], hf_logits(model, tokens)[-1], atol=ATOL, rtol=0)


def test_prefix_cache_hit_matches_transformers(windowed):
    """A second prompt shares the first's blocks for 3 windows of tokens and computes
    only its own tail: the window reaches back into the shared blocks."""
    model, gen = windowed
    vocab = gen.dims.vocab_size
    first = prompt(72, LENGTH, vocab)
    shared = 24  # six blocks of 4
    second = first[:shared] + prompt(73, 9, vocab)[1:]
    kv = new_cache(gen)
    prefill(gen, kv, [first], [0], [list(range(0, 16))])
    blocks = [list(range(0, shared // 4)) + list(range(20, 30))]
    logits = prefill(gen, kv, [second[shared:]], [shared], blocks)
    torch.testing.assert_close(logits[0, 0], hf_logits(model, second)[-1], atol=ATOL, rtol=0)


def test_prompt_logits_and_verify_match_transformers(windowed):
    model, gen = windowed
    ids = prompt(74, LENGTH, gen.dims.vocab_size)
    expected = hf_logits(model, ids)
    kv = new_cache(gen)
    table = page_table([list(range(0, 16))])
    every = gen.prefill_forward(
        tokens=padded([ids[:20]], [0]),
        page_table=table,
        kv_cache=kv,
        prompt_lens=torch.tensor([20]),
        start_pos=torch.tensor([0]),
        enable_trace=False,
        return_prompt_logits=True,
    )
    torch.testing.assert_close(every[0], expected[:20], atol=ATOL, rtol=0)
    # A verify of the next 5 tokens at positions 20..24 (one committed, four drafts).
    out = gen.decode_forward(
        tokens=torch.tensor([ids[20:25]]),
        start_pos=torch.arange(20, 25)[None, :],
        page_table=table,
        kv_cache=kv,
        enable_trace=False,
        num_valid_drafts=[4],
        accepted_counts=[1],
        spec_mode=spec.ACCEPT_MODE_LOGITS,
    )
    torch.testing.assert_close(out.logits[0], expected[20:25], atol=ATOL, rtol=0)


def test_drafter_drafts_what_the_windowed_early_exit_would(windowed):
    """The early-exit drafter masks the window too: with every layer drafting, its
    greedy drafts are the model's own greedy tokens."""
    model, gen = windowed
    ids = prompt(75, LENGTH, gen.dims.vocab_size)
    kv = new_cache(gen)
    prefill(gen, kv, [ids[:-1]], [0], [list(range(0, 16))])
    full = ReferenceLlamaGenerator.DRAFT_LAYERS_FRACTION
    try:
        ReferenceLlamaGenerator.DRAFT_LAYERS_FRACTION = 1.0
        drafts = gen.propose_draft_tokens(
            4,
            torch.tensor([[ids[-1]]]),
            torch.tensor([[LENGTH - 1]]),
            [1],
        )
    finally:
        ReferenceLlamaGenerator.DRAFT_LAYERS_FRACTION = full
    tokens = list(ids)
    for _ in range(4):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    assert drafts.draft_token_ids[0].tolist() == tokens[LENGTH:]


def test_the_reference_declares_the_window():
    assert ReferenceLlamaGenerator.model_capabilities[WINDOW_CAPABILITY_KEY] is True


# ---- `ttbundle test`: the golden of a reference bundle, and the window's fix line ----------


def _plan_of(folder):
    from types import SimpleNamespace

    from ttbundles.check.validate import check_bundle

    checked = check_bundle(folder)
    assert checked.metadata is not None, checked.diagnostics
    return SimpleNamespace(bundle_dir=folder, metadata=checked.metadata)


def test_a_bundle_on_the_reference_is_tested_against_transformers(run_cli, make_bundle, tmp_path):
    """`auto` picks transformers for a generator built on the reference (a golden made by
    the code under test proves nothing); any other generator keeps the reference."""
    from ttbundles.conformance.session import generator_is_reference

    done = run_cli("init", tmp_path / "mine", "--arch", "MistralForCausalLM", "--reference")
    assert done.returncode == 0, done.stderr
    assert generator_is_reference(_plan_of(tmp_path / "mine"))
    assert not generator_is_reference(_plan_of(make_bundle("other")))


def test_a_miss_past_the_window_names_the_window():
    from ttbundles.conformance.compare import window_hint

    window = attention_window(
        {"model_type": "mistral", "sliding_window": 8, "num_hidden_layers": 2}
    )
    general = "a decode step: check ..."
    assert window_hint(general, 2, window, 6) == general  # context 8: inside the window
    hint = window_hint(general, 3, window, 6)  # context 9: past it
    assert hint.startswith(
        "the context here (9 tokens) is longer than the checkpoint's sliding_window=8 (all 2 "
        "layers): the generator must mask keys older than the window"
    )
    assert hint.endswith(general)
    assert window_hint(general, 3, None, 6) == general


# --- ttbundle test reaches past the window ------------------------------------------------


def _reference_plan(tmp_path, arch="Gemma3ForCausalLM", **tests):
    from ttbundles.conformance.plan import resolve_plan
    from ttbundles.format.parse import load_metadata
    from ttbundles.scaffold.init import init_bundle

    folder = tmp_path / "b"
    init_bundle(folder, arch=arch, reference=True)
    if tests:
        document = json.loads((folder / "vllm_metadata.json").read_text())
        document.setdefault("tests", {}).update(tests.pop("section", {}))
        for mesh, target in tests.pop("targets", {}).items():
            document["targets"][mesh].update(target)
        (folder / "vllm_metadata.json").write_text(json.dumps(document))
    loaded = load_metadata(folder)
    assert loaded.metadata is not None, loaded.diagnostics
    return resolve_plan(folder, loaded.metadata)


def _window(size):
    return attention_window(
        {"model_type": "gemma3", "sliding_window": size, "num_hidden_layers": 6}
    )


def test_ttbundle_test_adds_a_prompt_past_the_window(tmp_path):
    """The default prompts (5, 8 and 14 tokens) all fit in a window of 16: the plan adds
    one longer than it, and the run reports which prompts crossed."""
    plan = _reference_plan(tmp_path)
    before = [p.name for p in plan.prompts]
    plan.cover_window(_window(16), max_positions=1024)
    assert [p.name for p in plan.prompts] == [*before, "window"]
    added = plan.prompts[-1]
    assert len(added.text.split()) >= 16 + 8 and plan.window.added == "window"
    plan.window.served({"p0": 5, "p1": 8, "p2": 14, "window": 25})
    assert plan.window.crossed and plan.window.crossed_by == ["window"]
    assert "crossed by window (longest prompt 25 tokens)" in plan.window.describe()
    record = plan.window.to_dict()
    assert record["size"] == 16 and record["crossed"] is True and record["reason"] is None
    assert (
        plan.harness_spec(models_dir=tmp_path, checkpoint="c", out_dir=tmp_path)["prompts"][-1][
            "name"
        ]
        == "window"
    )
    # no window: nothing added, nothing said
    again = _reference_plan(tmp_path / "2")
    again.cover_window(None)
    assert again.window is None and "window" not in [p.name for p in again.prompts]


def test_a_window_the_run_cannot_cross_is_said_with_its_reason(tmp_path):
    """A window the target's length leaves no room past (a real Gemma 3's 512 on a HOST
    target of 512), or a recorded golden: no prompt is added, and the run says it did
    not cross and why, in its output and its evidence."""
    plan = _reference_plan(tmp_path)
    plan.cover_window(_window(512), max_positions=8192)
    assert [p.name for p in plan.prompts] == ["p0", "p1", "p2"]
    assert "HOST target (max_model_len) allows 512" in plan.window.reason
    plan.window.served({"p0": 5, "p1": 8, "p2": 14})
    assert not plan.window.crossed
    line = plan.window.describe()
    assert "NOT crossed (longest prompt 14 tokens)" in line and "does not prove" in line
    recorded = _reference_plan(tmp_path / "2")
    recorded.cover_window(_window(16), max_positions=1024, recorded=True)
    assert "recorded golden" in recorded.window.reason and len(recorded.prompts) == 3
    # a prompt surely longer than the window already: nothing added
    long = " ".join(["word"] * 30)
    mine = _reference_plan(tmp_path / "3", section={"prompts": ["Hi there", long]})
    mine.cover_window(_window(16), max_positions=1024)
    assert [p.name for p in mine.prompts] == ["p0", "p1"] and mine.window.reason is None


def test_the_card_says_when_the_evidence_did_not_cross_the_window(tmp_path):
    from ttbundles.archive.evidence import write_evidence
    from ttbundles.check.support import support_card, to_markdown

    plan = _reference_plan(tmp_path)
    plan.cover_window(_window(512), max_positions=8192)
    plan.window.served({"p0": 5})
    write_evidence(
        plan.bundle_dir,
        {"mesh": "HOST", "passed": True, "paths": ["prefill"], "window": plan.window.to_dict()},
    )
    card = support_card(plan.bundle_dir, plan.metadata)
    assert card["meshes"]["HOST"]["evidence"]["window"]["crossed"] is False
    text = to_markdown(card)
    assert "sliding window (512 tokens) was not crossed by the tested prompts" in text


@pytest.mark.server
def test_ttbundle_test_of_a_gemma3_bundle_crosses_its_window(tmp_path, gemma3_checkpoint):
    """A real run on a Gemma 3 bundle (window 32): the added prompt crosses the window
    in prefill, matches transformers there, and the evidence says so."""
    from tests.conftest import _run_cli_process

    bundle = tmp_path / "g3"
    made = _run_cli_process("init", bundle, "--reference", "--from-hf", gemma3_checkpoint)
    assert made.returncode == 0, made.stderr
    done = _run_cli_process(
        "test", bundle, "--model", gemma3_checkpoint, "--path", "prefill",
        "--keep-evidence", "--format", "json", timeout=900,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["passed"], report["diagnostics"]
    window = report["window"]
    assert window["size"] == 32 and window["crossed"] and window["crossed_by"] == ["window"]
    assert window["longest_prompt"] > 32
    cases = {c["prompt"] for c in report["cases"]}
    assert "window" in cases
    evidence = json.loads((bundle / "evidence" / "HOST.json").read_text())
    assert evidence["window"]["crossed"] is True
    human = _run_cli_process(
        "test", bundle, "--model", gemma3_checkpoint, "--path", "prefill", timeout=900
    )
    assert "sliding window sliding_window=32" in human.stdout and "crossed by window" in (
        human.stdout
    ), human.stdout
