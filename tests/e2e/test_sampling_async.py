"""On-device sampling with per-batch host fallback, and asynchronous decode, end to end.

The servers (conftest.py): "demo" samples on the device where a batch allows it
(`sample_on_device_mode: "all"`) and decodes asynchronously (vLLM's async scheduling);
"demo-sync" is the same with `--no-async-scheduling`; "compat" sets
`always_compat_sampling`; "plain" is a bundle that does not declare async_decode (nor
sample_on_device). Which path a batch took is read from the worker's counters, as deltas
around a test's requests (`Server.stats_delta`, settled: the steps that retire a finished
request are counted in the test that sent it).

Batches are controlled by sending one request at a time, or one short request while one
long streamed request decodes. A request alone with max_tokens=N and a prompt under the
64-token step budget takes one prefill step and N - 1 decode steps; each step samples one
batch. Prompts are token ids, drawn at random per test so that no test hits blocks that
another one left in a server's prefix cache (prompts under 16 tokens never do).
"""

from __future__ import annotations

import math
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

pytestmark = pytest.mark.server

GREEDY = {"temperature": 0.0}
# Generate exactly max_tokens, through EOS, and return the token ids of prompt and output.
IDS = {"ignore_eos": True, "return_token_ids": True}
# Log-prob keys as token ids: the tiny tokenizer decodes many ids to the same text.
TOKEN_IDS = {"return_tokens_as_token_ids": True}
N = 8  # max_tokens of a short request: 1 prefill step + 7 decode steps
LONG = 300  # max_tokens of the request decoding in the background (about 1 s alone)
OPENAI_KEYS = {"temperature", "seed", "logprobs", "top_p", "presence_penalty", "logit_bias"}
# random_ids(703, 10): transformers' greedy continuation repeats token 135 four times,
# so a presence penalty visibly changes it.
HOST_PROMPT_SEED = 703
# random_ids(705, 10): transformers' greedy continuation has "ps" (token 375, one token
# with or without a leading space) second.
BAD_WORD_PROMPT_SEED, BAD_WORD, BAD_WORD_ID = 705, "ps", 375
# Structured output ends at the grammar's end (EOS); with ignore_eos vLLM would go on
# generating, unconstrained, after it.
STOP_AT_EOS = {"ignore_eos": False}


def random_ids(seed: int, length: int, vocab_size: int) -> list[int]:
    """`length` ordinary token ids (the first 7 ids are the special tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(7, vocab_size) for _ in range(length)]


def complete(server, prompt, max_tokens=N, **extra):
    """One completion; keys that the OpenAI client does not take go through extra_body."""
    kwargs = {k: v for k, v in extra.items() if k in OPENAI_KEYS}
    body = {**IDS, **{k: v for k, v in extra.items() if k not in OPENAI_KEYS}}
    with server.client() as client:
        return client.completions.create(
            model=server.model, prompt=prompt, max_tokens=max_tokens, extra_body=body, **kwargs
        )


def output_ids(response) -> list[int]:
    return list(response.choices[0].model_extra["token_ids"])


def concurrently(server, prompts, **extra) -> list[list[int]]:
    """Output ids of one request per prompt, all sent together."""
    barrier = threading.Barrier(len(prompts))

    def send(prompt):
        barrier.wait()
        return output_ids(complete(server, prompt, **extra))

    with ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(send, prompts))


class Background:
    """A greedy streamed completion decoding in a thread while the test sends others."""

    def __init__(self, server, prompt: list[int], max_tokens: int = LONG):
        self.tokens: list[int] = []
        self.error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(server, prompt, max_tokens), daemon=True
        )
        self._thread.start()

    def _run(self, server, prompt, max_tokens) -> None:
        try:
            with server.client() as client:
                stream = client.completions.create(
                    model=server.model,
                    prompt=prompt,
                    max_tokens=max_tokens,
                    temperature=0,
                    stream=True,
                    extra_body=IDS,
                )
                for chunk in stream:
                    for choice in chunk.choices:
                        self.tokens += list(choice.model_extra.get("token_ids") or [])
        except BaseException as exc:  # reported by result()
            self.error = exc

    def wait_for(self, count: int, timeout: float = 60.0) -> None:
        """Until `count` tokens have arrived: the request is decoding."""
        deadline = time.monotonic() + timeout
        while len(self.tokens) < count and self._thread.is_alive():
            assert time.monotonic() < deadline, f"{len(self.tokens)} tokens after {timeout} s"
            time.sleep(0.002)
        assert len(self.tokens) >= count, self.error

    def result(self, timeout: float = 120.0) -> list[int]:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the background request did not finish"
        if self.error is not None:
            raise self.error
        return self.tokens


def sampling_steps(response) -> int:
    """Steps that sampled for this request on the "demo" server: one per token, and one
    more after an EOS (async scheduling runs the next step before it sees the EOS)."""
    tokens = len(output_ids(response))
    assert tokens == response.usage.completion_tokens
    return tokens + (response.choices[0].finish_reason == "stop")


def drains(delta: dict[str, int]) -> dict[str, int]:
    """The early read-backs of steps in flight, by reason."""
    return {k: v for k, v in delta.items() if k.startswith("decode.drain.")}


def assert_penalised_greedy(reference, prompt, tokens, presence_penalty):
    """Each token is the argmax of transformers' logits minus the presence penalty on the
    tokens generated before it (vLLM's presence penalty: output tokens only)."""
    logprobs = reference.logprobs(prompt, tokens)  # log-softmax: argmax as the logits
    for i, token in enumerate(tokens):
        adjusted = logprobs[i].clone()
        adjusted[sorted(set(tokens[:i]))] -= presence_penalty
        assert adjusted.argmax().item() == token, f"token {i} of {tokens}"


# --- the sampling path of a batch ---------------------------------------------------------


def test_a_batch_of_plain_requests_samples_on_the_device(demo_server, reference):
    prompt = random_ids(700, 10, reference.vocab_size)
    before = demo_server.settled_stats()
    tokens = output_ids(complete(demo_server, prompt, **GREEDY))
    delta = demo_server.stats_delta(before)

    assert tokens == reference.greedy(prompt, N)
    assert delta["sampling.device"] == N
    assert "sampling.host" not in delta
    assert (delta["step.prefill"], delta["step.decode"]) == (1, N - 1)
    # Alone, every decode step is asynchronous and all but the first overlap the step
    # before; the only read-back forced early is the last one, when the request leaves.
    assert delta["decode.async"] == N - 1
    assert delta["decode.overlapped"] == N - 2
    assert drains(delta) == {"decode.drain.batch_change": 1}


def _check_logprobs(response, tokens, greedy, reference, prompt):
    """Each token's log-prob, and each of the top ones returned, is transformers'
    log-softmax of the raw logits at that position, to float32 rounding (1e-3: logits
    differ by ~1e-5). Requests set return_tokens_as_token_ids, so keys are token ids."""
    logprobs = response.choices[0].logprobs
    assert len(logprobs.token_logprobs) == len(tokens) == N
    expected = reference.logprobs(prompt, tokens)
    for i, token in enumerate(tokens):
        assert abs(logprobs.token_logprobs[i] - expected[i, token].item()) < 1e-3, i
        top = {int(k.removeprefix("token_id:")): v for k, v in logprobs.top_logprobs[i].items()}
        assert int(expected[i].argmax()) in top, (i, top)
        for token_id, value in top.items():
            assert abs(value - expected[i, token_id].item()) < 1e-3, (i, token_id)


def _check_penalties(response, tokens, greedy, reference, prompt):
    assert greedy.count(135) == 4 and tokens != greedy  # the repeats are penalised
    assert_penalised_greedy(reference, prompt, tokens, 2.0)


def _check_min_p(response, tokens, greedy, reference, prompt):
    """Each token's probability (at temperature 0.8) is at least 0.2 times the top one's."""
    logprobs = reference.logprobs(prompt, tokens)
    for i, token in enumerate(tokens):
        margin = (logprobs[i, token] - logprobs[i].max()).item() / 0.8
        assert margin >= math.log(0.2) - 1e-4, (i, tokens)


def _check_bad_words(response, tokens, greedy, reference, prompt):
    assert greedy[1] == BAD_WORD_ID
    assert tokens[0] == greedy[0] and BAD_WORD_ID not in tokens


def _check_choice(response, tokens, greedy, reference, prompt):
    assert response.choices[0].text in ("yes", "no")
    assert response.choices[0].finish_reason == "stop"


HOST_CASES = {
    # case: (request options, check(response, tokens, transformers' greedy, reference,
    #        prompt), prompt seed); the case names the reason, up to a "-"
    # Sampled at a temperature with no top-k: the token may lie outside the device's top
    # log-probs, so the host computes them.
    "logprobs": (
        {"logprobs": 2, "temperature": 0.8, "seed": 4, **TOKEN_IDS},
        _check_logprobs,
        HOST_PROMPT_SEED,
    ),
    # vLLM drops min_p from greedy requests: this one samples.
    "min_p": ({"min_p": 0.2, "temperature": 0.8, "seed": 1}, _check_min_p, HOST_PROMPT_SEED),
    "logit_bias": (
        {"logit_bias": {"42": 100}},
        lambda r, tokens, *_: tokens == [42] * N,
        HOST_PROMPT_SEED,
    ),
    "allowed_token_ids": (
        {"allowed_token_ids": [40, 41, 42]},
        lambda r, tokens, *_: set(tokens) <= {40, 41, 42},
        HOST_PROMPT_SEED,
    ),
    "bad_words": ({"bad_words": [BAD_WORD]}, _check_bad_words, BAD_WORD_PROMPT_SEED),
    "min_tokens": (
        {"min_tokens": 4},
        lambda r, tokens, greedy, *_: tokens == greedy,
        HOST_PROMPT_SEED,
    ),
}


@pytest.mark.parametrize("case", list(HOST_CASES))
def test_a_request_needing_the_host_sampler_takes_its_batch_to_the_host_once(
    demo_server, reference, case
):
    reason = case.split("-")[0]
    options, check, seed = HOST_CASES[case]
    prompt = random_ids(seed, 10, reference.vocab_size)
    greedy = reference.greedy(prompt, N)

    before = demo_server.settled_stats()
    response = complete(demo_server, prompt, **{**GREEDY, **options})
    host = demo_server.stats_delta(before)
    tokens = output_ids(response)
    assert check(response, tokens, greedy, reference, prompt) is not False, tokens
    # Every batch of that request (its prefill and its decodes) sampled on the host, for
    # that reason; no decode step was asynchronous (its tokens come from host logits).
    steps = sampling_steps(response)
    assert host["sampling.host"] == host[f"sampling.host.{reason}"] == steps, host
    assert (host["step.prefill"], host["step.decode"]) == (1, steps - 1)
    assert "sampling.device" not in host
    assert "decode.async" not in host

    # The next batch, a plain request, is back on the device (and asynchronous).
    before = demo_server.settled_stats()
    assert output_ids(complete(demo_server, prompt, **GREEDY)) == greedy
    device = demo_server.stats_delta(before)
    assert device["sampling.device"] == N
    assert "sampling.host" not in device
    assert device["decode.async"] == N - 1


# What the demo generator does on the device (it declares supports_device_penalties and
# max_device_logprobs): these stay there, asynchronous like any plain batch.
DEVICE_CASES = {
    "logprobs": ({"logprobs": 5, **TOKEN_IDS}, _check_logprobs),
    "logprobs-top_k": (
        {"logprobs": 3, "temperature": 1.2, "top_k": 4, "seed": 9, **TOKEN_IDS},
        _check_logprobs,
    ),
    "penalties": ({"presence_penalty": 2.0}, _check_penalties),
}


@pytest.mark.parametrize("case", list(DEVICE_CASES))
def test_penalties_and_logprobs_stay_on_the_device_where_the_generator_declares_them(
    demo_server, compat_server, reference, case
):
    options, check = DEVICE_CASES[case]
    prompt = random_ids(HOST_PROMPT_SEED, 10, reference.vocab_size)
    greedy = reference.greedy(prompt, N)
    before = demo_server.settled_stats()
    response = complete(demo_server, prompt, **{**GREEDY, **options})
    delta = demo_server.stats_delta(before)
    tokens = output_ids(response)
    assert check(response, tokens, greedy, reference, prompt) is not False, tokens
    assert delta["sampling.device"] == sampling_steps(response), delta
    assert "sampling.host" not in delta
    assert delta["decode.async"] == N - 1
    # The host path (vLLM's sampler) gives the same tokens for the deterministic cases.
    if "seed" not in options:
        assert output_ids(complete(compat_server, prompt, **{**GREEDY, **options})) == tokens


def test_greedy_tokens_are_the_same_on_both_paths_and_in_transformers(
    demo_server, compat_server, reference
):
    prompts = [random_ids(710 + i, 5 + 4 * i, reference.vocab_size) for i in range(3)]
    expected = [reference.greedy(p, 16) for p in prompts]
    runs = {}
    for label, server, options in (
        ("device", demo_server, {}),
        ("host: min_tokens", demo_server, {"min_tokens": 2}),
        ("host: always_compat", compat_server, {}),
    ):
        before = server.settled_stats()
        runs[label] = (
            concurrently(server, prompts, max_tokens=16, **GREEDY, **options),
            server.stats_delta(before),
        )
    for label, (tokens, _) in runs.items():
        assert tokens == expected, label

    steps = 3 * 16  # at most; prompts arriving together share steps
    device, host, compat = (delta for _, delta in runs.values())
    assert "sampling.host" not in device and 0 < device["sampling.device"] <= steps
    assert "sampling.device" not in host
    assert 0 < host["sampling.host"] == host["sampling.host.min_tokens"] <= steps
    assert "sampling.device" not in compat
    assert 0 < compat["sampling.host"] == compat["sampling.host.always_compat_sampling"] <= steps


def test_seeded_sampling_is_reproducible_on_each_path(demo_server, reference):
    prompt = random_ids(720, 10, reference.vocab_size)
    seeded = {"temperature": 0.8, "seed": 11}

    def sample(**options):
        before = demo_server.settled_stats()
        tokens = output_ids(complete(demo_server, prompt, max_tokens=16, **options))
        return tokens, demo_server.stats_delta(before)

    device = [sample(**seeded) for _ in range(2)]
    host = [sample(**seeded, logprobs=1) for _ in range(2)]
    other_seed, _ = sample(temperature=0.8, seed=12)

    assert device[0][0] == device[1][0]
    assert host[0][0] == host[1][0]
    # Both paths draw the token at each position from (seed, position) the same way, so
    # which path served a step does not change a seeded request's output.
    assert host[0][0] == device[0][0]
    assert other_seed != device[0][0]  # a seed changes the draw: the tokens are sampled
    for _, delta in device:
        assert delta["sampling.device"] == 16 and "sampling.host" not in delta
    for _, delta in host:
        assert delta["sampling.host.logprobs"] == 16 and "sampling.device" not in delta


MIXED = [
    {"temperature": 2.0, "top_k": 100, "seed": 42},
    {"temperature": 0.0},
    {"temperature": 0.9, "seed": 7, "min_p": 0.05},
    {"temperature": 0.0, "presence_penalty": 1.5},
    {"temperature": 0.7, "top_p": 0.9, "seed": 3},
    {"temperature": 0.0, "logit_bias": {"50": 4.0}},
    {"temperature": 1.0, "seed": 5, "logprobs": 2},
    {"temperature": 0.0, "min_tokens": 3},
    {"temperature": 1.3, "top_k": 10, "seed": 9, "frequency_penalty": 0.5},
    {"temperature": 0.5, "seed": 21, "repetition_penalty": 1.2},
]


def test_a_mixed_batch_sent_in_another_order_gives_every_request_the_same_output(
    demo_server, reference
):
    """Ten requests mixing every sampling parameter, sent together twice in different
    orders (the batches, and which of them go to the host, differ): every deterministic or
    seeded request gets the same tokens both times, and the same as alone."""
    vocab = reference.vocab_size
    prompts = [random_ids(740 + i, 8 + i, vocab) for i in range(len(MIXED))]

    def run(order):
        barrier = threading.Barrier(len(order))

        def send(i):
            barrier.wait()
            return i, output_ids(complete(demo_server, prompts[i], max_tokens=12, **MIXED[i]))

        with ThreadPoolExecutor(len(order)) as pool:
            return dict(pool.map(send, order))

    forward = run(list(range(len(MIXED))))
    backward = run(list(reversed(range(len(MIXED)))))
    assert forward == backward
    alone = output_ids(complete(demo_server, prompts[0], max_tokens=12, **MIXED[0]))
    assert alone == forward[0]


def test_seeded_host_sampling_does_not_depend_on_prompt_chunking(demo_server, reference):
    """A 200-token prompt is prefilled in 4 chunks; the chunks before the last draw a token
    that is thrown away, and that draw must not advance the request's seeded generator.
    The second time, 192 prompt tokens come from the prefix cache: one prefill step."""
    prompt = random_ids(730, 200, reference.vocab_size)
    runs = []
    for _ in range(2):
        before = demo_server.settled_stats()
        response = complete(demo_server, prompt, max_tokens=8, temperature=0.8, seed=5, logprobs=1)
        runs.append((output_ids(response), demo_server.stats_delta(before)))
    (first, first_delta), (second, second_delta) = runs
    assert (first_delta["step.prefill"], second_delta["step.prefill"]) == (4, 1)
    assert first_delta["sampling.host.logprobs"] == 4 + 7
    assert first == second


def test_always_compat_sampling_forces_the_host_sampler(compat_server, reference):
    assert "tt.always_compat_sampling: True (set by the user)" in compat_server.log_since(0)
    prompt = random_ids(740, 10, reference.vocab_size)
    before = compat_server.settled_stats()
    tokens = output_ids(complete(compat_server, prompt, **GREEDY))
    delta = compat_server.stats_delta(before)

    assert tokens == reference.greedy(prompt, N)
    assert delta["sampling.host"] == delta["sampling.host.always_compat_sampling"] == N
    assert "sampling.device" not in delta
    # Async scheduling is on, but host-sampled decode steps are never asynchronous.
    assert delta["step.decode"] == N - 1
    assert "decode.async" not in delta


# --- asynchronous decode ------------------------------------------------------------------


def test_steady_decode_keeps_two_steps_in_flight(demo_server, reference):
    prompts = [random_ids(800 + i, 6 + i, reference.vocab_size) for i in range(4)]
    before = demo_server.settled_stats()
    outputs = concurrently(demo_server, prompts, max_tokens=100, **GREEDY)
    delta = demo_server.stats_delta(before)

    assert outputs == [reference.greedy(p, 100) for p in prompts]
    assert "sampling.host" not in delta
    decode_steps = delta["step.decode"]
    assert decode_steps >= 99
    assert delta["decode.async"] == decode_steps  # every decode step
    # Only the first decode step after a prefill or a drain has nothing in flight.
    assert delta["decode.overlapped"] >= 0.85 * decode_steps, delta
    assert demo_server.settled_stats()["decode.max_in_flight"] == 2


def test_a_request_arriving_and_leaving_drains_the_steps_in_flight(demo_server, reference):
    vocab = reference.vocab_size
    long_prompt, short_prompt = random_ids(810, 10, vocab), random_ids(811, 10, vocab)
    before = demo_server.settled_stats()
    background = Background(demo_server, long_prompt)
    background.wait_for(5)
    short = output_ids(complete(demo_server, short_prompt, **GREEDY))
    decoded_meanwhile = len(background.tokens)
    long = background.result()
    delta = demo_server.stats_delta(before)

    assert decoded_meanwhile < LONG  # the short request came and went during the long one
    assert short == reference.greedy(short_prompt, N)
    assert long == reference.greedy(long_prompt, LONG)
    # The short request's prefill reads back the step in flight first; so does the step
    # after it left (the batch shrank), and the one after the long request ended.
    assert drains(delta) == {"decode.drain.prefill": 1, "decode.drain.batch_change": 2}
    assert (delta["step.prefill"], delta["step.decode"]) == (2, LONG - 1)
    assert delta["decode.async"] == LONG - 1
    assert delta["sampling.device"] == 2 + LONG - 1
    assert "sampling.host" not in delta


JOINING = {
    # reason: (request options, the drain its arrival causes)
    "min_tokens": ({"min_tokens": 4}, "prefill"),
}


@pytest.mark.parametrize("reason", list(JOINING))
def test_a_request_needing_the_host_sampler_joining_async_decode(demo_server, reference, reason):
    options, drain = JOINING[reason]
    vocab = reference.vocab_size
    long_prompt = random_ids(810, 10, vocab)
    short_prompt = random_ids(HOST_PROMPT_SEED, 10, vocab)
    before = demo_server.settled_stats()
    background = Background(demo_server, long_prompt)
    background.wait_for(5)
    response = complete(demo_server, short_prompt, **GREEDY, **options)
    decoded_meanwhile = len(background.tokens)
    long = background.result()
    delta = demo_server.stats_delta(before)

    assert decoded_meanwhile < LONG
    assert long == reference.greedy(long_prompt, LONG)
    short = output_ids(response)
    assert short == reference.greedy(short_prompt, N)
    short_steps = sampling_steps(response)

    # The step in flight is read back before the request's prefill; the next read-back
    # forced early is the one after the long request ended (when the short one left,
    # its last batch was a host batch: nothing was in flight).
    assert drains(delta) == {f"decode.drain.{drain}": 1, "decode.drain.batch_change": 1}
    # Its prefill and the decode steps it shares with the long request sample on
    # the host, synchronously; every other step samples on the device, asynchronously
    # (the long request's only drain left is its own end).
    assert (delta["step.prefill"], delta["step.decode"]) == (2, LONG - 1)
    assert delta["sampling.host"] == delta[f"sampling.host.{reason}"] == short_steps
    assert delta["sampling.device"] == 2 + LONG - 1 - short_steps
    assert delta["decode.async"] == LONG - 1 - (short_steps - 1)


@pytest.mark.parametrize("case", ["penalties", "logprobs"])
def test_a_device_penalty_or_logprobs_request_joining_async_decode(demo_server, reference, case):
    """Penalties and log-probs on the device apply to their own request only: the long
    greedy request decoding beside them is unchanged, and every step stays on the device
    (the batch change resets the slots' sampling state from the history the worker sends)."""
    options, check = DEVICE_CASES[case]
    vocab = reference.vocab_size
    long_prompt = random_ids(812, 10, vocab)
    short_prompt = random_ids(HOST_PROMPT_SEED, 10, vocab)
    before = demo_server.settled_stats()
    background = Background(demo_server, long_prompt)
    background.wait_for(5)
    response = complete(demo_server, short_prompt, **GREEDY, **options)
    long = background.result()
    delta = demo_server.stats_delta(before)

    assert long == reference.greedy(long_prompt, LONG)
    short = output_ids(response)
    assert (
        check(response, short, reference.greedy(short_prompt, N), reference, short_prompt)
        is not False
    )
    assert "sampling.host" not in delta
    assert delta["commands.reset_sampling_state"] >= 2  # the short one's arrival and exit
    assert delta["commands.resident"] > 0


def test_async_and_sync_decode_give_identical_tokens(demo_server, sync_server, reference):
    assert "async_scheduling: True (on: vLLM's default)" in demo_server.log_since(0)
    assert "'ttbundles.serving.scheduler.TTAsyncScheduler'" in demo_server.log_since(0)
    assert "async_scheduling: False (off, as requested)" in sync_server.log_since(0)
    assert "'ttbundles.serving.scheduler.TTScheduler'" in sync_server.log_since(0)

    prompts = [random_ids(820 + i, 6 + 3 * i, reference.vocab_size) for i in range(3)]
    requests = [(p, GREEDY) for p in prompts] + [
        (p, {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "seed": 100 + i})
        for i, p in enumerate(prompts)
    ]

    def run(server):
        before = server.settled_stats()
        barrier = threading.Barrier(len(requests))

        def send(request):
            prompt, options = request
            barrier.wait()
            return output_ids(complete(server, prompt, max_tokens=32, **options))

        with ThreadPoolExecutor(len(requests)) as pool:
            outputs = list(pool.map(send, requests))
        return outputs, server.stats_delta(before)

    async_outputs, async_delta = run(demo_server)
    sync_outputs, sync_delta = run(sync_server)

    assert async_outputs == sync_outputs
    assert async_outputs[:3] == [reference.greedy(p, 32) for p in prompts]
    assert len({tuple(t) for t in async_outputs[3:]}) == 3
    for delta in (async_delta, sync_delta):
        assert "sampling.host" not in delta and delta["sampling.device"] > 0
    assert async_delta["decode.async"] == async_delta["step.decode"] > 0
    sync_stats = sync_server.settled_stats()
    assert sync_delta["step.decode"] >= 31
    assert not [k for k in sync_stats if k.startswith("decode.")], sync_stats
    # Without async scheduling the generator still keeps its inputs resident in a steady
    # batch (it declares async decode): only a change of layout reloads them.
    assert sync_delta["commands.resident"] > sync_delta["commands.reload_inputs"] > 0


def test_a_bundle_without_async_decode_runs_synchronously(plain_server, reference):
    log = plain_server.log_since(0)
    assert (
        "async_scheduling: True -> False (plain-reference does not declare "
        "capabilities.async_decode)"
    ) in log
    assert "'ttbundles.serving.scheduler.TTScheduler'" in log
    prompt = random_ids(830, 10, reference.vocab_size)
    before = plain_server.settled_stats()
    tokens = output_ids(complete(plain_server, prompt, **GREEDY))
    delta = plain_server.stats_delta(before)

    assert tokens == reference.greedy(prompt, N)
    assert delta["step.decode"] == N - 1
    # No sample_on_device_mode: the host sampler; and no step was ever asynchronous.
    assert delta["sampling.host"] == delta["sampling.host.host_mode"] == N
    stats = plain_server.settled_stats()
    assert not [k for k in stats if k.startswith("decode.")], stats
    # Host sampling: host inputs are authoritative on every decode.
    assert delta["commands.reload_inputs"] == N - 1 and "commands.resident" not in delta


def test_top_k_1_is_greedy_and_logprobs_0_to_20_come_back(demo_server, reference):
    vocab = reference.vocab_size
    prompt = random_ids(760, 9, vocab)
    greedy = reference.greedy(prompt, N)
    assert output_ids(complete(demo_server, prompt, temperature=1.5, top_k=1, seed=1)) == greedy
    assert output_ids(complete(demo_server, prompt, temperature=0.9, top_k=1)) == greedy
    for count in (0, 1, 7, 20):
        response = complete(demo_server, prompt, logprobs=count, **GREEDY, **TOKEN_IDS)
        logprobs = response.choices[0].logprobs
        assert len(logprobs.token_logprobs) == N
        # The sampled token's entry, plus the top `count` (the sampled one among them).
        assert all(len(top) == max(count, 1) for top in logprobs.top_logprobs), count
    with demo_server.client() as client, pytest.raises(openai.BadRequestError):
        client.completions.create(model=demo_server.model, prompt=prompt, max_tokens=2, logprobs=21)


# --- structured output on the device's grammar --------------------------------------------

# The demo generator declares supports_device_grammar (the reference applies the bitmask
# in its sampler). The servers run without free JSON whitespace
# (--structured-outputs-config, conftest.py): the tiny model would pad an object to
# max_tokens.
ANSWER = {
    "type": "object",
    "properties": {"answer": {"enum": ["yes", "no"]}, "n": {"type": "integer"}},
    "required": ["answer"],
    "additionalProperties": False,
}
ANSWER_FORMAT = {"type": "json_schema", "json_schema": {"name": "answer", "schema": ANSWER}}
MESSAGES = [{"role": "user", "content": "Is a bundle a model? Answer in JSON."}]


def chat_json(server, **extra):
    with server.client() as client:
        return client.chat.completions.create(
            model=server.model,
            messages=MESSAGES,
            max_tokens=40,
            temperature=0,
            response_format=ANSWER_FORMAT,
            extra_body={"return_token_ids": True, **extra},
        )


def assert_answer(response) -> dict:
    """The reply validates against ANSWER (the grammar ended it at EOS)."""
    import json

    choice = response.choices[0]
    assert choice.finish_reason == "stop", choice
    value = json.loads(choice.message.content)
    assert isinstance(value, dict) and set(value) <= {"answer", "n"}, value
    assert value["answer"] in ("yes", "no") and isinstance(value.get("n", 0), int), value
    return value


def test_a_json_schema_chat_is_served_on_the_device_grammar_with_async_decode(
    demo_server, compat_server
):
    """The plan and the start-up log say structured output samples on the device grammar;
    a chat request with a JSON schema validates against it, its decodes sample on the
    device with the bitmask, asynchronously, and nothing is drained for the grammar;
    vLLM's host sampler (compat) gives the same tokens."""
    log = demo_server.log_since(0)
    assert "sampling.structured_output: None -> 'device'" in log
    assert "structured output: device grammar in decode" in log
    before = demo_server.settled_stats()
    response = chat_json(demo_server)
    delta = demo_server.stats_delta(before)
    assert_answer(response)
    steps = sampling_steps(response)
    # The prefill samples on the host (the device grammar is decode only); every decode
    # on the device with the bitmask, submitted without a read-back, no drain.
    prefills = delta["step.prefill"]
    assert delta["sampling.host"] == delta["sampling.host.structured_output"] == prefills
    assert delta["step.decode"] == steps - 1, delta
    assert delta["sampling.device"] == steps - 1, delta
    # Every decode but the one async scheduling runs after EOS (its grammar has ended:
    # vLLM sends no bitmask for it) carries the bitmask.
    assert delta["sampling.device.grammar"] == steps - 2, delta
    assert delta["decode.async"] == steps - 1
    # Nothing is read back for the grammar; the request's end may read back the step in
    # flight, as any request's end does (on vLLM 0.33.0 it does).
    assert set(drains(delta)) <= {"decode.drain.batch_change"}, delta
    host = chat_json(compat_server)
    assert output_ids(host) == output_ids(response)


def test_a_structured_request_joining_async_decode_drains_nothing_for_its_grammar(
    demo_server, reference
):
    """A JSON-schema request arriving while a long request decodes asynchronously: only
    its prefill reads back the step in flight (as any prefill does); the decode steps it
    shares with the long one stay on the device, asynchronous, with the grammar applied to
    its row only (the long request keeps transformers' tokens)."""
    long_prompt = random_ids(814, 10, reference.vocab_size)
    before = demo_server.settled_stats()
    background = Background(demo_server, long_prompt)
    background.wait_for(5)
    response = chat_json(demo_server)
    long = background.result()
    delta = demo_server.stats_delta(before)
    assert long == reference.greedy(long_prompt, LONG)
    assert_answer(response)
    # Prefill chunks and batch changes read back what is in flight; the grammar never.
    assert set(drains(delta)) <= {"decode.drain.prefill", "decode.drain.batch_change"}, delta
    assert delta["sampling.host"] == delta["sampling.host.structured_output"], delta
    assert delta["decode.async"] == LONG - 1
    assert delta["sampling.device.grammar"] >= 1


def test_top_logprobs_5_of_a_chat_come_from_the_device_sampler(demo_server, compat_server):
    """The plan and the start-up log say log-probs come from the device sampler (the demo
    generator returns its top 20); a greedy chat asking top_logprobs 5 samples every step
    on the device, asynchronously, and its log-probs are vLLM's host sampler's within
    float32."""
    log = demo_server.log_since(0)
    assert "sampling.logprobs: None -> 'device'" in log
    assert "logprobs: up to 20 from the device sampler" in log

    def ask(server):
        with server.client() as client:
            return client.chat.completions.create(
                model=server.model,
                messages=MESSAGES,
                max_tokens=N,
                temperature=0,
                logprobs=True,
                top_logprobs=5,
                extra_body={**IDS, **TOKEN_IDS},
            )

    before = demo_server.settled_stats()
    response = ask(demo_server)
    delta = demo_server.stats_delta(before)
    assert delta["sampling.device"] == sampling_steps(response), delta
    assert "sampling.host" not in delta
    assert delta["decode.async"] == N - 1
    host = ask(compat_server)
    assert output_ids(host) == output_ids(response)
    device_rows = response.choices[0].logprobs.content
    host_rows = host.choices[0].logprobs.content
    assert len(device_rows) == len(host_rows) == N
    for device_row, host_row in zip(device_rows, host_rows):
        assert len(device_row.top_logprobs) == 5
        assert [t.token for t in device_row.top_logprobs] == [
            t.token for t in host_row.top_logprobs
        ]
        assert math.isclose(device_row.logprob, host_row.logprob, abs_tol=1e-5)
        for d, h in zip(device_row.top_logprobs, host_row.top_logprobs):
            assert math.isclose(d.logprob, h.logprob, abs_tol=1e-5)
