"""One `ttbundle bench` run: serve the bundle (or use a running server), run vLLM's own
benchmark client on each workload, summarize, check the bundle's targets.

The server is `vllm serve` as `ttbundle demo` starts it (`demo.server`), with a models
folder holding only the bundle under test and the built-in bundles off, so the bundle
measured is the one named. The client is `vllm bench serve`'s code (its datasets and
timing) in a process of its own (`serving.bench_client`): this process imports no vLLM.

Workloads, both from `vllm bench serve`'s datasets:
- `random`: prompts of random tokens (`--dataset-name random`);
- `shared_prefix`: prompts that share one prefix, each with a suffix of its own
  (`--dataset-name prefix_repetition`): what the prefix cache is for.
Every request generates exactly output_len tokens (EOS ignored), greedily.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttbundles.bench.figures import LATENCIES, PERCENTILES, check_targets, figures, summarize
from ttbundles.demo.server import http_get, serve_environment, start_server
from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.format.metadata import BenchWorkload, BundleMetadata, PerformanceTarget

WORKLOADS = ("random", "shared_prefix")
SEED = 0
LOG_TAIL = 20

Say = Callable[[str], None]


@dataclass
class BenchReport:
    """What one run measured and found; `cli/bench.py` renders it."""

    metadata: BundleMetadata
    mesh: str
    checkpoint: str
    url: str
    workload: BenchWorkload
    rounds: int
    served_here: bool  # the run started the server (else --url)
    workloads: dict[str, dict[str, Any]] = field(default_factory=dict)
    target: PerformanceTarget | None = None
    not_checked: str | None = None  # why declared targets were not checked
    checks: list[dict[str, Any]] = field(default_factory=list)
    problems: list[Diagnostic] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not any(d.is_error for d in self.problems)

    def to_json(self) -> dict[str, Any]:
        """The report as data: `--format json` and the evidence both keep this."""
        return {
            "bundle": {"name": self.metadata.name, "version": self.metadata.version},
            "mesh": self.mesh,
            "checkpoint": self.checkpoint,
            "url": None if self.served_here else self.url,
            "workload": self.workload.model_dump(),
            "rounds": self.rounds,
            "workloads": self.workloads,
            "target": None
            if self.target is None
            else self.target.model_dump(exclude_none=True, exclude={"workload"}),
            "targets_not_checked": self.not_checked,
            "checks": self.checks,
            "passed": self.passed,
        }


def workload_argv(
    name: str, shape: BenchWorkload, *, base_url: str, model: str, tokenizer: str
) -> list[str]:
    """`vllm bench serve`'s options for one workload of `shape` against `base_url`."""
    common = [
        "--backend",
        "vllm",
        "--base-url",
        base_url,
        "--model",
        model,
        "--tokenizer",
        tokenizer,
        "--num-prompts",
        str(shape.num_prompts),
        "--max-concurrency",
        str(shape.max_concurrency),
        # Exactly output_len tokens each, greedily: the same work on every run.
        "--ignore-eos",
        "--temperature",
        "0",
        "--seed",
        str(SEED),
        "--disable-tqdm",
        # The per-request errors stay in the result (the client drops the other lists).
        "--save-detailed",
        "--percentile-metrics",
        ",".join(LATENCIES),
        "--metric-percentiles",
        PERCENTILES,
    ]
    if name == "random":
        dataset = [
            "--dataset-name",
            "random",
            "--random-input-len",
            str(shape.input_len),
            "--random-output-len",
            str(shape.output_len),
        ]
    else:
        prefix = shape.shared_prefix_len
        dataset = [
            "--dataset-name",
            "prefix_repetition",
            "--prefix-repetition-prefix-len",
            str(prefix),
            "--prefix-repetition-suffix-len",
            str(shape.input_len - prefix),
            # One prefix shared by every request: each one after the first can hit.
            "--prefix-repetition-num-prefixes",
            "1",
            "--prefix-repetition-output-len",
            str(shape.output_len),
        ]
    return [*dataset, *common]


def check_url(url: str) -> str:
    """The server's base URL (no trailing /v1); TTB117 when nothing healthy answers."""
    base = url.rstrip("/")
    base = base[: -len("/v1")] if base.endswith("/v1") else base
    if not base.startswith(("http://", "https://")):
        raise _unreachable(url, "not an http:// or https:// URL")
    status, _ = http_get(f"{base}/health", timeout=10.0)
    if status != 200:
        why = "nothing answers there" if status == 0 else f"/health answered HTTP {status}"
        raise _unreachable(url, why)
    return base


def _unreachable(url: str, why: str) -> TTBundleError:
    return TTBundleError.single(
        "TTB117",
        f"--url {url}: {why}",
        hint="give the address of a running vllm serve (e.g. http://127.0.0.1:8000), or "
        "leave --url out and ttbundle bench serves the bundle itself",
    )


def served_model(base: str) -> str:
    """The first model the server serves (its name for requests)."""
    status, body = http_get(f"{base}/v1/models", timeout=10.0)
    try:
        return json.loads(body)["data"][0]["id"] if status == 200 else ""
    except (ValueError, KeyError, IndexError, TypeError):
        return ""


def run_bench(
    bundle: Path,
    checkpoint: str,
    *,
    mesh: str,
    url: str | None = None,
    workloads: Sequence[str] = WORKLOADS,
    shape: dict[str, int] | None = None,
    rounds: int = 1,
    vllm_args: Sequence[str] = (),
    say: Say = lambda _: None,
    timeout: float = 1800.0,
) -> BenchReport:
    """Measure `bundle` on `mesh`: serve it (or use the server at `url`), run each
    workload `rounds` times, check the declared targets. `shape` overrides the workload's
    declared lengths and counts (then declared targets are not checked)."""
    from ttbundles.conformance.session import checked_bundle
    from ttbundles.conformance.workdirs import RunFolder
    from ttbundles.paths import model_argument

    tokenizer = model_argument(checkpoint)
    base = check_url(url) if url is not None else None
    folder = RunFolder()
    try:
        bundle_dir, meta = checked_bundle(bundle, folder.path)
        target = meta.performance.get(mesh)
        declared = target.workload if target is not None else BenchWorkload()
        workload = BenchWorkload.model_validate({**declared.model_dump(), **(shape or {})})
        report = BenchReport(
            metadata=meta,
            mesh=mesh,
            checkpoint=checkpoint,
            url=base or "",
            workload=workload,
            rounds=rounds,
            served_here=base is None,
            target=target,
        )
        server = None
        if base is None:
            say(f"serving {meta.name} on {mesh} (vllm serve {checkpoint})")
            server = _serve(bundle_dir, tokenizer, mesh, vllm_args, folder.path)
        try:
            if server is not None:
                server.wait_ready(timeout)
                base = server.base_url
            model = served_model(base) or tokenizer
            report.url = base
            runs = [
                {
                    "name": name,
                    "round": r,
                    "argv": workload_argv(
                        name, workload, base_url=base, model=model, tokenizer=tokenizer
                    ),
                }
                for r in range(rounds)
                for name in workloads
            ]
            say(f"running vllm bench serve: {', '.join(workloads)} x {rounds} round(s)")
            results = _client(runs, folder.path, timeout)
        finally:
            if server is not None:
                server.stop()
        for item, outcome in zip(runs, results):
            entry = report.workloads.setdefault(item["name"], {"rounds": []})
            problem = _failure(item["name"], outcome)
            if problem is not None:
                raise TTBundleError([problem])
            entry["rounds"].append(figures(outcome["result"]))
        for entry in report.workloads.values():
            entry["summary"] = summarize(entry["rounds"])
        if target is not None:
            if workload != declared:
                report.not_checked = (
                    "the workload differs from the one the targets were declared for"
                )
            else:
                report.checks, report.problems = check_targets(report.workloads, target, mesh)
        return report
    finally:
        folder.remove()


def _serve(bundle_dir: Path, checkpoint: str, mesh: str, vllm_args: Sequence[str], work: Path):
    """`vllm serve CHECKPOINT` registering only the bundle under test, on `mesh`."""
    models = work / "models"
    models.mkdir()
    (models / bundle_dir.name).symlink_to(bundle_dir, target_is_directory=True)
    env = serve_environment({k: v for k, v in os.environ.items() if k != "EXTRA_MODELS_DIR"})
    env.update(
        {"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0", "MESH_DEVICE": mesh}
    )
    return start_server(
        Path(checkpoint), vllm_args=list(vllm_args), env=env, log_path=work / "serve.log"
    )


def _client(runs: list[dict[str, Any]], work: Path, timeout: float) -> list[dict[str, Any]]:
    """Run the client (`serving.bench_client`) on `runs`; its results in order."""
    out = work / "bench-results.json"
    spec = work / "bench-spec.json"
    spec.write_text(
        json.dumps(
            {"runs": [{"name": r["name"], "argv": r["argv"]} for r in runs], "out": str(out)}
        ),
        encoding="utf-8",
    )
    # The client only talks HTTP: no Tenstorrent platform in it, and no model hub.
    env = {k: v for k, v in os.environ.items() if k != "MESH_DEVICE"}
    env["HF_HUB_OFFLINE"] = "1"
    log = work / "client.log"
    with open(log, "w", encoding="utf-8") as handle:
        try:
            code = subprocess.run(
                [sys.executable, "-m", "ttbundles.serving.bench_client", str(spec)],
                stdout=handle,
                stderr=subprocess.STDOUT,
                env=env,
                timeout=timeout,
                check=False,
            ).returncode
        except subprocess.TimeoutExpired:
            code = -1
    if code != 0 or not out.is_file():
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        raise TTBundleError.single(
            "TTB117",
            f"vllm bench serve's client failed (exit {code})",
            hint="its last lines:\n      " + "\n      ".join(tail),
        )
    return json.loads(out.read_text(encoding="utf-8"))["results"]


def _failure(name: str, outcome: dict[str, Any]) -> Diagnostic | None:
    """TTB117 for a workload whose client raised or whose requests failed."""
    if "error" in outcome:
        why = outcome["error"]
    else:
        result = outcome["result"]
        if not result.get("failed"):
            return None
        errors = "; ".join(outcome.get("request_errors") or ()) or "no error text"
        total = result["failed"] + result["completed"]
        why = f"{result['failed']} of {total} requests failed: {errors}"
    return Diagnostic(
        "TTB117",
        Severity.ERROR,
        f"the {name} workload did not run: {why}",
        hint="the server's log says why requests fail (a prompt longer than max_model_len: "
        "lower --input-len or raise the server's --max-model-len)",
    )


def to_evidence(report: BenchReport) -> dict[str, Any]:
    """The figures as `ttbundle bench --keep-evidence` keeps them in the bundle
    (`archive.evidence` adds the content digest): the report, the versions, the date."""
    import datetime
    from importlib.metadata import PackageNotFoundError, version

    from ttbundles.vllm_window import installed_vllm

    try:
        ttbundles_version: str | None = version("ttbundles")
    except PackageNotFoundError:
        ttbundles_version = None
    return {
        **report.to_json(),
        "recorded_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "versions": {"ttbundles": ttbundles_version, "vllm": installed_vllm()},
        "failures": [d.to_dict() for d in report.problems],
    }
