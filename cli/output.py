"""One output object for every command: human (rich) or JSON, never both.

Commands hand it data; it decides how data looks. Diagnostics and tables render the
same way everywhere, and JSON goes to stdout alone so machines can parse it.

The JSON shape is one for every command, success and failure alike (`envelope`):
`{"ok": bool, ...the command's own keys..., "diagnostics": [...]}`, each diagnostic with
`code`, `severity`, `message`, `file`, `pointer`, `line`, `column` and `hint` (the fix).
Errors raised before a command could answer (a usage error, a bundle that cannot be
read) take the same shape (`error`), so a script parses one thing whatever happened.

Nothing internal reaches the user: the synthetic packages bundle modules import under
(`_ttb_<name>_<hash>`) are shown as the bundle wrote them (`public`).

Tables (`table`): piped (stdout not a terminal), plain aligned columns, one row a line,
no borders and no wrapping, for grep and awk; on a terminal, a table when it fits the
width, else one block per row that wraps between words, never inside one.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections.abc import Iterable
from enum import Enum
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ttbundles.codes import docs_page
from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.loader import public_names


class Format(str, Enum):
    human = "human"
    json = "json"


_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


def public(text: str) -> str:
    """`text` as a user may see it: no synthetic bundle package names."""
    return public_names(text)


def envelope(ok: bool, diagnostics: Iterable[Diagnostic] = (), **data: Any) -> dict:
    """The one JSON shape of every command: `ok`, the command's data, `diagnostics`."""
    return {"ok": ok, **data, "diagnostics": [d.to_dict() for d in diagnostics]}


def short_path(path: str | Path, *, verbose: bool = False, limit: int = 40) -> str:
    """A path as a table shows it: relative to the current folder or `~` when shorter,
    and at most `limit` characters: its last folders whole after ".../" (the bundle's own
    folder always whole, however long), never a name cut in the middle; whole with
    `verbose`."""
    text = str(path)
    if verbose or not text:
        return text
    candidates = [text]
    with contextlib.suppress(ValueError):  # another drive (Windows)
        candidates.append(os.path.relpath(text))
    home = str(Path.home())
    if text == home or text.startswith(home + os.sep):
        candidates.append("~" + text[len(home) :])
    text = min(candidates, key=len)
    if len(text) <= limit:
        return text
    parts = Path(text).parts
    kept = parts[-1]
    for part in reversed(parts[:-1]):
        longer = os.path.join(part, kept)
        if len(longer) + 4 > limit:
            break
        kept = longer
    return os.path.join("...", kept)


class Output:
    def __init__(self, fmt: Format = Format.human):
        self.format = fmt
        self.out = Console(soft_wrap=True, highlight=False)
        self.err = Console(stderr=True, soft_wrap=True, highlight=False)

    @property
    def is_json(self) -> bool:
        return self.format is Format.json

    def json(self, data: Any) -> None:
        text = json.dumps(data, indent=2, sort_keys=False, default=str)
        sys.stdout.write(public(text) + "\n")
        sys.stdout.flush()

    def result(self, ok: bool, diagnostics: Iterable[Diagnostic] = (), **data: Any) -> None:
        """A command's JSON answer, in the one shape (`envelope`)."""
        self.json(envelope(ok, diagnostics, **data))

    def error(self, diagnostics: list[Diagnostic]) -> None:
        """Why a command could not do its work: JSON on stdout, or text on stderr."""
        if self.is_json:
            self.result(False, diagnostics)
        else:
            self.diagnostics(diagnostics, stderr=True)

    def line(self, text: str = "", *, style: str | None = None) -> None:
        self.out.print(escape(public(text)), style=style)

    def plain(self, text: str) -> None:
        """Unstyled, unwrapped: for lines scripts read (a path, a digest)."""
        sys.stdout.write(public(text) + "\n")
        sys.stdout.flush()

    def diagnostics(self, diagnostics: list[Diagnostic], *, stderr: bool = False) -> None:
        console = self.err if stderr else self.out
        for d in diagnostics:
            where = public(d.location())
            head = f"[{_STYLE[d.severity]}]{d.severity.value} {d.code}[/]"
            message = escape(public(d.message))
            text = f"{escape(where)}: {head} {message}" if where else f"{head} {message}"
            console.print(text)
            if d.hint:  # the fix, and the page that explains the code
                fix = f"{public(d.hint)} (see {docs_page(d.code)})"
                console.print(f"    [dim]fix:[/] {escape(fix)}")
            elif d.is_error:
                console.print(f"    [dim]fix:[/] see {docs_page(d.code)}")

    def table(
        self, title: str, columns: list[str], rows: list[list[Any]], *, head: int | None = None
    ) -> None:
        """Rows under column names. Piped: plain aligned columns (`_plain_table`). On a
        terminal wide enough: a table whose cells never wrap. Narrower: one block per row,
        the first `head` cells on a line and the others below as "name: value", wrapped
        between words (a word is never split)."""
        cells = [[public("" if v is None else str(v)) or "-" for v in row] for row in rows]
        if not self.out.is_terminal:
            self._plain_table(title, columns, cells)
            return
        widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
        if sum(widths) + 3 * len(columns) <= self.out.width:
            table = Table(title=title, title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False)
            for column in columns:
                table.add_column(column, no_wrap=True)
            for row in cells:
                table.add_row(*(escape(v) for v in row))
            self.out.print(table)
            return
        self._record_table(title, columns, cells, head=head or 1)

    def _record_table(
        self, title: str, columns: list[str], rows: list[list[str]], *, head: int
    ) -> None:
        import textwrap

        width = max(self.out.width, 40)
        lines = [title, ""] if title else []
        for row in rows:
            first = "  ".join(row[:head])
            lines += textwrap.wrap(
                first, width, break_long_words=False, break_on_hyphens=False
            ) or [""]
            for name, value in zip(columns[head:], row[head:]):
                lines += textwrap.wrap(
                    f"{name}: {value}",
                    width,
                    initial_indent="    ",
                    subsequent_indent="      ",
                    break_long_words=False,
                    break_on_hyphens=False,
                )
        self.out.print(escape("\n".join(lines)), soft_wrap=True)

    def _plain_table(self, title: str, columns: list[str], rows: list[list[str]]) -> None:
        """Aligned columns separated by two spaces, one row a line, nothing wrapped."""
        widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(columns)]
        lines = [title] if title else []
        for row in [columns, *rows]:
            cells = [v.ljust(w) for v, w in zip(row, widths)]
            lines.append("  ".join(cells).rstrip())
        sys.stdout.write("\n".join(lines) + "\n")
        sys.stdout.flush()


def summary(diagnostics: list[Diagnostic]) -> str:
    errors = sum(1 for d in diagnostics if d.severity is Severity.ERROR)
    warnings = sum(1 for d in diagnostics if d.severity is Severity.WARNING)
    notes = sum(1 for d in diagnostics if d.severity is Severity.INFO)
    text = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    return text + (f", {notes} note{'s' * (notes != 1)}" if notes else "")


def requested_format(argv: list[str]) -> Format:
    """The `--format` the command line asks for, read before (or without) click's parse,
    so that an error raised while parsing is answered in JSON too."""
    for index, arg in enumerate(argv):
        if arg == "--":
            break
        value = None
        if arg in ("--format", "-f") and index + 1 < len(argv):
            value = argv[index + 1]
        elif arg.startswith("--format="):
            value = arg.partition("=")[2]
        elif arg.startswith("-f") and len(arg) > 2 and not arg.startswith("--"):
            value = arg[2:]
        if value == Format.json.value:
            return Format.json
    return Format.human
