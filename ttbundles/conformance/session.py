"""One `ttbundle test` run: serve the bundle, load the golden, compare, report.

The served side runs in a subprocess (`python -m ttbundles.serving.harness`), so that its
registration and environment are a server's: a models folder holding only the bundle
under test, the mesh in MESH_DEVICE, built-in bundles off. While it imports vLLM and
serves, this process loads the live goldens (a thread), so the two overlap. Then every
case is compared against every golden, and the golden is recorded when asked.

A pooling bundle's pooling paths are compared with transformers (`reference.
pooling_golden`), the one pooling golden, whatever `--golden` chose for its generation
paths; a bundle that only pools (the form 'forward') takes no other golden.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ttbundles.conformance.plan import TestPlan, resolve_plan
from ttbundles.conformance.workdirs import RunFolder
from ttbundles.errors import Diagnostic, InvalidBundleError, Severity, TTBundleError, shown_as
from ttbundles.format.golden_file import (
    DEFAULT_TOP_K,
    GoldenFile,
    RecordedPerplexity,
    RecordedPrompt,
    model_identity,
)
from ttbundles.format.meshes import HOST

LIVE = ("reference", "transformers")
AUTO = "auto"
LOG_TAIL = 25

Progress = Callable[..., None]


def _quiet(*_: Any, **__: Any) -> None:
    return None


@dataclass
class TestReport:
    """Everything one run found; `cli/conformance.py` renders it."""

    __test__ = False

    plan: TestPlan
    checkpoint: str
    goldens: list[str]
    cases: list[Any] = field(default_factory=list)  # compare.CaseResult
    perplexity: list[Any] = field(default_factory=list)  # compare.PerplexityResult
    served: dict[str, Any] = field(default_factory=dict)
    problems: list[Diagnostic] = field(default_factory=list)  # not tied to a case
    recorded: Path | None = None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def failures(self) -> list[Diagnostic]:
        out = list(self.problems)
        for case in self.cases:
            out.extend(case.failures)
        for result in self.perplexity:
            out.extend(result.failures)
        return out

    @property
    def passed(self) -> bool:
        return not self.failures


# --- the bundle and the goldens -------------------------------------------------------


def checked_bundle(bundle: Path, workdir: Path) -> tuple[Path, Any]:
    """The bundle folder (an archive is verified and extracted into `workdir`) and its
    metadata; raises InvalidBundleError with every error `ttbundle validate` finds."""
    from ttbundles.check.validate import check_bundle, release_errors

    bundle = Path(bundle)
    archive = None
    if bundle.is_file():
        from ttbundles.archive.reader import extract_verified

        archive, bundle = bundle, extract_verified(bundle, workdir)
    elif not bundle.is_dir():
        raise InvalidBundleError(
            Diagnostic(
                "TTB001",
                Severity.ERROR,
                "no such bundle folder or archive",
                file=str(bundle),
                hint="check the path (relative paths are read from the current folder)",
            )
        )
    checked = check_bundle(bundle)  # its diagnostics name the files as the user typed
    errors = release_errors(checked.diagnostics)  # a template cannot pass: said first
    if errors or checked.metadata is None:
        found = errors or checked.diagnostics
        if archive is not None:
            # Inside the archive, as install says it: the extracted copy is removed.
            from dataclasses import replace

            inside = str(bundle)
            found = [
                replace(d, file=f"{archive}!{d.file[len(inside) :]}")
                if d.file and d.file.startswith(inside)
                else d
                for d in found
            ]
        raise InvalidBundleError(found)
    return bundle.absolute(), checked.metadata


def golden_choices(choices: list[str], plan: TestPlan) -> list[str]:
    """The goldens asked for, with `auto` resolved as far as it can be without the
    checkpoint: the bundle's recorded golden when it declares one."""
    out = []
    for choice in choices or [AUTO]:
        if choice == AUTO and plan.tests.golden is not None:
            choice = str(plan.bundle_dir / plan.tests.golden)
        if choice not in out:
            out.append(choice)
    return out


def _golden_path(choice: str, typed: list[str]) -> Path:
    """The golden FILE asked for; TTB001 (a path that does not exist, as everywhere) when
    `--golden` named none, with a did-you-mean for the live goldens' names."""
    path = Path(choice)
    if path.exists() or choice not in typed:  # the bundle's tests.golden: TTB111 on read
        return path
    from ttbundles.suggest import did_you_mean

    near = did_you_mean(choice, [*LIVE, AUTO])
    raise TTBundleError.single(
        "TTB001",
        "no such golden file",
        file=choice,
        hint=f"did you mean --golden {near}?"
        if near
        else "--golden takes reference, transformers, auto, or a FILE recorded with --record",
    )


def generator_is_reference(plan: TestPlan) -> bool:
    """Whether the bundle's generator is (built on) the torch reference generator, read
    from source: then the reference is the code under test, and a golden it makes proves
    nothing about it."""
    from ttbundles.check.static_reader import read_bundle_class

    try:
        static = read_bundle_class(plan.bundle_dir, plan.metadata)
    except Exception:  # noqa: BLE001 - unreadable: the ordinary default applies
        return False
    return static is not None and any(ref.startswith(REFERENCE_PACKAGE) for ref in static.lineage)


REFERENCE_PACKAGE = "ttbundles.reference."


def checkpoint_config(checkpoint: str) -> Any:
    """The checkpoint's config (its config.json, else as transformers loads it from the
    hub's cache), None when it cannot be read (the golden says why)."""
    try:
        return json.loads((Path(checkpoint) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        try:
            from ttbundles.reference.golden import load_config

            return load_config(checkpoint)
        except Exception:  # noqa: BLE001 - nothing known: hints stay general
            return None


def checkpoint_window(checkpoint: str) -> Any:
    """The checkpoint's sliding window (`format.attention_window`), None without one or
    when its config.json cannot be read (the golden says why)."""
    from ttbundles.format.attention_window import attention_window

    config = checkpoint_config(checkpoint)
    return attention_window(config) if config is not None else None


def max_positions(config: Any) -> int | None:
    """The positions the checkpoint's text model has (`max_position_embeddings`)."""
    if config is None:
        return None
    get = config.get if isinstance(config, dict) else lambda k: getattr(config, k, None)
    text = get("text_config")
    if text is not None:
        return max_positions(text)
    value = get("max_position_embeddings")
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def load_live(kind: str, checkpoint: str, *, tested_is_reference: bool = False) -> Any:
    """A live golden; `auto`: the reference where it covers the checkpoint, else
    transformers; with `tested_is_reference` (the bundle's generator is the reference),
    transformers first, the reference only when transformers cannot run the checkpoint.
    Raises TTBundleError (TTB125) when neither can be had."""
    try:
        from ttbundles.reference.golden import load_config, load_golden, reference_covers
    except ImportError as exc:
        raise _no_golden(kind, checkpoint, f"torch is not installed ({exc})") from None
    try:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # a bar per golden load is noise
        config = load_config(checkpoint)
    except Exception as exc:  # noqa: BLE001 - any failure to read it means no golden
        raise _no_golden(kind, checkpoint, f"cannot read its config: {exc}") from None
    if getattr(config, "vision_config", None) is not None and kind in (AUTO, "transformers"):
        # A vision-language checkpoint: transformers' image-text class, which takes the
        # image prompts' pixels too (text prompts: no image).
        try:
            from ttbundles.reference.vl_golden import VisionGolden

            return VisionGolden(checkpoint)
        except Exception as exc:  # noqa: BLE001
            raise _no_golden(kind, checkpoint, f"{type(exc).__name__}: {exc}") from None
    if kind == AUTO and tested_is_reference:
        try:
            return load_golden("transformers", checkpoint, config)
        except Exception:  # noqa: BLE001 - transformers cannot run it: the reference
            pass
    if kind == AUTO:
        kind = "reference" if reference_covers(config) is None else "transformers"
    elif kind == "reference":
        reason = reference_covers(config)
        if reason is not None:
            raise _no_golden(kind, checkpoint, reason)
    try:
        return load_golden(kind, checkpoint, config)
    except Exception as exc:  # noqa: BLE001
        raise _no_golden(kind, checkpoint, f"{type(exc).__name__}: {exc}") from None


def _no_golden(kind: str, checkpoint: str, reason: str) -> TTBundleError:
    return TTBundleError.single(
        "TTB125",
        f"no {kind} golden for {checkpoint}: {reason}",
        hint="use --golden transformers (any architecture transformers reads), or a golden "
        "recorded elsewhere: --golden FILE",
    )


def load_pooling(checkpoint: str, tasks: list[str]) -> Any:
    """The pooling golden for `tasks`; raises TTBundleError (TTB125) when transformers
    cannot compute it (no torch, an architecture it does not read, a checkpoint without
    the classification head)."""
    try:
        from ttbundles.reference.pooling_golden import PoolingGolden
    except ImportError as exc:
        raise _no_golden("pooling", checkpoint, f"torch is not installed ({exc})") from None
    try:
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()
        return PoolingGolden(checkpoint, tasks)
    except Exception as exc:  # noqa: BLE001 - any failure to load it means no golden
        raise _no_golden("pooling", checkpoint, f"{type(exc).__name__}: {exc}") from None


def pooling_only_goldens(choices: list[str], record: Path | None, plan: TestPlan) -> None:
    """A run of pooling paths only (a bundle of the form 'forward', or `--path` chose
    them) is compared with transformers: TTB125 for any other golden asked for, and for
    --record (a golden file holds generation steps)."""
    paths = ", ".join(plan.paths)
    other = [c for c in choices if c not in (AUTO, "transformers")]
    if other:
        raise TTBundleError.single(
            "TTB125",
            f"--golden {other[0]}: the pooling paths ({paths}) are compared with "
            "transformers only, and no generation path runs",
            hint="drop --golden, or pass --golden transformers",
        )
    if record is not None:
        raise TTBundleError.single(
            "TTB125",
            f"--record writes a golden of generation steps, and only pooling paths run ({paths})",
            hint="drop --record: the pooling paths are compared with transformers live",
        )


# --- the served side ------------------------------------------------------------------


def serve(
    plan: TestPlan,
    checkpoint: str,
    workdir: Path,
    *,
    progress: Progress,
    timeout: float,
) -> tuple[dict[str, Any], Any]:
    """Run the harness; its result document and its arrays (an NpzFile)."""
    import numpy as np

    models = workdir / "models"
    models.mkdir()
    (models / plan.bundle_dir.name).symlink_to(plan.bundle_dir, target_is_directory=True)
    out_dir = workdir / "out"
    out_dir.mkdir()
    spec = plan.harness_spec(models_dir=models, checkpoint=checkpoint, out_dir=out_dir)
    spec["parent"] = os.getpid()  # the harness ends with this process (`_die_with_parent`)
    spec_file = workdir / "spec.json"
    spec_file.write_text(json.dumps(spec), encoding="utf-8")
    log_file = workdir / "serve.log"
    env = {k: v for k, v in os.environ.items() if k != "EXTRA_MODELS_DIR"}
    error: dict[str, Any] | None = None
    process: subprocess.Popen | None = None
    timer: threading.Timer | None = None
    with open(log_file, "w", encoding="utf-8") as log:
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "ttbundles.serving.harness", str(spec_file)],
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                env=env,
                cwd=workdir,
                # Its own process group: whatever it starts goes with it (`_stop_group`).
                start_new_session=True,
            )
            timer = threading.Timer(timeout, _stop_group, (process,))
            timer.start()
            assert process.stdout is not None
            for line in process.stdout:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    continue
                kind = event.pop("event", None)
                if kind == "error":
                    error = event
                elif kind in ("plan", "progress", "advance"):
                    progress(kind, **event)
            code = process.wait()
        finally:
            if timer is not None:
                timer.cancel()
            if process is not None:
                _stop_group(process)
    if error is not None or code != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace").splitlines()[-LOG_TAIL:]
        kept = keep_log(log_file, plan.metadata.name)
        diagnostics = [
            Diagnostic(**{**d, "severity": Severity(d["severity"])})
            for d in (error or {}).get("diagnostics", [])
        ]
        if code != 0 and error is None:
            message = (
                f"the serving process was stopped after {timeout:.0f} s"
                if code < 0
                else f"the serving process exited with code {code}"
            )
        else:
            message = (error or {}).get("message", "unknown error")
            if diagnostics:
                message = "the error above"
            if (error or {}).get("where"):
                message = f"{message}, while {error['where']}"
        raise TTBundleError(
            [
                *diagnostics,
                Diagnostic(
                    "TTB127",
                    Severity.ERROR,
                    f"serving {plan.metadata.name} for the test failed: {message}",
                    file=str(kept) if kept is not None else None,
                    # The bundle's own diagnostics say what to fix; otherwise the log does.
                    hint="the whole log is in that file"
                    if diagnostics and kept is not None
                    else "the log's last lines:\n      " + "\n      ".join(tail),
                ),
            ]
        )
    result = json.loads((out_dir / "result.json").read_text(encoding="utf-8"))
    arrays = np.load(out_dir / "logits.npz")
    return result, arrays


def keep_log(log_file: Path, name: str) -> Path | None:
    """The serving log of a failed run, copied out of the run's temporary folder (which is
    always removed) to `<user cache>/test-logs/<bundle name>.log`: one file per bundle,
    the last failed run's, so nothing accumulates. None where it cannot be written."""
    from ttbundles.paths import user_cache_dir

    target = user_cache_dir() / "test-logs" / f"{name}.log"
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(log_file, target)
    except OSError:
        return None
    return target


def _stop_group(process: subprocess.Popen) -> None:
    """Kill the serving process and any process it started (its group), and reap it: a
    run that stops (finished, failed, timed out, Ctrl-C, SIGTERM) leaves nothing running,
    whatever the bundle's generator or vLLM started below it."""
    import contextlib
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


# --- one run --------------------------------------------------------------------------


def run_test(
    bundle: Path,
    checkpoint: str,
    *,
    mesh: str = HOST,
    goldens: list[str] | None = None,
    paths: list[str] | None = None,
    max_tokens: int | None = None,
    record: Path | None = None,
    record_top_k: int = DEFAULT_TOP_K,
    progress: Progress = _quiet,
    timeout: float = 1800.0,
) -> TestReport:
    from ttbundles.paths import model_argument

    started = time.perf_counter()
    typed = str(checkpoint)  # what the report shows: the path as the user typed it
    checkpoint = model_argument(typed)  # what the harness, in another folder, reads
    # Removed on every way out (a failure, Ctrl-C, SIGTERM through the CLI's handler);
    # a failed run's serving log is copied out first (`keep_log`). After `kill -9`, by
    # the next run (`workdirs`).
    folder = RunFolder()
    workdir = folder.path
    try:
        bundle_dir, metadata = checked_bundle(bundle, workdir)
        plan = resolve_plan(bundle_dir, metadata, paths=paths, max_tokens=max_tokens, mesh=mesh)
        if plan.generation_paths:
            choices = golden_choices(goldens or [], plan)
        else:  # pooling paths only: transformers, whatever else was asked
            pooling_only_goldens(goldens or [], record, plan)
            choices = []
        files: dict[str, GoldenFile] = {}
        for choice in choices:
            if choice not in LIVE and choice != AUTO:
                files[choice] = GoldenFile.read(_golden_path(choice, goldens or []))
        config = checkpoint_config(str(checkpoint))
        window = checkpoint_window(str(checkpoint))
        plan.cover_window(window, max_positions=max_positions(config), recorded=bool(files))
        live_kinds = [c for c in choices if c in LIVE or c == AUTO]
        if plan.has_images and (files or record is not None):
            raise TTBundleError.single(
                "TTB125",
                "image prompts against a recorded golden (--golden FILE, --record) are not "
                "supported yet",
                hint="compare image prompts with the live golden: --golden transformers",
            )
        if record is not None and not live_kinds:
            raise TTBundleError.single(
                "TTB125",
                "--record needs a live golden (reference or transformers) to record",
                hint="add --golden reference or --golden transformers",
            )
        report = TestReport(plan=plan, checkpoint=typed, goldens=[])
        extra_units = 1 + len(choices) + (1 if plan.pooling else 0) + (1 if record else 0)
        announced: dict[str, int] = {}

        def relay(kind: str, **event: Any) -> None:
            if kind == "plan":
                announced["total"] = event["total"] + extra_units
                progress("plan", total=announced["total"])
            else:
                progress(kind, **event)

        loaded: dict[str, Any] = {}
        failed: dict[str, TTBundleError] = {}
        tested_is_reference = AUTO in live_kinds and generator_is_reference(plan)

        def load_all() -> None:
            begun = time.perf_counter()
            for kind in live_kinds:
                try:
                    loaded[kind] = load_live(
                        kind, str(checkpoint), tested_is_reference=tested_is_reference
                    )
                except TTBundleError as exc:
                    failed[kind] = exc
            if plan.pooling:
                try:
                    loaded["pooling"] = load_pooling(str(checkpoint), plan.pooling)
                except TTBundleError as exc:
                    failed["pooling"] = exc
            report.seconds["golden_load"] = time.perf_counter() - begun

        loader = threading.Thread(target=load_all, name="ttbundle-golden", daemon=True)
        loader.start()
        # The harness serves a link to the bundle in the run's folder (or the archive's
        # extracted copy): its errors name the bundle as the user gave it.
        served_as = workdir / "models" / plan.bundle_dir.name
        shown = f"{bundle}!" if Path(bundle).is_file() else str(bundle)
        with shown_as(served_as, shown), shown_as(plan.bundle_dir, shown):
            served, arrays = serve(plan, str(checkpoint), workdir, progress=relay, timeout=timeout)
        report.seconds["serve"] = time.perf_counter() - started
        progress("progress", label="loading the golden")
        loader.join()
        if failed:
            raise TTBundleError([d for exc in failed.values() for d in exc.diagnostics])
        if record is not None and any(hasattr(g, "image_token_id") for g in loaded.values()):
            raise TTBundleError.single(
                "TTB125",
                "recording the golden of a vision-language checkpoint is not supported yet",
                hint="compare with the live golden: drop --record",
            )
        progress("advance", label="golden loaded")
        report.served = {k: v for k, v in served.items() if k not in ("runs", "model")}
        report.served["model"] = model_identity(served.get("model", {}))
        if plan.window is not None:
            plan.window.served({p["name"]: len(p["token_ids"]) for p in served["prompts"]})
        from ttbundles.conformance.compare import FileSource, LiveSource

        sources = []
        for choice in choices:
            if choice in files:
                golden = files[choice]
                check_golden_file(golden, choice, plan, served)
                sources.append(FileSource(golden, f"{Path(choice).name} ({golden.golden})"))
            else:
                sources.append(LiveSource(loaded[choice]))
        begun = time.perf_counter()
        for source in sources:
            progress("progress", label=f"comparing with {source.name}")
            report.goldens.append(source.name)
            compare_all(report, plan, served, arrays, source, window)
            progress("advance", label=f"compared with {source.name}")
        if plan.pooling:
            golden = loaded["pooling"]
            progress("progress", label=f"comparing the pooled vectors with {golden.name}")
            if golden.name not in report.goldens:
                report.goldens.append(golden.name)
            compare_pooling(report, plan, served, arrays, golden)
            progress("advance", label=f"compared the pooled vectors with {golden.name}")
        report.seconds["compare"] = time.perf_counter() - begun
        if record is not None:
            progress("progress", label=f"recording the golden to {record}")
            first = next(s for s in sources if s.live)
            recorded = record_golden(plan, served, first.golden, top_k=record_top_k)
            report.recorded = recorded.write(Path(record))
            progress("advance", label="golden recorded")
        report.seconds["total"] = time.perf_counter() - started
        return report
    finally:
        from ttbundles.registry.index import forget_user_index

        forget_user_index(workdir / "models")  # the harness's registration wrote it
        folder.remove()


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("ttbundles")
    except metadata.PackageNotFoundError:
        return "unknown"


def check_golden_file(golden: GoldenFile, where: str, plan: TestPlan, served: dict) -> None:
    """TTB126 when a recorded golden cannot answer for these tests."""
    from ttbundles.conformance.compare import golden_mismatch

    identity = model_identity(served.get("model", {}))
    differing = [k for k in identity if k in golden.model and golden.model[k] != identity[k]]
    if differing:
        raise golden_mismatch(
            f"{where} was recorded for another model ("
            + ", ".join(f"{k}: {golden.model[k]} vs {identity[k]}" for k in differing)
            + ")"
        )
    if plan.max_tokens > golden.max_tokens:
        raise golden_mismatch(
            f"{where} holds {golden.max_tokens} tokens per prompt; the tests ask for "
            f"{plan.max_tokens}"
        )
    for prompt in served["prompts"]:
        if golden.prompt_for(prompt["token_ids"]) is None:
            raise golden_mismatch(
                f"{where} has no prompt {prompt['name']} with these token ids (was it "
                "recorded for other prompts, or with another tokenizer?)"
            )


def compare_all(
    report: TestReport,
    plan: TestPlan,
    served: dict,
    arrays: Any,
    source: Any,
    window: Any = None,
) -> None:
    """Compare every served case with `source`; `window`: the checkpoint's sliding window
    (`format.attention_window`), which the fix lines name where a mismatch starts past it."""
    from ttbundles.conformance import compare

    labels = {p.name: p.label() for p in plan.prompts}
    images = {p.name: p.images for p in plan.prompts if p.images}
    thresholds = plan.thresholds
    runs = served["runs"]
    device_steps = served.get("device_steps", {})
    for path in plan.generation_paths:
        for item in runs.get(path, []):
            case = compare.CaseResult(
                path=path, prompt=item["prompt"], label=labels[item["prompt"]], golden=source.name
            )
            if path == "device_sampling":
                case.details.update(
                    seed=item["seed"],
                    seeded_alone=item["seeded_alone"],
                    seeded_batch=item["seeded_batch"],
                    device_steps=device_steps.get("sampling.device", 0),
                    host_steps=device_steps.get("sampling.host", 0),
                    device_top_logprobs=served.get("device_top_logprobs", 0),
                )
                compare.compare_logprobs(
                    case, item["context"], item["tokens"], item["logprobs"], source
                )
                compare.check_thresholds(case, thresholds, window, len(item["context"]))
                compare.compare_seeded(
                    case, item["context"], plan.tests.sampling.model_dump(), source
                )
                if not device_steps.get("sampling.device"):
                    compare._fail(
                        "TTB124",
                        case,
                        None,
                        "no step sampled on the device (every batch fell back to the host)",
                        "check the bundle's sample_on_device capability and the plan: "
                        "ttbundle plan --model CHECKPOINT --additional-config "
                        '\'{"tt": {"sample_on_device_mode": "all"}}\'',
                    )
            else:
                case.details.update(
                    num_cached_tokens=item["num_cached_tokens"],
                    prefill_chunks=item["prefill_chunks"],
                    prompt_tokens=len(item["context"]),
                )
                golden = source
                if item.get("images"):
                    case.details["images"] = len(images[item["prompt"]])
                    golden = source.with_images(images[item["prompt"]])
                compare.compare_logits(
                    case, item["context"], item["tokens"], arrays[item["logits"]], golden
                )
                compare.check_thresholds(case, thresholds, window, len(item["context"]))
                exercised(case, path, served)
            report.cases.append(case)
    perplexity = runs.get("perplexity")
    if perplexity is not None:
        result = compare.compare_perplexity(
            arrays[perplexity["logits"]], perplexity["token_ids"], source, thresholds
        )
        if result is not None:
            report.perplexity.append(result)


def compare_pooling(
    report: TestReport, plan: TestPlan, served: dict, arrays: Any, golden: Any
) -> None:
    """Compare every prompt's served pooled vectors with the pooling golden's, each
    pooling path as its engine's pooler pooled (`served["pooler"]`)."""
    from ttbundles.check.tests_section import POOLING_PATHS
    from ttbundles.conformance import compare, pooling

    labels = {p.name: p.label() for p in plan.prompts}
    for path in plan.paths:
        task = POOLING_PATHS.get(path)
        if task is None:
            continue
        pooler = served.get("pooler", {}).get(task, {})
        for item in served["runs"].get(path, []):
            pair = item.get("pair")  # a reranker's query/document pair (two prompts)
            label = (
                f"{item['prompt']} (query {labels[pair[0]]}, document {labels[pair[1]]})"
                if pair
                else labels[item["prompt"]]
            )
            case = compare.CaseResult(
                path=path, prompt=item["prompt"], label=label, golden=golden.name
            )
            case.details.update(
                prompt_tokens=len(item["context"]),
                pooling=pooler.get("seq_pooling_type"),
            )
            if pair:
                case.details["pair"] = list(pair)
            served_vectors = {kind: arrays[key] for kind, key in item["vectors"].items()}
            wanted = pooling.golden_vectors(task, golden, item["context"], pooler)
            pooling.compare_pooled(
                case, task, served_vectors, wanted, pooler.get("seq_pooling_type")
            )
            report.cases.append(case)


def exercised(case: Any, path: str, served: dict) -> None:
    """TTB124 when a path did not do what it is named for."""
    from ttbundles.conformance.compare import _fail

    details = case.details
    if path == "chunked_prefill" and details["prefill_chunks"] < 2:
        chunk = served.get("chunk_size")
        if isinstance(chunk, int) and details["prompt_tokens"] <= chunk:
            # A prompt no longer than the step budget is prefilled in one step whatever
            # the bundle does: a limit of these settings (tests.chunk_size), not a fault.
            case.skipped = (
                f"the chunked-prefill check cannot run: the prompt of "
                f"{details['prompt_tokens']} tokens fits one chunk of {chunk} "
                "(tests.chunk_size below the prompt's length makes it run)"
            )
            return
        _fail(
            "TTB124",
            case,
            None,
            f"the prompt of {details['prompt_tokens']} tokens was prefilled in one step "
            f"(chunk_size {served.get('chunk_size')})",
            "set tests.chunk_size below the prompt's length",
        )
    if path == "prefix_cache" and details["num_cached_tokens"] == 0:
        block = next((e["block_size"] for e in served["engines"] if e["name"] == "host"), "?")
        if isinstance(block, int) and details["prompt_tokens"] <= block:
            # vLLM caches whole blocks and recomputes at least the last token: a sequence
            # of one block or less can never hit. A limit of these settings, not a fault.
            case.skipped = (
                f"the cache-hit check cannot run: the resent sequence of "
                f"{details['prompt_tokens']} tokens does not exceed one block of {block} "
                "(longer prompts or more --max-tokens make it run)"
            )
            return
        _fail(
            "TTB124",
            case,
            None,
            f"no prefix-cache hit: its {details['prompt_tokens']} tokens fill no block of {block}",
            "use longer prompts or more max_tokens (the decode path's sequence is sent again)",
        )


def record_golden(plan: TestPlan, served: dict, golden: Any, *, top_k: int) -> GoldenFile:
    """What `golden` computes for these tests, as a GoldenFile: each prompt's greedy
    continuation of 2 x max_tokens steps with its top-k logits, and the perplexity text."""
    import numpy as np

    from ttbundles.conformance import metrics

    def f32(values: Any) -> list[float]:
        # The shortest text that reads back as the same float32.
        return [float(str(np.float32(v))) for v in values]

    prompts = []
    steps = 2 * plan.max_tokens
    for prompt in served["prompts"]:
        ids = list(prompt["token_ids"])
        tokens, logits = golden.greedy(ids, steps)
        top = [metrics.top_ids(row, top_k) for row in logits]
        prompts.append(
            RecordedPrompt(
                name=prompt["name"],
                text=prompt["text"],
                token_ids=ids,
                tokens=[int(t) for t in tokens],
                top_ids=[[int(i) for i in row] for row in top],
                top_values=[f32(row[ids_]) for row, ids_ in zip(logits, top)],
                lse=f32([metrics.logsumexp(row) for row in logits]),
            )
        )
    perplexity = None
    ppl = served.get("perplexity") or {}
    if ppl.get("token_ids"):
        from ttbundles.conformance.compare import LiveSource

        logprobs = LiveSource(golden).perplexity_logprobs(ppl["token_ids"])
        perplexity = RecordedPerplexity(ppl["text"], list(ppl["token_ids"]), f32(logprobs))
    return GoldenFile(
        golden=golden.name,
        model=model_identity(served.get("model", {})),
        max_tokens=plan.max_tokens,
        top_k=top_k,
        prompts=prompts,
        perplexity=perplexity,
        created_with=f"ttbundles {_version()}",
    )
