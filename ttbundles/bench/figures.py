"""The figures of a `ttbundle bench` run, their spread, and the bundle's targets.

A `vllm bench serve` result holds, per workload and round, the throughputs and, for each
latency (TTFT, TPOT, ITL, E2EL), its mean, median, standard deviation and percentiles over
the requests. A run of several rounds reports each figure's median over the rounds and its
range (min-max): the spread between requests is in the percentiles, the spread between
runs in the range. Targets (`performance.<MESH>` in the metadata) are checked against the
medians over the rounds: one slow round on a shared machine does not fail a bundle that
is usually within them, and the range shows it.
"""

from __future__ import annotations

import statistics
from typing import Any

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.metadata import PerformanceTarget

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATISTICS = ("mean", "median", "std", "p50", "p90", "p99")
PERCENTILES = "50,90,99"  # --metric-percentiles
THROUGHPUTS = ("output_throughput", "request_throughput", "total_token_throughput")
# The result's keys kept as figures: throughputs, counts, then every latency statistic.
FIGURES = (
    *THROUGHPUTS,
    "completed",
    "failed",
    "duration",
    *(f"{stat}_{latency}_ms" for latency in LATENCIES for stat in STATISTICS),
)
LIMITED = ("ttft_ms", "tpot_ms")  # the latencies a target may bound


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The figures of one `vllm bench serve` result (those it has)."""
    return {k: float(result[k]) for k in FIGURES if isinstance(result.get(k), (int, float))}


def summarize(rounds: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    """Each figure's median over the rounds and its range: {figure: {median, min, max}}."""
    out: dict[str, dict[str, float]] = {}
    for key in FIGURES:
        values = [r[key] for r in rounds if key in r]
        if values:
            out[key] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
    return out


def check_targets(
    workloads: dict[str, dict[str, Any]], target: PerformanceTarget, mesh: str
) -> tuple[list[dict[str, Any]], list[Diagnostic]]:
    """Every declared limit against every workload's median figure: the checks made
    ({workload, figure, limit, bound, value, passed}) and a TTB116 error per miss."""
    checks: list[dict[str, Any]] = []
    problems: list[Diagnostic] = []
    for name, entry in workloads.items():
        summary = entry["summary"]
        for latency in LIMITED:
            limits = getattr(target, latency)
            if limits is None:
                continue
            for stat, bound in limits.model_dump(exclude_none=True).items():
                figure = f"{stat}_{latency}"  # p50: asked for (PERCENTILES)
                checks.append(_check(name, figure, "at most", bound, summary.get(figure)))
        if target.output_throughput is not None:
            checks.append(
                _check(
                    name,
                    "output_throughput",
                    "at least",
                    target.output_throughput,
                    summary.get("output_throughput"),
                )
            )
    for check in checks:
        if not check["passed"]:
            value = check["value"]
            unit = "tokens/s" if check["figure"] == "output_throughput" else "ms"
            problems.append(
                Diagnostic(
                    "TTB116",
                    Severity.ERROR,
                    f"{check['workload']} workload on {mesh}: {check['figure']} is "
                    + ("not measured" if value is None else f"{value:.2f} {unit}")
                    + f", the bundle's target is {check['bound']} {check['limit']:g} {unit}",
                    pointer=f"/performance/{mesh}",
                    hint="make the bundle faster on this mesh, or declare the target it "
                    "reaches (performance in vllm_metadata.json); the range over rounds "
                    "shows whether one slow round caused it",
                )
            )
    return checks, problems


def _check(
    workload: str, figure: str, bound: str, limit: float, summary: dict[str, float] | None
) -> dict[str, Any]:
    value = None if summary is None else summary["median"]
    if value is None:
        passed = False
    elif bound == "at most":
        passed = value <= limit
    else:
        passed = value >= limit
    return {
        "workload": workload,
        "figure": figure,
        "bound": bound,
        "limit": limit,
        "value": value,
        "passed": passed,
    }
