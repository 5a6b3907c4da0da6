"""The prompts `ttbundle test` runs: the tests section's texts and its prompt file."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttbundles.errors import Diagnostic, Severity

DEFAULT_PROMPTS = (
    "The capital of France is",
    "Once upon a time, there was a",
    "Tenstorrent builds computers for AI. A mesh of chips runs",
)


@dataclass(frozen=True)
class Prompt:
    """One prompt: text (tokenized as vLLM does), token ids (a prompt file), or text with
    images (`images`: each `{"file": absolute path}` or `{"seed", "width", "height"}`;
    the text then goes through the checkpoint's chat template, images first)."""

    name: str
    text: str | None = None
    token_ids: tuple[int, ...] | None = None
    images: tuple[dict[str, Any], ...] = ()

    def label(self, width: int = 32) -> str:
        """`p1 'Once upon a time'`: how reports name it."""
        if self.text is None:
            return self.name
        text = self.text if len(self.text) <= width else self.text[: width - 1] + "…"
        extra = f" +{len(self.images)} image{'s' if len(self.images) > 1 else ''}"
        return f"{self.name} {text!r}" + (extra if self.images else "")

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "text": self.text,
            "token_ids": list(self.token_ids) if self.token_ids is not None else None,
            "images": [dict(i) for i in self.images],
        }


def text_prompts(texts: list[str]) -> list[Prompt]:
    return [Prompt(f"p{i}", text=text) for i, text in enumerate(texts)]


def image_prompts(prompts: list[Any], bundle_dir: Path) -> list[Prompt]:
    """The tests section's `image_prompts` (format.metadata.ImagePrompt), named i0, i1, ...;
    an image file becomes an absolute path (the harness runs in another folder)."""
    out = []
    for i, prompt in enumerate(prompts):
        images = tuple(
            {"file": str((bundle_dir / image.file).absolute())}
            if image.file is not None
            else {"seed": image.seed, "width": image.width, "height": image.height}
            for image in prompt.images
        )
        out.append(Prompt(f"i{i}", text=prompt.text, images=images))
    return out


def load_image(spec: dict[str, Any]) -> Any:
    """The PIL image of one image spec (`Prompt.images`): the file read as RGB, or random
    pixels drawn from the seed (numpy's PCG64: the same on every machine)."""
    import numpy as np
    from PIL import Image

    if "file" in spec:
        with Image.open(spec["file"]) as image:
            return image.convert("RGB")
    rng = np.random.default_rng(int(spec["seed"]))
    pixels = rng.integers(0, 256, size=(int(spec["height"]), int(spec["width"]), 3))
    return Image.fromarray(pixels.astype(np.uint8), "RGB")


def image_problems(bundle_dir: Path, prompts: list[Any], file: str) -> list[Diagnostic]:
    """TTB111 for each image file of `image_prompts` that is missing or no image."""
    out = []
    for i, prompt in enumerate(prompts):
        for j, image in enumerate(prompt.images):
            if image.file is None:
                continue
            try:
                load_image({"file": str(bundle_dir / image.file)})
            except FileNotFoundError:
                problem = "does not exist"
            except Exception as exc:  # noqa: BLE001 - PIL raises many kinds
                problem = f"is not an image PIL reads ({type(exc).__name__}: {exc})"
            else:
                continue
            out.append(
                Diagnostic(
                    "TTB111",
                    Severity.ERROR,
                    f"image file {image.file!r} {problem}",
                    file=file,
                    pointer=f"/tests/image_prompts/{i}/images/{j}/file",
                    hint="put the image in the bundle folder, or draw one: "
                    '{"seed": 0, "width": 64, "height": 64}',
                )
            )
    return out


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
