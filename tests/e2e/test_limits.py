"""A limit the bundle's target lowers, as an operator and a client meet it.

The real server is started with `--max-model-len 2048`; the demo bundle's HOST target
supports at most 512. Start-up says so in one WARNING (TTB246) naming the bundle, the
target and the asked value; a request over the limit is refused (400) with vLLM's words
and the reason: which limit, and why it is not what the server was started with.
"""

from __future__ import annotations

import openai
import pytest

pytestmark = pytest.mark.server

NOTE = (
    "(ttbundles: max_model_len is 512 on this server, not 2048: bundle demo@1.0.0's "
    "target HOST supports at most 512.)"
)


def test_start_up_warns_that_the_asked_length_was_lowered(real_server):
    lines = [x for x in real_server.log_path.read_text().splitlines() if "TTB246" in x]
    assert lines, "no TTB246 warning in the server's log"
    line = lines[0]
    assert "WARNING" in line
    assert (
        "TTB246 ttbundles: max_model_len 2048 lowered to 512: bundle demo@1.0.0's target "
        "HOST supports at most 512 (targets.HOST.max_model_len in its vllm_metadata.json) "
        "(fix: ask for at most 512 (--max-model-len 512)"
    ) in line


@pytest.mark.parametrize("endpoint", ["completions", "chat"])
def test_a_prompt_over_the_lowered_limit_is_refused_with_the_reason(real_server, endpoint):
    long_text = "one two three four five six seven eight nine ten " * 80  # ~800 tokens
    with real_server.client() as client, pytest.raises(openai.BadRequestError) as refused:
        if endpoint == "completions":
            client.completions.create(model=real_server.model, prompt=long_text, max_tokens=4)
        else:
            client.chat.completions.create(
                model=real_server.model,
                messages=[{"role": "user", "content": long_text}],
                max_tokens=4,
            )
    message = refused.value.message
    assert refused.value.status_code == 400
    assert "512" in message and NOTE in message


def test_max_tokens_over_the_lowered_limit_names_the_reason(real_server):
    with real_server.client() as client, pytest.raises(openai.BadRequestError) as refused:
        client.completions.create(model=real_server.model, prompt="Hello", max_tokens=1000)
    assert refused.value.status_code == 400
    assert NOTE in refused.value.message


def test_a_request_within_the_limit_is_served(real_server):
    with real_server.client() as client:
        out = client.completions.create(
            model=real_server.model, prompt="Hello", max_tokens=4, temperature=0
        )
    assert out.usage.completion_tokens == 4
