"""Ask a served model once, as a user would: the OpenAI client, completions and chat."""

from __future__ import annotations

from dataclasses import dataclass

COMPLETION_PROMPT = "The capital of France is"
CHAT_MESSAGES = ({"role": "user", "content": "Hello mesh! What is a bundle?"},)


@dataclass(frozen=True)
class Answer:
    prompt: str
    text: str
    finish_reason: str | None
    completion_tokens: int


@dataclass(frozen=True)
class DemoAnswers:
    model: str
    completion: Answer
    chat: Answer


def query(api_url: str, *, max_tokens: int = 16, timeout: float = 120.0) -> DemoAnswers:
    """One greedy completion and one greedy chat completion, with the OpenAI client."""
    import openai

    client = openai.OpenAI(base_url=api_url, api_key="EMPTY", timeout=timeout, max_retries=0)
    try:
        model = client.models.list().data[0].id
        completion = client.completions.create(
            model=model, prompt=COMPLETION_PROMPT, max_tokens=max_tokens, temperature=0
        )
        messages = [dict(m) for m in CHAT_MESSAGES]
        chat = client.chat.completions.create(
            model=model, messages=messages, max_tokens=max_tokens, temperature=0
        )
    finally:
        client.close()
    return DemoAnswers(
        model=model,
        completion=Answer(
            prompt=COMPLETION_PROMPT,
            text=completion.choices[0].text,
            finish_reason=completion.choices[0].finish_reason,
            completion_tokens=completion.usage.completion_tokens if completion.usage else 0,
        ),
        chat=Answer(
            prompt=messages[-1]["content"],
            text=chat.choices[0].message.content or "",
            finish_reason=chat.choices[0].finish_reason,
            completion_tokens=chat.usage.completion_tokens if chat.usage else 0,
        ),
    )
