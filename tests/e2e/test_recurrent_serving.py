"""A gated delta net hybrid as a new user meets it: a tiny random `Qwen3_5ForCausalLM` (8
layers, 3 GDN : 1 full attention, conv kernel 4) goes `ttbundle init --reference`,
`validate --strict`, `ttbundle test` (against transformers), `pack`, `install`, then plain
`vllm serve`, its recurrent state owned by the generator (a slot per request, given back
with `release_request`). Greedy tokens equal transformers' for prompts longer than two
prefill chunks (`--max-num-batched-tokens 64`), eight requests at once in a KV pool small
enough that vLLM preempts (re-prefill into a zeroed slot), and `n=2` whose children each
keep their own slot. The prefix cache is on (the reference keeps snapshots of a slot's
state): a repeated or shared prefix hits, restores the state a snapshot kept after exactly
the hit's tokens, and still gives transformers' tokens.

The other form, recurrent state vLLM's KV manager owns (MambaSpec groups), takes the same
path from `ttbundle init --reference --recurrent-owner vllm` (the reference's vLLM-owned
class, `ReferenceQwen3_5VllmStateGenerator`) to one more `vllm serve` of the same
checkpoint, its prefix cache on in vLLM's "align" mode (position-indexed Mamba blocks,
the state copied on at block boundaries): `ttbundle test` passes against transformers,
the same prompts and `n=2` give transformers' tokens, and a repeated prompt hits vLLM's
cache and still does."""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import threading
import urllib.request

import pytest

from tests.e2e.conftest import Reference, successes_per_engine
from tests.e2e.test_first_bundle import forked_server, shell_environment, typed
from tests.recurrent_checkpoints import write_recurrent_checkpoint

pytestmark = pytest.mark.server

MAX_TOKENS = 64
STORY = (
    "Once upon a time, there was a little girl who lived in a village near the forest. "
    "Whenever she went out, the little girl wore a red riding cloak "
)
# 100 to 194 tokens: two to four chunks of 64. The pool holds 576 tokens (a request of
# max_model_len and a block): the first three or four prompts fill it, and each
# crosses a block boundary in its 64 tokens of decode (blocks of 64 tokens on vLLM 0.34,
# whose hybrid hook picks them, 16 on 0.33), so vLLM must preempt.
PROMPTS = [STORY * k + f" number {i}" for i, k in enumerate([1, 2, 1, 2, 1, 1, 2, 1])]
SERVE = (
    "--max-num-batched-tokens 64 --max-model-len 512 --max-num-seqs 8 "
    "--kv-cache-memory-bytes 147456"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """The user's whole path, then one `vllm serve` of the installed bundle: (port, the
    server's log file, transformers on the checkpoint, what `ttbundle test` printed)."""
    home = tmp_path_factory.mktemp("gdn")
    env = shell_environment(home)
    write_recurrent_checkpoint("Qwen3_5ForCausalLM", home / "ckpt")
    created = typed("ttbundle init my-qwen --reference --from-hf ckpt", home, env)
    assert created.strip().splitlines()[-1] == "my-qwen", created
    assert "valid (0 errors, 0 warnings" in typed("ttbundle validate --strict my-qwen", home, env)
    tested = typed("ttbundle test my-qwen --model ckpt", home, env, timeout=900)
    typed("ttbundle pack my-qwen -o dist", home, env)
    typed("ttbundle install dist/my-qwen-0.1.0.ttbundle --models-dir models", home, env)
    with forked_server(home, env, SERVE) as (port, log):
        yield port, log, Reference(home / "ckpt"), tested


def _complete(port: int, prompt: str, n: int = 1) -> list[dict]:
    """The choices of one completion, greedy as vLLM allows it for `n > 1` (top_k 1)."""
    body = {
        "model": "ckpt",
        "prompt": prompt,
        "max_tokens": MAX_TOKENS,
        "temperature": 1.0,
        "top_k": 1,
        "n": n,
        "ignore_eos": True,
        "return_token_ids": True,
    }
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=300) as answer:
        return json.load(answer)["choices"]


def _metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
        text = answer.read().decode()
    [count] = re.findall(rf"^vllm:{name}\{{[^}}]*\}} ([\d.]+)$", text, re.M)
    return float(count)


def _preemptions(port: int) -> float:
    return _metric(port, "num_preemptions_total")


def test_ttbundle_test_passes_the_gdn_reference_against_transformers(served):
    *_, tested = served
    assert "PASSED" in tested and "FAIL" not in tested, tested
    assert "vs transformers" in tested, tested
    # Prompts split into several chunks: one slot carries the state across them.
    assert re.search(r"chunked_prefill\s+p2\s.*[3-9] chunks\s+pass", tested), tested


def test_the_plan_serves_the_generators_slots_and_only_attention_keeps_kv(served):
    _, log, _, _ = served
    text = log.read_text()
    assert "recurrent_state: 'generator' -> \"the generator's slots\"" in text, text[-4000:]
    assert "6 linear-attention (gated delta net) layers with recurrent state" in text
    assert "state 10,752 B per request" in text
    [kv] = [line for line in text.splitlines() if "KV cache of" in line]
    assert "1 KV group: full attention" in kv, kv
    assert "Traceback" not in text


def test_eight_chunked_requests_under_kv_pressure_give_transformers_tokens(served):
    port, _, reference, _ = served
    before = _preemptions(port)
    with concurrent.futures.ThreadPoolExecutor(len(PROMPTS)) as pool:
        answers = list(pool.map(lambda p: _complete(port, p), PROMPTS))
    for prompt, [choice] in zip(PROMPTS, answers, strict=True):
        ids = list(choice["prompt_token_ids"])
        assert len(ids) > 64, len(ids)  # more than one prefill chunk
        assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS), prompt
    assert max(len(c[0]["prompt_token_ids"]) for c in answers) > 128  # over two chunks
    assert _preemptions(port) > before, "the pool was meant to preempt"


def test_two_children_each_in_its_own_slot_give_transformers_tokens(served):
    port, _, reference, _ = served
    choices = _complete(port, PROMPTS[1], n=2)
    assert len(choices) == 2
    ids = list(choices[0]["prompt_token_ids"])
    for choice in choices:
        assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS)


def test_a_repeated_and_a_shared_prefix_hit_a_snapshot_and_give_transformers_tokens(served):
    """Chunks of 64 end on block boundaries (blocks of 64 tokens on 0.34, 16 on 0.33), so
    the reference keeps a snapshot at each: the second time, the prompt's chunks come from
    the cache (attention KV from vLLM's blocks, the GDN state from the snapshot), and so
    do those another prompt shares."""
    port, log, reference, _ = served
    prompt = STORY * 2 + " the first time"
    shares = STORY * 2 + " and then another ending altogether"
    common = os.path.commonprefix([
        reference.tokenizer(prompt)["input_ids"], reference.tokenizer(shares)["input_ids"]
    ])  # fmt: skip
    for time_ in range(3):
        text = shares if time_ == 2 else prompt
        before = _metric(port, "prefix_cache_hits_total")
        [choice] = _complete(port, text)
        ids = list(choice["prompt_token_ids"])
        assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS), text
        hit = _metric(port, "prefix_cache_hits_total") - before
        if time_ > 0:  # the first time may hit what the tests before left, or not
            # Snapshots where the 64-token chunks ended (the first time); a hit leaves
            # at least the prompt's last token to compute.
            shared = len(ids) - 1 if time_ == 1 else len(common)
            assert hit == shared // 64 * 64 >= 128, (text, hit, len(ids))
    assert "prefix_caching: True -> 'snapshots (64)'" in log.read_text()


def _two_engines_serve(home, reference, extra: str, plan_line: str) -> None:
    """`--data-parallel-size 2` on the bundle installed in `home`: an engine per submesh,
    each with its own generator and its own state; chunked prompts sent together are
    spread over both and each gets transformers' tokens."""
    args = f"--max-num-batched-tokens 64 --max-model-len 512 --max-num-seqs 4 {extra}"
    prompts = PROMPTS[:4]
    with forked_server(home, shell_environment(home), args, "serve-dp.log") as (port, dp_log):
        barrier = threading.Barrier(len(prompts))

        def send(prompt: str) -> list[dict]:
            barrier.wait()  # all in flight together: the load balancer spreads them
            return _complete(port, prompt)

        per_engine: dict[str, float] = {}
        for _ in range(4):  # a balancer that happened to pick one engine gets another round
            with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
                answers = list(pool.map(send, prompts))
            for prompt, [choice] in zip(prompts, answers, strict=True):
                ids = list(choice["prompt_token_ids"])
                assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS), prompt
            per_engine = successes_per_engine(f"http://127.0.0.1:{port}")
            if len([e for e, n in per_engine.items() if n > 0]) == 2:
                break
        assert sorted(per_engine) == ["0", "1"] and all(per_engine.values()), per_engine
        text = dp_log.read_text()
        assert plan_line in text, text[-4000:]
        assert "Traceback" not in text


def test_two_engines_each_keep_their_own_slots_and_give_transformers_tokens(served):
    """Data parallelism, the generator's slots: one more server (the only way to show two
    engines, each with its own slots, serving at once)."""
    _, log, reference, _ = served
    _two_engines_serve(
        log.parent,
        reference,
        "--data-parallel-size 2",
        "recurrent_state: 'generator' -> \"the generator's slots\"",
    )


# --- the vLLM-owned form: MambaSpec groups in vLLM's hybrid manager -------------------------

# A pool of 1 MiB: 2 shared tensors of 64 pages of 8 KiB (blocks of 64 tokens) on 0.34,
# 256 pages of 2 KiB on 0.33; every Mamba group holds a block per request for its life.
VLLM_OWNED_SERVE = (
    "--max-num-batched-tokens 64 --max-model-len 512 --max-num-seqs 8 "
    "--kv-cache-memory-bytes 1048576"
)


@pytest.fixture(scope="module")
def vllm_owned(tmp_path_factory):
    """The same path for the other form, `init --reference --recurrent-owner vllm`, then
    one `vllm serve` of the installed bundle (the checkpoint written alike, and no other
    start; the bundle declares prefix caching, so vLLM's "align" mode): (port, the
    server's log file, transformers on the checkpoint, what `ttbundle test` printed)."""
    home = tmp_path_factory.mktemp("gdn-vllm")
    env = shell_environment(home)
    write_recurrent_checkpoint("Qwen3_5ForCausalLM", home / "ckpt")
    created = typed(
        "ttbundle init my-qwen-vllm --reference --recurrent-owner vllm --from-hf ckpt", home, env
    )
    assert created.strip().splitlines()[-1] == "my-qwen-vllm", created
    metadata = json.loads((home / "my-qwen-vllm" / "vllm_metadata.json").read_text())
    assert metadata["capabilities"]["recurrent_state"]["owner"] == "vllm", metadata
    for flags in ("--strict", "--strict --import"):
        validated = typed(f"ttbundle validate {flags} my-qwen-vllm", home, env)
        assert "valid (0 errors, 0 warnings" in validated, validated
    tested = typed("ttbundle test my-qwen-vllm --model ckpt", home, env, timeout=900)
    typed("ttbundle pack my-qwen-vllm -o dist", home, env)
    typed("ttbundle install dist/my-qwen-vllm-0.1.0.ttbundle --models-dir models", home, env)
    with forked_server(home, env, VLLM_OWNED_SERVE) as (port, log):
        yield port, log, Reference(home / "ckpt"), tested


def test_ttbundle_test_passes_the_vllm_owned_form_against_transformers(vllm_owned):
    *_, tested = vllm_owned
    assert "PASSED" in tested and "FAIL" not in tested, tested
    assert "vs transformers" in tested, tested
    assert re.search(r"chunked_prefill\s+p2\s.*[3-9] chunks\s+pass", tested), tested


def test_vllm_owned_state_serves_chunked_prompts_and_two_children_like_transformers(
    vllm_owned,
):
    port, log, reference, _ = vllm_owned
    text = log.read_text()
    assert "recurrent_state: 'vllm' -> \"vLLM's MambaSpec groups\"" in text, text[-4000:]
    [kv] = [line for line in text.splitlines() if "KV cache of" in line]
    assert "4 KV groups: gated delta net state (3), full attention (1)" in kv, kv
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda p: _complete(port, p), PROMPTS[:4]))
    for prompt, [choice] in zip(PROMPTS, answers):
        ids = list(choice["prompt_token_ids"])
        assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS), prompt
    assert max(len(c[0]["prompt_token_ids"]) for c in answers) > 128  # over two chunks
    choices = _complete(port, PROMPTS[1], n=2)
    assert len(choices) == 2
    ids = list(choices[0]["prompt_token_ids"])
    for choice in choices:
        assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS)
    assert "Traceback" not in log.read_text()


def test_vllm_owned_state_in_align_mode_hits_a_repeated_prompt_and_gives_its_tokens(
    vllm_owned,
):
    """vLLM's "align" mode: chunks of 64 end on Mamba block boundaries (blocks of 64 tokens
    on 0.34, 16 on 0.33), vLLM keeps the state of the prompt's last boundary in its
    Mamba block; the same prompt again hits up to there, the runner copies that block's
    state into the request's next block, and the tokens are still transformers'."""
    port, log, reference, _ = vllm_owned
    prompt = STORY * 2 + " the align mode"
    for time_ in range(2):
        before = _metric(port, "prefix_cache_hits_total")
        [choice] = _complete(port, prompt)
        ids = list(choice["prompt_token_ids"])
        assert len(ids) > 128, len(ids)  # over two chunks of 64
        assert choice["token_ids"] == reference.greedy(ids, MAX_TOKENS), time_
        hit = _metric(port, "prefix_cache_hits_total") - before
        if time_ == 1:
            assert hit >= 64, (hit, len(ids))
    text = log.read_text()
    assert "prefix_caching: True -> '\"align\"'" in text, text[-4000:]
    assert "Traceback" not in text


def test_two_engines_each_keep_their_own_mamba_groups_and_give_transformers_tokens(vllm_owned):
    """Data parallelism, the state in vLLM's KV manager: each engine its own Mamba groups
    (prefix caching on: align mode in each engine); one more server, as for the other
    form."""
    _, log, reference, _ = vllm_owned
    _two_engines_serve(
        log.parent,
        reference,
        "--data-parallel-size 2 --kv-cache-memory-bytes 1048576",
        "recurrent_state: 'vllm' -> \"vLLM's MambaSpec groups\"",
    )
