"""Speculative decoding through `vllm serve` (the "spec-ngram", "spec-lanes",
"spec-drafter" and "spec-off" servers of conftest.py: the demo bundle with
`--speculative-config` ngram, k=4, under vLLM's default (asynchronous on 0.34.0)
scheduling, its single-execute variant as 2 in-process lanes with the same, the
demo-drafter variant with custom_class (the model's own drafter, k=4, the same
scheduling), and the demo bundle without speculation: the "demo-sync" server, shared
with the other server tests).

Greedy output with speculation equals greedy output without it, token for token, on
prompts whose continuation repeats (drafts are accepted) and on random text (they are
mostly rejected); sampled output keeps the target's distribution; vLLM's
speculative-decoding metrics appear on `/metrics` and count; logprobs are served while
speculating, the same as without (greedy) and the target's log-softmax (sampled); what
cannot speculate is refused per request with its TTB code.
"""

from __future__ import annotations

import random
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

pytestmark = pytest.mark.server

REPETITIVE = [
    "a a a a a a a a a a a a",
    "ab ab ab ab ab ab ab ab ab",
    "1 2 3 1 2 3 1 2 3 1 2 3",
    "one two three four one two three four one two three four one two",
]


def random_text(seed: int, words: int = 30) -> str:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    return " ".join(
        "".join(rng.choice(letters) for _ in range(rng.randint(2, 8))) for _ in range(words)
    )


RANDOM = [random_text(seed) for seed in range(4)]


def completion_ids(server, prompt: str, max_tokens: int, **extra) -> list[int]:
    """The completion's token ids (vLLM's `return_token_ids`)."""
    with server.client() as client:
        out = client.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=max_tokens,
            extra_body={"return_token_ids": True, "ignore_eos": True, **extra.pop("body", {})},
            **extra,
        )
    return list(out.choices[0].token_ids)


def all_ids(server, prompts: list[str], max_tokens: int, **extra) -> list[list[int]]:
    """Every prompt at once (one batch), in prompt order."""
    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(
            pool.map(lambda p: completion_ids(server, p, max_tokens, **dict(extra)), prompts)
        )


SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts_total",
    "vllm:spec_decode_num_draft_tokens_total",
    "vllm:spec_decode_num_accepted_tokens_total",
)


def spec_counters(server) -> dict[str, float]:
    values = server.metrics()
    return {name: values.get(name, 0.0) for name in SPEC_COUNTERS}


def asynchronous() -> bool:
    """Whether the speculating servers keep asynchronous scheduling: 0.34.0 does (the demo
    bundle declares async_spec_decode); 0.33.0's V1 runner protocol turns it off for ngram
    before the platform decides."""
    from ttbundles.serving import compat

    return not compat.V1_RUNNER_PARTS


SPECULATING = ["spec-ngram", "spec-lanes", "spec-drafter"]
ASSIGNED = "ttbundles:lane_requests_assigned"


@pytest.mark.parametrize("name", SPECULATING)
@pytest.mark.parametrize("kind", ["repetitive", "random"])
def test_greedy_output_with_speculation_equals_greedy_output_without(spec_servers, name, kind):
    speculating, baseline = spec_servers[name], spec_servers["spec-off"]
    prompts = REPETITIVE if kind == "repetitive" else RANDOM
    before = spec_counters(speculating)
    stats = speculating.settled_stats()
    lanes = name == "spec-lanes"
    assigned = speculating.lane_metrics().get(ASSIGNED, {}) if lanes else {}
    got = all_ids(speculating, prompts, 96, temperature=0)
    want = all_ids(baseline, prompts, 96, temperature=0)
    assert got == want
    if lanes:  # the prompts were spread over both lanes, each verifying its own rows
        now = speculating.lane_metrics()[ASSIGNED]
        assert all(now[lane] > assigned.get(lane, 0) for lane in (0, 1)), (assigned, now)
    after = speculating.wait_for_metric(SPEC_COUNTERS[0], before[SPEC_COUNTERS[0]] + 1)
    delta = speculating.stats_delta(stats)
    verified = delta.get("step.verify", 0)
    assert verified > 0, "no step verified drafts"
    # Asynchronous: every verify was read back after its submission (read_decode_output).
    assert delta.get("step.verify.async", 0) == (verified if asynchronous() else 0), delta
    drafts = after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]
    accepted = after[SPEC_COUNTERS[2]] - before[SPEC_COUNTERS[2]]
    assert drafts > 0
    if kind == "repetitive":  # the continuations repeat: some drafts are right
        assert accepted > 0, (drafts, accepted)


@pytest.mark.parametrize("name", SPECULATING)
def test_the_speculative_metrics_appear_and_count(spec_servers, name):
    server = spec_servers[name]
    before = spec_counters(server)
    completion_ids(server, REPETITIVE[0], 48, temperature=0)
    after = server.wait_for_metric(SPEC_COUNTERS[1], before[SPEC_COUNTERS[1]] + 1)
    for name in SPEC_COUNTERS:
        assert name in after, f"{name} is not on /metrics"
    proposed = after[SPEC_COUNTERS[1]] - before[SPEC_COUNTERS[1]]
    steps = after[SPEC_COUNTERS[0]] - before[SPEC_COUNTERS[0]]
    accepted = after[SPEC_COUNTERS[2]] - before[SPEC_COUNTERS[2]]
    # Each verify proposed at most k=4 drafts; at most every draft was accepted.
    assert 0 < steps <= proposed <= 4 * steps
    assert 0 <= accepted <= proposed
    # The baseline speculates nothing.
    assert spec_counters(spec_servers["spec-off"])[SPEC_COUNTERS[0]] == 0


def token_distribution(server, prompt: str, seeds: range, position: int) -> Counter:
    """How often each token comes at `position` of seeded samples (top-k 4)."""

    def one(seed: int) -> int:
        # Room for drafts past `position`: vLLM 0.33.0 schedules none beyond max_tokens.
        ids = completion_ids(
            server, prompt, position + 5, temperature=1.0, top_p=1.0, seed=seed, body={"top_k": 4}
        )
        return ids[position]

    with ThreadPoolExecutor(8) as pool:
        return Counter(pool.map(one, seeds))


BASELINE_DISTRIBUTION: dict[tuple[str, int], Counter] = {}  # the baseline's, sampled once


@pytest.mark.parametrize("name", SPECULATING)
def test_sampled_output_with_speculation_keeps_the_targets_distribution(spec_servers, name):
    """Seeded samples (temperature 1, top-k 4) of the 2nd token after a long prompt of
    random words, 400 requests on each server. The first token nearly always occurs in the
    prompt, so the n-gram proposer (prompt_lookup_min 1) drafts on both releases and the
    2nd token is the verify's (accepted, recovered or bonus). The two distributions (at
    most 16 tokens) must be within a total variation distance of 0.25: two samples of 400
    from one such distribution differ by about 0.11 (standard deviation about 0.02). A
    sampler that accepted every draft would put nearly all the mass on the drafts. The
    model's drafter drafts after every commit, so its 2nd token is the verify's too."""
    speculating, baseline = spec_servers[name], spec_servers["spec-off"]
    before = spec_counters(speculating)
    prompt = " ".join(random_text(seed) for seed in range(100, 103))
    seeds = range(400)
    got = token_distribution(speculating, prompt, seeds, 1)
    key = (prompt, len(seeds))
    if key not in BASELINE_DISTRIBUTION:
        BASELINE_DISTRIBUTION[key] = token_distribution(baseline, prompt, seeds, 1)
    want = BASELINE_DISTRIBUTION[key]
    after = spec_counters(speculating)
    assert after[SPEC_COUNTERS[1]] > before[SPEC_COUNTERS[1]], "no drafts were verified"
    total = len(seeds)
    distance = 0.5 * sum(abs(got[t] - want[t]) / total for t in got.keys() | want.keys())
    assert distance < 0.25, (distance, got.most_common(8), want.most_common(8))


@pytest.mark.parametrize(
    ("extra", "code", "parameter"),
    [
        ({"body": {"min_tokens": 3}}, "TTB237", "min_tokens"),
        ({"presence_penalty": 0.5}, "TTB237", "presence_penalty"),
        ({"body": {"structured_outputs": {"choice": ["yes", "no"]}}}, "TTB237", "structured"),
        (
            {
                "body": {
                    "response_format": {
                        "type": "json_schema",
                        "json_schema": {"name": "x", "schema": {"type": "object"}},
                    }
                }
            },
            "TTB237",
            "response_format json_schema",
        ),
    ],
)
def test_what_cannot_speculate_is_refused_per_request(spec_servers, extra, code, parameter):
    """Logprobs are served (below); these stay refused (TTB238 is for a plan without the
    logits accept mode, which the demo bundle offers: tests/test_speculative.py)."""
    server = spec_servers["spec-ngram"]
    with pytest.raises(openai.BadRequestError) as excinfo:
        completion_ids(server, REPETITIVE[0], 4, temperature=0, **extra)
    message = str(excinfo.value)
    assert code in message and parameter in message, message
    # what the client sent, once, never vLLM's internal repr
    assert "Params(" not in message and message.count(code) == 1, message
    # The server keeps serving.
    assert len(completion_ids(server, REPETITIVE[0], 4, temperature=0)) == 4


# --- logprobs while speculating -------------------------------------------------------

LOGPROBS = 5
TOLERANCE = 1e-4  # float32: the verify's logits and a one-token decode's differ by ~1e-6


def token_id(name: str) -> int:
    assert name.startswith("token_id:"), name
    return int(name.removeprefix("token_id:"))


def completion_logprobs(server, prompt: str, max_tokens: int, **extra):
    """(prompt ids, output ids, per token (its logprob, {top id: logprob})): keys are
    token ids (`return_tokens_as_token_ids`)."""
    body = {"return_token_ids": True, "return_tokens_as_token_ids": True, "ignore_eos": True}
    body.update(extra.pop("body", {}))
    with server.client() as client:
        out = client.completions.create(
            model=server.model,
            prompt=prompt,
            max_tokens=max_tokens,
            logprobs=extra.pop("logprobs", LOGPROBS),
            extra_body=body,
            **extra,
        )
    choice = out.choices[0]
    tokens = list(choice.token_ids)
    assert [token_id(t) for t in choice.logprobs.tokens] == tokens
    rows = [
        (value, {token_id(k): v for k, v in top.items()})
        for value, top in zip(choice.logprobs.token_logprobs, choice.logprobs.top_logprobs)
    ]
    return list(choice.prompt_token_ids), tokens, rows


def assert_rows_equal(got, want, where):
    """The same logprob per token and the same top tokens with the same logprobs."""
    assert len(got) == len(want), where
    for i, ((value, top), (value_w, top_w)) in enumerate(zip(got, want)):
        assert value == pytest.approx(value_w, abs=TOLERANCE), (where, i)
        assert set(top) == set(top_w), (where, i, top, top_w)
        for token, logprob in top.items():
            assert logprob == pytest.approx(top_w[token], abs=TOLERANCE), (where, i, token)


@pytest.mark.parametrize("kind", ["repetitive", "random"])
def test_greedy_logprobs_with_speculation_equal_those_without(spec_servers, kind):
    """logprobs=5, greedy, every prompt at once: the same tokens, and per token the same
    logprob and top 5 as the server that does not speculate; on repetitive prompts
    verifies commit accepted drafts (their tokens' logprobs come from the verify)."""
    speculating, baseline = spec_servers["spec-ngram"], spec_servers["spec-off"]
    prompts = REPETITIVE if kind == "repetitive" else RANDOM
    before = spec_counters(speculating)
    stats = speculating.settled_stats()

    def every(server):
        with ThreadPoolExecutor(len(prompts)) as pool:
            return list(
                pool.map(lambda p: completion_logprobs(server, p, 48, temperature=0), prompts)
            )

    got, want = every(speculating), every(baseline)
    for prompt, (_, tokens, rows), (_, tokens_w, rows_w) in zip(prompts, got, want):
        assert tokens == tokens_w, prompt
        assert len(rows) == len(tokens) == 48
        assert_rows_equal(rows, rows_w, prompt)
    after = speculating.wait_for_metric(SPEC_COUNTERS[0], before[SPEC_COUNTERS[0]] + 1)
    assert speculating.stats_delta(stats).get("step.verify", 0) > 0, "no step verified"
    if kind == "repetitive":
        accepted = after[SPEC_COUNTERS[2]] - before[SPEC_COUNTERS[2]]
        assert accepted > 0, "no draft was accepted"


def test_chat_logprobs_with_speculation_equal_those_without(spec_servers):
    speculating, baseline = spec_servers["spec-ngram"], spec_servers["spec-off"]
    messages = [{"role": "user", "content": REPETITIVE[3]}]

    def chat(server):
        with server.client() as client:
            out = client.chat.completions.create(
                model=server.model,
                messages=messages,
                max_tokens=32,
                temperature=0,
                logprobs=True,
                top_logprobs=LOGPROBS,
                extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True},
            )
        content = out.choices[0].logprobs.content
        return [token_id(c.token) for c in content], [
            (c.logprob, {token_id(t.token): t.logprob for t in c.top_logprobs}) for c in content
        ]

    tokens, rows = chat(speculating)
    tokens_w, rows_w = chat(baseline)
    assert tokens == tokens_w and len(tokens) == 32
    assert all(len(top) == LOGPROBS for _, top in rows)
    assert_rows_equal(rows, rows_w, "chat")


def test_sampled_logprobs_with_speculation_are_the_targets(spec_servers, reference):
    """Seeded samples (temperature 0.8, top-k 8) with logprobs=3 while speculating, on
    a repetitive prompt: each token's logprob and the top 3 are transformers'
    log-softmax of the raw logits at that position (vLLM's default raw_logprobs, which
    temperature and top-k do not change), within float32 tolerance."""
    speculating = spec_servers["spec-ngram"]
    stats = speculating.settled_stats()
    for seed in (1, 2, 3):
        prompt_ids, tokens, rows = completion_logprobs(
            speculating,
            REPETITIVE[2],
            32,
            logprobs=3,
            temperature=0.8,
            seed=seed,
            body={"top_k": 8},
        )
        expected = reference.logprobs(prompt_ids, tokens)
        assert len(rows) == len(tokens) == 32
        for i, (token, (value, top)) in enumerate(zip(tokens, rows)):
            assert value == pytest.approx(expected[i, token].item(), abs=TOLERANCE), (seed, i)
            values, ids = expected[i].topk(3)
            assert set(top) - {token} <= set(ids.tolist()) <= set(top), (seed, i)
            for index, logprob in zip(ids.tolist(), values.tolist()):
                assert top[index] == pytest.approx(logprob, abs=TOLERANCE), (seed, i)
    assert speculating.stats_delta(stats).get("step.verify", 0) > 0, "no step verified"
