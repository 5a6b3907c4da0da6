"""The pooling paths of `ttbundle test`: each prompt's served vectors against the golden's.

A pooling case is one prompt on one pooling path; its "steps" are the vectors vLLM
served for it, each checked on its own:

- `pooling_embed`: `embedding`, what `/v1/embeddings` answers (vLLM's head normalised
  the generator's pooled vector), and `raw`, the same request with `use_activation`
  false (the vector as the generator pooled it). The golden pools transformers' last
  hidden states as vLLM's pooler resolved it for the engine (`seq_pooling_type`), then
  normalises. Each must have a cosine of at least `COSINE_MIN` with the golden's and no
  component further than its tolerance: a wrong pooling (mean for last, a padded row's
  pad position) fails the cosine, a wrong scale only the raw vector's difference;
- `pooling_classify`: `probs`, what `/classify` answers (vLLM's activation: sigmoid for
  one label, softmax for more, after the checkpoint's logit calibration), and `logits`,
  with `use_activation` false. The golden is transformers' sequence classifier's logits,
  calibrated and activated the same way here. Each within its tolerance; with more than
  one label the most likely label must also be the golden's. A one-label classifier (a
  reranker) is also asked for query/document pairs as `/score` and `/rerank` ask it
  (`LLM.score`: the first prompt the query, each other prompt a document), on the token
  ids vLLM made of the pair, which the golden reads too.

A one-value vector has no PCC (a correlation of one number with another is no figure):
its step carries the difference alone.

The tolerances are float32's (`TOLERANCES`: an absolute part, and a part relative to the
golden's largest component): the served side and the golden compute the same function
in float32, and the served one in a padded batch. Failures: TTB128 (embeddings), TTB129
(classification), one per vector, naming the path, the prompt and the vector.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ttbundles.conformance import metrics
from ttbundles.conformance.compare import CaseResult, StepResult, _fail
from ttbundles.format.capabilities import POOLING_MISMATCH, POOLING_VECTORS

COSINE_MIN = 0.99999
"""The least cosine of a served embedding (either vector) with the golden's."""

# Vector kind -> (absolute, relative to the golden's largest |component|) tolerance.
TOLERANCES: dict[str, tuple[float, float]] = {
    "embedding": (1e-5, 0.0),  # unit length: every component within [-1, 1]
    "raw": (1e-5, 1e-4),
    "probs": (1e-5, 0.0),
    "logits": (1e-5, 1e-4),
}
# The vectors each pooling task serves, in the order they are compared, and the code of
# a mismatch (`format.capabilities.POOLING`).
KINDS: dict[str, tuple[str, ...]] = POOLING_VECTORS
CODES: dict[str, str] = POOLING_MISMATCH
DEFAULT_POOLING = "LAST"  # vLLM's for a decoder under --convert embed


def allowed(kind: str, golden: np.ndarray) -> float:
    """The largest absolute difference allowed for `kind` against `golden`."""
    absolute, relative = TOLERANCES[kind]
    values = np.asarray(golden, dtype=np.float64)
    top = float(np.abs(values).max()) if values.size else 0.0
    return absolute + relative * top


def normalise(vector: np.ndarray) -> np.ndarray:
    """Unit length, as vLLM's embedding head (`F.normalize`, eps 1e-12)."""
    x = np.asarray(vector, dtype=np.float64)
    return x / max(math.sqrt(float(x @ x)), 1e-12)


def calibrate(logits: np.ndarray, pooler: dict[str, Any]) -> np.ndarray:
    """vLLM's affine score calibration, `(logit - logit_mean) / logit_sigma`, where the
    pooler configuration sets them."""
    x = np.asarray(logits, dtype=np.float64)
    if pooler.get("logit_mean") is not None:
        x = x - float(pooler["logit_mean"])
    if pooler.get("logit_sigma") is not None:
        x = x / float(pooler["logit_sigma"])
    return x


def activate(logits: np.ndarray) -> np.ndarray:
    """vLLM's classifier activation: sigmoid for one label, softmax for more."""
    x = np.asarray(logits, dtype=np.float64)
    if x.size == 1:
        return 1.0 / (1.0 + np.exp(-x))
    return np.exp(metrics.log_softmax(x))


def golden_vectors(
    task: str, golden: Any, ids: list[int], pooler: dict[str, Any]
) -> dict[str, np.ndarray]:
    """The golden's vectors for one prompt, by kind (`KINDS[task]`)."""
    if task == "embed":
        raw = golden.embedding(ids, pooler.get("seq_pooling_type") or DEFAULT_POOLING)
        return {"embedding": normalise(raw), "raw": np.asarray(raw, dtype=np.float64)}
    logits = calibrate(golden.logits(ids), pooler)
    return {"probs": activate(logits), "logits": logits}


def compare_pooled(
    case: CaseResult,
    task: str,
    served: dict[str, np.ndarray],
    golden: dict[str, np.ndarray],
    pooling: str | None = None,
) -> None:
    """Fill `case.steps` (one per vector) and its failures; `pooling`: how vLLM pooled
    (`seq_pooling_type`), named in the hints."""
    code = CODES[task]
    vectors: dict[str, dict[str, Any]] = {}
    case.details["vectors"] = vectors
    found: dict[str, list[str]] = {}
    for index, kind in enumerate(KINDS[task]):
        mine = np.asarray(served[kind], dtype=np.float64).reshape(-1)
        theirs = np.asarray(golden[kind], dtype=np.float64).reshape(-1)
        if mine.shape != theirs.shape:
            case.steps.append(StepResult(index, None, None, False, note=kind))
            found[kind] = [f"{mine.size} components, the golden's {theirs.size}"]
            continue
        limit = allowed(kind, theirs)
        labels = task == "classify" and mine.size > 1
        step = StepResult(
            step=index,
            token=int(metrics.top_ids(mine, 1)[0]) if labels else None,
            golden_token=int(metrics.top_ids(theirs, 1)[0]) if labels else None,
            compared=True,
            pcc=metrics.pcc(mine, theirs) if mine.size > 1 else None,
            max_abs_diff=metrics.max_abs_diff(mine, theirs),
            note=kind,
        )
        if labels:
            step.top1 = step.token == step.golden_token
        if task == "embed":
            step.cosine = metrics.cosine(mine, theirs)
        case.steps.append(step)
        vectors[kind] = {"size": int(mine.size), "allowed": limit}
        problems = found.setdefault(kind, [])
        if step.cosine is not None and not (step.cosine >= COSINE_MIN):
            problems.append(f"cosine {step.cosine:.7f} < {COSINE_MIN}")
        if not (step.max_abs_diff is not None and step.max_abs_diff <= limit):
            problems.append(f"max abs diff {step.max_abs_diff:.4g} > {limit:.3g}")
        if step.top1 is False:
            problems.append(f"label {step.token}, the golden's {step.golden_token}")
    passed = {kind: not problems for kind, problems in found.items()}
    for kind, problems in found.items():
        if problems:
            mine = np.asarray(served[kind], dtype=np.float64).reshape(-1)
            theirs = np.asarray(golden[kind], dtype=np.float64).reshape(-1)
            _fail(
                code,
                case,
                None,
                f"the {kind} vector: {', '.join(problems)}",
                _hint(task, kind, mine, theirs, passed, pooling),
            )


def _hint(
    task: str,
    kind: str,
    mine: np.ndarray,
    theirs: np.ndarray,
    passed: dict[str, bool],
    pooling: str | None,
) -> str:
    """Where bring-up looks first for a failing vector."""
    if mine.shape != theirs.shape:
        return (
            "return one row per prompt of the model's width: [B, hidden] for embed, "
            "[B, num_labels] for classify"
        )
    pooled = pooling or DEFAULT_POOLING
    where = {
        "LAST": "the last real token of each right-padded row (attention_mask.sum(1) - 1)",
        "MEAN": "the mean over each row's real tokens (the attention mask's ones)",
        "CLS": "the first token of each row",
    }.get(pooled, pooled)
    if task == "embed" and kind == "raw" and passed.get("embedding"):
        scale = float(np.linalg.norm(mine)) / max(float(np.linalg.norm(theirs)), 1e-12)
        return (
            f"the normalised vector agrees but the raw one is {scale:.4g} times the "
            "golden's: return the pooled hidden state (after the final norm) unscaled and "
            "unnormalised; vLLM's head normalises"
        )
    if task == "embed":
        return (
            f"vLLM pools {pooled} here: {where}; check the pooling, the attention mask of "
            "padded rows and the final norm (forward returns one pooled row per prompt)"
        )
    if kind == "probs" and passed.get("logits"):
        return (
            "the logits agree: the probabilities are vLLM's activation of them (sigmoid for "
            "one label, softmax for more); return logits, not probabilities"
        )
    return (
        f"check the classification head (score) and where it is applied: vLLM pools {pooled} "
        f"here, {where}; forward returns the logits before any activation"
    )
