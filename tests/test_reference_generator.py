"""The reference Llama generator against transformers, and the contract behaviours.

Parity is checked on the tiny demo checkpoint and on tiny random Qwen2, Qwen3, Mistral
and scaled-RoPE Llama models built here, so a regression in the golden reference shows
up as a numeric mismatch with Hugging Face, not as a silent drift.
"""

from __future__ import annotations

import pytest
import torch
import transformers  # required: a missing or broken transformers fails, never skips

from ttbundles.demo.checkpoint import write_checkpoint
from ttbundles.format.contract import HostMesh, SamplingParams
from ttbundles.reference.attention import (
    causal_attention,
    causal_mask,
    context_blocks,
    gather_context,
)
from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.reference.readback import DeviceOutput
from ttbundles.reference.sampling import filtered_probs

ATOL = 1e-4
BLOCK = 4  # small blocks, so prompts span several and block boundaries are exercised
NUM_BLOCKS = 64


# ---- helpers ----------------------------------------------------------------------------


def load_generator(path) -> ReferenceLlamaGenerator:
    """As the worker does it: the config vLLM loaded, then initialize_vllm_model."""
    config = transformers.AutoConfig.from_pretrained(path)
    return ReferenceLlamaGenerator.initialize_vllm_model(
        hf_config=config, mesh_device=HostMesh(), max_batch_size=8, max_seq_len=256
    )


def new_cache(gen: ReferenceLlamaGenerator, num_blocks: int = NUM_BLOCKS):
    dims = gen.dims
    return gen.allocate_kv_cache(
        kv_cache_shape=(num_blocks, dims.num_kv_heads, BLOCK, dims.head_dim),
        dtype=torch.bfloat16,
        num_layers=dims.num_layers,
    )


def page_table(block_lists: list[list[int]], width: int = 16) -> torch.Tensor:
    """[B, width] int32 (wider when a row has more blocks); unused entries 0, as a
    padded worker table would be."""
    width = max([width] + [len(blocks) for blocks in block_lists])
    table = torch.zeros(len(block_lists), width, dtype=torch.int32)
    for row, blocks in enumerate(block_lists):
        table[row, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
    return table


def padded(chunks: list[list[int]], starts: list[int]) -> torch.Tensor:
    """[B, S] int64 rows from position 0, as TT-Metal passes them: each chunk at its start
    position; before it (already cached, never read) and after it a junk token."""
    width = max(s + len(c) for s, c in zip(starts, chunks, strict=True))
    out = torch.full((len(chunks), width), 7, dtype=torch.int64)
    for row, (start, chunk) in enumerate(zip(starts, chunks, strict=True)):
        out[row, start : start + len(chunk)] = torch.tensor(chunk, dtype=torch.int64)
    return out


def prefill(gen, kv, chunks, starts, blocks, sampling_params=None):
    """Prefill rows whose chunk i covers positions starts[i] .. starts[i]+len-1."""
    return gen.prefill_forward(
        tokens=padded(chunks, list(starts)),
        page_table=page_table(blocks),
        kv_cache=kv,
        prompt_lens=torch.tensor([s + len(c) for s, c in zip(starts, chunks, strict=True)]),
        start_pos=torch.tensor(starts),
        enable_trace=False,
        sampling_params=sampling_params,
        empty_slots=list(range(len(chunks))),
    )


def decode(gen, kv, tokens, positions, blocks, sampling_params=None, read_from_device=True):
    """A full-reload decode (every command a transition, as after a batch change); the
    logits `[B, 1, V]` or sampled tokens `[B]`, or the device output when not read."""
    device = sampling_params is not None
    out = gen.decode_forward(
        tokens=torch.tensor(tokens, dtype=torch.int64).reshape(-1, 1),
        start_pos=torch.tensor(positions, dtype=torch.int32),
        page_table=page_table(blocks),
        kv_cache=kv,
        enable_trace=False,
        read_from_device=read_from_device,
        sampling_params=sampling_params,
        reload_inputs=True,
        reload_sampling_params=device,
        reset_sampling_state=device,
    )
    return out[0] if read_from_device else out


@torch.no_grad()
def hf_last_logits(model, ids: list[int]) -> torch.Tensor:
    return model(torch.tensor([ids])).logits[0, -1]


def prompt(seed: int, length: int, vocab: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return [1] + torch.randint(3, vocab, (length - 1,), generator=generator).tolist()


def params(temperature, top_k=None, top_p=None, seed=None) -> SamplingParams:
    n = len(temperature)
    return SamplingParams(
        temperature=list(temperature),
        top_k=list(top_k or [0] * n),
        top_p=list(top_p or [1.0] * n),
        seed=list(seed or [None] * n),
    )


# ---- fixtures ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("demo-checkpoint"))


@pytest.fixture(scope="module")
def gen(demo_dir) -> ReferenceLlamaGenerator:
    return load_generator(demo_dir)


@pytest.fixture(scope="module")
def hf_model(demo_dir):
    return transformers.LlamaForCausalLM.from_pretrained(demo_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def vocab(gen) -> int:
    return gen.dims.vocab_size


# ---- (a) prefill parity -----------------------------------------------------------------


def test_prefill_logits_match_transformers_across_padded_batch(gen, hf_model, vocab):
    prompts = [prompt(i, n, vocab) for i, n in enumerate((3, 13, 8, 1))]
    kv = new_cache(gen)
    blocks = [[4 * r + b for b in range(4)] for r in range(len(prompts))]
    logits = prefill(gen, kv, prompts, [0] * len(prompts), blocks)
    assert logits.shape == (len(prompts), 1, vocab) and logits.dtype == torch.float32
    for row, ids in enumerate(prompts):
        torch.testing.assert_close(logits[row, 0], hf_last_logits(hf_model, ids), atol=ATOL, rtol=0)


def test_prefill_hidden_states_match_transformers_every_position(gen, hf_model, vocab):
    """return_hidden_states (the pooling form prefill_hidden): every position's final
    hidden state after the last norm, `[B, L, hidden]`, zero past a row's prompt; a later
    chunk's rows are the chunk's positions, attending over the cached ones."""
    prompts = [prompt(i + 20, n, vocab) for i, n in enumerate((5, 12, 1))]
    kv = new_cache(gen)
    blocks = [[4 * r + b for b in range(4)] for r in range(len(prompts))]
    hidden = gen.prefill_forward(
        tokens=padded(prompts, [0, 0, 0]),
        page_table=page_table(blocks),
        kv_cache=kv,
        prompt_lens=torch.tensor([len(p) for p in prompts]),
        enable_trace=False,
        return_hidden_states=True,
    )
    assert hidden.shape == (3, 12, gen.dims.hidden_size) and hidden.dtype == torch.float32
    with torch.no_grad():
        for row, ids in enumerate(prompts):
            want = hf_model.model(torch.tensor([ids])).last_hidden_state[0]
            torch.testing.assert_close(hidden[row, : len(ids)], want, atol=ATOL, rtol=0)
            assert not hidden[row, len(ids) :].any()
    # The second half of row 1's prompt as a chunk over the first half's cache.
    chunk = gen.prefill_forward(
        tokens=padded([prompts[1][6:]], [6]),
        page_table=page_table(blocks[1:2]),
        kv_cache=kv,
        prompt_lens=torch.tensor([12]),
        start_pos=torch.tensor([6]),
        enable_trace=False,
        return_hidden_states=True,
    )
    torch.testing.assert_close(chunk[0, :6], hidden[1, 6:12], atol=ATOL, rtol=0)


# ---- (b) chunked prefill + greedy decode == generate() ------------------------------------


def test_chunked_prefill_then_greedy_decode_matches_generate(gen, hf_model, vocab):
    ids = prompt(10, 11, vocab)
    steps = 11  # one token from prefill, ten from decode
    config = transformers.GenerationConfig(
        max_new_tokens=steps,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_logits=True,
        return_dict_in_generate=True,
    )
    with torch.no_grad():
        expected = hf_model.generate(torch.tensor([ids]), generation_config=config)
    expected_tokens = expected.sequences[0, len(ids) :].tolist()

    kv = new_cache(gen)
    blocks = [[9, 3, 14, 0, 6, 21]]  # positions 0..23
    first = prefill(gen, kv, [ids[:6]], [0], blocks)
    torch.testing.assert_close(first[0, 0], hf_last_logits(hf_model, ids[:6]), atol=ATOL, rtol=0)
    logits = prefill(gen, kv, [ids[6:]], [6], blocks)[0, 0]

    produced = []
    for step in range(steps):
        torch.testing.assert_close(logits, expected.logits[step][0], atol=ATOL, rtol=0)
        token = int(torch.argmax(logits))
        produced.append(token)
        if step + 1 < steps:
            out = decode(gen, kv, [token], [len(ids) + step], blocks)
            assert out.shape == (1, 1, vocab)
            logits = out[0, 0]
    assert produced == expected_tokens


# ---- (c) paged cache: any block order -----------------------------------------------------


def _prefill_and_decode(gen, kv, prompts, blocks, steps=3):
    logits = prefill(gen, kv, prompts, [0] * len(prompts), blocks)
    history = [logits]
    tokens = torch.argmax(logits[:, 0], dim=-1).tolist()
    positions = [len(p) for p in prompts]
    for _ in range(steps):
        logits = decode(gen, kv, tokens, positions, blocks)
        history.append(logits)
        tokens = torch.argmax(logits[:, 0], dim=-1).tolist()
        positions = [p + 1 for p in positions]
    return history


def test_shuffled_page_table_gives_identical_results(gen, vocab):
    prompts = [prompt(20, 14, vocab), prompt(21, 9, vocab)]
    contiguous = [list(range(0, 5)), list(range(5, 10))]
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(3)).tolist()
    shuffled = [order[:5], order[5:10]]
    reference = _prefill_and_decode(gen, new_cache(gen), prompts, contiguous)
    paged = _prefill_and_decode(gen, new_cache(gen), prompts, shuffled)
    for expected, actual in zip(reference, paged, strict=True):
        torch.testing.assert_close(actual, expected, atol=1e-6, rtol=0)


# ---- (d) prefix caching -------------------------------------------------------------------


def test_prefix_cached_blocks_are_reused(gen, hf_model, vocab):
    a = prompt(30, 10, vocab)  # blocks 0, 1 full; block 2 partial
    b = a[:8] + prompt(31, 6, vocab)[1:]  # shares A's first two full blocks
    kv = new_cache(gen)
    prefill(gen, kv, [a], [0], [[0, 1, 2]])
    reused = prefill(gen, kv, [b[8:]], [8], [[0, 1, 5, 6]])[0, 0]

    full = prefill(gen, new_cache(gen), [b], [0], [[0, 1, 2, 3]])[0, 0]
    torch.testing.assert_close(reused, full, atol=1e-5, rtol=0)
    torch.testing.assert_close(reused, hf_last_logits(hf_model, b), atol=ATOL, rtol=0)


def test_prefill_of_whole_cached_prompt_recomputes_last_token(gen, hf_model, vocab):
    """vLLM recomputes the last prompt token when every block was a prefix-cache hit."""
    a = prompt(32, 8, vocab)
    kv = new_cache(gen)
    prefill(gen, kv, [a], [0], [[0, 1]])
    again = prefill(gen, kv, [a[7:]], [7], [[0, 1]])[0, 0]
    torch.testing.assert_close(again, hf_last_logits(hf_model, a), atol=ATOL, rtol=0)


# ---- (e) padding rows -------------------------------------------------------------------


def test_decode_padding_rows_are_skipped(gen, vocab):
    prompts = [prompt(40, 6, vocab), prompt(41, 9, vocab)]
    blocks = [[0, 1, 2], [3, 4, 5]]
    kv = new_cache(gen)
    first = torch.argmax(prefill(gen, kv, prompts, [0, 0], blocks)[:, 0], dim=-1).tolist()
    alone_kv = [[k.clone(), v.clone()] for k, v in kv]

    # Padding rows point at block 0, which row 0 owns: a write would corrupt it.
    mixed = decode(
        gen,
        kv,
        [first[0], 5, first[1], 5],
        [6, -1, 9, -1],
        [blocks[0], [0, 0, 0], blocks[1], [0, 0, 0]],
    )
    alone = [decode(gen, alone_kv, [first[r]], [len(prompts[r])], [blocks[r]]) for r in (0, 1)]

    # Batch shape changes float32 rounding (1e-6 level), nothing more; a stray write
    # would change cached K/V by O(1).
    torch.testing.assert_close(mixed[0], alone[0][0], atol=1e-5, rtol=0)
    torch.testing.assert_close(mixed[2], alone[1][0], atol=1e-5, rtol=0)
    assert torch.all(mixed[1] == 0) and torch.all(mixed[3] == 0)
    for (k, v), (k_alone, v_alone) in zip(kv, alone_kv, strict=True):
        torch.testing.assert_close(k, k_alone, atol=1e-5, rtol=0)
        torch.testing.assert_close(v, v_alone, atol=1e-5, rtol=0)


# ---- (f) on-device sampling ---------------------------------------------------------------


@pytest.fixture
def decode_ready(gen, vocab):
    """Three prefilled rows, ready for a decode step (decode is idempotent: it rewrites
    the same K/V at the same positions, so one state serves many calls)."""
    prompts = [prompt(50 + r, n, vocab) for r, n in enumerate((5, 12, 7))]
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    kv = new_cache(gen)
    logits = prefill(gen, kv, prompts, [0, 0, 0], blocks)
    tokens = torch.argmax(logits[:, 0], dim=-1).tolist()
    return kv, tokens, [len(p) for p in prompts], blocks, logits


def test_greedy_sampling_is_argmax(gen, vocab, decode_ready):
    kv, tokens, positions, blocks, prefill_logits = decode_ready
    logits = decode(gen, kv, tokens, positions, blocks)
    sampled = decode(gen, kv, tokens, positions, blocks, params([0.0, 0.0, 0.0]))
    assert sampled.dtype == torch.int64 and sampled.shape == (3,)
    assert sampled.tolist() == torch.argmax(logits[:, 0], dim=-1).tolist()
    # And in prefill, with the same meaning.
    prompts = [prompt(50 + r, n, vocab) for r, n in enumerate((5, 12, 7))]
    again, logprobs = prefill(gen, new_cache(gen), prompts, [0, 0, 0], blocks, params([0.0] * 3))
    assert again.shape == (3, 1) and logprobs is None
    assert again.reshape(-1).tolist() == torch.argmax(prefill_logits[:, 0], dim=-1).tolist()


def test_seeded_sampling_is_reproducible_and_batch_independent(gen, decode_ready):
    kv, tokens, positions, blocks, _ = decode_ready
    hot = params([1.5, 1.5, 1.5], seed=[11, 12, 13])
    first = decode(gen, kv, tokens, positions, blocks, hot)
    assert decode(gen, kv, tokens, positions, blocks, hot).tolist() == first.tolist()

    # Row 1 alone, then at another index beside an unseeded neighbour.
    alone = decode(gen, kv, tokens[1:2], positions[1:2], blocks[1:2], params([1.5], seed=[12]))
    moved = decode(
        gen,
        kv,
        [tokens[2], tokens[1]],
        [positions[2], positions[1]],
        [blocks[2], blocks[1]],
        params([0.7, 1.5], seed=[None, 12]),
    )
    assert int(alone[0]) == int(first[1]) == int(moved[1])

    # It is really sampling: different seeds give different tokens at a high temperature.
    draws = {
        int(decode(gen, kv, tokens[1:2], positions[1:2], blocks[1:2], params([5.0], seed=[s]))[0])
        for s in range(24)
    }
    assert len(draws) > 1


def test_top_k_and_top_p_cuts(gen, decode_ready):
    kv, tokens, positions, blocks, _ = decode_ready
    logits = decode(gen, kv, tokens, positions, blocks)[:, 0]
    greedy = torch.argmax(logits, dim=-1).tolist()
    top1 = decode(
        gen, kv, tokens, positions, blocks, params([1.0] * 3, top_k=[1] * 3, seed=[1, 2, 3])
    )
    assert top1.tolist() == greedy
    tiny_p = decode(
        gen,
        kv,
        tokens,
        positions,
        blocks,
        params([1.0] * 3, top_p=[1e-6] * 3, seed=[None, 2, None]),
    )
    assert tiny_p.tolist() == greedy

    allowed = set(torch.topk(logits[0], 2).indices.tolist())
    for s in range(16):
        token = decode(
            gen, kv, tokens[:1], positions[:1], blocks[:1], params([3.0], top_k=[2], seed=[s])
        )
        assert int(token[0]) in allowed


def test_filtered_probs_top_p_keeps_the_crossing_token():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    probs = filtered_probs(logits, temperature=1.0, top_k=0, top_p=0.7)
    torch.testing.assert_close(probs, torch.tensor([0.625, 0.375, 0.0, 0.0]))
    assert torch.equal(filtered_probs(logits, 1.0, 0, 1.0) > 0, torch.ones(4, dtype=torch.bool))


# ---- (g) asynchronous readback ------------------------------------------------------------


@pytest.mark.parametrize("sample", [False, True])
def test_async_readback_matches_synchronous_path(gen, decode_ready, sample):
    kv, tokens, positions, blocks, _ = decode_ready
    sampling = params([0.0, 1.0, 0.0], seed=[None, 5, None]) if sample else None
    expected = decode(gen, kv, tokens, positions, blocks, sampling)

    handle = decode(gen, kv, tokens, positions, blocks, sampling, read_from_device=False)
    assert isinstance(handle, DeviceOutput)
    host, events = gen.read_decode_output(handle, async_read=True)
    assert events and all(hasattr(e, "wait") for e in events)
    for event in events:
        event.wait()
    result, _ = gen.process_decode_output_host(host, is_tokens=sample)
    assert torch.equal(result, expected)

    handle = decode(gen, kv, tokens, positions, blocks, sampling, read_from_device=False)
    direct = gen.read_decode_output(handle, async_read=False)
    assert torch.equal(gen.process_decode_output_host(direct, is_tokens=sample)[0], expected)


def test_steady_decode_takes_its_input_tokens_from_the_device(gen, vocab):
    """With reload_inputs=False the host may not know the last tokens yet (-1): the
    generator feeds its own on-device samples, so two steps can be in flight."""
    prompts = [prompt(70 + r, n, vocab) for r, n in enumerate((6, 9))]
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7]]
    greedy = params([0.0, 0.0])

    def run(host_knows_tokens: bool) -> list[list[int]]:
        kv = new_cache(gen)
        first = prefill(gen, kv, prompts, [0, 0], blocks, greedy)[0].reshape(-1).tolist()
        positions = [len(p) for p in prompts]
        produced, tokens, handles = [first], first, []
        for step in range(4):
            reload = host_knows_tokens or step == 0
            handle = gen.decode_forward(
                tokens=torch.tensor(tokens if reload else [-1, -1]).reshape(-1, 1),
                start_pos=torch.tensor([p + step for p in positions]),
                page_table=page_table(blocks),
                kv_cache=kv,
                read_from_device=False,
                sampling_params=greedy,
                reload_inputs=reload,
                reload_sampling_params=step == 0,
                reset_sampling_state=step == 0,
            )
            handles.append(gen.read_decode_output(handle, async_read=True))
            if host_knows_tokens:  # read back before the next step: no overlap
                host, events = handles[-1]
                for event in events:
                    event.wait()
                tokens = gen.process_decode_output_host(host, is_tokens=True)[0].tolist()
        tokens_per_step = []
        for host, events in handles:
            for event in events:
                event.wait()
            tokens_per_step.append(gen.process_decode_output_host(host, is_tokens=True)[0])
        return produced + [t.tolist() for t in tokens_per_step]

    assert run(host_knows_tokens=False) == run(host_knows_tokens=True)
    # Unknown tokens with reload_inputs=True: nothing on the device may stand in for them.
    with pytest.raises(ValueError, match="unknown"):
        gen.decode_forward(
            tokens=torch.tensor([[-1]]),
            start_pos=torch.tensor([3]),
            page_table=page_table([[0]]),
            kv_cache=new_cache(gen),
            sampling_params=params([0.0]),
            reload_inputs=True,
        )


# ---- (h) batched paged attention ---------------------------------------------------------


def test_gather_context_reads_each_rows_blocks_up_to_the_longest():
    cache = torch.randn(10, 2, 4, 3)  # N=10, KV=2, Bs=4, D=3
    # Past its own blocks a row's page table holds junk (99 is not even a block).
    table = torch.tensor([[7, 2, 9, 99], [4, 99, 99, 99]])
    last = torch.tensor([9, 2])  # row 0: positions 0..9 (3 blocks); row 1: 0..2 (1 block)
    context = gather_context(cache, context_blocks(table, last, cache.shape))
    assert context.shape == (2, 2, 12, 3)  # [n, KV, C, D], C = 3 blocks of 4
    for row in range(2):
        for p in range(12):
            block = table[row, min(p // 4, int(last[row]) // 4)]  # a shorter row repeats
            assert torch.equal(context[row, :, p], cache[block, :, p % 4])  # its last block


def test_causal_attention_is_masked_softmax_over_grouped_heads():
    n, length, heads, kv_heads, context, dim = 3, 2, 4, 2, 6, 8
    generator = torch.Generator().manual_seed(0)
    q = torch.randn(n, length, heads, dim, generator=generator)
    k = torch.randn(n, kv_heads, context, dim, generator=generator)
    v = torch.randn(n, kv_heads, context, dim, generator=generator)
    positions = torch.tensor([[3, 4], [0, 1], [4, 5]])  # row 1 sees 1-2 of its 6 keys
    visible = causal_mask(positions, context)
    out = causal_attention(q, k, v, visible, scale=dim**-0.5)
    for row in range(n):
        k_row = k[row].repeat_interleave(heads // kv_heads, dim=0)  # [H, C, D]
        v_row = v[row].repeat_interleave(heads // kv_heads, dim=0)
        scores = q[row].transpose(0, 1) @ k_row.transpose(1, 2) * dim**-0.5  # [H, L, C]
        scores = scores.masked_fill(~visible[row], float("-inf"))
        expected = (torch.softmax(scores, dim=-1) @ v_row).transpose(0, 1)  # [L, H, D]
        torch.testing.assert_close(out[row], expected, atol=1e-6, rtol=0)


def test_ragged_batched_decode_matches_transformers(gen, hf_model, vocab):
    """One decode step over contexts of very different lengths (ending mid-block and on
    block boundaries), attended in one batched call. Page-table entries past each row's
    blocks are out of range, so reading them (rather than masking) would fail."""
    lengths = (1, 4, 9, 40)
    prompts = [prompt(80 + r, n, vocab) for r, n in enumerate(lengths)]
    order = torch.randperm(NUM_BLOCKS, generator=torch.Generator().manual_seed(8)).tolist()
    table = torch.full((len(prompts), 16), 10 * NUM_BLOCKS, dtype=torch.int32)
    used = 0
    for row, n in enumerate(lengths):
        count = -(-(n + 1) // BLOCK)  # the prompt and one decoded token
        table[row, :count] = torch.tensor(order[used : used + count], dtype=torch.int32)
        used += count
    kv = new_cache(gen)
    logits = gen.prefill_forward(
        tokens=padded(prompts, [0] * len(prompts)),
        page_table=table,
        kv_cache=kv,
        prompt_lens=torch.tensor(lengths),
        start_pos=torch.zeros(len(prompts), dtype=torch.long),
    )
    nxt = torch.argmax(logits[:, 0], dim=-1).tolist()
    stepped, _ = gen.decode_forward(
        tokens=torch.tensor(nxt).reshape(-1, 1),
        start_pos=torch.tensor(lengths),
        page_table=table,
        kv_cache=kv,
    )
    for row, ids in enumerate(prompts):
        torch.testing.assert_close(
            stepped[row, 0], hf_last_logits(hf_model, ids + [nxt[row]]), atol=ATOL, rtol=0
        )
    # A prefill of one token per row (every block a prefix-cache hit) is batched the same way.
    again = gen.prefill_forward(
        tokens=padded([p[-1:] for p in prompts], [n - 1 for n in lengths]),
        page_table=table,
        kv_cache=kv,
        prompt_lens=torch.tensor(lengths),
        start_pos=torch.tensor([n - 1 for n in lengths]),
    )
    torch.testing.assert_close(again, logits, atol=1e-5, rtol=0)


# ---- (i) model variants -------------------------------------------------------------------

_COMMON = dict(
    vocab_size=160,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
VARIANTS = {
    # q/k/v biases, tied embeddings
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    # q_norm/k_norm, head_dim != hidden / heads; saved sharded
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=32, tie_word_embeddings=False)),
    "mistral": ("MistralConfig", "MistralForCausalLM", dict(sliding_window=None)),
    "llama3-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
    "linear-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(rope_parameters={"rope_type": "linear", "rope_theta": 500.0, "factor": 2.0}),
    ),
    "yarn-rope": (
        "LlamaConfig",
        "LlamaForCausalLM",
        dict(
            rope_parameters={
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "original_max_position_embeddings": 64,
            }
        ),
    ),
}


def build_variant(name: str, folder):
    config_name, model_name, extra = VARIANTS[name]
    config = getattr(transformers, config_name)(**_COMMON, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_name)(config).eval()
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():  # weights large enough that a wrong detail changes the logits
        for _, param in sorted(model.named_parameters()):
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            else:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))
    shard = "40KB" if name == "qwen3" else "1GB"
    model.save_pretrained(folder, safe_serialization=True, max_shard_size=shard)
    return model


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_variant_parity_with_transformers(name, tmp_path):
    model = build_variant(name, tmp_path)
    if name == "qwen3":
        assert (tmp_path / "model.safetensors.index.json").exists()
    gen = load_generator(tmp_path)
    vocab = gen.dims.vocab_size
    prompts = [prompt(60, 7, vocab), prompt(61, 20, vocab)]
    kv = new_cache(gen)
    blocks = [list(range(0, 8)), list(range(8, 16))]
    logits = prefill(gen, kv, prompts, [0, 0], blocks)
    for row, ids in enumerate(prompts):
        torch.testing.assert_close(logits[row, 0], hf_last_logits(model, ids), atol=ATOL, rtol=0)

    nxt = torch.argmax(logits[:, 0], dim=-1).tolist()
    stepped = decode(gen, kv, nxt, [len(p) for p in prompts], blocks)
    for row, ids in enumerate(prompts):
        torch.testing.assert_close(
            stepped[row, 0], hf_last_logits(model, ids + [nxt[row]]), atol=ATOL, rtol=0
        )
