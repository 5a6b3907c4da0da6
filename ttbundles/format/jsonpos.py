"""Where a JSON pointer lands in a document's text, as line and column.

Only called when a diagnostic needs a location, so validating a good file never pays for
it. The text has already been parsed by `json.loads`, so this scanner can assume it is
well-formed and stay small.
"""

from __future__ import annotations

import json
import re

_WS = re.compile(r"[ \t\n\r]*")
_decoder = json.JSONDecoder()


def escape(token: str) -> str:
    """One RFC 6901 reference token."""
    return token.replace("~", "~0").replace("/", "~1")


def pointer(path: tuple | list) -> str:
    """An RFC 6901 pointer from a sequence of keys and indices."""
    return "".join("/" + escape(str(p)) for p in path)


def locate(text: str) -> dict[str, tuple[int, int]]:
    """Map every pointer in the document to the 1-based (line, column) of its value.

    For object members, `<pointer>#key` maps to the position of the key itself, which is
    where an "unknown key" diagnostic should point.
    """
    positions: dict[str, int] = {}
    _scan(text, _skip(text, 0), "", positions)
    line_starts = [0] + [m.end() for m in re.finditer(r"\n", text)]

    def to_line_col(offset: int) -> tuple[int, int]:
        lo, hi = 0, len(line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - line_starts[lo] + 1

    return {p: to_line_col(o) for p, o in positions.items()}


def _skip(text: str, i: int) -> int:
    return _WS.match(text, i).end()  # type: ignore[union-attr]


def _scan(text: str, i: int, path: str, out: dict[str, int]) -> int:
    out[path] = i
    ch = text[i]
    if ch == "{":
        i = _skip(text, i + 1)
        if text[i] == "}":
            return i + 1
        while True:
            key_start = i
            key, i = _decoder.raw_decode(text, i)
            child = f"{path}/{escape(key)}"
            out[f"{child}#key"] = key_start
            i = _skip(text, i)
            i = _skip(text, i + 1)  # the colon
            i = _skip(text, _scan(text, i, child, out))
            if text[i] == ",":
                i = _skip(text, i + 1)
                continue
            return i + 1
    if ch == "[":
        i = _skip(text, i + 1)
        if text[i] == "]":
            return i + 1
        index = 0
        while True:
            i = _skip(text, _scan(text, i, f"{path}/{index}", out))
            index += 1
            if text[i] == ",":
                i = _skip(text, i + 1)
                continue
            return i + 1
    _, end = _decoder.raw_decode(text, i)
    return end
