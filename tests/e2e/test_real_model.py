"""A real trained model end to end: SmolLM2-135M-Instruct served on the host mesh by the
demo bundle, against transformers on the same float32 weights.

Token ids are compared, not text (the incremental detokenizer holds back a trailing
partial UTF-8 sequence). Logits of the two implementations differ by float32 rounding
over 30 layers (about 1e-5 relative); log-probabilities are held to 2e-3, which allows
that and nothing a real defect (a wrong position, head or norm) would stay under.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.e2e.test_sampling_async import IDS, TOKEN_IDS, concurrently, output_ids

pytestmark = pytest.mark.server

TOKENS = 32
LOGPROB_TOLERANCE = 2e-3
TEXTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "Water boils at a temperature of",
]
QUESTIONS = [
    "What is the capital of France?",
    "Name three fruits.",
    "How many legs does a spider have?",
]


def prompts(reference) -> list[list[int]]:
    plain = [reference.tokenizer(text)["input_ids"] for text in TEXTS]
    chats = [reference.chat_prompt_ids([{"role": "user", "content": q}]) for q in QUESTIONS]
    return plain + chats


def test_the_model_answers_in_words(real_server):
    with real_server.client() as client:
        chat = client.chat.completions.create(
            model=real_server.model,
            messages=[{"role": "user", "content": "What is the capital of France?"}],
            max_tokens=24,
            temperature=0,
        )
    assert "Paris" in chat.choices[0].message.content


def test_greedy_token_ids_match_transformers_in_one_batch(real_server, real_reference):
    ids = prompts(real_reference)
    assert len(ids) >= 8
    served = concurrently(real_server, ids, max_tokens=TOKENS, temperature=0.0)
    for prompt, tokens in zip(ids, served):
        assert tokens == real_reference.greedy(prompt, TOKENS), prompt


def test_top20_logprobs_match_transformers(real_server, real_reference):
    prompt = real_reference.chat_prompt_ids([{"role": "user", "content": QUESTIONS[1]}])
    with real_server.client() as client:
        response = client.completions.create(
            model=real_server.model,
            prompt=prompt,
            max_tokens=12,
            temperature=0.0,
            logprobs=20,
            extra_body={**IDS, **TOKEN_IDS},
        )
    tokens = output_ids(response)
    expected = real_reference.logprobs(prompt, tokens)
    logprobs = response.choices[0].logprobs
    for i, token in enumerate(tokens):
        assert abs(logprobs.token_logprobs[i] - expected[i, token].item()) < LOGPROB_TOLERANCE
        top = {int(k.removeprefix("token_id:")): v for k, v in logprobs.top_logprobs[i].items()}
        assert len(top) >= 20
        best = set(expected[i].topk(20).indices.tolist())
        assert len(best & set(top)) >= 19, i  # a tie at the 20th place may swap one
        for token_id, value in top.items():
            assert abs(value - expected[i, token_id].item()) < LOGPROB_TOLERANCE, (i, token_id)


def test_chunked_prefill_and_a_prefix_cache_hit_give_the_same_tokens(real_server, real_reference):
    story = " ".join(TEXTS * 6)  # ~150 tokens: three 64-token prefill chunks
    prompt = real_reference.tokenizer(story)["input_ids"]
    assert len(prompt) > 128
    expected = real_reference.greedy(prompt, TOKENS)
    before = real_server.metrics()
    first = concurrently(real_server, [prompt], max_tokens=TOKENS, temperature=0.0)[0]
    again = concurrently(real_server, [prompt], max_tokens=TOKENS, temperature=0.0)[0]
    after = real_server.metrics()
    assert first == again == expected
    hits = after.get("vllm:prefix_cache_hits_total", 0) - before.get(
        "vllm:prefix_cache_hits_total", 0
    )
    assert hits >= 128  # the second request reused at least the first full blocks


def _served_prompt_logprobs(server, prompt: list[int], k: int) -> list[dict[int, dict]]:
    """The prompt logprobs vLLM reports for `prompt` (prompt_logprobs=k), by position:
    entry 0 is None (nothing predicts the first token), entry i maps token ids to
    {"logprob", "rank", ...}."""
    with server.client() as client:
        response = client.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=2,
            temperature=0.0,
            extra_body={**IDS, "prompt_logprobs": k},
        )
    served = response.choices[0].model_extra["prompt_logprobs"]
    assert len(served) == len(prompt) and served[0] is None
    return [{int(t): v for t, v in entry.items()} for entry in served[1:]]


def test_prompt_logprobs_equal_transformers_log_softmax(real_server, real_reference):
    """A ~150-token prompt (three 64-token prefill chunks) and a short one, sent together:
    each position's log-probability of the prompt token, its rank and the top 5 equal
    transformers' log-softmax of the prompt, within float32 rounding."""
    tokenizer = real_reference.tokenizer
    long = tokenizer(" ".join(TEXTS * 6))["input_ids"]
    short = tokenizer(TEXTS[3])["input_ids"]
    assert len(long) > 128
    barrier = threading.Barrier(2)

    def send(prompt):
        barrier.wait()
        return _served_prompt_logprobs(real_server, prompt, 5)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(send, (long, short)))
    for prompt, served in zip((long, short), results):
        expected = real_reference.prompt_logprobs(prompt)
        for i, entry in enumerate(served):
            token = prompt[i + 1]
            assert abs(entry[token]["logprob"] - expected[i, token].item()) < LOGPROB_TOLERANCE
            rank = int((expected[i] > expected[i, token] + LOGPROB_TOLERANCE).sum()) + 1
            assert (
                rank
                <= entry[token]["rank"]
                <= int((expected[i] >= expected[i, token] - LOGPROB_TOLERANCE).sum())
            ), i
            top = {t for t in entry if t != token} | (
                {token} if entry[token]["rank"] <= 5 else set()
            )
            assert len(top) == 5
            assert len(top & set(expected[i].topk(5).indices.tolist())) >= 4, i
            for token_id, value in entry.items():
                assert abs(value["logprob"] - expected[i, token_id].item()) < LOGPROB_TOLERANCE


def test_echo_with_logprobs_reports_the_prompt_as_transformers_scores_it(
    real_server, real_reference
):
    """completions' echo with logprobs, as a loglikelihood evaluation asks: the prompt's
    tokens come back with their log-probabilities, then the generated ones."""
    prompt = real_reference.tokenizer(TEXTS[0] + " Paris")["input_ids"]
    with real_server.client() as client:
        response = client.completions.create(
            model=real_server.model,
            prompt=prompt,
            max_tokens=3,
            temperature=0.0,
            echo=True,
            logprobs=1,
            extra_body={**IDS, **TOKEN_IDS},
        )
    logprobs = response.choices[0].logprobs
    served = logprobs.token_logprobs
    assert len(served) == len(prompt) + 3 and served[0] is None
    expected = real_reference.prompt_logprobs(prompt)
    for i, token in enumerate(prompt[1:]):
        assert abs(served[i + 1] - expected[i, token].item()) < LOGPROB_TOLERANCE, i
    assert logprobs.tokens[: len(prompt)] == [f"token_id:{t}" for t in prompt]
