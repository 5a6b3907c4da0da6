"""`ttbundle doctor`: will `vllm serve` start here, and if not, why.

The questions an operator asks before reading 200 lines of engine log: is TT-Metal's ttnn
findable, which mesh MESH_DEVICE names, will the platform plugin activate and why, which
vLLM and torch are installed, which bundles register for this mesh and which of them can
be imported here. Every answer comes from the code the server runs (the plugin's
`activation`, the one mesh parse, the registry, `servable`), never a parallel guess, and
nothing heavy is imported: vLLM and torch are looked up by their package metadata.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

from ttbundles import envs
from ttbundles.errors import Diagnostic, Severity, TTBundleError

# The entry points vLLM must load for ttbundles to serve (VLLM_PLUGINS filters by name).
PLATFORM_PLUGIN = "tt"
GENERAL_PLUGINS = ("tt_model_registry", "ttbundles")


@dataclass
class Check:
    """One line of the report: what was looked at, its state, what was found."""

    name: str
    status: str  # "ok", "warning", "error" or "info"
    detail: str

    def to_dict(self) -> dict[str, str]:
        return {"name": self.name, "status": self.status, "detail": self.detail}


@dataclass
class Report:
    checks: list[Check] = field(default_factory=list)
    problems: list[Diagnostic] = field(default_factory=list)
    mesh: str | None = None
    bundles: list[dict[str, Any]] = field(default_factory=list)
    vllm: dict[str, Any] | None = None  # the installed vLLM against the tested window

    @property
    def ok(self) -> bool:
        """Whether `vllm serve` would start: no error among the problems."""
        return not any(d.is_error for d in self.problems)

    def add(self, name: str, status: str, detail: str) -> None:
        self.checks.append(Check(name, status, detail))

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "mesh": self.mesh,
            "vllm": self.vllm,
            "checks": [c.to_dict() for c in self.checks],
            "bundles": self.bundles,
            "problems": [d.to_dict() for d in self.problems],
        }


def _version(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def diagnose(environ: Mapping[str, str] | None = None) -> Report:
    """The report for `environ` (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    report = Report()
    report.add("ttbundles", "info", _version("ttbundles") or "(not installed)")
    for name in ("vllm", "torch"):
        found = _version(name)
        if name == "vllm" and found:
            _vllm_window(report, found)
            continue
        report.add(name, "ok" if found else "error", found or "not installed")
        if not found:
            report.problems.append(
                Diagnostic(
                    "TTB108",
                    Severity.ERROR,
                    f"{name} is not installed in this Python: vllm serve cannot run",
                    hint="install ttbundles' dependencies (see docs/get-started/setup.md)",
                )
            )
    _ttnn_and_mesh(report, environ)
    _platform(report, environ)
    _trust(report, environ)
    _bundles(report, environ)
    return report


def _vllm_window(report: Report, found: str) -> None:
    """The installed vLLM against the tested window (`ttbundles.vllm_window`): in it, ok;
    outside, a warning (TTB217) naming both and what to do. JSON carries the window."""
    from ttbundles import vllm_window

    verdict = vllm_window.verdict(found)
    report.vllm = {
        "version": verdict.version,
        "tested_window": list(vllm_window.TESTED_VLLM),
        "in_window": verdict.tested,
        "relation": verdict.relation,
    }
    if verdict.tested:
        report.add("vllm", "ok", f"{found} (tested window: {vllm_window.window_text()})")
        return
    report.add("vllm", "warning", verdict.line())
    report.problems.append(
        Diagnostic(
            "TTB217",
            Severity.WARNING,
            verdict.problem(),
            hint=verdict.advice(),
        )
    )


def _trust(report: Report, environ: Mapping[str, str]) -> None:
    """The trust policy: permissive, or which keys and chains it trusts (TTB143 if the
    policy cannot be read: registration would refuse to start)."""
    from ttbundles.trust.policy import describe

    try:
        text = describe(environ)
    except TTBundleError as exc:
        report.add("trust policy", "error", "unusable: registration fails")
        report.problems.extend(exc.diagnostics)
        return
    report.add("trust policy", "info" if text.startswith("permissive") else "ok", text)


def _ttnn_and_mesh(report: Report, environ: Mapping[str, str]) -> None:
    from ttbundles.format.meshes import parse_mesh
    from ttbundles.registry.servable import device_problem
    from ttbundles.tt_metal import ttnn_origin

    origin = ttnn_origin()
    raw = envs.read("MESH_DEVICE", environ)
    mesh = None
    if raw:
        try:
            mesh = parse_mesh(raw)
        except TTBundleError as exc:
            report.problems.extend(exc.diagnostics)
    # A Tenstorrent mesh without ttnn: the missing piece is ttnn (the mesh itself is
    # fine), so the failure goes on the ttnn line.
    problem = device_problem(mesh) if mesh is not None else None
    if origin is not None:
        version = _version("ttnn")
        report.add("ttnn", "ok", f"{origin}" + (f" ({version})" if version else ""))
    elif problem is not None:
        report.add(
            "ttnn",
            "error",
            f"not importable (TT-Metal is not in this Python), and MESH_DEVICE={raw} needs it",
        )
    else:
        report.add("ttnn", "info", "not importable (TT-Metal is not in this Python)")
    if not raw:
        report.add("mesh", "info", "MESH_DEVICE is unset")
        return
    if mesh is None:
        report.add("mesh", "error", f"MESH_DEVICE={raw!r} is not a mesh")
        return
    report.mesh = mesh.name
    spelled = f" (MESH_DEVICE={raw})" if raw != mesh.name else ""
    report.add("mesh", "ok", f"{mesh.name}: {mesh.describe()}{spelled}")
    if problem is not None:
        report.problems.append(problem)


def _platform(report: Report, environ: Mapping[str, str]) -> None:
    from ttbundles.serving.plugin import activation

    active, why = activation(environ)
    status = (
        "error" if not active else ("ok" if report.mesh or not _mesh_set(environ) else "warning")
    )
    report.add("platform", status, ("activates: " if active else "inactive: ") + why)
    if not active:
        report.problems.append(
            Diagnostic(
                "TTB108",
                Severity.ERROR,
                f"the TT platform will not activate ({why}): vllm serve would fail with "
                "'Failed to infer device type'",
                hint="set MESH_DEVICE (HOST for the host mesh, or the card's preset), or run "
                "inside the TT-Metal environment",
            )
        )
    installed = {
        group: {
            e.name for e in metadata.entry_points(group=group) if e.value.startswith("ttbundles.")
        }
        for group in ("vllm.platform_plugins", "vllm.general_plugins")
    }
    missing = []
    if PLATFORM_PLUGIN not in installed["vllm.platform_plugins"]:
        missing.append(f"platform plugin {PLATFORM_PLUGIN!r}")
    if not set(GENERAL_PLUGINS) & installed["vllm.general_plugins"]:
        missing.append("general plugin 'tt_model_registry'")
    others = sorted(
        f"{e.name} ({e.value})"
        for e in metadata.entry_points(group="vllm.platform_plugins")
        if not e.value.startswith("ttbundles.")
    )
    allowed = envs.read("VLLM_PLUGINS", environ)
    detail = "entry points installed" if not missing else "missing: " + ", ".join(missing)
    detail += (
        f"; VLLM_PLUGINS={allowed}" if allowed is not None else "; VLLM_PLUGINS unset (all load)"
    )
    filtered = []
    if allowed is not None:
        names = {n.strip() for n in allowed.split(",") if n.strip()}
        if PLATFORM_PLUGIN not in names:
            filtered.append(PLATFORM_PLUGIN)
        if not names & set(GENERAL_PLUGINS):
            filtered.append("tt_model_registry")
    status = "error" if missing or filtered else ("warning" if others else "ok")
    report.add("plugins", status, detail)
    if missing:
        report.problems.append(
            Diagnostic(
                "TTB108",
                Severity.ERROR,
                f"vLLM cannot find ttbundles' {' and '.join(missing)}",
                hint="reinstall ttbundles into the Python that runs vllm (pip install ttbundles)",
            )
        )
    if filtered:
        report.problems.append(
            Diagnostic(
                "TTB108",
                Severity.ERROR,
                f"VLLM_PLUGINS={allowed} leaves out {', '.join(filtered)}: vLLM will not load "
                "the TT platform or register the bundles",
                hint=f"add them: VLLM_PLUGINS={allowed},{','.join(filtered)} (or unset it)",
            )
        )
    if others:
        report.problems.append(
            Diagnostic(
                "TTB108",
                Severity.WARNING,
                f"other platform plugins are installed: {', '.join(others)}; if one activates "
                "too, vLLM refuses to start ('Only one platform plugin can be activated')",
                hint="uninstall the other plugin, or list only ours in VLLM_PLUGINS",
            )
        )


def _bundles(report: Report, environ: Mapping[str, str]) -> None:
    from ttbundles.registry.registry import compute
    from ttbundles.registry.servable import mark_unservable, refusals

    if report.mesh is None and _mesh_set(environ):
        report.add("bundles", "info", "not computed: the mesh is invalid")
        return
    try:
        registry = compute(environ)
    except TTBundleError as exc:
        report.add("bundles", "error", "registration fails")
        report.problems.extend(d for d in exc.diagnostics if d not in report.problems)
        return
    unservable = mark_unservable(registry)
    refused = [d for d in refusals(registry, environ=environ) if d.code != "TTB107"]
    registered = [e for e in registry.entries if e.status.value in ("registered", "unservable")]
    servable = [e for e in registered if e.status.value == "registered"]
    report.bundles = [
        {
            "tt_arch": e.tt_arch,
            "bundle": e.metadata.name if e.metadata else None,
            "version": e.metadata.version if e.metadata else None,
            "source": e.source.value,
            "servable": e.status.value == "registered",
            "reason": e.reason,
            "signer": e.signer,
        }
        for e in registered
    ]
    skipped = [e for e in registry.entries if e.status.value == "skipped"]
    detail = f"{len(servable)} registered for mesh {registry.mesh or 'any'}"
    if servable:
        detail += ": " + ", ".join(f"{e.tt_arch} ({e.label})" for e in servable[:4])
        detail += ", ... (ttbundle list shows all)" if len(servable) > 4 else ""
    # What list folds into its count: the unservable entries and the listing entries
    # (architectures no tested vLLM serves, which ship no bundle).
    from ttbundles.registry.servable import listing_rows, not_servable_counts

    not_servable = [e.reason for e in registered if e.status.value == "unservable"]
    not_servable += [row["reason"] for row in listing_rows(registry)]
    if not_servable:
        # Split by why, so that the count agrees with the warnings below (TTB058 names
        # the classes not importable here; a TTB202 refusal is in its reason).
        counts = not_servable_counts(not_servable)
        detail += f"; {len(not_servable)} registered but not servable here: {counts}"
    if skipped:
        detail += f"; {len(skipped)} skipped"
    status = "error" if refused or not servable else ("warning" if unservable or skipped else "ok")
    report.add("bundles", status, detail)
    report.problems.extend(refused)
    if not refused:  # what strict mode would raise is already in `refused`
        report.problems.extend(d if not d.is_error else _as_warning(d) for d in registry.problems)
    report.problems.extend(unservable)
    if not servable:
        report.problems.append(
            Diagnostic(
                "TTB200",
                Severity.ERROR,
                f"no bundle registers a servable TT architecture for mesh "
                f"{registry.mesh or 'any'}: every model would be refused",
                hint="add bundles to EXTRA_MODELS_DIR, or check the mesh (ttbundle list)",
            )
        )


def _mesh_set(environ: Mapping[str, str]) -> bool:
    return envs.read("MESH_DEVICE", environ) is not None


def _as_warning(d: Diagnostic) -> Diagnostic:
    """A skipped bundle's error: the server starts without it (non-strict), a warning."""
    from dataclasses import replace

    return replace(d, severity=Severity.WARNING, message=d.message + " (bundle skipped)")
