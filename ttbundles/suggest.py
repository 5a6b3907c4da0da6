"""Did-you-mean suggestions for every "unknown name" diagnostic, computed one way."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate, compared case-insensitively, or None when nothing is close."""
    pool = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(word.lower(), list(pool), n=1, cutoff=0.6)
    return pool[match[0]] if match else None


def hint_for(word: str, candidates: Iterable[str], *, what: str = "") -> str:
    """A fix hint: 'did you mean X?' or the list of allowed names."""
    candidates = list(candidates)
    best = did_you_mean(word, candidates)
    if best is not None:
        return f"did you mean {best!r}?"
    allowed = ", ".join(repr(c) for c in candidates)
    return f"use one of {allowed}" if not what else f"use one of the {what}: {allowed}"
