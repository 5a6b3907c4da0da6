"""The vLLM releases ttbundles is tested on (the window), and how a version compares.

A low layer on purpose: the plugin's load-time check, `ttbundle doctor` and
`ttbundle list --vllm` read it, and none of them may import vLLM (the plugin runs in
every vLLM process, the CLI must answer where vLLM is absent). What differs between the
releases of the window lives in `ttbundles.serving.compat`, the one module to re-read
at the next bump; this module only names the releases.

Moving the window forward: add the release here and in `scripts/setup`, widen the range
in `pyproject.toml`, then work through `ttbundles.serving.compat` (see
docs/operators/upgrading-vllm.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import metadata

from packaging.version import InvalidVersion, Version

TESTED_VLLM: tuple[str, ...] = ("0.33.0", "0.34.0")
"""Every release the whole suite runs on, oldest first."""

DEFAULT_VLLM = TESTED_VLLM[-1]
"""The release `scripts/setup` installs into `.venv` (the newest of the window)."""


def window_text() -> str:
    """The window as people read it: "0.33.0 and 0.34.0"."""
    if len(TESTED_VLLM) == 1:
        return TESTED_VLLM[0]
    return ", ".join(TESTED_VLLM[:-1]) + " and " + TESTED_VLLM[-1]


def public_version(version: str) -> str:
    """A version without its local part: an empty-device build calls itself 0.34.0+empty
    (or keeps 0.34.0 through VLLM_VERSION_OVERRIDE); both are release 0.34.0."""
    return version.split("+", 1)[0].strip()


def installed_vllm() -> str | None:
    """The installed vLLM's release (its distribution metadata; vLLM is not imported),
    or None where vLLM is not installed."""
    try:
        return public_version(metadata.version("vllm"))
    except metadata.PackageNotFoundError:
        return None


@dataclass(frozen=True)
class WindowVerdict:
    """Where a vLLM release stands against the window."""

    version: str
    tested: bool  # one of TESTED_VLLM exactly
    relation: str  # "tested", "older", "newer", "between" or "invalid"

    def advice(self) -> str:
        """What to do about it, in one clause."""
        if self.tested:
            return "nothing to do"
        if self.relation == "older":
            return f"upgrade vLLM to {DEFAULT_VLLM} (pip install 'vllm=={DEFAULT_VLLM}')"
        if self.relation == "newer":
            return (
                f"install a tested release (pip install 'vllm=={DEFAULT_VLLM}') or a "
                "ttbundles release whose window includes it"
            )
        return f"install a tested release (pip install 'vllm=={DEFAULT_VLLM}')"

    def problem(self) -> str:
        """What is wrong, without the advice (a diagnostic carries that as its fix)."""
        if self.relation == "invalid":
            return f"vLLM version {self.version!r} cannot be read as a release"
        return f"vLLM {self.version} is outside the tested window ({window_text()})"

    def line(self) -> str:
        """One line for a log or a report."""
        if self.tested:
            return f"vLLM {self.version} is in the tested window ({window_text()})"
        if self.relation == "invalid":
            return f"vLLM version {self.version!r} cannot be read as a release"
        return (
            f"vLLM {self.version} is outside the tested window ({window_text()}): {self.advice()}"
        )


def verdict(version: str) -> WindowVerdict:
    """Where `version` stands: tested, older or newer than the window, or between two of
    its releases (a patch release the suite has not run on)."""
    version = public_version(version)
    if version in TESTED_VLLM:
        return WindowVerdict(version, True, "tested")
    try:
        asked = Version(version)
    except InvalidVersion:
        return WindowVerdict(version, False, "invalid")
    if asked < Version(TESTED_VLLM[0]):
        return WindowVerdict(version, False, "older")
    if asked > Version(TESTED_VLLM[-1]):
        return WindowVerdict(version, False, "newer")
    return WindowVerdict(version, False, "between")
