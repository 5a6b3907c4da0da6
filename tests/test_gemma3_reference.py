"""The reference generator on Gemma 3 text (`Gemma3ForCausalLM`) against transformers:
a 12-layer checkpoint (10 local layers with a 32-token window, 2 global ones), prompts
several windows long, through every path that attends (chunked prefill, decode, a
prefix-cache hit, prompt logits, the speculative verify, the drafter); each of Gemma's
differences from Llama is shown to matter, and the configs it does not implement are
refused with the key that is not.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers  # required: a missing or broken transformers fails, never skips

from tests.conftest import GEMMA3_WINDOW
from tests.test_reference_generator import decode, new_cache, page_table, prefill, prompt
from tests.test_sliding_window import hf_logits, load
from ttbundles.format import speculative as spec
from ttbundles.format.attention_window import attention_window
from ttbundles.reference.config import ModelDims
from ttbundles.reference.families import style_of
from ttbundles.reference.generator import ReferenceLlamaGenerator

ATOL = 1e-4
LENGTH = 3 * GEMMA3_WINDOW + 7  # several windows
BLOCKS = list(range(32))  # 128 positions of 4


@pytest.fixture(scope="module")
def gemma(gemma3_checkpoint):
    model = transformers.AutoModelForCausalLM.from_pretrained(gemma3_checkpoint).eval()
    assert type(model).__name__ == "Gemma3ForCausalLM"
    return model.float(), load(gemma3_checkpoint)


def every_logit(gen, ids: list[int]) -> torch.Tensor:
    return gen.prefill_forward(
        tokens=torch.tensor([ids]),
        page_table=page_table([BLOCKS], width=32),
        kv_cache=new_cache(gen),
        prompt_lens=torch.tensor([len(ids)]),
        start_pos=torch.tensor([0]),
        enable_trace=False,
        return_prompt_logits=True,
    )[0]


def test_the_layers_and_window_are_the_configs(gemma):
    _, gen = gemma
    assert gen.window is not None and gen.window.size == GEMMA3_WINDOW
    assert gen.window.layers == set(range(12)) - {5, 11}
    assert gen.local_rope is not None and gen.local_rope[2] == gen.window.layers
    assert gen.style.embed_scale == 8.0 and gen.scale == 24**-0.5
    assert gen.dims.hidden_act == "gelu_pytorch_tanh"


def test_prompt_logits_match_transformers_and_every_detail_matters(gemma):
    """Equal to transformers at every position; the test can fail: without any one of
    Gemma's details (or its window) the logits leave transformers'."""
    model, gen = gemma
    ids = prompt(80, LENGTH, gen.dims.vocab_size)
    expected = hf_logits(model, ids)
    torch.testing.assert_close(every_logit(gen, ids), expected, atol=ATOL, rtol=0)
    changes = {
        "embed_scale": dict(style=dataclasses.replace(gen.style, embed_scale=None)),
        "query_scale": dict(style=dataclasses.replace(gen.style, query_scale=None)),
        "final_softcap": dict(style=dataclasses.replace(gen.style, final_softcap=None)),
        "local_rope": dict(local_rope=None),
        "window": dict(window=None),
        "activation": dict(dims=dataclasses.replace(gen.dims, hidden_act="silu")),
    }
    for name, change in changes.items():
        saved = {key: getattr(gen, key) for key in change}
        for key, value in change.items():
            setattr(gen, key, value)
        if "style" in change:
            gen.scale = gen.style.query_scale or gen.dims.head_dim**-0.5
        try:
            wrong = every_logit(gen, ids)
        finally:
            for key, value in saved.items():
                setattr(gen, key, value)
            gen.scale = gen.style.query_scale or gen.dims.head_dim**-0.5
        assert not torch.allclose(wrong, expected, atol=1e-2), name


def test_chunked_prefill_and_decode_match_transformers(gemma):
    model, gen = gemma
    ids = prompt(81, LENGTH, gen.dims.vocab_size)
    kv = new_cache(gen)
    chunk = 13  # not a multiple of the window or the block size
    for start in range(0, LENGTH, chunk):
        logits = prefill(gen, kv, [ids[start : start + chunk]], [start], [BLOCKS])
    torch.testing.assert_close(logits[0, 0], hf_logits(model, ids)[-1], atol=ATOL, rtol=0)
    tokens = list(ids)
    for _ in range(5):  # greedy decode, each step against transformers
        tokens.append(int(torch.argmax(logits[0, -1]).item()))
        logits = decode(gen, kv, [tokens[-1]], [len(tokens) - 1], [BLOCKS])
        torch.testing.assert_close(logits[0, 0], hf_logits(model, tokens)[-1], atol=ATOL, rtol=0)


def test_prefix_cache_hit_matches_transformers(gemma):
    """A second prompt shares the first's blocks for two windows and a half and computes
    only its tail: the local layers' window reaches back into the shared blocks, the
    global layers' attention over all of them."""
    model, gen = gemma
    vocab = gen.dims.vocab_size
    first = prompt(82, LENGTH, vocab)
    shared = 80  # twenty blocks of 4
    second = first[:shared] + prompt(83, 30, vocab)[1:]
    kv = new_cache(gen)
    prefill(gen, kv, [first], [0], [BLOCKS])
    blocks = list(range(shared // 4)) + list(range(40, 52))
    logits = prefill(gen, kv, [second[shared:]], [shared], [blocks])
    torch.testing.assert_close(logits[0, 0], hf_logits(model, second)[-1], atol=ATOL, rtol=0)


def test_verify_and_drafter_match_transformers(gemma):
    model, gen = gemma
    ids = prompt(84, LENGTH, gen.dims.vocab_size)
    expected = hf_logits(model, ids)
    kv = new_cache(gen)
    table = page_table([BLOCKS], width=32)
    cut = LENGTH - 5
    prefill(gen, kv, [ids[:cut]], [0], [BLOCKS])
    out = gen.decode_forward(
        tokens=torch.tensor([ids[cut:]]),
        start_pos=torch.arange(cut, LENGTH)[None, :],
        page_table=table,
        kv_cache=kv,
        enable_trace=False,
        num_valid_drafts=[4],
        accepted_counts=[1],
        spec_mode=spec.ACCEPT_MODE_LOGITS,
    )
    torch.testing.assert_close(out.logits[0], expected[cut:], atol=ATOL, rtol=0)
    # The drafter with every layer: its greedy drafts are the model's greedy tokens.
    prefill(gen, kv, [ids[:-1]], [0], [BLOCKS])
    full = ReferenceLlamaGenerator.DRAFT_LAYERS_FRACTION
    try:
        ReferenceLlamaGenerator.DRAFT_LAYERS_FRACTION = 1.0
        drafts = gen.propose_draft_tokens(
            3, torch.tensor([[ids[-1]]]), torch.tensor([[LENGTH - 1]]), [1]
        )
    finally:
        ReferenceLlamaGenerator.DRAFT_LAYERS_FRACTION = full
    tokens = list(ids)
    for _ in range(3):
        tokens.append(int(hf_logits(model, tokens)[-1].argmax()))
    assert drafts.draft_token_ids[0].tolist() == tokens[LENGTH:]


def test_older_configs_pattern_the_layers_like_transformers():
    """A config.json with `sliding_window_pattern` and no `layer_types`: the same layers
    as Gemma3TextConfig derives, read from the dict and from the object."""
    raw = {
        "model_type": "gemma3_text",
        "num_hidden_layers": 8,
        "sliding_window": 16,
        "sliding_window_pattern": 4,
    }
    config = transformers.Gemma3TextConfig(
        num_hidden_layers=8, sliding_window=16, sliding_window_pattern=4
    )
    expected = {i for i, t in enumerate(config.layer_types) if t == "sliding_attention"}
    assert expected == {0, 1, 2, 4, 5, 6}
    for source in (raw, config):
        window = attention_window(source)
        assert window is not None and window.layers == expected


def test_a_bidirectional_gemma_is_refused():
    config = transformers.Gemma3TextConfig(
        hidden_size=64, num_attention_heads=4, head_dim=16, use_bidirectional_attention=True
    )
    with pytest.raises(NotImplementedError, match="use_bidirectional_attention"):
        style_of(config, ModelDims.from_hf_config(config))


def test_other_gemmas_are_refused_with_what_is_missing():
    """Gemma 1/2 read as Llama would be wrong in silence: refused. Gemma 4 is its own
    family (tests/test_gemma4_reference.py): a default Gemma 4 config is refused for
    what that family does not compute (the per-layer embeddings of the small models)."""
    config = transformers.Gemma4TextConfig(
        hidden_size=64, num_attention_heads=4, head_dim=16, num_hidden_layers=2
    )
    with pytest.raises(NotImplementedError, match="hidden_size_per_layer_input"):
        style_of(config, ModelDims(160, 64, 2, 4, 2, 16, 1e-6))
    gemma2 = transformers.Gemma2Config(hidden_size=64, num_attention_heads=4, head_dim=16)
    with pytest.raises(NotImplementedError, match="implements Gemma 3 text"):
        style_of(gemma2, ModelDims(160, 64, 2, 4, 2, 16, 1e-6))


def test_the_reference_golden_covers_gemma3(gemma, gemma3_checkpoint):
    """`ttbundle test --golden reference` (and `auto`) can use the reference on Gemma 3:
    it is covered, and its golden's logits are transformers'."""
    from ttbundles.reference.golden import ReferenceGolden, load_config, reference_covers

    model, gen = gemma
    config = load_config(gemma3_checkpoint)
    assert reference_covers(config) is None
    ids = prompt(85, LENGTH, gen.dims.vocab_size)
    golden = ReferenceGolden(gemma3_checkpoint, config).sequence_logits(ids)
    torch.testing.assert_close(torch.from_numpy(golden), hf_logits(model, ids), atol=ATOL, rtol=0)
    gemma4 = transformers.Gemma4TextConfig(hidden_size=64, num_attention_heads=4, head_dim=16)
    gemma4.architectures = ["Gemma4ForCausalLM"]
    assert "hidden_size_per_layer_input" in reference_covers(gemma4)


def test_vllm_knows_gemma3_for_causal_lm():
    """vLLM's own registry has the architecture (in both releases), so a bundle
    registered for it overrides a name vLLM knows rather than inventing one."""
    from vllm.model_executor.models.registry import ModelRegistry

    assert "Gemma3ForCausalLM" in ModelRegistry.get_supported_archs()
