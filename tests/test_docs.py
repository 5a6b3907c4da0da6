"""The docs say what the code does: generated pages are current, examples run.

- The reference pages under docs/reference/ (all but commands.md) are what
  `scripts/gen-docs` writes from the code; a page out of date fails here.
- Every error code has what to do (`codes.WHAT_TO_DO`) and an anchor the CLI's fix lines
  name (`codes.docs_page`).
- Fenced blocks marked `<!-- runnable: ... -->` in README.md and docs/ run as a user
  types them; `<!-- runnable server: ... -->` ones need vLLM and run in the slow tier.
- The site builds with `mkdocs build --strict` (broken links and anchors, pages missing
  from the navigation), and the README stays short, its links pointing at files.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ttbundles.codes import CODES, WHAT_TO_DO, docs_page

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
CODE = re.compile(r"\bTTB\d{3}\b")


def _generator():
    spec = importlib.util.spec_from_file_location("gen_docs", ROOT / "scripts" / "gen_docs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- generated pages --------------------------------------------------------------------


def test_generated_reference_pages_are_current():
    """docs/reference/*.md as scripts/gen-docs writes them from the code, byte for byte."""
    stale = _generator().stale_pages()
    assert stale == [], f"out of date: {stale}; run scripts/gen-docs and commit the pages"


def test_every_code_says_what_to_do():
    assert [code for code in CODES if not WHAT_TO_DO.get(code, "").strip()] == [], (
        "add what to do about these codes to ttbundles.codes.WHAT_TO_DO"
    )
    assert sorted(set(WHAT_TO_DO) - set(CODES)) == []


def test_codes_are_well_formed():
    assert all(CODE.fullmatch(code) for code in CODES)
    assert all(text and text == text.strip() for text in CODES.values())


def test_every_code_has_the_anchor_its_fix_line_names():
    page = (DOCS / "reference" / "codes.md").read_text(encoding="utf-8")
    for code in CODES:
        path, anchor = docs_page(code).split("#")
        assert (ROOT / path).is_file()
        assert f"{{#{anchor}}}" in page, code


def test_the_codes_page_lists_each_code_once():
    page = (DOCS / "reference" / "codes.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (TTB\d{3}) ", page, re.MULTILINE)
    assert headings == list(CODES)


def test_every_environment_variable_is_documented():
    from ttbundles import envs

    page = (DOCS / "reference" / "environment.md").read_text(encoding="utf-8")
    table = page.split("\n## ")[0]
    rows = re.findall(r"^\| `([A-Z_0-9]+)` \|", table, re.MULTILINE)
    assert sorted(rows) == sorted(n for n in dir(envs) if n.isupper() and n != "RENAMED")


# --- the site and the README ------------------------------------------------------------


def test_the_docs_site_builds_strictly(tmp_path):
    """`mkdocs build --strict`: every page in the navigation, every link and anchor found."""
    # mkdocs comes with the `docs` extra, which scripts/setup installs.
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_readme_is_short():
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 150


def test_the_quick_start_is_the_two_commands_ci_runs():
    """README's quick start is `./scripts/demo` and `./scripts/test`; CI runs the second."""
    text = README.read_text(encoding="utf-8")
    quick = text.split("## Quick start", 1)[1]
    assert quick.split("```")[1].split() == ["./scripts/demo", "./scripts/test"]
    assert "./scripts/test" in (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert all(os.access(ROOT / "scripts" / name, os.X_OK) for name in ("demo", "test"))


def test_the_readme_links_to_files_that_exist():
    links = re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", README.read_text(encoding="utf-8"))
    local = [link for link in links if "://" not in link]
    assert local, "README.md links into the docs"
    assert [link for link in local if not (ROOT / link).exists()] == []


# --- runnable blocks --------------------------------------------------------------------

RUNNABLE = re.compile(r"<!-- runnable( server)?:[^>]*-->\n```[a-z]*\n(.*?)\n```", re.DOTALL)
EXIT = re.compile(r"\s+#\s*exit\s+(\d+)\s*$")


def _documents() -> list[Path]:
    return [README, *sorted(DOCS.rglob("*.md"))]


def runnable_blocks() -> list[tuple[str, bool, str]]:
    """(where, needs a server, block) for each fenced block marked runnable."""
    found = []
    for path in _documents():
        text = path.read_text(encoding="utf-8")
        for index, match in enumerate(RUNNABLE.finditer(text)):
            where = f"{path.relative_to(ROOT)}:{index}"
            found.append((where, bool(match.group(1)), match.group(2)))
    return found


def _cases() -> list:
    return [
        pytest.param(block, id=where, marks=[pytest.mark.server] if server else [])
        for where, server, block in runnable_blocks()
    ]


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


def test_the_docs_have_runnable_blocks():
    blocks = runnable_blocks()
    assert any(not server for _, server, _ in blocks), "the docs lost their fast examples"
    assert any(server for _, server, _ in blocks), "the docs lost their served examples"


@pytest.mark.parametrize("block", _cases())
def test_runnable_block(block, tmp_path):
    """Each command as a user types it (a shell, relative paths, output piped), in a
    fresh folder with a copy of the demo bundle at ./demo; its exit status and its
    output (stdout, then stderr) as the page shows them."""
    from ttbundles.paths import builtin_bundles_dir

    # Without the evidence the demo ships with: the pages edit their copy, which would
    # make it stale (TTB114) in outputs that are about something else.
    shutil.copytree(
        builtin_bundles_dir() / "demo", tmp_path / "demo", ignore=shutil.ignore_patterns("evidence")
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TT_", "EXTRA_MODELS"))}
    env.update({"COLUMNS": "250", "NO_COLOR": "1", "TERM": "dumb", "HF_HUB_OFFLINE": "1"})
    env.pop("MESH_DEVICE", None)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    for command, status, expected in _commands(block):
        done = subprocess.run(
            command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300
        )
        output = done.stdout + done.stderr
        assert done.returncode == status, f"$ {command}\n{output}"
        assert "Traceback" not in output
        if expected:
            assert _pattern(expected).match(output), f"$ {command}\n{output}"


def test_the_demo_set_up_installs_only_what_the_demo_needs():
    """./scripts/demo runs scripts/setup: no OCI registry there (apt-get, as root); the
    distribution tests' registry is installed by scripts/test, before the shared set-up."""
    scripts = Path(__file__).resolve().parents[1] / "scripts"
    for shared in ("setup", "demo"):
        text = (scripts / shared).read_text()
        assert "apt-get" not in text and "docker-registry" not in text, shared
    test = (scripts / "test").read_text()
    assert test.index("apt-get install") < test.index("scripts/setup\n")
    assert "docker-registry apache2-utils" in test
    assert "scripts/setup" in (scripts / "demo").read_text()


def test_the_generator_contract_has_one_section_per_concept_and_a_runnable_drafter():
    """One "## Speculative decoding" (two that disagreed confused authors); the page's
    propose_draft_tokens snippet runs as written; the page says how to start a drafter."""
    page = Path(__file__).resolve().parents[1] / "docs" / "authors" / "generator-contract.md"
    text = page.read_text()
    headings = [line for line in text.splitlines() if line.startswith("## ")]
    titles = [h.split(" {#")[0] for h in headings]
    assert len(titles) == len(set(titles)), titles
    # the old section's claim, untrue since the logits accept mode is served
    assert "`accept_modes` including `argmax_ids`" not in text
    [snippet] = [
        block
        for block in re.findall(r"```python\n(.*?)```", text, flags=re.S)
        if "def propose_draft_tokens" in block
    ]
    exec(compile(snippet, str(page), "exec"), {"__name__": "snippet"})
    assert "**Starting a drafter.**" in text and "bundles/demo-drafter" in text
