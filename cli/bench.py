"""`ttbundle bench`: a bundle's serving speed, measured by vLLM's own benchmark client."""

from __future__ import annotations

import signal
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ttbundles import envs

from .options import FormatOption
from .output import Format, Output


class Workload(str, Enum):
    random = "random"
    shared_prefix = "shared_prefix"


def bench(
    bundle: Annotated[
        Path, typer.Argument(help="Bundle folder or .ttbundle archive.", show_default=False)
    ],
    model: Annotated[
        str,
        typer.Option(
            "--model",
            help="Checkpoint folder or hub repo: served, and its tokenizer makes the prompts.",
            show_default=False,
        ),
    ],
    vllm_args: Annotated[
        list[str] | None,
        typer.Argument(
            help="Further `vllm serve` options, after `--` (not with --url).",
            show_default=False,
            metavar="VLLM_SERVE_OPTIONS",
        ),
    ] = None,
    mesh: Annotated[
        str | None,
        typer.Option(
            help="Mesh to serve on, and whose targets to check. Default: $MESH_DEVICE, else HOST.",
            show_default=False,
        ),
    ] = None,
    url: Annotated[
        str | None,
        typer.Option(
            "--url",
            help="Measure the vllm serve already running at this address (e.g. "
            "http://127.0.0.1:8000) instead of serving the bundle.",
            show_default=False,
        ),
    ] = None,
    workload: Annotated[
        list[Workload] | None,
        typer.Option(
            "--workload",
            help="random (prompts of random tokens) or shared_prefix (prompts sharing one "
            "prefix). Repeat for both; default: both.",
            show_default=False,
        ),
    ] = None,
    input_len: Annotated[
        int | None,
        typer.Option(help="Prompt tokens per request, instead of the declared workload's.", min=1),
    ] = None,
    output_len: Annotated[
        int | None,
        typer.Option(help="Tokens generated per request, instead of the declared.", min=1),
    ] = None,
    num_prompts: Annotated[
        int | None,
        typer.Option(help="Requests per workload and round, instead of the declared.", min=1),
    ] = None,
    max_concurrency: Annotated[
        int | None,
        typer.Option(help="Requests in flight at most, instead of the declared.", min=1),
    ] = None,
    rounds: Annotated[
        int,
        typer.Option(help="Runs of each workload: figures are medians, with their range.", min=1),
    ] = 1,
    keep_evidence: Annotated[
        bool,
        typer.Option(
            "--keep-evidence",
            help="Keep the figures as evidence in the bundle folder "
            "(evidence/performance/MESH.json, with the versions, the date and the digest of "
            "the content measured), where packing and signing cover it; ttbundle card "
            "shows them.",
        ),
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds allowed for serving and for the client.", min=1)
    ] = 1800.0,
    fmt: FormatOption = Format.human,
) -> None:
    """Measure a bundle's serving speed with vLLM's own `vllm bench serve` workloads.

    Serves the bundle on the mesh (or measures the server at --url), then runs random
    prompts and prompts sharing a prefix. Reported per workload: TTFT and TPOT (mean,
    median, p90, p99, standard deviation), output and request throughput; with --rounds
    N, each figure's median and its range over the rounds.

    The workload is the bundle's declared one (performance.MESH.workload in the
    metadata), else 16 prompts of 128 tokens, 32 out, 4 at a time. Declared targets are
    checked against it: exit 0 when every one holds, 1 when one is missed (TTB116).

    Example: ttbundle bench bundles/demo --model ./ckpt

    Example: ttbundle bench my-bundle --model ./ckpt --url http://127.0.0.1:8000 --rounds 3
    """
    from ttbundles.bench.session import WORKLOADS, run_bench

    out = Output(fmt)
    if url is not None and vllm_args:
        raise typer.BadParameter(
            "vllm serve options are for the server bench starts; --url measures a running one",
            param_hint="'--url'",
        )
    if keep_evidence and not bundle.is_dir():
        raise typer.BadParameter(
            f"{bundle} is not a bundle folder; bench the folder, then pack it again",
            param_hint="'--keep-evidence'",
        )
    shape = {
        k: v
        for k, v in {
            "input_len": input_len,
            "output_len": output_len,
            "num_prompts": num_prompts,
            "max_concurrency": max_concurrency,
        }.items()
        if v is not None
    }
    # SIGTERM unwinds like Ctrl-C: the server bench started is stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    report = run_bench(
        bundle,
        model,
        mesh=mesh or envs.MESH_DEVICE or "HOST",
        url=url,
        workloads=[w.value for w in workload] if workload else list(WORKLOADS),
        shape=shape,
        rounds=rounds,
        vllm_args=list(vllm_args or []),
        say=(lambda _: None) if out.is_json else (lambda text: out.err.print(text)),
        timeout=timeout,
    )
    kept = None
    if keep_evidence:
        from ttbundles.archive.evidence import write_evidence
        from ttbundles.bench.session import to_evidence

        kept = write_evidence(bundle, to_evidence(report), performance=True)
    if out.is_json:
        out.result(
            report.passed,
            report.problems,
            **report.to_json(),
            evidence=str(kept) if kept else None,
        )
    else:
        render(report, out)
        if kept is not None:
            out.line(f"evidence kept in {kept}")
    raise typer.Exit(0 if report.passed else 1)


def render(report: Any, out: Output) -> None:
    """The figures as one table per workload, the checks, and the verdict."""
    w = report.workload
    meta = report.metadata
    where = "served here" if report.served_here else report.url
    out.line(
        f"{meta.name}@{meta.version} on {report.mesh} ({where}), checkpoint "
        f"{report.checkpoint}: {w.num_prompts} requests of {w.input_len} tokens, "
        f"{w.output_len} out, {w.max_concurrency} at a time, {report.rounds} round(s)",
        style="bold",
    )
    for name, entry in report.workloads.items():
        summary = entry["summary"]
        rows = []
        for latency in ("ttft", "tpot", "itl", "e2el"):
            row = [latency.upper() + " (ms)"]
            for stat in ("mean", "median", "p90", "p99", "std"):
                row.append(_figure(summary.get(f"{stat}_{latency}_ms")))
            rows.append(row)
        title = name
        if name != "random":
            title += f" (shared prefix {w.shared_prefix_len} tokens)"
        out.table(title, ["latency", "mean", "median", "p90", "p99", "std"], rows)
        out.line(
            f"  output throughput {_figure(summary.get('output_throughput'))} tokens/s, "
            f"requests {_figure(summary.get('request_throughput'))}/s"
        )
    if report.rounds > 1:
        out.line("figures: median over the rounds [min-max]")
    if report.not_checked:
        out.line(f"targets not checked: {report.not_checked}")
    elif report.target is None:
        out.line(f"no targets declared for {report.mesh} (performance in vllm_metadata.json)")
    for check in report.checks:
        value = "-" if check["value"] is None else f"{check['value']:.2f}"
        verdict = "pass" if check["passed"] else "MISSED"
        out.line(
            f"  target {check['workload']}: {check['figure']} {value} {check['bound']} "
            f"{check['limit']:g}: {verdict}"
        )
    if report.problems:
        out.diagnostics(report.problems)
    if report.checks:
        missed = sum(not c["passed"] for c in report.checks)
        out.line(
            f"{'PASSED' if report.passed else 'FAILED'}: {len(report.checks)} targets, "
            f"{missed} missed",
            style="green" if report.passed else "bold red",
        )


def _figure(entry: dict[str, float] | None) -> str:
    if entry is None:
        return "-"
    if entry["min"] == entry["max"]:
        return f"{entry['median']:.2f}"
    return f"{entry['median']:.2f} [{entry['min']:.2f}-{entry['max']:.2f}]"
