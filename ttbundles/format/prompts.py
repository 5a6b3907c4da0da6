"""The prompts `ttbundle test` runs: the tests section's texts and its prompt file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity

DEFAULT_PROMPTS = (
    "The capital of France is",
    "Once upon a time, there was a",
    "Tenstorrent builds computers for AI. A mesh of chips runs",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt: text (tokenized as vLLM does) or token ids (a prompt file)."""

    name: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None

    def label(self, width: int = 32) -> str:
        """`p1 'Once upon a time'`: how reports name it."""
        if self.text is None:
            return self.name
        text = self.text if len(self.text) <= width else self.text[: width - 1] + "…"
        return f"{self.name} {text!r}"

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "text": self.text,
            "token_ids": list(self.token_ids) if self.token_ids is not None else None,
        }


def text_prompts(texts: list[str]) -> list[Prompt]:
    return [Prompt(f"p{i}", text=text) for i, text in enumerate(texts)]


def read_prompt_file(path: Path, *, display: str | None = None) -> list[Prompt]:
    """Prompts from a JSON file of token ids: `[[1, 2], ...]` (named f0, f1, ...) or
    `{"name": [1, 2], ...}`. Raises `PromptFileError` naming the JSON pointer of a
    problem."""
    where = display or str(path)
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PromptFileError(where, None, "the prompt file does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise PromptFileError(where, None, f"cannot read the prompt file: {exc}") from None
    except json.JSONDecodeError as exc:
        raise PromptFileError(where, None, f"invalid JSON: {exc.msg} (line {exc.lineno})") from None
    if isinstance(document, list):
        items = [(f"f{i}", f"/{i}", ids) for i, ids in enumerate(document)]
    elif isinstance(document, dict):
        items = [
            (str(k), "/" + str(k).replace("~", "~0").replace("/", "~1"), v)
            for k, v in document.items()
        ]
    else:
        raise PromptFileError(
            where, "", "a prompt file is an array of token-id arrays or an object of them"
        )
    if not items:
        raise PromptFileError(where, "", "the prompt file holds no prompt")
    prompts, seen = [], set()
    for name, pointer, ids in items:
        if not isinstance(ids, list) or not ids:
            raise PromptFileError(
                where, pointer, f"prompt {name!r} is not a non-empty array of token ids"
            )
        for index, token in enumerate(ids):
            if not isinstance(token, int) or isinstance(token, bool) or token < 0:
                raise PromptFileError(
                    where, f"{pointer}/{index}", f"prompt {name!r}: {token!r} is not a token id"
                )
        key = tuple(ids)
        if key in seen:
            raise PromptFileError(where, pointer, f"prompt {name!r} repeats an earlier prompt")
        seen.add(key)
        prompts.append(Prompt(name, token_ids=key))
    return prompts


class PromptFileError(Exception):
    def __init__(self, file: str, pointer: str | None, message: str):
        super().__init__(message)
        self.diagnostic = Diagnostic(
            "TTB111",
            Severity.ERROR,
            message,
            file=file,
            pointer=pointer,
            hint='write [[1, 2, 3], ...] or {"name": [1, 2, 3], ...} (token ids of the '
            "checkpoint's tokenizer)",
        )
