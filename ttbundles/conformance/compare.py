"""The served run against a golden: per prompt, per path, per step; then the thresholds.

A *case* is one prompt on one path. Step k of a case is the generator's prediction of its
k-th output token: step 0 comes from the prefill (the prompt's last position), step k > 0
from the decode of output token k - 1. Served logits (host-sampled paths) are compared with
the golden's logits for the same token sequence:

- a live golden (reference, transformers) is teacher-forced on the served sequence, so
  every step is compared, also after the bundle's greedy tokens left the golden's;
- a recorded golden knows only its own greedy path: a step is compared while the served
  sequence is still on it (up to and including the first diverging token), and later
  steps are reported as not compared.

Failures are diagnostics naming the path, the prompt and the first step that fails.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

import numpy as np

from ttbundles.conformance import metrics
from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.format.golden_file import GoldenFile


@dataclass(frozen=True)
class GoldenStep:
    """The golden at one step: the whole row of logits (`ids` None), or its top-k."""

    values: np.ndarray
    lse: float
    ids: np.ndarray | None = None

    @property
    def token(self) -> int:
        return int(self.ids[0]) if self.ids is not None else int(metrics.top_ids(self.values, 1)[0])

    def logits_at(self, ids: np.ndarray) -> np.ndarray:
        """The golden's logits at `ids`; NaN where a recorded golden does not know them."""
        if self.ids is None:
            return self.values[ids]
        known = {int(i): float(v) for i, v in zip(self.ids, self.values)}
        return np.array([known.get(int(i), math.nan) for i in ids], dtype=np.float64)


class GoldenSource(Protocol):
    name: str
    live: bool

    def steps(self, context: list[int], tokens: list[int]) -> list[GoldenStep | None]: ...

    def perplexity_logprobs(self, ids: list[int]) -> np.ndarray | None: ...

    def rows(self, context: list[int], tokens: list[int]) -> np.ndarray | None: ...

    def with_images(self, images: Any) -> GoldenSource: ...


class LiveSource:
    """A live golden (`reference.golden`), teacher-forced on whatever it is given."""

    live = True

    def __init__(self, golden: Any):
        self.golden = golden
        self.name = golden.name

    def rows(self, context: list[int], tokens: list[int]) -> np.ndarray:
        """The golden's logits `[len(tokens), V]` for each step of the sequence."""
        sequence = list(context) + list(tokens[:-1])
        logits = self.logits(sequence, len(context))
        start = len(context) - 1
        return logits[start : start + len(tokens)]

    def logits(self, sequence: list[int], prompt_tokens: int) -> np.ndarray:
        return self.golden.sequence_logits(sequence)

    def with_images(self, images: Any) -> LiveSource:
        """This golden for an image prompt: `images` are its image specs
        (`format.prompts.Prompt.images`), fed with the same token ids."""
        if not hasattr(self.golden, "image_token_id"):
            raise TTBundleError.single(
                "TTB125",
                f"the {self.name} golden takes no images: image prompts are compared with "
                "transformers' image-text class",
                hint="use --golden transformers (or auto) for a bundle with image prompts",
            )
        return ImageSource(self.golden, images)

    def steps(self, context: list[int], tokens: list[int]) -> list[GoldenStep | None]:
        if not tokens:
            return []
        return [GoldenStep(row, metrics.logsumexp(row)) for row in self.rows(context, tokens)]

    def perplexity_logprobs(self, ids: list[int]) -> np.ndarray:
        logits = self.golden.sequence_logits(list(ids))
        return np.array([metrics.log_softmax(logits[j])[ids[j + 1]] for j in range(len(ids) - 1)])


class ImageSource(LiveSource):
    """A live vision-language golden bound to one prompt's images: each teacher-forced
    sequence carries the same pixels, placeholders marked in the prompt only."""

    def __init__(self, golden: Any, images: Any):
        from ttbundles.format.prompts import load_image

        super().__init__(golden)
        self.images = [load_image(i) for i in images]

    def logits(self, sequence: list[int], prompt_tokens: int) -> np.ndarray:
        return self.golden.sequence_logits(sequence, self.images, prompt_tokens)


class FileSource:
    """A recorded golden: its own greedy path, top-k logits per step."""

    live = False

    def __init__(self, golden: GoldenFile, label: str):
        self.file = golden
        self.name = label

    def rows(self, context: list[int], tokens: list[int]) -> None:
        return None

    def with_images(self, images: Any) -> FileSource:
        raise TTBundleError.single(
            "TTB125",
            "image prompts against a recorded golden are not supported yet",
            hint="compare image prompts with the live golden: --golden transformers",
        )

    def steps(self, context: list[int], tokens: list[int]) -> list[GoldenStep | None]:
        recorded = None
        for prompt in self.file.prompts:
            n = len(prompt.token_ids)
            if list(context[:n]) == prompt.token_ids and (
                recorded is None or n > len(recorded.token_ids)
            ):
                recorded = prompt
        if recorded is None:
            raise golden_mismatch(
                f"{self.name} has no prompt with the token ids {list(context)[:8]}..."
            )
        path = recorded.token_ids + recorded.tokens
        out: list[GoldenStep | None] = []
        for k in range(len(tokens)):
            prefix = list(context) + list(tokens[:k])
            j = len(prefix) - len(recorded.token_ids)
            if 0 <= j < len(recorded.tokens) and prefix == path[: len(prefix)]:
                out.append(
                    GoldenStep(
                        np.asarray(recorded.top_values[j], dtype=np.float64),
                        float(recorded.lse[j]),
                        np.asarray(recorded.top_ids[j], dtype=np.int64),
                    )
                )
            else:
                out.append(None)
        return out

    def perplexity_logprobs(self, ids: list[int]) -> np.ndarray | None:
        ppl = self.file.perplexity
        if ppl is None or ppl.token_ids != list(ids):
            return None
        return np.asarray(ppl.logprobs, dtype=np.float64)


def golden_mismatch(message: str) -> TTBundleError:
    return TTBundleError.single(
        "TTB126",
        message,
        hint="record the golden again for these tests: ttbundle test BUNDLE --model "
        "CHECKPOINT --record FILE",
    )


# --- results --------------------------------------------------------------------------


@dataclass
class StepResult:
    step: int
    token: int | None  # the bundle's token at this step
    golden_token: int | None  # the golden's top-1 at this step (None: not compared)
    compared: bool
    pcc: float | None = None
    max_abs_diff: float | None = None
    top1: bool | None = None
    top5: bool | None = None
    note: str = ""
    cosine: float | None = None  # a pooled vector's (`conformance.pooling`)


@dataclass
class CaseResult:
    path: str
    prompt: str
    label: str
    golden: str
    steps: list[StepResult] = field(default_factory=list)
    details: dict[str, Any] = field(default_factory=dict)
    failures: list[Diagnostic] = field(default_factory=list)
    # Why the path's own check could not run at these settings (a harness limit, not the
    # bundle's failure): said, never failed.
    skipped: str | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    @property
    def compared(self) -> list[StepResult]:
        return [s for s in self.steps if s.compared]

    def _extreme(self, name: str, pick: Any) -> tuple[float | None, int | None]:
        values = [(getattr(s, name), s.step) for s in self.compared if getattr(s, name) is not None]
        if not values:
            return None, None
        bad = [v for v in values if not math.isfinite(v[0])]
        return bad[0] if bad else pick(values, key=lambda v: v[0])

    @property
    def pcc_min(self) -> tuple[float | None, int | None]:
        return self._extreme("pcc", min)

    @property
    def max_abs_diff(self) -> tuple[float | None, int | None]:
        return self._extreme("max_abs_diff", max)

    @property
    def cosine_min(self) -> tuple[float | None, int | None]:
        return self._extreme("cosine", min)

    def rate(self, name: str) -> float | None:
        values = [getattr(s, name) for s in self.compared if getattr(s, name) is not None]
        return sum(values) / len(values) if values else None

    @property
    def first_divergence(self) -> int | None:
        """The first step whose greedy token is not the golden's (None: none)."""
        for s in self.compared:
            if s.token is not None and s.golden_token is not None and s.token != s.golden_token:
                return s.step
        return None

    def summary(self) -> dict[str, Any]:
        pcc_min, pcc_step = self.pcc_min
        diff, diff_step = self.max_abs_diff
        cosine, cosine_step = self.cosine_min
        return {
            "steps": len(self.steps),
            "compared": len(self.compared),
            "pcc_min": pcc_min,
            "pcc_min_step": pcc_step,
            "top1": self.rate("top1"),
            "top5": self.rate("top5"),
            "max_abs_diff": diff,
            "max_abs_diff_step": diff_step,
            "first_divergence": self.first_divergence,
            "cosine_min": cosine,
            "cosine_min_step": cosine_step,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "prompt": self.prompt,
            "label": self.label,
            "golden": self.golden,
            "passed": self.passed,
            "skipped": self.skipped,
            "summary": _clean(self.summary()),
            "details": self.details,
            "steps": [_clean(asdict(s)) for s in self.steps],
            "diagnostics": [d.to_dict() for d in self.failures],
        }


@dataclass
class PerplexityResult:
    golden: str
    served: float | None
    reference: float | None  # the golden's
    tokens: int
    failures: list[Diagnostic] = field(default_factory=list)

    @property
    def ratio(self) -> float | None:
        if self.served is None or self.reference is None or not self.reference:
            return None
        return self.served / self.reference

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        return _clean(
            {
                "golden": self.golden,
                "bundle": self.served,
                "golden_perplexity": self.reference,
                "ratio": self.ratio,
                "tokens": self.tokens,
                "passed": self.passed,
                "diagnostics": [d.to_dict() for d in self.failures],
            }
        )


def _clean(data: dict[str, Any]) -> dict[str, Any]:
    """JSON-safe: NaN and infinities as strings."""
    out = {}
    for key, value in data.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        out[key] = value
    return out


# --- comparing ------------------------------------------------------------------------


def _fail(code: str, case: CaseResult, step: int | None, message: str, hint: str) -> None:
    where = f"{case.path}, prompt {case.label}" + (f", step {step}" if step is not None else "")
    case.failures.append(
        Diagnostic(code, Severity.ERROR, f"{where}: {message} (golden: {case.golden})", hint=hint)
    )


def compare_logits(
    case: CaseResult, context: list[int], tokens: list[int], served: np.ndarray, source: Any
) -> None:
    """Fill `case.steps` from served logits `[steps, V]` (NaN rows: nothing recorded)."""
    golden_steps = source.steps(context, tokens)
    for k, token in enumerate(tokens):
        g = golden_steps[k]
        row = served[k]
        if np.isnan(row).all():
            case.steps.append(StepResult(k, token, None, False, note="no logits recorded"))
            continue
        if g is None:
            case.steps.append(StepResult(k, token, None, False, note="off the recorded path"))
            continue
        ids = g.ids if g.ids is not None else np.arange(row.shape[0])
        mine = row[ids].astype(np.float64)
        theirs = g.values if g.ids is not None else g.values.astype(np.float64)
        top5 = metrics.top_ids(row, 5)
        case.steps.append(
            StepResult(
                step=k,
                token=token,
                golden_token=g.token,
                compared=True,
                pcc=metrics.pcc(mine, theirs),
                max_abs_diff=metrics.max_abs_diff(mine, theirs),
                top1=int(metrics.top_ids(row, 1)[0]) == g.token,
                top5=g.token in set(top5.tolist()),
            )
        )


def compare_logprobs(
    case: CaseResult,
    context: list[int],
    tokens: list[int],
    logprobs: list[list[list[float]]] | None,
    source: Any,
) -> None:
    """Device-sampled greedy steps: tokens, and the device's top log-probabilities
    (`[[id, logprob], ...]` per step, best first) where it returned them."""
    golden_steps = source.steps(context, tokens)
    for k, token in enumerate(tokens):
        g = golden_steps[k]
        if g is None:
            case.steps.append(StepResult(k, token, None, False, note="off the recorded path"))
            continue
        result = StepResult(k, token, g.token, True, top1=token == g.token)
        if logprobs is not None and k < len(logprobs) and logprobs[k]:
            entries = logprobs[k]
            ids = np.array([int(i) for i, _ in entries], dtype=np.int64)
            mine = np.array([v for _, v in entries], dtype=np.float64)
            theirs = g.logits_at(ids) - g.lse
            known = np.isfinite(theirs)
            if known.sum() >= 2:
                result.pcc = metrics.pcc(mine[known], theirs[known])
                result.max_abs_diff = metrics.max_abs_diff(mine[known], theirs[known])
            result.top5 = g.token in set(ids[:5].tolist())
        case.steps.append(result)


def _where_to_look(path: str, step: int) -> str:
    """Where bring-up looks first when `step` of `path` is the first to fail."""
    if step == 0:
        return {
            "chunked_prefill": "the prompt prefilled in chunks differs: a chunk must attend "
            "to the earlier chunks' K/V in the cache (start_pos, the page table)",
            "prefix_cache": "the prefill after a prefix-cache hit differs: the cached blocks "
            "reached through the page table, the prefill from start_pos",
            "device_sampling": "the device's greedy token or top log-probabilities differ "
            "after the prefill: the device sampler's argmax and log-softmax",
        }.get(
            path,
            "the prefill already differs: weights, norms, RoPE of the prompt positions, "
            "causal attention over the prompt",
        )
    return (
        "a decode step: check the decode position (RoPE at start_pos), the K/V the prefill "
        "wrote and decode reads through the page table, the cache's block boundaries"
    )


def window_hint(hint: str, step: int, window: Any, prompt_tokens: int | None) -> str:
    """`hint`, led by the checkpoint's sliding window when the failing step's context is
    longer than it: step k's query sits at position prompt_tokens - 1 + k, and only past
    the window does a generator that ignores it differ."""
    if window is None or prompt_tokens is None or prompt_tokens + step <= window.size:
        return hint
    return (
        f"the context here ({prompt_tokens + step} tokens) is longer than the checkpoint's "
        f"{window.describe()}: the generator must mask keys older than the window (a query "
        f"at position p sees keys p - {window.size} < c <= p) in prefill and decode; "
        f"else: {hint}"
    )


def check_thresholds(
    case: CaseResult, thresholds: Any, window: Any = None, prompt_tokens: int | None = None
) -> None:
    """Add a failure for each threshold the case misses, at its first failing step.
    `window` (`format.attention_window`) and the prompt's length: a miss past the window
    names it first (`window_hint`)."""

    def where_to_look(path: str, step: int) -> str:
        return window_hint(_where_to_look(path, step), step, window, prompt_tokens)

    for s in case.compared:
        if s.pcc is not None and not (s.pcc >= thresholds.pcc):
            hint = where_to_look(case.path, s.step)
            _fail("TTB120", case, s.step, f"PCC {s.pcc:.6f} < {thresholds.pcc}", hint)
            break
    if thresholds.max_abs_diff is not None:
        for s in case.compared:
            if s.max_abs_diff is not None and not (s.max_abs_diff <= thresholds.max_abs_diff):
                _fail(
                    "TTB120",
                    case,
                    s.step,
                    f"max abs diff {s.max_abs_diff:.4g} > {thresholds.max_abs_diff}",
                    where_to_look(case.path, s.step),
                )
                break
    for name, limit, what in (
        ("top1", thresholds.top1, "top-1 agreement"),
        ("top5", thresholds.top5, "top-5 agreement"),
    ):
        rate = case.rate(name)
        if rate is None or rate >= limit:
            continue
        first = next(s for s in case.compared if getattr(s, name) is False)
        detail = (
            f"the bundle's top-1 {first.token}, the golden's {first.golden_token}"
            if name == "top1"
            else f"the golden's top-1 {first.golden_token} not in the bundle's top 5"
        )
        counted = [s for s in case.compared if getattr(s, name) is not None]
        _fail(
            "TTB120",
            case,
            first.step,
            f"{what} {rate:.2f} < {limit} over {len(counted)} steps, first miss here: {detail}",
            where_to_look(case.path, first.step),
        )
    missing = [s for s in case.steps if s.note == "no logits recorded"]
    if missing:
        _fail(
            "TTB127",
            case,
            missing[0].step,
            "the served run recorded no logits for this step",
            "the generator must return logits when sampling on the host",
        )


def compare_seeded(
    case: CaseResult, context: list[int], sampling: dict[str, Any], source: Any
) -> None:
    """Seeded device sampling: the same seed alone and in a batch, token for token; and
    each token within the golden's top-k / top-p (live goldens only)."""
    alone, batch = case.details["seeded_alone"], case.details["seeded_batch"]
    for k, (a, b) in enumerate(zip(alone, batch)):
        if a != b:
            _fail(
                "TTB121",
                case,
                k,
                f"seed {case.details['seed']} gave token {a} alone and {b} in a batch",
                "a device sampler must key its draws on the request's seed (and position), "
                "never on the batch or a shared stream",
            )
            break
    if len(alone) != len(batch):
        _fail("TTB121", case, None, "the seeded runs produced different lengths", "")
    if not source.live:
        case.details["support"] = "not checked (a recorded golden knows only its greedy path)"
        return
    if sampling["top_k"] <= 0 and sampling["top_p"] >= 1.0:
        case.details["support"] = "every token (no top-k or top-p cut)"
        return
    rows = source.rows(context, alone)
    for k, token in enumerate(alone):
        if not metrics.in_support(
            rows[k],
            token,
            temperature=sampling["temperature"],
            top_k=sampling["top_k"],
            top_p=sampling["top_p"],
        ):
            rank = metrics.rank_of(rows[k], token)
            _fail(
                "TTB122",
                case,
                k,
                f"seeded token {token} is the golden's {rank}th most likely, outside "
                f"top_k={sampling['top_k']} / top_p={sampling['top_p']}",
                "the device sampler must apply top-k and top-p to the request's logits",
            )
            break
    else:
        case.details["support"] = "every seeded token within the golden's top-k / top-p"


def compare_perplexity(
    served_logits: np.ndarray, ids: list[int], source: Any, thresholds: Any
) -> PerplexityResult | None:
    golden_lp = source.perplexity_logprobs(ids)
    if golden_lp is None:
        return None
    served_lp = np.array(
        [metrics.log_softmax(served_logits[j])[ids[j + 1]] for j in range(len(ids) - 1)]
    )
    result = PerplexityResult(
        source.name, metrics.perplexity(served_lp), metrics.perplexity(golden_lp), len(ids)
    )
    ratio = result.ratio
    limit = thresholds.perplexity_ratio
    if result.served is None or not math.isfinite(result.served):
        result.failures.append(
            Diagnostic(
                "TTB127",
                Severity.ERROR,
                "perplexity: the served run recorded no usable logits for the text",
            )
        )
    elif limit is not None and (ratio is None or max(ratio, 1 / ratio) > limit):
        result.failures.append(
            Diagnostic(
                "TTB123",
                Severity.ERROR,
                f"perplexity: the bundle's {result.served:.4g} vs the golden's "
                f"{result.reference:.4g} (ratio {ratio:.4f}, allowed 1/{limit}..{limit}; "
                f"golden: {source.name})",
                hint="compare the prefill path's PCC: a perplexity gap with good decode "
                "numbers points at long prompts",
            )
        )
    return result
