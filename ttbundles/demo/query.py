"""Ask a served model once, as a user would: the OpenAI client, completions and chat.

Every request streams, so the answer comes with what a user feels: the time to the first
token and the decode rate after it. `query` asks a text model; `query_image` sends a
vision-language model the picture the demo draws (`picture`) as a data URL.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

COMPLETION_PROMPT = "The capital of France is"
CHAT_MESSAGES = ({"role": "user", "content": "What is the capital of France?"},)
IMAGE_PROMPT = "What shapes and colours are in this picture?"
RANDOM_WEIGHTS_NOTE = (
    "The vision checkpoint has seeded random weights: its answer is noise, not a "
    "description of the picture. What it shows is the image path (data URL, vLLM's "
    "Qwen2.5-VL processor, the vision tower on the host mesh, M-RoPE), greedy-identical "
    "to transformers."
)


@dataclass(frozen=True)
class Answer:
    prompt: str
    text: str
    finish_reason: str | None
    completion_tokens: int
    ttft_s: float  # seconds from sending to the first token
    tokens_per_s: float  # output tokens after the first, per second

    def summary(self) -> str:
        return (
            f"{self.completion_tokens} tokens, {self.finish_reason}; "
            f"TTFT {self.ttft_s * 1000:.0f} ms, {self.tokens_per_s:.1f} tokens/s"
        )


@dataclass(frozen=True)
class DemoAnswers:
    model: str
    completion: Answer
    chat: Answer


@dataclass(frozen=True)
class VisionAnswers:
    model: str
    picture: str  # what the picture shows
    chat: Answer
    prompt_token_ids: list[int]  # as the server prefilled them (image placeholders too)
    token_ids: list[int]  # the answer's tokens
    note: str = RANDOM_WEIGHTS_NOTE


def _timed(stream, prompt: str, text_of) -> Answer:  # noqa: ANN001 - openai stream types
    start = time.perf_counter()
    first = last = None
    parts: list[str] = []
    finish, tokens = None, 0
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for choice in chunk.choices:
            piece = text_of(choice)
            if piece:
                now = time.perf_counter()
                first = first if first is not None else now
                last = now
                parts.append(piece)
            finish = choice.finish_reason or finish
    ttft = (first - start) if first is not None else 0.0
    rate = (tokens - 1) / (last - first) if first is not None and last > first else 0.0
    return Answer(prompt, "".join(parts), finish, tokens, ttft, rate)


def query(api_url: str, *, max_tokens: int = 24, timeout: float = 120.0) -> DemoAnswers:
    """One greedy completion and one greedy chat completion, streamed, with the OpenAI
    client."""
    import openai

    client = openai.OpenAI(base_url=api_url, api_key="EMPTY", timeout=timeout, max_retries=0)
    usage = {"include_usage": True}
    try:
        model = client.models.list().data[0].id
        completion = _timed(
            client.completions.create(
                model=model,
                prompt=COMPLETION_PROMPT,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options=usage,
            ),
            COMPLETION_PROMPT,
            lambda choice: choice.text,
        )
        messages = [dict(m) for m in CHAT_MESSAGES]
        chat = _timed(
            client.chat.completions.create(
                model=model,
                messages=messages,
                max_tokens=max_tokens,
                temperature=0,
                stream=True,
                stream_options=usage,
            ),
            messages[-1]["content"],
            lambda choice: choice.delta.content,
        )
    finally:
        client.close()
    return DemoAnswers(model=model, completion=completion, chat=chat)


def _recording(stream, ids: dict[str, list[int]]):  # noqa: ANN001, ANN202 - openai types
    """Pass `stream` through, collecting the token ids vLLM adds with `return_token_ids`:
    the prompt's on the first chunk, each chunk's new tokens on its choice."""
    for chunk in stream:
        prompt = getattr(chunk, "prompt_token_ids", None)
        if prompt:
            ids["prompt"] = list(prompt)
        for choice in chunk.choices:
            ids["output"].extend(getattr(choice, "token_ids", None) or [])
        yield chunk


def query_image(api_url: str, *, max_tokens: int = 24, timeout: float = 120.0) -> VisionAnswers:
    """One greedy chat completion with the demo's picture and `IMAGE_PROMPT`, streamed,
    with the OpenAI client; the token ids come back too (vLLM's `return_token_ids`)."""
    import openai

    from ttbundles.demo.picture import DESCRIPTION, data_url, draw_picture

    client = openai.OpenAI(base_url=api_url, api_key="EMPTY", timeout=timeout, max_retries=0)
    content = [
        {"type": "image_url", "image_url": {"url": data_url(draw_picture())}},
        {"type": "text", "text": IMAGE_PROMPT},
    ]
    ids: dict[str, list[int]] = {"prompt": [], "output": []}
    try:
        model = client.models.list().data[0].id
        stream = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
            extra_body={"return_token_ids": True},
        )
        chat = _timed(_recording(stream, ids), IMAGE_PROMPT, lambda choice: choice.delta.content)
    finally:
        client.close()
    return VisionAnswers(model, DESCRIPTION, chat, ids["prompt"], ids["output"])
