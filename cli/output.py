"""One output object for every command: human (rich) or JSON, never both.

Commands hand it data; it decides how data looks. Diagnostics and tables render the
same way everywhere, and JSON goes to stdout alone so machines can parse it.
"""

from __future__ import annotations

import json
import sys
from enum import Enum
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ttbundles.errors import Diagnostic, Severity


class Format(str, Enum):
    human = "human"
    json = "json"


_STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "yellow", Severity.INFO: "cyan"}


class Output:
    def __init__(self, fmt: Format = Format.human):
        self.format = fmt
        self.out = Console(soft_wrap=True, highlight=False)
        self.err = Console(stderr=True, soft_wrap=True, highlight=False)

    @property
    def is_json(self) -> bool:
        return self.format is Format.json

    def json(self, data: Any) -> None:
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")

    def line(self, text: str = "", *, style: str | None = None) -> None:
        self.out.print(escape(text), style=style)

    def plain(self, text: str) -> None:
        """Unstyled, unwrapped: for lines scripts read (a path, a digest)."""
        sys.stdout.write(text + "\n")
        sys.stdout.flush()

    def diagnostics(self, diagnostics: list[Diagnostic], *, stderr: bool = False) -> None:
        console = self.err if stderr else self.out
        for d in diagnostics:
            where = d.location()
            head = f"[{_STYLE[d.severity]}]{d.severity.value} {d.code}[/]"
            text = (
                f"{escape(where)}: {head} {escape(d.message)}"
                if where
                else (f"{head} {escape(d.message)}")
            )
            console.print(text)
            if d.hint:
                console.print(f"    [dim]fix:[/] {escape(d.hint)}")

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        table = Table(title=title, title_justify="left", show_lines=False)
        for column in columns:
            table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(escape("" if v is None else str(v)) for v in row))
        self.out.print(table)


def summary(diagnostics: list[Diagnostic]) -> str:
    errors = sum(1 for d in diagnostics if d.severity is Severity.ERROR)
    warnings = sum(1 for d in diagnostics if d.severity is Severity.WARNING)
    notes = sum(1 for d in diagnostics if d.severity is Severity.INFO)
    text = f"{errors} error{'s' * (errors != 1)}, {warnings} warning{'s' * (warnings != 1)}"
    return text + (f", {notes} note{'s' * (notes != 1)}" if notes else "")
