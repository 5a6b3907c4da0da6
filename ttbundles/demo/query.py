"""Ask a served model once, as a user would: the OpenAI client, completions and chat.

Both requests stream, so the answer comes with what a user feels: the time to the first
token and the decode rate after it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

COMPLETION_PROMPT = "The capital of France is"
CHAT_MESSAGES = ({"role": "user", "content": "What is the capital of France?"},)


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
