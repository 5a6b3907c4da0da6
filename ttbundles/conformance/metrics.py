"""The numbers `ttbundle test` reports, as TT bring-up computes them.

- **PCC**: Pearson correlation of two logit vectors (TT-Metal's `comp_pcc`): 1.0 is the
  same shape up to scale and shift; two constant vectors count as 1.0 when equal; a NaN or
  an infinity anywhere gives NaN, which fails any threshold.
- **max abs diff**: the largest absolute difference of two logit vectors.
- **cosine**: the cosine similarity of two pooled vectors (embeddings).
- **top-1 agreement** of a step: the bundle's most likely token is the golden's.
- **top-5 agreement** of a step: the golden's most likely token is among the bundle's five
  most likely (TT-Metal's demos' "top-5 accuracy" against reference tokens).
- **perplexity** of a text: `exp(-mean(log p(token j + 1 | tokens 0..j)))`.

Ties in a ranking are broken by the lower token id, as `argmax` does.
"""

from __future__ import annotations

import math

import numpy as np


def _finite_pair(a: np.ndarray, b: np.ndarray, metric: str) -> tuple[np.ndarray, np.ndarray] | None:
    """Both as flat float64 vectors; None when either is empty or not finite (the metric
    is then NaN, which fails any threshold); different lengths are a caller's error."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"{metric} of vectors of different lengths: {x.shape} vs {y.shape}")
    if x.size == 0 or not (np.isfinite(x).all() and np.isfinite(y).all()):
        return None
    return x, y


def pcc(a: np.ndarray, b: np.ndarray) -> float:
    """Pearson correlation of two equal-length vectors (see the module docstring)."""
    pair = _finite_pair(a, b, "pcc")
    if pair is None:
        return math.nan
    x, y = pair
    dx, dy = x - x.mean(), y - y.mean()
    sx, sy = math.sqrt(float(dx @ dx)), math.sqrt(float(dy @ dy))
    if sx == 0.0 or sy == 0.0:
        return 1.0 if (sx == sy and np.array_equal(x, y)) else 0.0
    return max(-1.0, min(1.0, float(dx @ dy) / (sx * sy)))


def max_abs_diff(a: np.ndarray, b: np.ndarray) -> float:
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.size == 0:
        return 0.0
    diff = np.abs(x - y)
    return math.nan if np.isnan(diff).any() else float(diff.max())


def top_ids(values: np.ndarray, k: int) -> np.ndarray:
    """The ids of the k largest values, largest first, ties to the lower id."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    k = min(k, values.size)
    order = np.lexsort((np.arange(values.size), -values))  # by value desc, then id asc
    return order[:k]


def logsumexp(values: np.ndarray) -> float:
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    top = float(x.max())
    if not math.isfinite(top):
        return top
    return top + math.log(float(np.exp(x - top).sum()))


def log_softmax(values: np.ndarray) -> np.ndarray:
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    return x - logsumexp(x)


def perplexity(logprobs: list[float] | np.ndarray) -> float:
    """`exp(-mean(logprobs))`; NaN for no tokens or a non-finite log-probability."""
    lp = np.asarray(logprobs, dtype=np.float64).reshape(-1)
    if lp.size == 0 or not np.isfinite(lp).all():
        return math.nan
    return math.exp(-float(lp.mean()))


def rank_of(values: np.ndarray, token: int) -> int:
    """1-based rank of `token` in `values` (ties to the lower id, as `top_ids`)."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    own = values[token]
    return int((values > own).sum() + (values[:token] == own).sum()) + 1


def in_support(
    logits: np.ndarray,
    token: int,
    *,
    temperature: float,
    top_k: int,
    top_p: float,
    tolerance: float = 1e-3,
) -> bool:
    """Whether sampling with these parameters can draw `token` from `logits`: within the
    top-k (its logit at least the k-th largest, less `tolerance`), and within the top-p
    nucleus (the mass strictly above it below top_p, plus `tolerance`)."""
    x = np.asarray(logits, dtype=np.float64).reshape(-1)
    if not (0 <= token < x.size) or not np.isfinite(x[token]):
        return False
    if 0 < top_k < x.size:
        kth = float(np.sort(x)[-top_k])
        if x[token] < kth - tolerance * max(1.0, abs(kth)):
            return False
        x = np.where(x >= kth - tolerance * max(1.0, abs(kth)), x, -np.inf)
    if top_p < 1.0:
        probs = np.exp(log_softmax(x / temperature))
        above = float(probs[probs > probs[token]].sum())
        if above >= top_p + tolerance:
            return False
    return True


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two equal-length vectors (the embedding metric: 1.0 is the
    same direction at any scale); a NaN or an infinity anywhere, or a zero vector, gives
    NaN, which fails any threshold."""
    pair = _finite_pair(a, b, "cosine")
    if pair is None:
        return math.nan
    x, y = pair
    nx, ny = math.sqrt(float(x @ x)), math.sqrt(float(y @ y))
    if nx == 0.0 or ny == 0.0:
        return math.nan
    return max(-1.0, min(1.0, float(x @ y) / (nx * ny)))
