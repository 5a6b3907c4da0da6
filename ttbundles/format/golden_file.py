"""The recorded golden: what a live golden computed for a bundle's tests, in one file.

`ttbundle test --record FILE` writes it where the reference generator or transformers can
run; `ttbundle test --golden FILE` (or the bundle's `tests.golden`) checks a bundle against
it where they cannot (a TT system). It is gzip-compressed JSON, written byte for byte the
same for the same content (no timestamp, sorted keys), so a bundle that ships it keeps a
stable digest. For each prompt it holds the token ids, the golden's greedy continuation of
twice `max_tokens` steps (the prefix_cache path continues the decode path's sequence) and
each step's top-k logits (ids and values) with the logsumexp of the whole row, so that
log-probabilities of the recorded ids are exact; and the perplexity text's per-token
log-probabilities.

Reading it needs neither torch nor numpy.
"""

from __future__ import annotations

import gzip
import io
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.fsutil import write_bytes_atomic

FORMAT = "ttbundles-golden"
FORMAT_VERSION = 1
SUFFIX = ".json.gz"
DEFAULT_TOP_K = 32
# The configuration fields that identify a checkpoint's model (not its weights).
MODEL_FIELDS = (
    "architectures",
    "vocab_size",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
)


@dataclass
class RecordedPrompt:
    name: str
    text: str | None
    token_ids: list[int]
    tokens: list[int]  # the golden's greedy continuation
    top_ids: list[list[int]]  # [steps][K], best first
    top_values: list[list[float]]  # the logits at top_ids
    lse: list[float]  # logsumexp of each step's whole row of logits


@dataclass
class RecordedPerplexity:
    text: str
    token_ids: list[int]
    logprobs: list[float]  # log p(token j + 1 | tokens 0..j)


@dataclass
class GoldenFile:
    golden: str  # the live golden that computed it: "reference" or "transformers"
    model: dict[str, Any]
    max_tokens: int
    top_k: int
    prompts: list[RecordedPrompt]
    perplexity: RecordedPerplexity | None = None
    created_with: str = ""
    path: Path | None = field(default=None, compare=False)

    def prompt_for(self, token_ids: list[int]) -> RecordedPrompt | None:
        for prompt in self.prompts:
            if prompt.token_ids == list(token_ids):
                return prompt
        return None

    def to_document(self) -> dict[str, Any]:
        data = asdict(self)
        data.pop("path")
        return {"format": FORMAT, "format_version": FORMAT_VERSION, **data}

    def write(self, path: Path) -> Path:
        """Write atomically; the same content gives the same bytes."""
        path = Path(path)
        text = json.dumps(self.to_document(), sort_keys=True, separators=(",", ":"))
        buffer = io.BytesIO()
        with gzip.GzipFile(filename="", mode="wb", fileobj=buffer, mtime=0, compresslevel=9) as gz:
            gz.write(text.encode("utf-8"))
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes_atomic(path, buffer.getvalue())
        return path

    @classmethod
    def read(cls, path: Path, *, display: str | None = None) -> GoldenFile:
        where = display or str(path)
        try:
            raw = Path(path).read_bytes()
        except FileNotFoundError:
            raise _error(where, "the golden file does not exist") from None
        except OSError as exc:
            raise _error(where, f"cannot read the golden file: {exc}") from None
        try:
            document = json.loads(gzip.decompress(raw).decode("utf-8"))
        except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise _error(where, f"not a gzip-compressed JSON golden file ({exc})") from None
        return cls.from_document(document, where, Path(path))

    @classmethod
    def from_document(cls, document: Any, where: str, path: Path | None = None) -> GoldenFile:
        if not isinstance(document, dict) or document.get("format") != FORMAT:
            raise _error(where, f"not a {FORMAT} file")
        version = document.get("format_version")
        if version != FORMAT_VERSION:
            raise _error(
                where,
                f"golden format version {version!r} is not supported; this release reads "
                f"version {FORMAT_VERSION}",
            )
        try:
            prompts = [RecordedPrompt(**p) for p in document["prompts"]]
            perplexity = document.get("perplexity")
            golden = cls(
                golden=str(document["golden"]),
                model=dict(document["model"]),
                max_tokens=int(document["max_tokens"]),
                top_k=int(document["top_k"]),
                prompts=prompts,
                perplexity=RecordedPerplexity(**perplexity) if perplexity else None,
                created_with=str(document.get("created_with", "")),
                path=path,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise _error(where, f"the golden file is incomplete or malformed ({exc})") from None
        for index, prompt in enumerate(golden.prompts):
            steps = len(prompt.tokens)
            shapes = {len(prompt.top_ids), len(prompt.top_values), len(prompt.lse)}
            widths = {len(row) for row in prompt.top_ids} | {len(r) for r in prompt.top_values}
            if shapes != {steps} or widths != {golden.top_k} or not prompt.token_ids:
                raise _error(where, f"prompt {index} ({prompt.name}) has inconsistent lengths")
        ppl = golden.perplexity
        if ppl is not None and len(ppl.logprobs) != max(len(ppl.token_ids) - 1, 0):
            raise _error(where, "the perplexity log-probabilities do not match its tokens")
        return golden


def model_identity(config: dict[str, Any]) -> dict[str, Any]:
    """What identifies a checkpoint's model in a golden file (from its config.json)."""
    return {k: config.get(k) for k in MODEL_FIELDS if config.get(k) is not None}


class GoldenFileError(TTBundleError):
    """A golden file that cannot be used."""


def _error(where: str, message: str) -> GoldenFileError:
    return GoldenFileError(
        Diagnostic(
            "TTB111",
            Severity.ERROR,
            message,
            file=where,
            hint="record it again: ttbundle test BUNDLE --model CHECKPOINT --record FILE",
        )
    )
