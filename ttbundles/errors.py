"""One error root and one diagnostic shape for everything ttbundles reports.

Every problem a user can cause is a `Diagnostic` with a stable code, so the CLI, the
registry's startup report and `--format json` consumers all speak the same language.
Exceptions carry diagnostics; the CLI decides how to render them (never a traceback).
"""

from __future__ import annotations

import contextlib
import enum
import os
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


@dataclass(frozen=True)
class Diagnostic:
    """A problem found in a bundle, an archive or a configuration.

    `pointer` is an RFC 6901 JSON pointer into `file` when the problem is in a JSON
    document; `line`/`column` are 1-based where known.
    """

    code: str
    severity: Severity
    message: str
    file: str | None = None
    pointer: str | None = None
    line: int | None = None
    column: int | None = None
    hint: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def location(self) -> str:
        """`file:line:col#pointer`, as much of it as is known."""
        parts = self.file or ""
        if self.line is not None:
            parts += f":{self.line}"
            if self.column is not None:
                parts += f":{self.column}"
        if self.pointer is not None:
            parts += f" {self.pointer or '/'}"
        return parts.strip()

    def to_dict(self) -> dict:
        data = asdict(self)
        data["severity"] = self.severity.value
        return data

    def __str__(self) -> str:
        where = self.location()
        text = f"{self.severity.value} {self.code}: {self.message}"
        if where:
            text = f"{where}: {text}"
        if self.hint:
            text += f" (fix: {self.hint})"
        return text


@dataclass
class Report:
    """Diagnostics collected over one run; reported together, never one at a time."""

    diagnostics: list[Diagnostic] = field(default_factory=list)

    def add(self, diagnostic: Diagnostic) -> None:
        self.diagnostics.append(diagnostic)

    def extend(self, diagnostics: Iterable[Diagnostic]) -> None:
        self.diagnostics.extend(diagnostics)

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.ERROR]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.WARNING]

    def effective(
        self, strict: bool = False, strict_unverifiable: bool = False
    ) -> list[Diagnostic]:
        """The diagnostics with the severities a strict run gives them.

        `strict` makes warnings errors, except the unverifiable ones (`codes.UNVERIFIABLE`:
        "could not be checked here", not "wrong"); `strict_unverifiable` makes those
        errors, notes included.
        """
        from ttbundles.codes import UNVERIFIABLE

        def severity(d: Diagnostic) -> Severity:
            if d.code in UNVERIFIABLE:
                return Severity.ERROR if strict_unverifiable else d.severity
            if strict and d.severity is Severity.WARNING:
                return Severity.ERROR
            return d.severity

        return [
            d if severity(d) is d.severity else replace(d, severity=severity(d))
            for d in self.diagnostics
        ]

    def ok(self, strict: bool = False, strict_unverifiable: bool = False) -> bool:
        """Valid: no errors once `effective` has applied the strictness asked for."""
        return not any(d.is_error for d in self.effective(strict, strict_unverifiable))


class TTBundleError(Exception):
    """Root of every exception ttbundles raises on purpose.

    Carries one or more diagnostics; `str()` renders them one per line.
    """

    def __init__(self, diagnostics: Diagnostic | Iterable[Diagnostic]):
        if isinstance(diagnostics, Diagnostic):
            diagnostics = [diagnostics]
        self.diagnostics: list[Diagnostic] = list(diagnostics)
        super().__init__("\n".join(str(d) for d in self.diagnostics))

    @classmethod
    def single(
        cls,
        code: str,
        message: str,
        *,
        file: str | Path | None = None,
        pointer: str | None = None,
        hint: str | None = None,
    ) -> TTBundleError:
        return cls(
            Diagnostic(
                code=code,
                severity=Severity.ERROR,
                message=message,
                file=str(file) if file is not None else None,
                pointer=pointer,
                hint=hint,
            )
        )


class InvalidBundleError(TTBundleError):
    """A bundle failed validation."""


class ArchiveError(TTBundleError):
    """An archive is malformed, tampered with, or unsafe to extract."""


class InstallError(TTBundleError):
    """An install or uninstall could not be carried out."""


class ConfigurationError(TTBundleError):
    """A vLLM configuration cannot be served by the selected bundle."""


def missing_path(path: str | Path, *, what: str = "file or folder") -> Diagnostic:
    """The one diagnostic for a path the user gave that does not exist (TTB001), whatever
    the command: scripts match one code for one condition."""
    return Diagnostic(
        "TTB001",
        Severity.ERROR,
        f"no such {what}",
        file=str(path),
        hint="check the path (relative paths are read from the current folder)",
    )


def relocated(
    diagnostics: Iterable[Diagnostic], folder: str | Path, shown: str
) -> list[Diagnostic]:
    """`diagnostics` naming `shown` (the archive, registry reference or folder the user
    gave) wherever they name `folder`, a work folder of ours that is gone by the time the
    user reads them: in the file, the message and the hint ("reproduce with: ttbundle
    validate --import <our temporary copy>" is no use)."""
    import re

    prefixes = sorted({str(folder), os.path.realpath(folder)}, key=len, reverse=True)
    # A file inside an archive is `ARCHIVE!/path`; the folder itself, as a command's
    # argument, is the archive.
    pattern = re.compile("|".join(re.escape(p) for p in prefixes) + r"(?P<inside>/)?")
    whole = shown[:-1] if shown.endswith("!") else shown

    def swap(match: re.Match) -> str:
        return shown + "/" if match.group("inside") else whole

    out = []
    for d in diagnostics:
        changes = {}
        for name in ("file", "message", "hint"):
            text = getattr(d, name)
            if not text:
                continue
            text = pattern.sub(swap, text)
            if text != getattr(d, name):
                changes[name] = text
        out.append(replace(d, **changes) if changes else d)
    return out


@contextlib.contextmanager
def shown_as(folder: str | Path, shown: str) -> Iterator[None]:
    """Errors raised inside name `shown` where they would name `folder` (`relocated`)."""
    try:
        yield
    except TTBundleError as exc:
        exc.diagnostics = relocated(exc.diagnostics, folder, shown)
        exc.args = ("\n".join(str(d) for d in exc.diagnostics),)
        raise
