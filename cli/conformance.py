"""`ttbundle test`: a bundle's generator, served as `vllm serve` serves it, against a golden."""

from __future__ import annotations

import signal
import sys
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from ttbundles import envs

from .output import Format, Output


class TestFormat(str, Enum):
    __test__ = False

    human = "human"
    json = "json"
    junit = "junit"


def test(
    bundle: Annotated[
        Path, typer.Argument(help="Bundle folder or .ttbundle archive.", show_default=False)
    ],
    model: Annotated[
        str, typer.Option("--model", help="Checkpoint folder or hub repo.", show_default=False)
    ],
    mesh: Annotated[
        str | None,
        typer.Option(
            help="Mesh to serve on. Default: $MESH_DEVICE, else HOST.", show_default=False
        ),
    ] = None,
    golden: Annotated[
        list[str] | None,
        typer.Option(
            "--golden",
            help="reference (the torch reference generator), transformers, a golden FILE "
            "recorded with --record, or auto: the bundle's tests.golden, else the reference "
            "where it covers the checkpoint, else transformers. Repeat to compare with "
            "several.",
            show_default="auto",
        ),
    ] = None,
    path: Annotated[
        list[str] | None,
        typer.Option(
            "--path",
            help="Serving path to exercise instead of the bundle's tests.paths: prefill, "
            "decode, chunked_prefill, prefix_cache, device_sampling, and for a pooling "
            "bundle pooling_embed, pooling_classify. Repeat for several.",
            show_default=False,
        ),
    ] = None,
    max_tokens: Annotated[
        int | None,
        typer.Option(help="Tokens per prompt, instead of tests.max_tokens.", min=1),
    ] = None,
    record: Annotated[
        Path | None,
        typer.Option(
            "--record",
            help="Also write the (first live) golden to FILE (gzip JSON): token ids and each "
            "step's top-k logits, for machines without the reference or transformers. "
            "Inside the bundle, name it in tests.golden.",
            dir_okay=False,
        ),
    ] = None,
    keep_evidence: Annotated[
        bool,
        typer.Option(
            "--keep-evidence",
            help="Keep the evidence of this run in the bundle folder (evidence/MESH.json: "
            "mesh, versions, paths, thresholds, pass or fail with the figures, date, and "
            "the digest of the content proven), where packing and signing cover it.",
        ),
    ] = False,
    steps: Annotated[
        bool,
        typer.Option("--steps", help="Print every case's per-step table (failing cases' always)."),
    ] = False,
    timeout: Annotated[
        float, typer.Option(help="Seconds allowed for serving the bundle.", min=1)
    ] = 1800.0,
    fmt: Annotated[
        TestFormat,
        typer.Option("--format", "-f", help="Output: human (default), json or junit (XML)."),
    ] = TestFormat.human,
) -> None:
    """Prove that a bundle computes the right thing, against a golden, per prompt and step.

    The bundle's generator runs as `vllm serve` runs it (ttbundles' worker and model runner).

    Reported: logits PCC, top-1/top-5 agreement, max abs diff, the first diverging token.

    Also: seeded sampling alone and in a batch, and both perplexities on a short text.

    A pooling bundle: its embeddings and classification logits against transformers'.

    What runs comes from the bundle's tests section.

    Exit 0 when every threshold holds, 1 when one fails (naming the path, prompt and step).

    Example: ttbundle test bundles/demo --model ./ckpt

    Example: ttbundle test my-bundle --model ./ckpt --golden transformers --format junit
    """
    from ttbundles.conformance.session import run_test
    from ttbundles.hub import answer_offline

    # Without a network: the cache (offline for the harness and the golden too) or TTB208
    # at once, as plan and init --from-hf answer, not two minutes of retries.
    answer_offline(model)
    if keep_evidence and not bundle.is_dir():
        # An archive's files are fixed by its manifest: evidence goes into a folder.
        raise typer.BadParameter(
            f"{bundle} is not a bundle folder; test the folder, then pack it again",
            param_hint="'--keep-evidence'",
        )

    # SIGTERM unwinds like Ctrl-C: the serving process is stopped and the run's temporary
    # folder removed on the way out (exit 143).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    with progress_bar() as progress:
        report = run_test(
            bundle,
            model,
            mesh=mesh or envs.MESH_DEVICE or "HOST",
            goldens=list(golden or []),
            paths=list(path or []) or None,
            max_tokens=max_tokens,
            record=record,
            progress=progress,
            timeout=timeout,
        )
    kept = None
    if keep_evidence:
        from ttbundles.archive.evidence import write_evidence
        from ttbundles.conformance.report import to_evidence

        kept = write_evidence(bundle, to_evidence(report))
    if fmt is TestFormat.json:
        from ttbundles.conformance.report import to_json

        Output(Format.json).json({**to_json(report), "evidence": str(kept) if kept else None})
    elif fmt is TestFormat.junit:
        from ttbundles.conformance.report import to_junit

        sys.stdout.write(to_junit(report))
    else:
        render(report, Output(), every_step=steps)
        if kept is not None:
            Output().line(f"evidence kept in {kept}")
    raise typer.Exit(0 if report.passed else 1)


@contextmanager
def progress_bar():
    """A progress callback: a rich bar on stderr when it is a terminal, else nothing."""
    from rich.console import Console

    console = Console(stderr=True)
    if not console.is_terminal:
        yield lambda *_, **__: None
        return
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with bar:
        task = bar.add_task("starting vLLM", total=None)

        def update(kind: str, **event: Any) -> None:
            if kind == "plan":
                bar.update(task, total=event["total"])
            elif kind == "progress":
                bar.update(task, description=event.get("label", ""))
            elif kind == "advance":
                bar.advance(task)

        yield update


def render(report: Any, out: Output, *, every_step: bool) -> None:
    from ttbundles.conformance.report import fmt, step_lines

    plan = report.plan
    meta = plan.metadata
    out.line(
        f"{meta.name}@{meta.version} on {plan.mesh}, checkpoint {report.checkpoint}: "
        f"{len(plan.prompts)} prompts"
        + (f" x {plan.max_tokens} tokens" if plan.generation_paths else "")
        + (f", pooled ({', '.join(plan.pooling)})" if plan.pooling else ""),
        style="bold",
    )
    lengths = {p["name"]: len(p["token_ids"]) for p in report.served.get("prompts", [])}
    for prompt in plan.prompts:
        out.line(f"  {prompt.label(60)} ({lengths.get(prompt.name, '?')} tokens)")
    if plan.window is not None:
        out.line(
            f"sliding window {plan.window.describe()}",
            style=None if plan.window.crossed else "yellow",
        )
    columns = ["path", "prompt", "steps", "PCC min", "top-1", "top-5", "max |diff|"]
    columns += ["diverges", "notes", "result"]
    for golden in report.goldens:
        rows = []
        for case in (c for c in report.cases if c.golden == golden):
            s = case.summary()
            rows.append(
                [
                    case.path,
                    case.prompt,
                    f"{s['compared']}/{s['steps']}",
                    _at(fmt(s["pcc_min"], ".6f"), s["pcc_min_step"]),
                    fmt(s["top1"], ".2f"),
                    fmt(s["top5"], ".2f"),
                    _at(fmt(s["max_abs_diff"], ".2g"), s["max_abs_diff_step"]),
                    "-" if s["first_divergence"] is None else f"step {s['first_divergence']}",
                    notes(case),
                    ("FAIL" if not case.passed else "skipped" if case.skipped else "pass"),
                ]
            )
        out.table(f"vs {golden} (PCC and max |diff|: worst @ step)", columns, rows)
        for result in (r for r in report.perplexity if r.golden == golden):
            out.line(
                f"perplexity ({result.tokens} tokens): bundle {fmt(result.served, '.6g')}, "
                f"golden {fmt(result.reference, '.6g')}, ratio {fmt(result.ratio, '.4f')}: "
                f"{'pass' if result.passed else 'FAIL'}"
            )
    for case in report.cases:
        if case.skipped:
            out.line(f"note: {case.path}, prompt {case.label}: skipped: {case.skipped}")
    for case in report.cases:
        if every_step or not case.passed:
            out.line(f"{case.path}, {case.label} vs {case.golden}:", style="bold")
            for line in step_lines(case):
                out.line("  " + line)
    failures = report.failures
    if failures:
        out.diagnostics(failures)
    t = plan.thresholds
    limits = []
    if plan.generation_paths:
        limits.append(f"PCC >= {t.pcc}, top-1 >= {t.top1}, top-5 >= {t.top5}")
        if t.max_abs_diff is not None:
            limits.append(f"max |diff| <= {t.max_abs_diff}")
        if t.perplexity_ratio is not None:
            limits.append(f"perplexity ratio <= {t.perplexity_ratio}")
    if plan.pooling:
        from ttbundles.conformance.pooling import COSINE_MIN

        limits.append(f"pooled: cosine >= {COSINE_MIN}, max |diff| within float32's")
    verdict = "PASSED" if report.passed else "FAILED"
    cases = len(report.cases) + len(report.perplexity)
    out.line(
        f"{verdict}: {cases} cases, {len(failures)} failures ({', '.join(limits)})"
        + (f"; golden recorded to {report.recorded}" if report.recorded else ""),
        style="green" if report.passed else "bold red",
    )


def _at(value: str, step: int | None) -> str:
    return value if step is None else f"{value} @{step}"


def notes(case: Any) -> str:
    from ttbundles.conformance.report import fmt

    d = case.details
    parts = []
    if case.path == "chunked_prefill":
        parts.append(f"{d.get('prefill_chunks')} chunks")
    if case.path == "prefix_cache":
        parts.append(f"{d.get('num_cached_tokens')} cached")
    if "vectors" in d:  # a pooling case (conformance.pooling)
        cosine = case.summary()["cosine_min"]
        if cosine is not None:
            parts.append(f"cosine {fmt(cosine, '.7f')}")
        if d.get("pooling"):
            parts.append(f"{d['pooling']} pooling")
    if case.path == "device_sampling":
        same = d.get("seeded_alone") == d.get("seeded_batch")
        parts.append(f"seed {d.get('seed')} alone{'=' if same else '!='}batch")
        parts.append(f"{d.get('device_steps')} device steps")
    return ", ".join(parts)
