"""A bundle's support card: per target mesh and feature, tested, served or refused.

- **tested**: the bundle's evidence on that mesh (`archive.evidence`, fresh and passed)
  covers the feature through a `ttbundle test` path;
- **served**: the plan admits it (the bundle declares it), with no evidence for it;
- **refused**: the plan refuses it or turns it off, with the code it gives.

A mesh measured by `ttbundle bench --keep-evidence` also shows its figures (median TTFT,
TPOT, output throughput per workload), with the same staleness.

The plan's verdict is derived from the metadata as the plan derives it (the capabilities
gate each feature), without importing vLLM: a card is printed where no vLLM need be.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ttbundles.archive.evidence import Evidence, mesh_status, read_evidence
from ttbundles.archive.evidence import evidence_status as evidence_status  # list, inspect
from ttbundles.check.tests_section import POOLING_PATHS, generates
from ttbundles.format.capabilities import CAPABILITIES, Capability
from ttbundles.format.metadata import BundleMetadata

ANY_MESH = "any"
TT_METAL_STATUS = "x-tt-metal-status"
# Feature -> the `ttbundle test` paths whose passing proves it (all of them); a
# `sample_on_device` mode: `device_sampling` run in that mode (`_tested`).
_TEST_PATHS: dict[str, tuple[str, ...]] = {
    "text generation": ("prefill", "decode"),
    **{c.card: (c.test_path,) for c in CAPABILITIES if c.card and c.test_path and not c.choices},
    **{f"pooling: {task}": (path,) for path, task in POOLING_PATHS.items()},
}


def _features(meta: BundleMetadata) -> list[tuple[str, bool, str, str]]:
    """(feature, admitted, code when not, what the plan does) for every feature: text
    generation, then each capability with a card row, in the catalogue's order."""
    caps = meta.capabilities
    pooling = caps.pooling
    only_pools = pooling is not None and pooling.form == "forward"
    out = [
        (
            "text generation",
            generates(meta),
            "TTB272" if only_pools else "",
            "refused by the plan" if only_pools else "a classifier: vLLM pools it",
        )
    ]
    for entry in CAPABILITIES:
        if entry.card is not None:
            for feature, admitted in _declared(entry, meta):
                out.append((feature, admitted, entry.refusal or "", entry.plan_note))
    return out


def _declared(entry: Capability, meta: BundleMetadata) -> list[tuple[str, bool]]:
    """(feature, declared) for the card rows of one capability: one per choice of a list."""
    caps = meta.capabilities
    value = getattr(caps, entry.name)
    if entry.name == "pooling":
        value = value.tasks if value is not None else []
    elif entry.name == "execution":
        value = value == "single"  # lanes: one engine over the whole mesh
    elif entry.name == "modalities":
        value = "image" in caps.input_limits()  # images: with `multimodal` alone too
    if entry.choices:
        return [(f"{entry.card}: {choice}", choice in value) for choice in entry.choices]
    return [(entry.card or entry.name, bool(value))]


def _tested(feature: str, evidence: Evidence | None) -> bool:
    if evidence is None or evidence.stale or not evidence.passed:
        return False
    ran = set(evidence.record.get("paths") or ())
    if feature in _TEST_PATHS:
        return set(_TEST_PATHS[feature]) <= ran
    if feature.startswith("sample_on_device: "):
        mode = feature.partition(": ")[2]
        return "device_sampling" in ran and evidence.record.get("device_mode") == mode
    return False


def support_card(bundle_dir: Path, meta: BundleMetadata) -> dict[str, Any]:
    """The card as data: bundle, meshes ({mesh: {status, evidence, features}}), and
    diagnostics (what is wrong with the evidence, as `Diagnostic`s)."""
    found, problems = read_evidence(bundle_dir)
    measured, more = read_evidence(bundle_dir, performance=True)
    problems += more
    by_mesh = {e.mesh: e for e in found}
    figures = {e.mesh: e for e in measured}
    meshes = list(meta.targets) or [ANY_MESH]
    meshes += [m for m in [*by_mesh, *figures] if m not in meshes]
    card: dict[str, Any] = {
        "bundle": {"name": meta.name, "version": meta.version, "arch": meta.arch},
        "meshes": {},
        "diagnostics": problems,  # Diagnostic objects: stale or unreadable evidence
        # What TT-Metal's own catalog states for the bundle's models (status tier, meshes),
        # as the bundle quotes it with its source (`x-tt-metal-status`); None: not quoted.
        "tt_metal_status": meta.extensions.get(TT_METAL_STATUS),
    }
    for mesh in meshes:
        evidence = by_mesh.get(mesh)
        features = []
        for feature, admitted, code, refusal in _features(meta):
            if not admitted:
                features.append(
                    {"feature": feature, "status": "refused", "code": code, "note": refusal}
                )
            elif _tested(feature, evidence):
                features.append({"feature": feature, "status": "tested"})
            else:
                features.append({"feature": feature, "status": "served"})
        card["meshes"][mesh] = {
            "status": mesh_status(evidence),
            "evidence": None
            if evidence is None
            else {
                "file": str(evidence.file.relative_to(bundle_dir)),
                "passed": evidence.passed,
                "stale": evidence.stale,
                "recorded_at": evidence.record.get("recorded_at"),
                "versions": evidence.record.get("versions"),
                # The checkpoint's sliding window and whether the run crossed it.
                "window": evidence.record.get("window"),
            },
            "features": features,
            "performance": _performance(bundle_dir, figures.get(mesh)),
        }
    return card


# The figures a card shows per workload: the medians over the bench run's rounds.
CARD_FIGURES = ("p50_ttft_ms", "p99_ttft_ms", "p50_tpot_ms", "p99_tpot_ms", "output_throughput")


def _performance(bundle_dir: Path, evidence: Evidence | None) -> dict[str, Any] | None:
    """A mesh's kept bench figures for the card; None when it was never measured."""
    if evidence is None:
        return None
    record = evidence.record
    workloads = {}
    for name, entry in (record.get("workloads") or {}).items():
        summary = entry.get("summary") or {}
        workloads[name] = {
            k: summary[k]["median"] for k in CARD_FIGURES if isinstance(summary.get(k), dict)
        }
    return {
        "file": str(evidence.file.relative_to(bundle_dir)),
        "passed": evidence.passed,
        "stale": evidence.stale,
        "recorded_at": record.get("recorded_at"),
        "versions": record.get("versions"),
        "workload": record.get("workload"),
        "workloads": workloads,
    }


def to_markdown(card: dict[str, Any]) -> str:
    """The card as Markdown with Hugging Face model-card front matter."""
    bundle = card["bundle"]
    tested = sorted(m for m, v in card["meshes"].items() if v["status"] == "tested")
    lines = [
        "---",
        "library_name: vllm",
        "tags:",
        "- tenstorrent",
        "- ttbundles",
        f"- {bundle['arch']}",
        f"ttbundle: {bundle['name']}@{bundle['version']}",
        "tested_meshes: [" + ", ".join(tested) + "]",
        "---",
        "",
        f"# {bundle['name']} {bundle['version']}: support",
        "",
        "tested: proven on the mesh by the bundle's evidence (`ttbundle test "
        "--keep-evidence`); served: the plan admits it, not tested; refused: the plan "
        "refuses it (code).",
    ]
    for mesh, entry in card["meshes"].items():
        evidence = entry["evidence"]
        lines += ["", f"## {mesh}: {entry['status']}", ""]
        if evidence is not None:
            versions = evidence.get("versions") or {}
            lines.append(
                f"Evidence {evidence['file']}, {evidence.get('recorded_at')}, "
                f"vLLM {versions.get('vllm')}, ttbundles {versions.get('ttbundles')}"
                + (" (stale: the bundle changed since)" if evidence["stale"] else "")
            )
            window = evidence.get("window")
            if isinstance(window, dict) and not window.get("crossed"):
                lines.append(
                    f"The checkpoint's sliding window ({window.get('size')} tokens) was not "
                    "crossed by the tested prompts: its windowed layers are not proven"
                    + (f" ({window['reason']})" if window.get("reason") else "")
                    + "."
                )
            lines.append("")
        lines += ["| feature | status |", "|---|---|"]
        for f in entry["features"]:
            status = f["status"] + (f" ({f['code']}: {f['note']})" if "code" in f else "")
            lines.append(f"| {f['feature']} | {status} |")
        if entry.get("performance"):
            lines += _performance_lines(entry["performance"])
    stated = card.get("tt_metal_status")
    if isinstance(stated, dict) and isinstance(stated.get("support"), list):
        lines += ["", "## What TT-Metal states", "", f"Source: {stated.get('source')}", ""]
        lines += ["| models | status | meshes | TT-Metal commit |", "|---|---|---|---|"]
        for row in stated["support"]:
            if isinstance(row, dict):
                lines.append(
                    f"| {', '.join(row.get('models') or [])} | {row.get('status')} | "
                    f"{', '.join(row.get('meshes') or [])} | {row.get('tt_metal_commit')} |"
                )
    return "\n".join(lines) + "\n"


def _performance_lines(performance: dict[str, Any]) -> list[str]:
    """The kept bench figures as a Markdown table under the mesh's features."""
    versions = performance.get("versions") or {}
    w = performance.get("workload") or {}
    verdict = "targets met" if performance["passed"] else "a target missed"
    lines = [
        "",
        f"### Performance (ttbundle bench, {performance.get('recorded_at')}, vLLM "
        f"{versions.get('vllm')})",
        "",
        f"{w.get('num_prompts')} requests of {w.get('input_len')} tokens, "
        f"{w.get('output_len')} out, {w.get('max_concurrency')} at a time; {verdict}"
        + (" (stale: the bundle changed since)" if performance["stale"] else "")
        + "; medians:",
        "",
        "| workload | TTFT p50 (ms) | TTFT p99 (ms) | TPOT p50 (ms) | TPOT p99 (ms) | "
        "output tokens/s |",
        "|---|---|---|---|---|---|",
    ]
    for name, values in performance["workloads"].items():
        cells = [f"{values[k]:.2f}" if k in values else "-" for k in CARD_FIGURES]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines
