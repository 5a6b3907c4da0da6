"""The README's table of error codes and `ttbundles.codes.CODES` say the same thing."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

from ttbundles.codes import CODES, markdown_table

README = Path(__file__).parents[1] / "README.md"
CODE = re.compile(r"\bTTB\d{3}\b")


def table_codes() -> Counter:
    """Codes in the first cell of the README's Markdown table rows."""
    found: Counter = Counter()
    for line in README.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.lstrip().startswith("|") and cells:
            found.update(CODE.findall(cells[0]))
    return found


def test_every_code_is_documented():
    documented = table_codes()
    missing = [code for code in CODES if code not in documented]
    assert missing == [], f"add these codes to the README's error-code table: {missing}"


def test_table_lists_no_unknown_or_repeated_code():
    documented = table_codes()
    assert sorted(set(documented) - set(CODES)) == []
    assert [code for code, n in documented.items() if n > 1] == []


def test_codes_are_well_formed():
    assert all(CODE.fullmatch(code) for code in CODES)
    assert all(text and text == text.strip() for text in CODES.values())


def test_the_readme_table_is_generated_from_the_catalogue():
    """The README's table is `codes.markdown_table()`, row for row and word for word."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Error codes") :]
    section = section[: section.index("\n## ", 1)]
    assert markdown_table() in section, "regenerate the README's table from ttbundles.codes"
