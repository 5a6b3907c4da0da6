"""Before a vLLM upgrade: which bundles would still register on another vLLM release.

`ttbundle compat VERSION` asks this without installing anything: each installed and
built-in bundle's `requires.vllm` is held against VERSION (its other requirements against
this machine, as the registry checks them), and VERSION against the tested window
(`ttbundles.vllm_window`). Pure over the registry's own computation, so the answer is the
one the plugin would give after the upgrade, less what only the new vLLM could tell.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ttbundles import vllm_window
from ttbundles.errors import Diagnostic, Severity
from ttbundles.registry.registry import Status, compute
from ttbundles.registry.requirements import unmet
from ttbundles.registry.servable import mark_unservable


@dataclass(frozen=True)
class BundleOnRelease:
    """One bundle's fate on the asked release."""

    tt_arch: str | None
    bundle: str | None
    source: str
    path: str
    now: str  # its status on this machine
    registers: bool  # on the asked release
    reason: str  # why not, or "" when it registers
    # Whether this machine can serve it (`ttbundle list`'s word): a built-in whose class
    # is not importable here registers on any release and is still served by none.
    servable: bool = True

    @property
    def verdict(self) -> str:
        """The asked release's column, in `ttbundle list`'s words."""
        if not self.registers:
            return "does not register"
        return "registers" if self.servable else "registers, not servable here"

    def to_dict(self) -> dict[str, Any]:
        return {
            "tt_arch": self.tt_arch,
            "bundle": self.bundle,
            "source": self.source,
            "path": self.path,
            "status_now": self.now,
            "registers": self.registers,
            "servable": self.servable,
            "reason": self.reason,
        }


@dataclass
class UpgradeReport:
    version: str
    verdict: vllm_window.WindowVerdict
    bundles: list[BundleOnRelease] = field(default_factory=list)
    problems: list[Diagnostic] = field(default_factory=list)

    @property
    def lost(self) -> list[BundleOnRelease]:
        """Bundles that register now and would not on the asked release."""
        return [b for b in self.bundles if b.now == Status.REGISTERED.value and not b.registers]

    @property
    def ok(self) -> bool:
        """Safe to upgrade as far as ttbundles can tell: in the window, nothing lost."""
        return self.verdict.tested and not self.lost

    def to_dict(self) -> dict[str, Any]:
        return {
            "vllm": self.version,
            "tested_window": list(vllm_window.TESTED_VLLM),
            "in_window": self.verdict.tested,
            "relation": self.verdict.relation,
            "bundles": [b.to_dict() for b in self.bundles],
        }


def check_release(
    version: str,
    *,
    models_dirs: Sequence[Path] | None = None,
    mesh: str | None = None,
) -> UpgradeReport:
    """What would register on vLLM `version` (a release such as "0.34.0"); raises
    ValueError for a string that is not a version."""
    try:
        asked = Version(vllm_window.public_version(version))
    except InvalidVersion as error:
        raise ValueError(f"{version!r} is not a vLLM version (e.g. 0.34.0)") from error
    report = UpgradeReport(str(asked), vllm_window.verdict(str(asked)))
    registry = compute(mesh=mesh, models_dirs=models_dirs)
    # As `ttbundle list` does: what this machine cannot serve is not called registered.
    mark_unservable(registry)
    for entry in registry.entries:
        facts = entry.facts
        if facts is None:  # invalid metadata: it registers on no release
            continue
        requires = dict(facts.requires or {})
        spec = requires.pop("vllm", None)
        reasons = []
        if spec:
            try:
                if not SpecifierSet(spec).contains(asked, prereleases=True):
                    reasons.append(f"requires vllm{spec}")
            except InvalidSpecifier:
                reasons.append(f"requires vllm{spec} (not a version specifier)")
        reasons += unmet(requires) if any(requires.values()) else []
        invalid = entry.status is Status.SKIPPED and not entry.reason.startswith("TTB100")
        if invalid:
            reasons.append(entry.reason)
        servable = entry.status is not Status.UNSERVABLE
        # Why it is not servable, when nothing else keeps it from registering.
        reasons_shown = "; ".join(reasons) if reasons or servable else entry.reason
        report.bundles.append(
            BundleOnRelease(
                tt_arch=entry.tt_arch,
                bundle=facts.name,
                source=entry.source.value,
                path=str(entry.path),
                now=entry.status.value,
                registers=not reasons,
                reason=reasons_shown,
                servable=servable,
            )
        )
    if not report.verdict.tested:
        report.problems.append(
            Diagnostic(
                "TTB217", Severity.WARNING, report.verdict.problem(), hint=report.verdict.advice()
            )
        )
    for lost in report.lost:
        report.problems.append(
            Diagnostic(
                "TTB218",
                Severity.ERROR,
                f"{lost.bundle} ({lost.tt_arch}) registers now but not on vLLM {asked}: "
                f"{lost.reason}",
                file=lost.path,
                pointer="/requires/vllm",
                hint="install a release of the bundle that declares the new vLLM, or stay on "
                "the current one",
            )
        )
    return report
