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


def one_slip(word: str, option: str) -> bool:
    """`word` is `option` with one typing slip: two neighbours swapped (`--fromat`), one
    character wrong, missing or extra. Tighter than a did-you-mean, since a word that is
    not ours may be one of vLLM's options (`--load-format` is not a slip of `--format`)."""
    if word == option:
        return False
    if len(word) == len(option):
        diff = [i for i, (a, b) in enumerate(zip(word, option)) if a != b]
        if len(diff) == 1:
            return True
        return (
            len(diff) == 2
            and diff[1] == diff[0] + 1
            and word[diff[0]] == option[diff[1]]
            and word[diff[1]] == option[diff[0]]
        )
    short, long = sorted((word, option), key=len)
    if len(long) - len(short) != 1:
        return False
    return any(long[:i] + long[i + 1 :] == short for i in range(len(long)))


def slipped_option(args: Iterable[str], options: Iterable[str]) -> tuple[str, str] | None:
    """The first of `args` that is one of `options` (long ones) with one typing slip, as
    (what was typed, the option meant); None when there is none."""
    longs = [o for o in options if o.startswith("--")]
    for arg in args:
        typed = arg.partition("=")[0]
        meant = next((o for o in longs if one_slip(typed, o)), None)
        if meant is not None:
            return typed, meant
    return None
