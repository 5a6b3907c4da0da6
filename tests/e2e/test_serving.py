"""Serving end to end: real `vllm serve` on the host mesh, the real OpenAI client, and
transformers on the same checkpoint as the reference (see conftest.py for the servers).

Prompts given as token ids are drawn at random per test so that no test hits blocks
another test left in the demo server's prefix cache.
"""

from __future__ import annotations

import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import openai
import pytest

pytestmark = pytest.mark.server

GREEDY = {"temperature": 0.0}
# Generate exactly max_tokens, through EOS, and return the token ids of prompt and output.
IDS = {"ignore_eos": True, "return_token_ids": True}
BLOCK_SIZE = 16  # vLLM's KV cache block on this platform
TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")  # the installed command
CHUNK = 64  # the demo server's --max-num-batched-tokens


def random_ids(seed: int, length: int, vocab_size: int) -> list[int]:
    """`length` ordinary token ids (the first 7 ids are the special tokens)."""
    rng = random.Random(seed)
    return [rng.randrange(7, vocab_size) for _ in range(length)]


def complete(server, prompt, max_tokens=16, **extra):
    """One completion; extra keys that are not OpenAI's go through extra_body."""
    known = {"temperature", "seed", "logprobs", "stream", "top_p"}
    kwargs = {k: v for k, v in extra.items() if k in known}
    body = {**IDS, **{k: v for k, v in extra.items() if k not in known}}
    with server.client() as client:
        return client.completions.create(
            model=server.model, prompt=prompt, max_tokens=max_tokens, extra_body=body, **kwargs
        )


def output_ids(response) -> list[int]:
    return list(response.choices[0].model_extra["token_ids"])


def prompt_ids(response) -> list[int]:
    return list(response.choices[0].model_extra["prompt_token_ids"])


# --- greedy parity ----------------------------------------------------------------------


def test_concurrent_greedy_completions_match_transformers(demo_server, reference):
    vocab = reference.vocab_size
    prompts = [
        "Hello",
        "The capital of France is",
        "A bundle holds metadata and an adapter class. The registry maps architectures "
        "to generators. Prefill reads the prompt; decode writes one token at a time.",
        random_ids(101, 37, vocab),
        random_ids(102, 150, vocab),
    ]
    barrier = threading.Barrier(len(prompts))

    def send(prompt):
        barrier.wait()  # all requests in flight together: one batch, several lengths
        return complete(demo_server, prompt, max_tokens=16, **GREEDY)

    with ThreadPoolExecutor(len(prompts)) as pool:
        responses = list(pool.map(send, prompts))

    for prompt, response in zip(prompts, responses):
        ids = prompt_ids(response)
        expected_prompt = (
            prompt if isinstance(prompt, list) else (reference.tokenizer(prompt).input_ids)
        )
        assert ids == expected_prompt
        assert output_ids(response) == reference.greedy(ids, 16), f"prompt {prompt!r}"
        assert response.usage.completion_tokens == 16


def test_chat_completion_matches_transformers(demo_server, reference):
    messages = [
        {"role": "system", "content": "You are a mesh of chips."},
        {"role": "user", "content": "Hello mesh! What is a bundle?"},
    ]
    with demo_server.client() as client:
        response = client.chat.completions.create(
            model=demo_server.model, messages=messages, max_tokens=16, temperature=0, extra_body=IDS
        )
    ids = list(response.model_extra["prompt_token_ids"])
    assert ids == reference.chat_prompt_ids(messages)  # the checkpoint's chat template
    tokens = list(response.choices[0].model_extra["token_ids"])
    assert tokens == reference.greedy(ids, 16)
    assert response.choices[0].message.role == "assistant"
    assert response.choices[0].message.content  # detokenized, non-empty


def test_streaming_gives_the_non_streaming_answer(demo_server, reference):
    prompt = "Once upon a time"
    whole = complete(demo_server, prompt, max_tokens=24, **GREEDY)

    text, tokens, finish = "", [], None
    with demo_server.client() as client:
        stream = client.completions.create(
            model=demo_server.model,
            prompt=prompt,
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body=IDS,
        )
        chunks = 0
        for chunk in stream:
            for choice in chunk.choices:
                chunks += 1
                text += choice.text
                tokens += list(choice.model_extra.get("token_ids") or [])
                finish = choice.finish_reason or finish
    assert chunks > 1  # streamed, not one final message
    assert tokens == output_ids(whole) == reference.greedy(prompt_ids(whole), 24)
    assert text == whole.choices[0].text
    assert finish == "length"

    messages = [{"role": "user", "content": "Tell me about the sky."}]
    with demo_server.client() as client:
        chat_whole = client.chat.completions.create(
            model=demo_server.model,
            messages=messages,
            max_tokens=24,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        chat_text = ""
        for chunk in client.chat.completions.create(
            model=demo_server.model,
            messages=messages,
            max_tokens=24,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        ):
            if chunk.choices and chunk.choices[0].delta.content:
                chat_text += chunk.choices[0].delta.content
    assert chat_text == chat_whole.choices[0].message.content


# --- chunked prefill --------------------------------------------------------------------


def test_long_prompt_is_prefilled_in_chunks_and_matches_transformers(demo_server, reference):
    prompt = random_ids(201, 200, reference.vocab_size)
    before = demo_server.stats()
    response = complete(demo_server, prompt, max_tokens=8, **GREEDY)
    after = demo_server.stats()

    assert output_ids(response) == reference.greedy(prompt, 8)
    # 200 tokens under a 64-token step budget: 64 + 64 + 64 + 8, one prefill step each.
    prefill_steps = after.get("step.prefill", 0) - before.get("step.prefill", 0)
    assert prefill_steps == math.ceil(len(prompt) / CHUNK) == 4
    assert after.get("step.decode", 0) - before.get("step.decode", 0) == 7


def test_decode_steps_interleave_with_the_chunks_of_a_long_prompt(demo_server, reference):
    vocab = reference.vocab_size
    running_prompt = random_ids(211, 12, vocab)
    long_prompt = random_ids(212, 200, vocab)
    offset = demo_server.log_size()
    received: list[tuple[float, list[int]]] = []
    running_max = 200

    def run():
        with demo_server.client() as client:
            stream = client.completions.create(
                model=demo_server.model,
                prompt=running_prompt,
                max_tokens=running_max,
                temperature=0,
                stream=True,
                extra_body=IDS,
            )
            for chunk in stream:
                for choice in chunk.choices:
                    received.append(
                        (time.monotonic(), list(choice.model_extra.get("token_ids") or []))
                    )

    runner = threading.Thread(target=run)
    runner.start()
    try:
        deadline = time.monotonic() + 60
        while sum(len(ids) for _, ids in received) < 3 and time.monotonic() < deadline:
            time.sleep(0.005)
        long_response = complete(demo_server, long_prompt, max_tokens=4, **GREEDY)
        decoded_when_long_finished = sum(len(ids) for _, ids in received)
    finally:
        runner.join(120)
    running_tokens = [t for _, ids in received for t in ids]

    # Both answers are still transformers' greedy tokens.
    assert output_ids(long_response) == reference.greedy(long_prompt, 4)
    assert running_tokens == reference.greedy(running_prompt, running_max)
    # The running request was still decoding when the long prompt finished, so every
    # chunk of the long prompt ran next to it ("2 running").
    assert decoded_when_long_finished < running_max
    steps = demo_server.steps_since(offset)
    chunk_steps = [
        i for i, (kind, running) in enumerate(steps) if kind == "prefill" and running == 2
    ]
    assert len(chunk_steps) == math.ceil(len(long_prompt) / CHUNK) == 4, steps
    # Decode interleaving (by default 2 prefill steps, then 1 decode step): never more
    # than two chunks in a row, so the running request kept receiving tokens.
    kinds = "".join(
        "P" if kind == "prefill" else "D" for kind, _ in steps[chunk_steps[0] : chunk_steps[-1] + 1]
    )
    assert "PPP" not in kinds and "D" in kinds, kinds


# --- sampling ---------------------------------------------------------------------------


def test_seeded_sampling_is_reproducible(demo_server):
    prompt = "The quick brown fox"

    def sample(seed):
        response = complete(demo_server, prompt, max_tokens=16, temperature=0.8, seed=seed)
        return output_ids(response)

    alone = sample(1234)
    # The same seed again, this time batched with other requests: the same tokens.
    with ThreadPoolExecutor(4) as pool:
        batched = list(pool.map(sample, [1234, 1, 2, 3]))
    assert batched[0] == alone
    assert len(alone) == 16
    assert sample(1) == batched[1]
    assert len({tuple(ids) for ids in (alone, *batched[1:])}) == 4  # seeds 1234, 1, 2, 3


def test_logprobs_match_transformers(demo_server, reference):
    prompt = "The sky is blue. Water is"
    response = complete(
        demo_server, prompt, max_tokens=8, logprobs=3, return_tokens_as_token_ids=True, **GREEDY
    )
    choice = response.choices[0]
    tokens = output_ids(response)
    expected = reference.logprobs(prompt_ids(response), tokens)

    def token_id(name: str) -> int:
        assert name.startswith("token_id:"), name
        return int(name.removeprefix("token_id:"))

    assert [token_id(t) for t in choice.logprobs.tokens] == tokens
    assert tokens == expected.argmax(dim=-1).tolist()  # greedy: the top token each time
    for i, token in enumerate(tokens):
        assert choice.logprobs.token_logprobs[i] == pytest.approx(
            expected[i, token].item(), abs=1e-3
        )
        top = {token_id(name): value for name, value in choice.logprobs.top_logprobs[i].items()}
        values, ids = expected[i].topk(3)
        assert set(top) == set(ids.tolist())
        for token_index, value in zip(ids.tolist(), values.tolist()):
            assert top[token_index] == pytest.approx(value, abs=1e-3)


# --- requests that are refused ----------------------------------------------------------


def _still_serving(server) -> None:
    response = complete(server, "Hello", max_tokens=4, **GREEDY)
    assert len(output_ids(response)) == 4


def test_prompt_logprobs_of_an_undeclaring_bundle_are_refused_with_400(plain_server):
    """The "plain" bundle declares no prompt_logprobs: such a request (and echo with
    logprobs, which asks for them) is a 400, and the server keeps serving."""
    with pytest.raises(openai.BadRequestError) as refused:
        complete(plain_server, "Hello", max_tokens=4, prompt_logprobs=1, **GREEDY)
    assert refused.value.status_code == 400
    assert "TTB206" in str(refused.value)
    with plain_server.client() as client, pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(
            model=plain_server.model, prompt="Hello", max_tokens=1, echo=True, logprobs=1
        )
    assert "TTB206" in str(refused.value)
    _still_serving(plain_server)


def test_requests_beyond_the_context_are_refused_with_400(demo_server, reference):
    vocab = reference.vocab_size
    with pytest.raises(openai.BadRequestError) as refused:  # the prompt alone is too long
        complete(demo_server, random_ids(301, 600, vocab), max_tokens=1, **GREEDY)
    assert refused.value.status_code == 400
    assert "maximum context length is 512 tokens" in str(refused.value)
    assert "600" in str(refused.value)
    with pytest.raises(openai.BadRequestError) as refused:  # so is the output alone
        complete(demo_server, "Hello", max_tokens=600, **GREEDY)
    assert refused.value.status_code == 400
    assert "max_tokens=600 cannot be greater than max_model_len=512" in str(refused.value)
    _still_serving(demo_server)


def test_generation_stops_at_the_end_of_the_context(demo_server, reference):
    # prompt + max_tokens > max_model_len, each fitting alone: vLLM 0.33 does not refuse
    # it, it shortens the generation to the room left (512 - 500 = 12 tokens).
    prompt = random_ids(302, 500, reference.vocab_size)
    response = complete(demo_server, prompt, max_tokens=100, **GREEDY)
    assert response.usage.completion_tokens == 12
    assert response.choices[0].finish_reason == "length"
    assert output_ids(response) == reference.greedy(prompt, 12)
    _still_serving(demo_server)


# --- prefix caching ---------------------------------------------------------------------


HITS = "vllm:prefix_cache_hits_total"
QUERIES = "vllm:prefix_cache_queries_total"
PROMPT_TOKENS = "vllm:prompt_tokens_total"


def test_prefix_caching_reuses_the_blocks_of_a_repeated_prompt(demo_server, reference):
    prompt = random_ids(401, 100, reference.vocab_size)
    cached = len(prompt) // BLOCK_SIZE * BLOCK_SIZE  # full blocks only: 96 tokens

    outputs, hits, prefill_steps = [], [], []
    for _ in range(2):
        metrics = demo_server.metrics()
        stats = demo_server.stats()
        outputs.append(output_ids(complete(demo_server, prompt, max_tokens=8, **GREEDY)))
        after = demo_server.wait_for_metric(QUERIES, metrics.get(QUERIES, 0) + len(prompt))
        hits.append(after.get(HITS, 0) - metrics.get(HITS, 0))
        prefill_steps.append(demo_server.stats()["step.prefill"] - stats.get("step.prefill", 0))

    assert hits == [0, cached]
    assert prefill_steps == [2, 1]  # 64 + 36 tokens, then only the 4 not cached
    assert outputs[0] == outputs[1] == reference.greedy(prompt, 8)


def test_bundle_without_capabilities_serves_without_prefix_caching(plain_server, reference):
    log = plain_server.log_since(0)
    assert "serving TTLlamaForCausalLM with plain-reference@1.0.0" in log
    for decision in (
        "enable_prefix_caching: True -> False",
        "async_scheduling: True -> False",
        "enable_chunked_prefill: True -> False",
    ):
        assert decision in log

    prompt = random_ids(501, 200, reference.vocab_size)
    before = plain_server.metrics()
    stats = plain_server.stats()
    outputs = [output_ids(complete(plain_server, prompt, max_tokens=8, **GREEDY)) for _ in range(2)]
    after = plain_server.wait_for_metric(
        PROMPT_TOKENS, before.get(PROMPT_TOKENS, 0) + 2 * len(prompt)
    )

    assert after.get(PROMPT_TOKENS, 0) - before.get(PROMPT_TOKENS, 0) == 2 * len(prompt)
    assert after.get(HITS, 0) - before.get(HITS, 0) == 0
    # No chunked prefill either: each 200-token prompt is prefilled in one step.
    assert plain_server.stats()["step.prefill"] - stats.get("step.prefill", 0) == 2
    assert outputs[0] == outputs[1] == reference.greedy(prompt, 8)


def test_plain_bundle_answers_concurrent_requests_like_transformers(plain_server, reference):
    prompts = ["Hello world", random_ids(601, 60, reference.vocab_size), "The sky is"]
    with ThreadPoolExecutor(len(prompts)) as pool:
        responses = list(
            pool.map(lambda p: complete(plain_server, p, max_tokens=16, **GREEDY), prompts)
        )
    for response in responses:
        assert output_ids(response) == reference.greedy(prompt_ids(response), 16)


# --- the one-command demo ---------------------------------------------------------------


# What the session sets that a user's shell does not: the demo runs without them, its
# engine core spawned as the vllm command does by default (tests/conftest.py forks it).
AS_USERS_RUN_IT = ("VLLM_PLUGINS", "EXTRA_MODELS_DIR", "VLLM_WORKER_MULTIPROC_METHOD")


def _demo(args: list[str], cache: Path) -> subprocess.CompletedProcess:
    """`ttbundle demo` as the README runs it, with the shell naming a card's mesh (the
    demo must ignore it) and the given cache folder."""
    env = {k: v for k, v in os.environ.items() if k not in AS_USERS_RUN_IT}
    env.update(
        {"XDG_CACHE_HOME": str(cache), "COLUMNS": "250", "NO_COLOR": "1", "MESH_DEVICE": "T3K"}
    )
    return subprocess.run(
        [TTBUNDLE, "demo", *args], capture_output=True, text=True, env=env, timeout=600
    )


def _assert_served_and_stopped(run: subprocess.CompletedProcess, cache: Path) -> list[str]:
    assert run.returncode == 0, run.stdout + run.stderr
    lines = run.stdout.splitlines()
    pid = int(re.search(r"\(pid (\d+)", run.stdout).group(1))
    # The answers come while the server runs; "server stopped" is said last.
    assert lines[-1] == "server stopped"
    with pytest.raises(ProcessLookupError):  # the server is gone, not orphaned
        os.kill(pid, 0)
    log = (cache / "ttbundles" / "demo-server.log").read_text()
    assert "serving TTLlamaForCausalLM with demo@1.0.0 (built-in) on mesh HOST" in log
    # The startup summary once per process; the class as the bundle wrote it, no internal
    # package and no site-packages path in what ttbundles says.
    ours = [line for line in log.splitlines() if "ttbundles: " in line]
    summaries = [line.split(")")[0] for line in ours if " bundles for mesh HOST: " in line]
    assert summaries and len(summaries) == len(set(summaries)), summaries
    assert "ttbundles: loaded TTLlamaForCausalLM (adapter:DemoGenerator, decode contract v1)" in log
    assert not [line for line in ours if "_ttb_" in line or "site-packages" in line]
    return lines


def test_demo_command_answers_in_words(real_model, tmp_path):
    """`ttbundle demo --query`, the README's main job: the real model, its own server,
    answers with TTFT and tokens/s, exit 0. The model is the one the fixture prepared,
    linked into a cache of this test's own: the demo's server log is written there, and a
    run of the other vLLM release at the same time (`.ci/run`) writes its own."""
    cache = tmp_path
    model = cache / "ttbundles" / real_model.name
    model.parent.mkdir()
    model.symlink_to(real_model, target_is_directory=True)
    lines = _assert_served_and_stopped(_demo(["--query"], cache), cache)
    assert lines[0] == f"checkpoint: {model} (cached)"
    chat = next(line for line in lines if line.startswith("chat: "))
    assert "Paris" in chat and "TTFT" in chat and "tokens/s" in chat


def test_demo_tiny_in_the_foreground_serves_on_a_time_wait_port_and_keeps_vllms_log(tmp_path):
    """`ttbundle demo --tiny` without --query: the tiny checkpoint prepared into the cache;
    on a port a stopped server left in TIME_WAIT (`--port` takes it, as vllm serve's
    listener does: SO_REUSEADDR); vLLM's log goes to its file, not over the demo's lines,
    and the curl hint is the last line printed while it serves; the served model answers
    (the --query flow itself is test_demo_command_answers_in_words')."""
    import signal
    import time

    import openai

    from tests.conftest import time_wait_port

    port = time_wait_port()
    env = {k: v for k, v in os.environ.items() if k not in AS_USERS_RUN_IT}
    env.update({"XDG_CACHE_HOME": str(tmp_path), "COLUMNS": "250", "NO_COLOR": "1"})
    out = tmp_path / "stdout.txt"
    with out.open("w") as sink:
        demo = subprocess.Popen(
            [TTBUNDLE, "demo", "--tiny", "--port", str(port)],
            stdout=sink,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    try:
        deadline = time.monotonic() + 600
        while "try: curl" not in out.read_text():
            assert demo.poll() is None and time.monotonic() < deadline, out.read_text()
            time.sleep(1)
        # Anything vLLM would still print after the hint comes before this request's
        # answer: the request goes through the same server after it.
        checkpoint = tmp_path / "ttbundles" / "demo-checkpoint"
        # Closed before the stop below: no open connection for the server to wait on.
        with openai.OpenAI(
            base_url=f"http://127.0.0.1:{port}/v1", api_key="EMPTY", max_retries=0
        ) as client:
            answer = client.completions.create(
                model=str(checkpoint), prompt="The capital of France is", max_tokens=4
            )
        assert answer.usage.completion_tokens == 4
        lines = out.read_text().splitlines()
        assert lines[0] == f"checkpoint: {checkpoint} (prepared now)"
        assert any(f"starting vllm serve on http://127.0.0.1:{port} (pid " in x for x in lines)
        assert lines[-1].startswith(f"try: curl http://127.0.0.1:{port}"), lines[-5:]
        assert not [line for line in lines if "INFO" in line or "(APIServer" in line], lines
        log = tmp_path / "ttbundles" / "demo-server.log"
        assert f"vLLM's log: {log}" in lines[-3]
        assert "Application startup complete" in log.read_text()
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(180)


def test_demo_command_vision_sends_its_picture(tmp_path):
    """`ttbundle demo --vision --query -f json`: the tiny vision checkpoint prepared into
    the cache, served with the demo-vision bundle; the demo's own picture goes through the
    chat API as a data URL and the streamed answer is transformers' greedy answer."""
    from ttbundles.demo.picture import draw_picture
    from ttbundles.reference.vl_golden import VisionGolden

    run = _demo(["--query", "--vision", "-f", "json"], tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    checkpoint = tmp_path / "ttbundles" / "demo-vision-checkpoint"
    assert f"checkpoint: {checkpoint} (prepared now)" in run.stderr
    assert run.stderr.splitlines()[-1] == "server stopped"
    answers = json.loads(run.stdout)["answers"]
    chat = answers["chat"]
    assert answers["model"] == str(checkpoint)
    assert "random weights" in answers["note"] and "noise" in answers["note"]
    assert chat["finish_reason"] == "length" and chat["completion_tokens"] == 24
    assert chat["text"] and chat["ttft_s"] > 0 and chat["tokens_per_s"] > 0
    log = (tmp_path / "ttbundles" / "demo-server.log").read_text()
    assert "serving TTQwen2_5_VLForConditionalGeneration with demo-vision@1.0.0" in log
    golden = VisionGolden(checkpoint)
    prompt, output = answers["prompt_token_ids"], answers["token_ids"]
    assert prompt.count(golden.image_token_id) == 24  # 168 x 112 pixels: 12 x 8 patches, 2 x 2
    assert output == golden.greedy(prompt, [draw_picture()], 24)
