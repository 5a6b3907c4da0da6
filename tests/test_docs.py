"""The README's table of error codes and `ttbundles.codes.CODES` say the same thing."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import pytest

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


# --- doc-tests: the README's runnable blocks ----------------------------------------------

RUNNABLE = re.compile(r"<!-- runnable:[^>]*-->\n```\n(.*?)\n```", re.DOTALL)
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


def runnable_blocks() -> list[str]:
    """The fenced blocks the README marks `<!-- runnable: ... -->`."""
    return RUNNABLE.findall(README.read_text(encoding="utf-8"))


def _commands(block: str) -> list[tuple[str, int, list[str]]]:
    """(command, expected exit status, expected output lines) for each `$` line."""
    out: list[tuple[str, int, list[str]]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            command = line[2:]
            found = EXIT.search(command)
            status = int(found.group(1)) if found else 0
            out.append((EXIT.sub("", command), status, []))
        else:
            out[-1][2].append(line)
    return out


def _pattern(lines: list[str]) -> re.Pattern:
    """The expected lines as a regex over the whole output: `...` matches anything (a
    line of `...` any number of lines), everything else literally."""
    parts = [".*?".join(re.escape(p) for p in line.split("...")) for line in lines]
    return re.compile(r"\A" + r"\n".join(parts) + r"\n?\Z", re.DOTALL)


def test_the_readme_has_runnable_blocks():
    assert runnable_blocks(), "README.md lost its runnable examples"


@pytest.mark.parametrize("index", range(len(runnable_blocks())))
def test_readme_runnable_block(index, tmp_path):
    """Each command as a user types it (a shell, relative paths, output piped), in a
    fresh folder with a copy of the demo bundle at ./demo; its exit status and its
    output (stdout, then stderr) as the README shows them."""
    import os
    import shutil
    import subprocess

    from ttbundles.paths import builtin_bundles_dir

    shutil.copytree(builtin_bundles_dir() / "demo", tmp_path / "demo")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TT_", "EXTRA_MODELS"))}
    env.update({"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb", "HF_HUB_OFFLINE": "1"})
    env.pop("MESH_DEVICE", None)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    for command, status, expected in _commands(runnable_blocks()[index]):
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        output = done.stdout + done.stderr
        assert done.returncode == status, f"$ {command}\n{output}"
        assert "Traceback" not in output
        if expected:
            assert _pattern(expected).match(output), f"$ {command}\n{output}"
