"""The reference generator on Gemma 4 text (`Gemma4ForCausalLM` and the text part of
`Gemma4ForConditionalGeneration`) against transformers: a 6-layer checkpoint (4 local
layers with a 16-token window, 2 global ones with their own head size and KV heads,
values from keys, a partial RoPE), prompts several windows long, through batched,
chunked prefill and decode; each of Gemma 4's differences is shown to matter; the KV
cache keeps each layer's own shape, in one pool where vLLM's groups share it; what of
the real models the reference does not compute is refused by name.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
import transformers  # required: a missing or broken transformers fails, never skips

from tests.conftest import GEMMA4_WINDOW, gemma4_text_config, write_gemma4_checkpoint
from tests.test_reference_generator import decode, page_table, prefill, prompt
from tests.test_sliding_window import hf_logits
from ttbundles.demo.checkpoint import build_tokenizer
from ttbundles.format.contract import HostMesh
from ttbundles.reference.families import family_of, style_of
from ttbundles.reference.families.gemma4 import LayerShape, layer_shapes
from ttbundles.reference.gemma4 import ReferenceGemma4Generator

ATOL = 1e-4
LENGTH = 3 * GEMMA4_WINDOW + 7  # several windows
BLOCK = 4
BLOCKS = list(range(20))  # 80 positions of 4


def load(folder) -> ReferenceGemma4Generator:
    config = transformers.AutoConfig.from_pretrained(folder)
    generator_cls = family_of(config).generator_class()
    assert generator_cls is ReferenceGemma4Generator
    return generator_cls.initialize_vllm_model(
        hf_config=config, mesh_device=HostMesh(), max_batch_size=4, max_seq_len=256
    )


def new_cache(gen: ReferenceGemma4Generator, num_blocks: int = 64):
    return gen.allocate_kv_cache(
        (num_blocks, gen.dims.num_kv_heads, BLOCK, gen.dims.head_dim),
        torch.float32,
        gen.dims.num_layers,
    )


@pytest.fixture(scope="module", params=["Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"])
def gemma(request, tmp_path_factory):
    conditional = request.param == "Gemma4ForConditionalGeneration"
    folder = write_gemma4_checkpoint(
        tmp_path_factory.mktemp("checkpoint") / "tiny-gemma4", conditional=conditional
    )
    model = (
        transformers.AutoModelForImageTextToText
        if conditional
        else transformers.AutoModelForCausalLM
    )
    loaded = model.from_pretrained(folder).eval().float()
    assert type(loaded).__name__ == request.param
    return loaded, load(folder)


def every_logit(gen, ids: list[int]) -> torch.Tensor:
    return gen.prefill_forward(
        tokens=torch.tensor([ids]),
        page_table=page_table([BLOCKS], width=20),
        kv_cache=new_cache(gen),
        prompt_lens=torch.tensor([len(ids)]),
        start_pos=torch.tensor([0]),
        enable_trace=False,
        return_prompt_logits=True,
    )[0]


def test_each_layer_has_its_own_shape_and_cache(gemma):
    _, gen = gemma
    local, wide = LayerShape(2, 16), LayerShape(1, 32, values_from_keys=True)
    assert gen.shapes == [local, local, wide, local, local, wide]
    assert gen.window is not None and gen.window.layers == {0, 1, 3, 4}
    assert gen.scale == 1.0 and gen.style.embed_scale == 8.0
    cache = new_cache(gen, 10)
    assert [tuple(k.shape) for k, _ in cache] == [(10, 2, 4, 16)] * 2 + [(10, 1, 4, 32)] + [
        (10, 2, 4, 16)
    ] * 2 + [(10, 1, 4, 32)]
    with pytest.raises(ValueError, match="does not fit the model"):
        gen.allocate_kv_cache((10, 3, 4, 16), torch.float32, 6)


def test_prompt_logits_match_transformers_and_every_detail_matters(gemma):
    """Equal to transformers at every position, several windows long; the test can
    fail: without any one of Gemma 4's details (or its window) the logits leave
    transformers'."""
    model, gen = gemma
    ids = prompt(90, LENGTH, gen.dims.vocab_size)
    expected = hf_logits(model, ids)
    torch.testing.assert_close(every_logit(gen, ids), expected, atol=ATOL, rtol=0)
    freq, full = gen.global_rope
    whole = 1.0 / (1e6 ** (torch.arange(0, 32, 2).float() / 32))
    changes = {
        "partial_rope": dict(global_rope=(whole, full)),
        "window": dict(window=None),
        "final_softcap": dict(style=dataclasses.replace(gen.style, final_softcap=None)),
        "query_scale": dict(scale=32**-0.5),
    }
    for name, change in changes.items():
        saved = {key: getattr(gen, key) for key in change}
        for key, value in change.items():
            setattr(gen, key, value)
        try:
            wrong = every_logit(gen, ids)
        finally:
            for key, value in saved.items():
                setattr(gen, key, value)
        assert not torch.allclose(wrong, expected, atol=1e-2), name
    scalars = [layer.layer_scalar for layer in gen.weights.layers]
    try:
        for layer in gen.weights.layers:
            layer.layer_scalar = None
        assert not torch.allclose(every_logit(gen, ids), expected, atol=1e-2), "layer_scalar"
    finally:
        for layer, scalar in zip(gen.weights.layers, scalars, strict=True):
            layer.layer_scalar = scalar


def test_batched_chunked_prefill_and_decode_match_transformers(gemma):
    """Two rows prefilled together in chunks that cut the window and the blocks, then
    greedy decode of both rows past several windows, each step against transformers."""
    model, gen = gemma
    vocab = gen.dims.vocab_size
    prompts = [prompt(91, LENGTH, vocab), prompt(92, LENGTH - 20, vocab)]
    blocks = [list(range(0, 24)), list(range(24, 48))]
    kv = new_cache(gen)
    chunk = 13  # not a multiple of the window or the block size
    starts, ends = [0, 0], [len(p) for p in prompts]
    while starts != ends:
        live = [i for i in range(2) if starts[i] < ends[i]]
        chunks = [prompts[i][starts[i] : min(starts[i] + chunk, ends[i])] for i in live]
        logits = prefill(gen, kv, chunks, [starts[i] for i in live], [blocks[i] for i in live])
        for row, i in enumerate(live):
            starts[i] += len(chunks[row])
            if starts[i] == ends[i]:
                expected = hf_logits(model, prompts[i])[-1]
                torch.testing.assert_close(logits[row, 0], expected, atol=ATOL, rtol=0)
                prompts[i] = prompts[i] + [int(torch.argmax(logits[row, -1]))]
    for _ in range(4):
        logits = decode(gen, kv, [p[-1] for p in prompts], [len(p) - 1 for p in prompts], blocks)
        for row, tokens in enumerate(prompts):
            torch.testing.assert_close(
                logits[row, 0], hf_logits(model, tokens)[-1], atol=ATOL, rtol=0
            )
            tokens.append(int(torch.argmax(logits[row, 0])))


def test_greedy_tokens_are_transformers_generate(gemma):
    """The reference's greedy continuation past the window is transformers' own
    `generate` (its sliding-window cache), token for token."""
    model, gen = gemma
    ids = prompt(93, 2 * GEMMA4_WINDOW + 3, gen.dims.vocab_size)
    expected = model.generate(
        torch.tensor([ids]), max_new_tokens=12, do_sample=False, pad_token_id=0
    )[0, len(ids) :].tolist()
    kv = new_cache(gen)
    logits = prefill(gen, kv, [ids], [0], [BLOCKS])
    tokens = list(ids)
    for _ in range(12):
        tokens.append(int(torch.argmax(logits[0, -1])))
        logits = decode(gen, kv, [tokens[-1]], [len(tokens) - 1], [BLOCKS])
    assert tokens[len(ids) :] == expected


def test_groups_that_share_one_pool_view_it_in_their_own_shapes(gemma):
    """vLLM's KV groups overlay one block pool: layers of the same tensor index share
    one allocation, each in its own (equal-bytes) shape; a shape that is not the
    layer's is refused."""
    model, gen = gemma
    local, wide = (24, 2, 4, 16), (24, 1, 4, 32)
    # Two groups (sliding: layers 0, 1, 3, 4; full: 2, 5) overlaying one pool; a layer's
    # tensor index is its position in its group, as vLLM assigns it.
    specs = [
        (local, torch.float32, 0),
        (local, torch.float32, 1),
        (wide, torch.float32, 0),
        (local, torch.float32, 2),
        (local, torch.float32, 3),
        (wide, torch.float32, 1),
    ]
    cache = gen.allocate_kv_cache_per_layer(specs)
    assert [tuple(k.shape) for k, _ in cache] == [s for s, _, _ in specs]
    assert cache[2][0].data_ptr() == cache[0][0].data_ptr()
    assert cache[5][1].data_ptr() == cache[1][1].data_ptr()
    bad = list(specs)
    bad[2] = (local, torch.float32, 0)
    with pytest.raises(ValueError, match="layer 2's kv_cache_shape"):
        gen.allocate_kv_cache_per_layer(bad)
    # A block id belongs to one group at a time: the sliding group's blocks 0-11, the
    # full group's 12-23, each layer reading its group's table; transformers' logits.
    ids = prompt(94, LENGTH - 10, gen.dims.vocab_size)
    sliding = page_table([list(range(0, 12))], width=12)
    full = page_table([list(range(12, 24))], width=12)
    logits = gen.prefill_forward(
        tokens=torch.tensor([ids]),
        page_table=full,
        page_tables_per_layer=[sliding, sliding, full, sliding, sliding, full],
        kv_cache=cache,
        prompt_lens=torch.tensor([len(ids)]),
        start_pos=torch.tensor([0]),
        enable_trace=False,
    )
    torch.testing.assert_close(logits[0, 0], hf_logits(model, ids)[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (
            dict(enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=32),
            "enable_moe_block",
        ),
        (dict(hidden_size_per_layer_input=8), "hidden_size_per_layer_input"),
        (dict(num_kv_shared_layers=2), "num_kv_shared_layers"),
        (dict(use_bidirectional_attention="vision"), "use_bidirectional_attention"),
    ],
)
def test_what_the_reference_does_not_compute_is_refused_by_name(tmp_path, overrides, key):
    """26B-A4B's experts, the small models' per-layer embeddings, KV sharing and
    bidirectional attention: refused, naming the key, never computed wrong."""
    from ttbundles.reference.config import ModelDims
    from ttbundles.reference.families.gemma4 import dims_config
    from ttbundles.reference.golden import reference_covers

    config = gemma4_text_config(build_tokenizer(tmp_path), **overrides)
    config.architectures = ["Gemma4ForCausalLM"]
    with pytest.raises(NotImplementedError, match=key):
        style_of(config, ModelDims.from_hf_config(dims_config(config)))
    with pytest.raises(NotImplementedError, match=key):
        ReferenceGemma4Generator.check_config(config)
    assert key in (reference_covers(config) or "")


def test_config_json_shapes_are_the_loaded_configs(tmp_path):
    """A config.json (`global_head_dim`, `num_global_key_value_heads`, as the released
    checkpoints spell them) gives the shapes transformers' loaded config gives, with and
    without values from keys (without, the global layers keep the model's KV heads)."""
    tokenizer = build_tokenizer(tmp_path)
    for k_eq_v in (True, False):
        config = gemma4_text_config(tokenizer, attention_k_eq_v=k_eq_v)
        raw = config.to_dict()
        raw.pop("per_layer_config", None)
        raw.update(global_head_dim=32, num_global_key_value_heads=1)
        assert layer_shapes(raw) == layer_shapes(config)
        assert layer_shapes(config)[2] == LayerShape(1 if k_eq_v else 2, 32, k_eq_v)


def test_the_reference_golden_covers_gemma4(gemma):
    """`ttbundle test --golden reference` can use the reference on Gemma 4."""
    from ttbundles.reference.golden import ReferenceGolden, reference_covers

    model, gen = gemma
    folder = model.config._name_or_path
    config = transformers.AutoConfig.from_pretrained(folder)
    assert reference_covers(config) is None
    ids = prompt(95, LENGTH, gen.dims.vocab_size)
    golden = ReferenceGolden(folder, config).sequence_logits(ids)
    torch.testing.assert_close(torch.from_numpy(golden), hf_logits(model, ids), atol=ATOL, rtol=0)


# The released checkpoints' text configs as their config.json spells them (published
# values; the reference reads no weights to check a declaration).
GEMMA4_31B_TEXT = {
    "model_type": "gemma4_text",
    "hidden_size": 5376,
    "intermediate_size": 21504,
    "num_hidden_layers": 60,
    "num_attention_heads": 32,
    "num_key_value_heads": 16,
    "head_dim": 256,
    "global_head_dim": 512,
    "num_global_key_value_heads": 4,
    "attention_k_eq_v": True,
    "sliding_window": 1024,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
    "hidden_size_per_layer_input": 0,
    "num_kv_shared_layers": 0,
    "enable_moe_block": False,
    "final_logit_softcapping": 30.0,
    "vocab_size": 262144,
}
GEMMA4_26B_A4B_TEXT = {
    **GEMMA4_31B_TEXT,
    "num_hidden_layers": 30,
    "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
    "num_key_value_heads": 8,
    "num_global_key_value_heads": 2,
    "enable_moe_block": True,
    "num_experts": 128,
    "top_k_experts": 8,
    "moe_intermediate_size": 704,
}


def builtin(name: str) -> dict:
    import json

    from ttbundles.paths import builtin_bundles_dir

    return json.loads((builtin_bundles_dir() / name / "vllm_metadata.json").read_text())


def test_the_builtin_gemma4_bundles_declarations_agree_with_the_reference():
    """What the built-in Gemma 4 bundles claim that the reference can check: the
    architectures it reads (the 31B autoport's Gemma4ForConditionalGeneration, the
    demos' text and conditional classes; not the unified or autoport class names of
    their own), the 31B's KV groups (kv_cache_spec: true; the reference's layout is
    sliding layers beside global ones with their own shape, 16x256 and 4x512: pages of
    two sizes, which vLLM unifies by block size), and 26B-A4B's experts, which the
    reference refuses by name rather than computing a dense model."""
    from ttbundles.check.reference_archs import GEMMA4_ARCHITECTURES, covers
    from ttbundles.format.attention_window import attention_window
    from ttbundles.reference.golden import reference_covers

    reads = {
        name: covers(GEMMA4_ARCHITECTURES, builtin(name)["arch"])
        for name in (
            "tt-gemma-4-31b",
            "tt-gemma4",
            "tt-gemma4-text",
            "tt-gemma4-unified",
            "tt-gemma-4-26b-a4b",
        )
    }
    assert reads == {
        "tt-gemma-4-31b": True,
        "tt-gemma4": True,
        "tt-gemma4-text": True,
        "tt-gemma4-unified": False,  # vLLM's own unified model, no transformers class
        "tt-gemma-4-26b-a4b": False,  # TT-Metal's class name
    }
    big = builtin("tt-gemma-4-31b")
    assert big["capabilities"]["kv_cache_spec"] is True
    config = {
        "architectures": [big["arch"]],
        "model_type": "gemma4",
        "text_config": GEMMA4_31B_TEXT,
    }
    ReferenceGemma4Generator.check_config(config)
    shapes = layer_shapes(config)
    assert shapes.count(LayerShape(16, 256)) == 50
    assert shapes.count(LayerShape(4, 512, values_from_keys=True)) == 10
    window = attention_window(config)
    assert window is not None and window.size == 1024 and len(window.layers) == 50
    # transformers' loaded config gives the same shapes.
    loaded = transformers.Gemma4TextConfig(
        **{k: v for k, v in GEMMA4_31B_TEXT.items() if k != "model_type"}
    )
    assert layer_shapes(loaded) == shapes
    # 26B-A4B (its TT-Metal class aside): the experts are refused by name.
    moe = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "text_config": GEMMA4_26B_A4B_TEXT,
    }
    assert builtin("tt-gemma-4-26b-a4b")["capabilities"]["kv_cache_spec"] is True
    with pytest.raises(NotImplementedError, match="enable_moe_block"):
        ReferenceGemma4Generator.check_config(moe)
    loaded_moe = transformers.Gemma4Config(text_config=GEMMA4_26B_A4B_TEXT)
    loaded_moe.architectures = ["Gemma4ForConditionalGeneration"]
    assert "enable_moe_block" in (reference_covers(loaded_moe) or "")
