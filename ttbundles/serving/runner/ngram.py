"""The host n-gram proposer (vLLM's `ngram` method, "prompt lookup decoding"): drafts are
the tokens that followed the last earlier occurrence of the sequence's own suffix.

vLLM's proposers cannot run here: 0.33.0's `NgramProposer` is numba-compiled
(`vllm/v1/spec_decode/ngram_proposer.py`; numba is not a dependency of an `empty` build),
0.34.0's is two Triton kernels (`vllm/v1/worker/gpu/spec_decode/ngram/speculator.py`).
This is numpy with the same semantics, both of them, because they differ and a user
compares us with the release they run (`serving.compat.NGRAM_STYLE` says which):

- both: the longest n in [prompt_lookup_min, prompt_lookup_max] whose last-n tokens
  occur earlier in the sequence (the occurrence ends before the last token); the drafts
  are the tokens after that occurrence, at most K;
- 0.33.0 ("earliest"): of the occurrences of that longest n, the earliest; fewer than K
  drafts when fewer tokens follow it, none without a match, K capped so that the sequence
  stays within max_model_len;
- 0.34.0 ("latest, padded"): the latest occurrence; always K drafts, the slots past the
  available tokens (or all K, without a match) filled with the last token (they are
  verified and rejected like any draft; the fill only costs acceptance).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

NgramStyle = Literal["earliest", "latest_padded"]


@dataclass(frozen=True)
class NgramProposer:
    """`propose(tokens)`: the drafts for one sequence (its prompt and outputs)."""

    min_n: int
    max_n: int
    k: int
    max_model_len: int
    style: NgramStyle

    def propose(self, tokens: np.ndarray) -> list[int]:
        total = len(tokens)
        k = self.k
        padded = self.style == "latest_padded"
        if not padded:
            k = min(k, self.max_model_len - total)
            if k <= 0 or total < self.min_n:
                return []
        start = self._draft_start(tokens)
        if start is None:
            return [int(tokens[-1])] * k if padded and total else []
        drafts = tokens[start : start + k].tolist()
        if padded and len(drafts) < k:
            drafts += [int(tokens[-1])] * (k - len(drafts))
        return [int(t) for t in drafts]

    def _draft_start(self, tokens: np.ndarray) -> int | None:
        """Where the drafts begin: just after the chosen occurrence of the suffix."""
        total = len(tokens)
        for n in range(min(self.max_n, total - 1), self.min_n - 1, -1):
            # Windows starting at 0 .. total - n - 1: each ends before the last token.
            count = total - n
            if count <= 0:
                continue
            windows = np.lib.stride_tricks.sliding_window_view(tokens[: total - 1], n)
            matches = np.flatnonzero((windows[:count] == tokens[total - n :]).all(axis=1))
            if len(matches):
                position = int(matches[0] if self.style == "earliest" else matches[-1])
                return position + n
        return None
