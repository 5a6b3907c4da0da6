"""The reference Qwen3.5 generator (a gated delta net hybrid) against transformers, driven
through the contract: a tiny random `Qwen3_5ForCausalLM` (8 layers, every 4th full
attention, conv kernel 4) made here, seeded and saved with safetensors. Prefill, chunked
prefill, greedy decode, two users of different lengths in one batch (no padding leaks into
a state), a released slot reused from zero, `slot_remap` and `note_state_slots_moved`,
and the KV layout the generator gives vLLM (the attention layers only).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
import transformers  # required: a missing or broken transformers fails, never skips

from tests.test_reference_generator import padded, page_table, prompt
from ttbundles.format.contract import HostMesh
from ttbundles.reference.qwen3_5 import ReferenceQwen3_5Generator

ATOL = 1e-4
BLOCK = 4
BLOCKS = 64
VOCAB = 96


def write_tiny_qwen3_5(folder) -> str:
    """A tiny random Qwen3.5 text checkpoint; the `1 + w` norms, the gated norm and the
    GDN parameters are randomised too, so that each of them matters."""
    torch.manual_seed(0)
    config = transformers.Qwen3_5TextConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=8,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        linear_num_key_heads=2,
        linear_num_value_heads=4,
        linear_key_head_dim=8,
        linear_value_head_dim=8,
        linear_conv_kernel_dim=4,
        full_attention_interval=4,
        initializer_range=0.1,
        max_position_embeddings=256,
        architectures=["Qwen3_5ForCausalLM"],
    )
    model = transformers.Qwen3_5ForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("dt_bias"):
                param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(folder, safe_serialization=True)
    return str(folder)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = write_tiny_qwen3_5(tmp_path_factory.mktemp("qwen3_5"))
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    assert type(model).__name__ == "Qwen3_5ForCausalLM"
    assert model.config.layer_types.count("full_attention") == 2
    return model, transformers.AutoConfig.from_pretrained(folder)


def make_gen(config, batch: int = 4) -> ReferenceQwen3_5Generator:
    return ReferenceQwen3_5Generator.initialize_vllm_model(
        hf_config=config, mesh_device=HostMesh(), max_batch_size=batch, max_seq_len=256
    )


@pytest.fixture
def gen(tiny):
    return make_gen(tiny[1])


def new_cache(gen):
    dims = gen.dims
    return gen.allocate_kv_cache(
        (BLOCKS, dims.num_kv_heads, BLOCK, dims.head_dim), torch.float32, gen.kv_layer_count()
    )


def blocks_of(user: int) -> list[int]:
    return list(range(user * 16, user * 16 + 16))


def prefill(gen, kv, chunks, starts, slots, users=None):
    users = users if users is not None else slots
    return gen.prefill_forward(
        tokens=padded(chunks, list(starts)),
        page_table=page_table([blocks_of(u) for u in users]),
        kv_cache=kv,
        prompt_lens=torch.tensor([s + len(c) for s, c in zip(starts, chunks, strict=True)]),
        start_pos=torch.tensor(starts),
        empty_slots=list(slots),
        enable_trace=False,
    )[:, 0]


def decode(gen, kv, tokens, positions, users, slot_remap=None):
    return gen.decode_forward(
        tokens=torch.tensor(tokens).reshape(-1, 1),
        start_pos=torch.tensor(positions, dtype=torch.int32),
        page_table=page_table([blocks_of(u) for u in users]),
        kv_cache=kv,
        enable_trace=False,
        slot_remap=slot_remap,
        reload_inputs=True,
    )[0][:, 0]


@torch.no_grad()
def hf_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0]


def test_only_the_attention_layers_keep_kv(gen, tiny):
    assert gen.layer_kinds.count("linear_attention") == 6 and gen.kv_layer_count() == 2
    assert len(new_cache(gen)) == 2
    assert gen.state.recurrent.shape == (6, 4, 4, 8, 8) and gen.state.conv.shape == (6, 4, 64, 3)
    assert gen.state.recurrent.dtype == torch.float32
    vllm_config = SimpleNamespace(
        model_config=SimpleNamespace(hf_config=tiny[1], dtype=torch.float32),
        cache_config=SimpleNamespace(block_size=BLOCK),
    )
    specs = ReferenceQwen3_5Generator.get_kv_cache_spec(vllm_config)
    assert sorted(specs) == ["model.layers.3.self_attn", "model.layers.7.self_attn"]
    assert all(type(s).__name__ == "FullAttentionSpec" for s in specs.values())
    caps = ReferenceQwen3_5Generator.model_capabilities
    assert caps["supports_spec_decode"] is False
    # A prefix cache of snapshots: a hit restores the state after exactly its tokens.
    assert caps["supports_prefix_caching"] is True and caps["recurrent_prefix_snapshots"] > 0


def test_prefill_logits_equal_transformers_and_two_chunks_equal_one(gen, tiny):
    model, _ = tiny
    ids = prompt(1, 37, VOCAB)
    expected = hf_logits(model, ids)
    kv = new_cache(gen)
    every = gen.prefill_forward(
        tokens=torch.tensor([ids]),
        page_table=page_table([blocks_of(0)]),
        kv_cache=kv,
        prompt_lens=torch.tensor([37]),
        start_pos=torch.tensor([0]),
        empty_slots=[0],
        enable_trace=False,
        return_prompt_logits=True,
    )[0]
    torch.testing.assert_close(every, expected, atol=ATOL, rtol=0)
    assert (expected - expected.mean()).abs().max() > 0.1  # the logits say something
    kv = new_cache(gen)
    prefill(gen, kv, [ids[:20]], [0], [1])
    last = prefill(gen, kv, [ids[20:]], [20], [1])
    torch.testing.assert_close(last[0], expected[-1], atol=ATOL, rtol=0)


def test_greedy_decode_equals_transformers_generate(gen, tiny):
    model, _ = tiny
    ids = prompt(2, 11, VOCAB)
    out = model.generate(
        torch.tensor([ids]), max_new_tokens=20, min_new_tokens=20, do_sample=False
    )[0, len(ids) :].tolist()
    kv = new_cache(gen)
    logits = prefill(gen, kv, [ids], [0], [2])
    tokens = [int(torch.argmax(logits[0]))]
    for step in range(19):
        row = decode(gen, kv, [0, 0, tokens[-1], 0], [-1, -1, len(ids) + step, -1], range(4))
        tokens.append(int(torch.argmax(row[2])))
    assert tokens == out
    assert len(set(tokens)) > 3  # not a degenerate loop


def test_two_users_of_different_lengths_batched_each_get_their_own_logits(gen, tiny):
    """Rows of 9 and 30 tokens in one prefill, then decoded together: a padded row would
    take the padding into its state and leave transformers'."""
    model, _ = tiny
    short, long = prompt(3, 9, VOCAB), prompt(4, 30, VOCAB)
    kv = new_cache(gen)
    logits = prefill(gen, kv, [short, long], [0, 0], [3, 1])
    torch.testing.assert_close(logits[0], hf_logits(model, short)[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(logits[1], hf_logits(model, long)[-1], atol=ATOL, rtol=0)
    nexts = [int(torch.argmax(row)) for row in logits]
    rows = decode(gen, kv, [0, nexts[1], 0, nexts[0]], [-1, 30, -1, 9], range(4))
    torch.testing.assert_close(rows[3], hf_logits(model, short + nexts[:1])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(rows[1], hf_logits(model, long + nexts[1:])[-1], atol=ATOL, rtol=0)


def test_a_released_slot_is_reused_from_zero(gen, tiny):
    model, _ = tiny
    first, second = prompt(5, 25, VOCAB), prompt(6, 13, VOCAB)
    kv = new_cache(gen)
    prefill(gen, kv, [first], [0], [0])
    assert gen.state.recurrent[:, 0].abs().sum() > 0
    gen.release_request(0)
    assert gen.state.recurrent[:, 0].abs().sum() == 0 and gen.state.conv[:, 0].abs().sum() == 0
    logits = prefill(gen, kv, [second], [0], [0])
    torch.testing.assert_close(logits[0], hf_logits(model, second)[-1], atol=ATOL, rtol=0)
    # A first chunk starts from zeros even in a slot nobody released.
    logits = prefill(gen, kv, [first], [0], [0])
    torch.testing.assert_close(logits[0], hf_logits(model, first)[-1], atol=ATOL, rtol=0)


def test_slot_remap_moves_the_states_once(gen, tiny):
    """Users prefilled into slots 0 and 1 decode as rows 1 and 0 (remap [1, 0]): each row
    continues the state it was given, and the runner's settlement moves nothing again."""
    model, _ = tiny
    a, b = prompt(7, 10, VOCAB), prompt(8, 17, VOCAB)
    kv = new_cache(gen)
    logits = prefill(gen, kv, [a, b], [0, 0], [0, 1], users=[0, 1])
    na, nb = (int(torch.argmax(row)) for row in logits)
    rows = decode(gen, kv, [nb, na, 0, 0], [17, 10, -1, -1], [1, 0, 2, 3], slot_remap=[1, 0])
    torch.testing.assert_close(rows[0], hf_logits(model, b + [nb])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(rows[1], hf_logits(model, a + [na])[-1], atol=ATOL, rtol=0)
    gen.note_state_slots_moved({0: 1, 1: 0})  # settles the remap: no second move
    ma, mb = int(torch.argmax(rows[1])), int(torch.argmax(rows[0]))
    rows = decode(gen, kv, [mb, ma, 0, 0], [18, 11, -1, -1], [1, 0, 2, 3])
    torch.testing.assert_close(rows[0], hf_logits(model, b + [nb, mb])[-1], atol=ATOL, rtol=0)
    torch.testing.assert_close(rows[1], hf_logits(model, a + [na, ma])[-1], atol=ATOL, rtol=0)
    # A move the runner makes between steps, with no remap: the state follows it.
    gen.note_state_slots_moved({1: 3})
    rows = decode(gen, kv, [0, 0, 0, 7], [-1, -1, -1, 12], [1, 0, 2, 0])
    torch.testing.assert_close(rows[3], hf_logits(model, a + [na, ma, 7])[-1], atol=ATOL, rtol=0)


@pytest.mark.parametrize("arch", ["Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration"])
def test_init_reference_makes_a_qwen3_5_bundle_that_validates(run_cli, tmp_path, arch):
    """`init --reference` builds on the Qwen3.5 generator: attention-only KV spec, the
    state's lifecycle spelled out, prefix caching through snapshots of the state; it
    validates strictly."""
    import json

    done = run_cli("init", tmp_path / "q", "--arch", arch, "--reference")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    source = (tmp_path / "q" / "adapter.py").read_text()
    assert "from ttbundles.reference.qwen3_5 import ReferenceQwen3_5Generator" in source
    assert "def release_request" in source and "def note_state_slots_moved" in source
    assert '"supports_prefix_caching": True' in source
    assert '"recurrent_prefix_snapshots": 64' in source
    caps = json.loads((tmp_path / "q" / "vllm_metadata.json").read_text())["capabilities"]
    assert caps["prefix_caching"] is True and caps["kv_cache_spec"] is True
    assert caps["recurrent_state"] == {"owner": "generator", "layers": "from_config"}
    done = run_cli("validate", "--strict", tmp_path / "q")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stdout + done.stderr


def test_init_reference_refuses_qwen3_next_and_says_what_is_missing(run_cli, tmp_path):
    done = run_cli("init", tmp_path / "n", "--arch", "Qwen3NextForCausalLM", "--reference")
    assert done.returncode == 1 and not (tmp_path / "n").exists()
    assert "error TTB041 the torch reference generator does not cover Qwen3NextForCausalLM" in (
        done.stderr
    )
    assert "mixture-of-experts" in done.stderr and "in_proj_qkvz" in done.stderr


def test_the_golden_reads_qwen3_5_with_its_own_generator(tiny, tmp_path):
    from ttbundles.reference.golden import ReferenceGolden, reference_covers

    model, config = tiny
    assert reference_covers(config) is None
    golden = ReferenceGolden(config._name_or_path, config)
    ids = prompt(9, 14, VOCAB)
    torch.testing.assert_close(
        torch.from_numpy(golden.sequence_logits(ids)), hf_logits(model, ids), atol=ATOL, rtol=0
    )
