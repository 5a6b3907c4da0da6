"""`ttbundle test` results as data: the JSON document and JUnit XML (for CI systems)."""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from typing import Any

from ttbundles.conformance.session import TestReport


def to_json(report: TestReport) -> dict[str, Any]:
    plan = report.plan
    meta = plan.metadata
    # The envelope every command's JSON has (cli/output.py): ok first, diagnostics last.
    return {
        "ok": report.passed,
        "bundle": {"name": meta.name, "version": meta.version, "path": str(plan.bundle_dir)},
        "checkpoint": report.checkpoint,
        "mesh": plan.mesh,
        "goldens": report.goldens,
        "paths": plan.paths,
        "prompts": report.served.get("prompts", [p.to_dict() for p in plan.prompts]),
        "max_tokens": plan.max_tokens,
        "thresholds": plan.thresholds.model_dump(),
        "sampling": plan.tests.sampling.model_dump(),
        "served": {k: v for k, v in report.served.items() if k != "prompts"},
        "passed": report.passed,
        "window": plan.window.to_dict() if plan.window is not None else None,
        "cases": [case.to_dict() for case in report.cases],
        "perplexity": [result.to_dict() for result in report.perplexity],
        "recorded": str(report.recorded) if report.recorded else None,
        "seconds": {k: round(v, 3) for k, v in report.seconds.items()},
        "diagnostics": [d.to_dict() for d in report.failures],
    }


def to_evidence(report: TestReport) -> dict[str, Any]:
    """What the run proved, as `ttbundle test --keep-evidence` keeps it in the bundle
    (`archive.evidence` adds the content digest): the mesh and its target, the versions it
    ran with, the paths and thresholds, pass or fail with each case's figures, the date."""
    import datetime
    from importlib.metadata import PackageNotFoundError, version

    from ttbundles.tt_metal import ttnn_origin
    from ttbundles.vllm_window import installed_vllm

    plan = report.plan
    meta = plan.metadata
    target = meta.target(plan.mesh)
    try:
        ttbundles_version: str | None = version("ttbundles")
    except PackageNotFoundError:
        ttbundles_version = None
    tt_metal = None
    origin = ttnn_origin()
    if origin is not None:
        try:
            tt_metal = {"version": version("ttnn"), "origin": origin}
        except PackageNotFoundError:
            tt_metal = {"version": None, "origin": origin}
    return {
        "mesh": plan.mesh,
        "target": target.model_dump(exclude_defaults=True) if target is not None else None,
        "bundle": {"name": meta.name, "version": meta.version},
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "ttbundles": ttbundles_version,
            "vllm": installed_vllm(),
            "tt_metal": tt_metal,  # None: not installed (the host mesh runs without it)
        },
        "checkpoint": report.checkpoint,
        "goldens": report.goldens,
        "paths": plan.paths,
        # The sample_on_device mode the device_sampling path ran (None: host sampling).
        "device_mode": plan.device_mode if "device_sampling" in plan.paths else None,
        "max_tokens": plan.max_tokens,
        "thresholds": plan.thresholds.model_dump(),
        "passed": report.passed,
        # The checkpoint's sliding window, and whether a prompt crossed it (None: none):
        # evidence of a run that stayed inside it does not prove the windowed layers.
        "window": plan.window.to_dict() if plan.window is not None else None,
        "cases": [
            {
                "path": case.path,
                "prompt": case.prompt,
                "golden": case.golden,
                "passed": case.passed,
                "skipped": case.skipped,
                "figures": case.to_dict()["summary"],
            }
            for case in report.cases
        ],
        "perplexity": [result.to_dict() for result in report.perplexity],
        "failures": [d.to_dict() for d in report.failures],
    }


def fmt(value: float | None, spec: str) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return format(value, spec)


def step_lines(case: Any) -> list[str]:
    """A case's per-step table as plain text (a pooling case's: per vector)."""
    if "vectors" in case.details:
        return vector_lines(case)
    lines = ["step  token  golden  PCC        max|diff|  top-1  top-5  note"]
    for s in case.steps:
        lines.append(
            f"{s.step:>4}  {_opt(s.token):>5}  {_opt(s.golden_token):>6}  "
            f"{fmt(s.pcc, '.6f'):<9}  {fmt(s.max_abs_diff, '.3g'):<9}  "
            f"{_yes(s.top1):<5}  {_yes(s.top5):<5}  {s.note}"
        )
    return lines


def vector_lines(case: Any) -> list[str]:
    """A pooling case's vectors (`conformance.pooling`) as plain text."""
    vectors = case.details["vectors"]
    # One-value vectors (a reranker's score) have no PCC: no column for it then.
    correlated = any(s.pcc is not None for s in case.steps)
    pcc_head = "PCC        " if correlated else ""
    lines = [f"vector     size  cosine     {pcc_head}max|diff|  allowed    label  golden"]
    for s in case.steps:
        known = vectors.get(s.note, {})
        pcc = f"{fmt(s.pcc, '.6f'):<9}  " if correlated else ""
        lines.append(
            f"{s.note:<9}  {_opt(known.get('size')):>4}  {fmt(s.cosine, '.7f'):<9}  "
            f"{pcc}{fmt(s.max_abs_diff, '.3g'):<9}  "
            f"{fmt(known.get('allowed'), '.3g'):<9}  {_opt(s.token):>5}  {_opt(s.golden_token):>6}"
        )
    return lines


def _opt(value: Any) -> str:
    return "-" if value is None else str(value)


def _yes(value: bool | None) -> str:
    return "-" if value is None else ("yes" if value else "NO")


def to_junit(report: TestReport) -> str:
    """One testsuite per golden, one testcase per path and prompt (and the perplexity)."""
    plan = report.plan
    meta = plan.metadata
    bundle = f"{meta.name}@{meta.version}"
    root = ET.Element("testsuites", name=f"ttbundle test {bundle}")
    total = failures = 0
    for golden in report.goldens:
        cases = [c for c in report.cases if c.golden == golden]
        ppl = [p for p in report.perplexity if p.golden == golden]
        failed = sum(1 for c in cases if not c.passed) + sum(1 for p in ppl if not p.passed)
        skipped = sum(1 for c in cases if c.passed and c.skipped)
        count = len(cases) + len(ppl)
        total += count
        failures += failed
        suite = ET.SubElement(
            root,
            "testsuite",
            name=f"{bundle} vs {golden}",
            tests=str(count),
            failures=str(failed),
            errors="0",
            skipped=str(skipped),
            time=f"{report.seconds.get('total', 0.0):.3f}",
        )
        properties = ET.SubElement(suite, "properties")
        for name, value in (
            ("bundle", bundle),
            ("checkpoint", report.checkpoint),
            ("mesh", plan.mesh),
            ("golden", golden),
            ("max_tokens", str(plan.max_tokens)),
            ("thresholds", ", ".join(f"{k}={v}" for k, v in plan.thresholds.model_dump().items())),
        ):
            ET.SubElement(properties, "property", name=name, value=value)
        for case in cases:
            element = ET.SubElement(
                suite, "testcase", classname=f"{meta.name}.{case.path}", name=case.label, time="0"
            )
            for failure in case.failures:
                node = ET.SubElement(element, "failure", type=failure.code, message=failure.message)
                node.text = failure.hint or ""
            if case.skipped and case.passed:
                ET.SubElement(element, "skipped", message=case.skipped)
            ET.SubElement(element, "system-out").text = "\n".join(step_lines(case))
        for result in ppl:
            element = ET.SubElement(
                suite, "testcase", classname=f"{meta.name}.perplexity", name="perplexity", time="0"
            )
            for failure in result.failures:
                node = ET.SubElement(element, "failure", type=failure.code, message=failure.message)
                node.text = failure.hint or ""
            ET.SubElement(element, "system-out").text = (
                f"bundle {fmt(result.served, '.6g')}, golden {fmt(result.reference, '.6g')}, "
                f"ratio {fmt(result.ratio, '.6f')} over {result.tokens} tokens"
            )
    root.set("tests", str(total))
    root.set("failures", str(failures))
    root.set("errors", "0")
    root.set("time", f"{report.seconds.get('total', 0.0):.3f}")
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"
