"""Did-you-mean suggestions for every "unknown name" diagnostic, computed one way."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


def did_you_mean(word: str, candidates: Iterable[str]) -> str | None:
    """The closest candidate, compared case-insensitively, or None when nothing is close."""
    ranked = close_names(word, candidates)
    return ranked[0] if ranked else None


def close_names(word: str, candidates: Iterable[str], *, n: int = 3) -> list[str]:
    """Up to `n` candidates close to `word` (case-insensitively), closest first.

    difflib decides what is close, but its ratio favours the longer of two names one
    keystroke away (`N150X` is nearer `N150x4` than `N150` by it): the order is the
    number of typing slips instead, and at equal slips the candidates' own order, which
    lists the plain name before its variants."""
    pool: dict[str, tuple[int, str]] = {}
    for index, candidate in enumerate(candidates):
        pool.setdefault(candidate.lower(), (index, candidate))
    typed = word.lower()
    close = difflib.get_close_matches(typed, list(pool), n=len(pool) or 1, cutoff=0.6)
    close.sort(key=lambda name: (slips(typed, name), pool[name][0]))
    return [pool[name][1] for name in close[:n]]


def slips(word: str, other: str) -> int:
    """The typing slips between two words: characters wrong, missing or extra, and two
    neighbours swapped, each one (the optimal string alignment distance)."""
    rows = [list(range(len(other) + 1))]
    for i, a in enumerate(word, 1):
        row = [i]
        for j, b in enumerate(other, 1):
            cost = min(rows[-1][j] + 1, row[j - 1] + 1, rows[-1][j - 1] + (a != b))
            if i > 1 and j > 1 and a == other[j - 2] and word[i - 2] == b:
                cost = min(cost, rows[-2][j - 2] + 1)
            row.append(cost)
        rows.append(row)
    return rows[-1][-1]


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
