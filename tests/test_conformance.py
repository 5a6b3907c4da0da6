"""`ttbundle test`: the tests section, the metrics, the comparison, the golden file, the
reports (fast tier); and the command itself on the demo bundle and on deliberately wrong
generators, served by vLLM's engine (the slow tier, `-m server`).
"""

from __future__ import annotations

import gzip
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from ttbundles.conformance import metrics
from ttbundles.conformance.compare import (
    CaseResult,
    FileSource,
    GoldenStep,
    LiveSource,
    check_thresholds,
    compare_logits,
    compare_logprobs,
    compare_perplexity,
    compare_seeded,
)
from ttbundles.conformance.plan import resolve_plan
from ttbundles.conformance.report import to_json, to_junit
from ttbundles.conformance.session import TestReport, golden_choices
from ttbundles.errors import InvalidBundleError
from ttbundles.format.golden_file import GoldenFile, GoldenFileError
from ttbundles.format.metadata import Thresholds
from ttbundles.format.parse import parse_metadata
from ttbundles.format.schema import generate_schema

REPO = Path(__file__).parents[1]
DEMO = REPO / "bundles" / "demo"
META = "vllm_metadata.json"
BASE = {
    "schema_version": 1,
    "name": "t",
    "version": "1.0.0",
    "arch": "LlamaForCausalLM",
    "main_class": "adapter:Gen",
}
ALL_CAPS = {
    "prefix_caching": True,
    "chunked_prefill": True,
    "sample_on_device": ["decode_only", "all"],
}


def parsed(tests, **extra):
    text = json.dumps({**BASE, **extra, "tests": tests}, indent=2)
    return parse_metadata(text, file=Path(META))


def only_error(tests, **extra):
    loaded = parsed(tests, **extra)
    assert loaded.metadata is None and len(loaded.diagnostics) == 1, [
        str(d) for d in loaded.diagnostics
    ]
    return loaded.diagnostics[0]


# --- the tests section: schema and parsing ----------------------------------------------


def test_absent_tests_section_is_none_and_an_empty_one_has_every_default():
    assert parse_metadata(json.dumps(BASE), file=Path(META)).metadata.tests is None
    tests = parsed({}).metadata.tests
    assert tests.prompts == [] and tests.prompt_file is None and tests.paths is None
    assert tests.max_tokens == 16 and tests.chunk_size is None and tests.golden is None
    assert (tests.thresholds.pcc, tests.thresholds.top1, tests.thresholds.top5) == (
        0.99,
        0.95,
        0.99,
    )
    assert tests.thresholds.max_abs_diff is None and tests.thresholds.perplexity_ratio == 1.05
    assert tests.sampling.top_k == 20 and tests.perplexity_text


def test_a_full_tests_section_parses_and_the_schema_accepts_it():
    tests = {
        "prompts": ["Hello", "The sky is"],
        "prompt_file": "tests/prompts.json",
        "max_tokens": 8,
        "paths": ["decode", "prefix_cache", "device_sampling"],
        "chunk_size": 4,
        "sampling": {"seed": 3, "temperature": 1, "top_k": 0, "top_p": 0.9, "x-note": "ok"},
        "thresholds": {"pcc": 0.98, "top1": 0.9, "top5": 1, "max_abs_diff": 0.5},
        "perplexity_text": None,
        "golden": "tests/golden.json.gz",
        "x-owner": "bring-up",
    }
    loaded = parsed(tests, capabilities=ALL_CAPS)
    assert loaded.diagnostics == []
    meta = loaded.metadata
    assert meta.tests.paths == ["decode", "prefix_cache", "device_sampling"]
    assert meta.tests.thresholds.top5 == 1.0 and meta.tests.perplexity_text is None
    assert meta.tests.extensions == {"x-owner": "bring-up"}
    assert meta.tests.sampling.extensions == {"x-note": "ok"}
    jsonschema.validate({**BASE, "capabilities": ALL_CAPS, "tests": tests}, generate_schema())


@pytest.mark.parametrize(
    ("tests", "bad"),
    [
        ({"promts": []}, "promts"),
        ({"thresholds": {"pc": 1}}, "pc"),
        ({"sampling": {"sed": 1}}, "sed"),
    ],
)
def test_the_schema_rejects_unknown_keys_in_tests(tests, bad):
    with pytest.raises(jsonschema.ValidationError, match=bad):
        jsonschema.validate({**BASE, "tests": tests}, generate_schema())


@pytest.mark.parametrize(
    ("tests", "code", "pointer", "line", "fix"),
    [
        ({"promts": ["a"]}, "TTB030", "/tests/promts", 8, "did you mean 'prompts'?"),
        ({"thresholds": {"pc": 0.9}}, "TTB030", "/tests/thresholds/pc", 9, "did you mean 'pcc'?"),
        ({"sampling": {"sed": 1}}, "TTB030", "/tests/sampling/sed", 9, "did you mean 'seed'?"),
        (
            {"paths": ["decode", "decoding"]},
            "TTB033",
            "/tests/paths/1",
            10,
            "did you mean 'decode'?",
        ),
        ({"thresholds": {"pcc": "0.99"}}, "TTB032", "/tests/thresholds/pcc", 9, "without quotes"),
        ({"thresholds": {"pcc": 1.5}}, "TTB033", "/tests/thresholds/pcc", 9, None),
        ({"max_tokens": 0}, "TTB033", "/tests/max_tokens", 8, None),
        ({"max_tokens": True}, "TTB032", "/tests/max_tokens", 8, None),
        ({"paths": ["decode", "decode"]}, "TTB033", "/tests/paths", 8, "list each once"),
        ({"prompts": ["a", "a"]}, "TTB033", "/tests/prompts", 8, "list each prompt once"),
        ({"prompts": [""]}, "TTB033", "/tests/prompts/0", 9, None),
        ({"golden": "../golden.json.gz"}, "TTB033", "/tests/golden", 8, "relative"),
        ({"prompt_file": "/etc/passwd"}, "TTB033", "/tests/prompt_file", 8, "relative"),
        ({"sampling": {"temperature": 0}}, "TTB033", "/tests/sampling/temperature", 9, None),
        ("not an object", "TTB032", "/tests", 7, "write an object"),
    ],
)
def test_bad_tests_sections_are_diagnosed_like_the_rest_of_the_format(
    tests, code, pointer, line, fix
):
    d = only_error(tests)
    assert (d.code, d.pointer, d.line) == (code, pointer, line), str(d)
    if fix is not None:
        assert fix in (d.hint or ""), str(d)


# --- validate: the section's rules beyond the schema ------------------------------------


def test_validate_names_a_path_the_capabilities_do_not_declare(make_bundle, run_cli):
    folder = make_bundle(
        "t", metadata={"tests": {"paths": ["decode", "prefix_cache", "device_sampling"]}}
    )
    done = run_cli("validate", folder)
    assert done.returncode == 1
    assert f"{META}:11:7 /tests/paths/1: error TTB110" in done.stdout
    assert "needs capabilities.prefix_caching" in done.stdout
    assert "/tests/paths/2: error TTB110" in done.stdout
    assert "needs capabilities.sample_on_device" in done.stdout


def test_validate_checks_the_prompt_file_and_points_into_it(make_bundle, run_cli):
    folder = make_bundle(
        "t",
        metadata={"tests": {"prompt_file": "prompts.json"}},
        files={"prompts.json": '{"a": [1, 2], "b": [3, -4]}'},
    )
    done = run_cli("validate", folder)
    assert done.returncode == 1
    assert "prompts.json /b/1: error TTB111 prompt 'b': -4 is not a token id" in done.stdout


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({}, "golden: the golden file does not exist"),
        ({"golden.json.gz": "plain text"}, "not a gzip-compressed JSON golden file"),
    ],
)
def test_validate_checks_the_recorded_golden(make_bundle, run_cli, files, message):
    folder = make_bundle("t", metadata={"tests": {"golden": "golden.json.gz"}}, files=files)
    done = run_cli("validate", folder)
    assert done.returncode == 1 and "TTB111" in done.stdout and message in done.stdout


def test_the_demo_bundle_declares_its_tests():
    loaded = parse_metadata((DEMO / META).read_text(), file=DEMO / META)
    assert loaded.diagnostics == [] and loaded.metadata.tests is not None
    plan = resolve_plan(DEMO, loaded.metadata)
    assert plan.paths == [
        "prefill",
        "decode",
        "chunked_prefill",
        "prefix_cache",
        "device_sampling",
        "pooling_embed",  # it pools too (the form prefill_hidden)
    ]
    assert plan.device_mode == "all" and plan.max_tokens == 12


# --- the plan ---------------------------------------------------------------------------


def plan_for(tmp_path, tests=None, capabilities=None, files=None, **kwargs):
    folder = tmp_path / "b"
    folder.mkdir(exist_ok=True)
    for name, text in (files or {}).items():
        (folder / name).write_text(text)
    document = {**BASE, "capabilities": capabilities or {}}
    if tests is not None:
        document["tests"] = tests
    meta = parse_metadata(json.dumps(document), file=folder / META).metadata
    return resolve_plan(folder, meta, **kwargs)


def test_default_paths_follow_the_capabilities(tmp_path):
    assert plan_for(tmp_path).paths == ["prefill", "decode"]
    plan = plan_for(
        tmp_path, capabilities={"prefix_caching": True, "sample_on_device": ["decode_only"]}
    )
    assert plan.paths == ["prefill", "decode", "prefix_cache", "device_sampling"]
    assert plan.device_mode == "decode_only"
    assert [p.text for p in plan.prompts][0] == "The capital of France is"  # the defaults


def test_command_line_paths_win_and_are_checked_against_the_capabilities(tmp_path):
    plan = plan_for(tmp_path, tests={"paths": ["prefill"]}, paths=["decode"], max_tokens=3)
    assert plan.paths == ["decode"] and plan.max_tokens == 3
    with pytest.raises(InvalidBundleError) as caught:
        plan_for(tmp_path, paths=["chunked_prefill"])
    (d,) = caught.value.diagnostics
    assert d.code == "TTB110" and d.pointer is None
    with pytest.raises(InvalidBundleError, match="unknown test path 'decoding'"):
        plan_for(tmp_path, paths=["decoding"])


def test_texts_come_first_then_the_prompt_file(tmp_path):
    plan = plan_for(
        tmp_path,
        tests={"prompts": ["Hi"], "prompt_file": "p.json"},
        files={"p.json": "[[5, 6, 7], [8]]"},
    )
    assert [(p.name, p.text, p.token_ids) for p in plan.prompts] == [
        ("p0", "Hi", None),
        ("f0", None, (5, 6, 7)),
        ("f1", None, (8,)),
    ]
    assert not plan.runs_perplexity or plan.tests.perplexity_text


def test_a_mesh_the_bundle_does_not_target_is_refused(tmp_path):
    folder = tmp_path / "b"
    folder.mkdir()
    meta = parse_metadata(
        json.dumps({**BASE, "targets": {"N150": {}}}), file=folder / META
    ).metadata
    with pytest.raises(InvalidBundleError, match="does not target mesh HOST"):
        resolve_plan(folder, meta)


def test_auto_picks_the_bundles_recorded_golden(tmp_path):
    plan = plan_for(tmp_path, tests={"golden": "g.json.gz"})
    assert golden_choices([], plan) == [str(plan.bundle_dir / "g.json.gz")]
    assert golden_choices(["reference", "auto"], plan_for(tmp_path)) == ["reference", "auto"]


# --- metrics ----------------------------------------------------------------------------


def test_pcc_is_pearson_and_handles_the_edges():
    rng = np.random.default_rng(0)
    x = rng.normal(size=1000)
    assert metrics.pcc(x, x) == pytest.approx(1.0)
    assert metrics.pcc(x, 3 * x + 7) == pytest.approx(1.0)
    assert metrics.pcc(x, -x) == pytest.approx(-1.0)
    y = rng.normal(size=1000)
    assert metrics.pcc(x, y) == pytest.approx(np.corrcoef(x, y)[0, 1])
    assert metrics.pcc(np.ones(4), np.ones(4)) == 1.0
    assert metrics.pcc(np.ones(4), np.zeros(4)) == 0.0
    assert metrics.pcc(np.ones(4), x[:4]) == 0.0
    assert math.isnan(metrics.pcc(np.array([1.0, np.nan]), np.array([1.0, 2.0])))
    with pytest.raises(ValueError):
        metrics.pcc(x, y[:10])


def test_rankings_logsumexp_and_perplexity():
    values = np.array([1.0, 3.0, 3.0, 2.0])
    assert metrics.top_ids(values, 3).tolist() == [1, 2, 3]  # ties: the lower id first
    assert metrics.rank_of(values, 2) == 2 and metrics.rank_of(values, 0) == 4
    assert metrics.logsumexp(values) == pytest.approx(np.log(np.exp(values).sum()))
    assert metrics.log_softmax(values).max() == pytest.approx(3 - metrics.logsumexp(values))
    assert metrics.perplexity(np.full(10, -math.log(384))) == pytest.approx(384)
    assert math.isnan(metrics.perplexity([]))
    assert metrics.max_abs_diff(values, values + [0, 0.5, -2, 0]) == 2.0


def test_sampling_support_is_top_k_then_top_p():
    logits = np.array([5.0, 4.0, 3.0, 2.0, 1.0])
    kw = {"temperature": 1.0}
    assert metrics.in_support(logits, 1, top_k=2, top_p=1.0, **kw)
    assert not metrics.in_support(logits, 2, top_k=2, top_p=1.0, **kw)
    assert metrics.in_support(logits, 0, top_k=0, top_p=0.5, **kw)
    assert not metrics.in_support(logits, 3, top_k=0, top_p=0.5, **kw)
    assert metrics.in_support(logits, 4, top_k=0, top_p=1.0, **kw)


# --- comparing --------------------------------------------------------------------------


class ArrayGolden:
    """A live golden whose logits are a fixed function of the sequence."""

    name = "array"

    def __init__(self, vocab=16, seed=1):
        self.table = np.random.default_rng(seed).normal(size=(64, vocab)).astype(np.float32)

    def sequence_logits(self, ids):
        return np.stack([self.table[(sum(ids[: j + 1]) * 7 + j) % 64] for j in range(len(ids))])

    def greedy(self, ids, steps):
        tokens, rows = [], []
        for _ in range(steps):
            row = self.sequence_logits(ids + tokens)[-1]
            rows.append(row)
            tokens.append(int(np.argmax(row)))
        return tokens, np.stack(rows)


def served_like(golden, context, steps, *, break_at=None, noise=0.0):
    """A bundle's greedy run that agrees with `golden` until `break_at` (scrambled after)."""
    tokens, rows = [], []
    for k in range(steps):
        row = golden.sequence_logits(context + tokens)[-1].copy()
        if break_at is not None and k >= break_at:
            row = row[::-1].copy()
        row = row + noise
        rows.append(row)
        tokens.append(int(np.argmax(row)))
    return tokens, np.stack(rows)


def case(path="decode"):
    return CaseResult(path=path, prompt="p0", label="p0 'x'", golden="array")


def test_a_faithful_run_passes_every_threshold_against_a_live_golden():
    golden = ArrayGolden()
    context = [1, 2, 3]
    tokens, logits = served_like(golden, context, 6, noise=1e-4)
    result = case()
    compare_logits(result, context, tokens, logits, LiveSource(golden))
    check_thresholds(result, Thresholds(max_abs_diff=1e-3))
    assert result.passed and len(result.compared) == 6
    summary = result.summary()
    assert summary["pcc_min"] == pytest.approx(1.0) and summary["first_divergence"] is None
    assert summary["top1"] == summary["top5"] == 1.0


def test_the_first_failing_step_is_named_and_teacher_forcing_compares_every_step():
    golden = ArrayGolden()
    context = [4, 5]
    tokens, logits = served_like(golden, context, 6, break_at=3)
    result = case()
    compare_logits(result, context, tokens, logits, LiveSource(golden))
    check_thresholds(result, Thresholds())
    assert len(result.compared) == 6  # a live golden follows the bundle's tokens
    codes = {d.code for d in result.failures}
    assert codes == {"TTB120"}
    pcc = next(d for d in result.failures if "PCC" in d.message)
    assert pcc.message.startswith("decode, prompt p0 'x', step 3: PCC")
    assert result.summary()["first_divergence"] == 3


def test_missing_served_logits_are_a_failure_of_their_own():
    golden = ArrayGolden()
    tokens, logits = served_like(golden, [1], 3)
    logits[1] = np.nan
    result = case()
    compare_logits(result, [1], tokens, logits, LiveSource(golden))
    check_thresholds(result, Thresholds())
    assert [d.code for d in result.failures] == ["TTB127"]
    assert "step 1" in result.failures[0].message


def test_device_logprobs_are_compared_as_log_probabilities():
    golden = ArrayGolden()
    context = [2, 3]
    tokens, logits = served_like(golden, context, 4)
    logprobs = []
    for row in logits:
        lp = metrics.log_softmax(row)
        ids = metrics.top_ids(row, 5)
        logprobs.append([[int(i), float(lp[i])] for i in ids])
    result = case("device_sampling")
    compare_logprobs(result, context, tokens, logprobs, LiveSource(golden))
    check_thresholds(result, Thresholds(max_abs_diff=1e-5))
    assert result.passed and all(s.pcc == pytest.approx(1.0) for s in result.steps)


def test_seeded_runs_must_agree_and_stay_in_the_golden_support():
    golden = ArrayGolden()
    context = [1, 1]
    alone = [int(np.argmax(golden.sequence_logits(context)[-1]))]
    result = case("device_sampling")
    result.details.update(seed=5, seeded_alone=alone + [3, 3], seeded_batch=alone + [3, 9])
    sampling = {"temperature": 1.0, "top_k": 16, "top_p": 1.0}
    compare_seeded(result, context, sampling, LiveSource(golden))
    (d,) = result.failures
    assert d.code == "TTB121" and "step 2" in d.message and "seed 5" in d.message
    # A token the golden ranks last, with top_k=1: outside the support.
    row = golden.sequence_logits(context)[-1]
    worst = int(np.argmin(row))
    result = case("device_sampling")
    result.details.update(seed=5, seeded_alone=[worst], seeded_batch=[worst])
    compare_seeded(result, context, {**sampling, "top_k": 1}, LiveSource(golden))
    (d,) = result.failures
    assert d.code == "TTB122" and "step 0" in d.message


def test_perplexity_ratio_is_checked_both_ways():
    golden = ArrayGolden()
    ids = [1, 2, 3, 4, 5]
    served = golden.sequence_logits(ids)[:-1]
    same = compare_perplexity(served, ids, LiveSource(golden), Thresholds())
    assert same.passed and same.ratio == pytest.approx(1.0)
    worse = compare_perplexity(served * 0.0, ids, LiveSource(golden), Thresholds())
    assert not worse.passed and worse.failures[0].code == "TTB123"


# --- the recorded golden ----------------------------------------------------------------


def recorded(golden, prompts, steps, top_k=8):
    from ttbundles.format.golden_file import RecordedPrompt

    out = []
    for name, ids in prompts.items():
        tokens, logits = golden.greedy(list(ids), steps)
        top = [metrics.top_ids(row, top_k) for row in logits]
        out.append(
            RecordedPrompt(
                name=name,
                text=None,
                token_ids=list(ids),
                tokens=tokens,
                top_ids=[t.tolist() for t in top],
                top_values=[row[t].tolist() for row, t in zip(logits, top)],
                lse=[metrics.logsumexp(row) for row in logits],
            )
        )
    return GoldenFile("array", {"vocab_size": 16}, steps // 2, top_k, out)


def test_a_golden_file_round_trips_byte_for_byte(tmp_path):
    golden = recorded(ArrayGolden(), {"a": [1, 2], "b": [3]}, 6)
    first = golden.write(tmp_path / "g.json.gz").read_bytes()
    again = golden.write(tmp_path / "h.json.gz").read_bytes()
    assert first == again  # no timestamp: a bundle shipping it keeps its digest
    back = GoldenFile.read(tmp_path / "g.json.gz")
    assert back.prompts == golden.prompts and back.top_k == 8 and back.max_tokens == 3
    assert json.loads(gzip.decompress(first))["format"] == "ttbundles-golden"


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda d: d.update(format_version=9), "version 9 is not supported"),
        (lambda d: d["prompts"][0]["lse"].pop(), "inconsistent lengths"),
        (lambda d: d.pop("prompts"), "incomplete or malformed"),
    ],
)
def test_a_broken_golden_file_is_refused(tmp_path, mutate, message):
    document = recorded(ArrayGolden(), {"a": [1, 2]}, 4).to_document()
    mutate(document)
    path = tmp_path / "g.json.gz"
    path.write_bytes(gzip.compress(json.dumps(document).encode()))
    with pytest.raises(GoldenFileError, match=message) as caught:
        GoldenFile.read(path)
    assert caught.value.diagnostics[0].code == "TTB111"


def test_a_recorded_golden_compares_on_its_path_and_stops_at_the_divergence():
    live = ArrayGolden()
    source = FileSource(recorded(live, {"a": [1, 2]}, 8), "g.json.gz (array)")
    tokens, logits = served_like(live, [1, 2], 6, break_at=2)
    result = case()
    compare_logits(result, [1, 2], tokens, logits, source)
    check_thresholds(result, Thresholds())
    assert [s.compared for s in result.steps] == [True, True, True, False, False, False]
    assert result.steps[3].note == "off the recorded path"
    assert any("step 2" in d.message for d in result.failures)
    # The prefix_cache path continues a recorded path: steps max_tokens.. are known too.
    faithful, logits = served_like(live, [1, 2], 8)
    result = case("prefix_cache")
    compare_logits(result, [1, 2] + faithful[:4], faithful[4:], logits[4:], source)
    check_thresholds(result, Thresholds())
    assert result.passed and len(result.compared) == 4


def test_golden_steps_from_a_file_know_only_their_top_k():
    step = GoldenStep(np.array([3.0, 2.0]), 4.0, np.array([7, 1]))
    assert step.token == 7
    known = step.logits_at(np.array([1, 7, 5]))
    assert known[:2].tolist() == [2.0, 3.0] and math.isnan(known[2])


def test_the_recorded_reference_golden_round_trips_against_the_live_one(tmp_path, demo_checkpoint):
    """Record the reference golden for a plan, read it back, and check the reference's own
    logits against it: every step compared and equal to float32 precision."""
    import torch  # noqa: F401 - required: a missing or broken torch fails

    from ttbundles.conformance.session import record_golden
    from ttbundles.reference.golden import ReferenceGolden

    plan = plan_for(tmp_path, tests={"max_tokens": 4})
    golden = ReferenceGolden(demo_checkpoint)
    prompts = [{"name": "p0", "text": "x", "token_ids": [1, 40, 41, 42]}]
    served = {
        "prompts": prompts,
        "model": {"vocab_size": 384},
        "perplexity": {"text": "t", "token_ids": [1, 50, 51, 52, 53]},
    }
    path = record_golden(plan, served, golden, top_k=16).write(tmp_path / "g.json.gz")
    back = GoldenFile.read(path)
    assert back.golden == "reference" and len(back.prompts[0].tokens) == 8
    source = FileSource(back, "g")
    tokens, logits = golden.greedy([1, 40, 41, 42], 8)
    result = case()
    compare_logits(result, [1, 40, 41, 42], tokens, logits, source)
    check_thresholds(result, Thresholds(pcc=0.999999, max_abs_diff=1e-4))
    assert result.passed and len(result.compared) == 8
    ppl = compare_perplexity(
        golden.sequence_logits([1, 50, 51, 52, 53])[:-1], [1, 50, 51, 52, 53], source, Thresholds()
    )
    assert ppl.passed and ppl.ratio == pytest.approx(1.0, abs=1e-6)


# --- a golden file inside a bundle: packed, and covered by the manifest -------------------


def test_pack_includes_the_golden_and_verify_covers_it(tmp_path, make_bundle):
    from ttbundles.archive.reader import read_archive, verify
    from ttbundles.build import pack
    from ttbundles.installer.operations import install

    golden = recorded(ArrayGolden(), {"a": [1, 2]}, 4)
    folder = make_bundle("t", metadata={"tests": {"golden": "tests/golden.json.gz"}})
    golden.write(folder / "tests" / "golden.json.gz")
    archive = pack(folder, tmp_path / "dist")
    assert "tests/golden.json.gz" in {f.path for f in read_archive(archive).files}
    installed = install(archive, tmp_path / "models").path
    assert verify(installed).ok()
    (installed / "tests" / "golden.json.gz").write_bytes(gzip.compress(b"{}"))
    (error,) = verify(installed).errors
    assert error.code == "TTB082" and error.message.startswith("tests/golden.json.gz: ")


# --- the reports ------------------------------------------------------------------------


def a_report(tmp_path):
    plan = plan_for(tmp_path, tests={"max_tokens": 3})
    golden = ArrayGolden()
    report = TestReport(plan=plan, checkpoint="ckpt", goldens=["array"])
    for path, break_at in (("prefill", None), ("decode", 1)):
        for name in ("p0", "p1"):
            result = CaseResult(path=path, prompt=name, label=name, golden="array")
            tokens, logits = served_like(golden, [1, 2], 3, break_at=break_at)
            compare_logits(result, [1, 2], tokens, logits, LiveSource(golden))
            check_thresholds(result, Thresholds())
            report.cases.append(result)
    served = golden.sequence_logits([1, 2, 3])[:-1]
    report.perplexity.append(
        compare_perplexity(served, [1, 2, 3], LiveSource(golden), Thresholds())
    )
    report.seconds["total"] = 1.5
    return report


def test_junit_has_one_testcase_per_path_and_prompt(tmp_path):
    report = a_report(tmp_path)
    root = ET.fromstring(to_junit(report))
    assert root.tag == "testsuites" and root.get("tests") == "5" and root.get("failures") == "2"
    (suite,) = root.findall("testsuite")
    assert suite.get("name") == "t@1.0.0 vs array" and suite.get("tests") == "5"
    cases = suite.findall("testcase")
    assert [(c.get("classname"), c.get("name")) for c in cases] == [
        ("t.prefill", "p0"),
        ("t.prefill", "p1"),
        ("t.decode", "p0"),
        ("t.decode", "p1"),
        ("t.perplexity", "perplexity"),
    ]
    failures = [f for c in cases for f in c.findall("failure")]
    assert failures and all(f.get("type") == "TTB120" for f in failures)
    assert "step 1" in failures[0].get("message")
    assert all(c.find("system-out") is not None for c in cases)


def test_the_json_report_is_json_and_says_where_it_failed(tmp_path):
    data = json.loads(json.dumps(to_json(a_report(tmp_path))))
    assert data["passed"] is False and data["goldens"] == ["array"]
    failing = [c for c in data["cases"] if not c["passed"]]
    assert {c["path"] for c in failing} == {"decode"}
    assert failing[0]["summary"]["first_divergence"] == 1
    assert all(len(c["steps"]) == c["summary"]["steps"] for c in data["cases"])
    assert data["perplexity"][0]["passed"] is True


# --- the runner's step observer (the runner stepped in-process, no engine) ---------------


def test_the_step_observer_sees_each_rows_positions_and_logits(demo_checkpoint):
    import vllm  # noqa: F401 - required: a missing or broken vllm fails

    from tests.test_runner_steps import build, request, run
    from ttbundles.reference.golden import ReferenceGolden

    scheduler, runner = build(demo_checkpoint, async_decode=False)
    seen = []
    runner.observer = lambda kind, req_ids, starts, ends, logits: seen.append(
        (kind, list(req_ids), list(starts), list(ends), None if logits is None else logits.clone())
    )
    prompt = list(range(20, 30))
    # min_tokens keeps the batch on the host sampler, so the generator returns logits.
    out = run(scheduler, runner, {0: [request("a", prompt, 3, temperature=0.0, min_tokens=1)]})
    assert [(k, s, e) for k, _, s, e, _ in seen] == [
        ("prefill", [0], [10]),
        ("decode", [10], [11]),
        ("decode", [11], [12]),
    ]
    golden = ReferenceGolden(demo_checkpoint).sequence_logits(prompt + out["a"][:2])
    for (_, _, _, ends, logits), position in zip(seen, (10, 11, 12)):
        assert ends == [position]
        np.testing.assert_allclose(logits[0].numpy(), golden[position - 1], atol=1e-4)
    # Sampling on the device: the rows are observed, without logits.
    scheduler, runner = build(demo_checkpoint, async_decode=True)
    seen.clear()
    runner.observer = lambda kind, req_ids, starts, ends, logits: seen.append((kind, logits))
    run(scheduler, runner, {0: [request("b", prompt, 3, temperature=0.0)]})
    assert [k for k, _ in seen] == ["prefill", "decode", "decode"]
    assert all(logits is None for _, logits in seen)


# --- the command, before anything is served ---------------------------------------------


def test_the_command_refuses_a_path_the_bundle_does_not_declare(make_bundle, run_cli):
    folder = make_bundle("t")
    done = run_cli("test", folder, "--model", "ckpt", "--path", "prefix_cache")
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "error TTB110 test path 'prefix_cache' needs capabilities.prefix_caching" in done.stderr


def test_the_command_refuses_an_unreadable_golden_file(make_bundle, run_cli, tmp_path):
    (tmp_path / "g.json.gz").write_text("not gzip")
    done = run_cli("test", make_bundle("t"), "--model", "ckpt", "--golden", tmp_path / "g.json.gz")
    assert done.returncode == 1 and "TTB111" in done.stderr and "Traceback" not in done.stderr


def test_the_command_refuses_an_invalid_bundle_with_validates_diagnostics(make_bundle, run_cli):
    folder = make_bundle("t", metadata={"tests": {"max_tokens": -1}})
    done = run_cli("test", folder, "--model", "ckpt")
    assert done.returncode == 1 and "/tests/max_tokens: error TTB033" in done.stderr


# --- the command, served (the slow tier) ------------------------------------------------

ROPE_ADAPTER = '''"""Decode applies RoPE one position late (prefill is right)."""

from ttbundles.reference.generator import ReferenceLlamaGenerator


class RopeOffByOne(ReferenceLlamaGenerator):
    def forward_segments(self, segments, page_table, kv_cache, **kwargs):
        self._decoding = all(len(s.tokens) == 1 for s in segments)
        return super().forward_segments(segments, page_table, kv_cache, **kwargs)

    def rope(self, positions):
        return super().rope(positions + 1 if self._decoding else positions)
'''

KV_ADAPTER = '''"""K/V written through the page table, but attention reads a sequence's blocks as if
they followed its first one: the rest of the page table is ignored."""

import torch

import ttbundles.reference.model as reference
from ttbundles.reference.generator import ReferenceLlamaGenerator


class ContiguousReads(ReferenceLlamaGenerator):
    def forward_segments(self, segments, page_table, kv_cache, **kwargs):
        groups = reference.attention_groups

        def contiguous(segments, positions, table, shape, *window):
            first = table[:, :1] + torch.arange(table.shape[1])
            return groups(segments, positions, first, shape, *window)

        reference.attention_groups = contiguous
        try:
            return super().forward_segments(segments, page_table, kv_cache, **kwargs)
        finally:
            reference.attention_groups = groups
'''

SEED_ADAPTER = '''"""A device sampler that drops the request's seed."""

import dataclasses

from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.reference.sampling import DeviceSampler


class SeedlessSampler(DeviceSampler):
    def reload_params(self, slots, params, positions):
        super().reload_params(slots, dataclasses.replace(params, seed=None), positions)

    def reset_state(self, slots, params, positions, prompt_tokens, output_tokens):
        unseeded = dataclasses.replace(params, seed=None)
        super().reset_state(slots, unseeded, positions, prompt_tokens, output_tokens)


class DropsTheSeed(ReferenceLlamaGenerator):
    model_capabilities = {"supports_sample_on_device": True}

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.sampler = SeedlessSampler(self.max_batch_size, self.dims.vocab_size)
'''
# 14 tokens: the third decode writes position 16, the first of a second KV block; the
# short prompt's block lies between the long one's first block and its second.
KV_PROMPTS = {"long": list(range(20, 34)), "short": [50, 51, 52, 53, 54]}
SERVE_TIMEOUT = 900


def demo_tests() -> dict:
    return json.loads((DEMO / META).read_text())["tests"]


def serve_cli(*args):
    from tests.conftest import _run_cli_process

    return _run_cli_process("test", *args, timeout=SERVE_TIMEOUT)


def wrong_bundle(folder: Path, name: str, adapter: str, cls: str, tests: dict, caps=None):
    folder.mkdir(parents=True)
    (folder / "adapter.py").write_text(adapter)
    document = {
        **BASE,
        "name": name,
        "main_class": f"adapter:{cls}",
        "capabilities": caps or {},
        "tests": tests,
    }
    (folder / META).write_text(json.dumps(document, indent=2))
    return folder


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory, demo_checkpoint):
    """The demo bundle against both live goldens, every path, recording the golden."""
    golden = tmp_path_factory.mktemp("golden") / "golden.json.gz"
    done = serve_cli(
        DEMO,
        "--model",
        demo_checkpoint,
        "--golden",
        "reference",
        "--golden",
        "transformers",
        "--record",
        golden,
        "--format",
        "json",
    )
    assert done.stdout.strip(), done.stderr[-3000:]
    return done, json.loads(done.stdout), golden


@pytest.mark.server
def test_the_demo_bundle_passes_against_both_goldens_on_every_path(demo_run):
    done, report, _ = demo_run
    assert done.returncode == 0 and report["passed"], report["diagnostics"]
    assert report["goldens"] == ["reference", "transformers"]
    assert "━" not in done.stderr  # no progress bar when stderr is not a terminal
    paths = ["prefill", "decode", "chunked_prefill", "prefix_cache", "device_sampling"]
    # The demo bundle pools too (the form prefill_hidden): its embeddings are compared
    # with transformers' only (the reference golden has no pooler).
    assert report["paths"] == [*paths, "pooling_embed"]
    pooled = [c for c in report["cases"] if c["path"] == "pooling_embed"]
    assert [(c["golden"], c["prompt"]) for c in pooled] == [
        ("transformers", n) for n in ("p0", "p1", "p2")
    ]
    assert all(c["passed"] and c["summary"]["cosine_min"] >= 0.99999 for c in pooled)
    for golden in report["goldens"]:
        cases = [c for c in report["cases"] if c["golden"] == golden and c["path"] in paths]
        assert [(c["path"], c["prompt"]) for c in cases] == [
            (p, n) for p in paths for n in ("p0", "p1", "p2")
        ]
        for case in cases:
            summary = case["summary"]
            steps = 1 if case["path"] == "prefill" else 12
            assert summary["steps"] == summary["compared"] == steps, case
            assert summary["pcc_min"] > 0.9999 and summary["first_divergence"] is None
            assert summary["top1"] == 1.0 and summary["top5"] == 1.0
        by_path = {c["path"]: [] for c in cases}
        for c in cases:
            by_path[c["path"]].append(c["details"])
        assert all(d["prefill_chunks"] >= 2 for d in by_path["chunked_prefill"])
        assert all(d["prefill_chunks"] == 1 for d in by_path["decode"])
        assert all(d["num_cached_tokens"] >= 16 for d in by_path["prefix_cache"])
        assert all(d["num_cached_tokens"] == 0 for d in by_path["decode"])
        for d in by_path["device_sampling"]:
            assert d["seeded_alone"] == d["seeded_batch"] and d["device_steps"] > 0
            assert d["host_steps"] == 0 and d["support"].startswith("every seeded token")
    assert [p["golden"] for p in report["perplexity"]] == ["reference", "transformers"]
    assert all(abs(p["ratio"] - 1) < 1e-4 for p in report["perplexity"])
    engines = {e["name"]: e for e in report["served"]["engines"]}
    assert set(engines) == {"host", "chunked", "device", "pool-embed"}
    assert engines["device"]["options"]["additional_config"]["tt"] == {
        "sample_on_device_mode": "all"
    }


@pytest.mark.server
def test_a_recorded_golden_shipped_in_the_bundle_checks_its_archive(
    demo_run, tmp_path, demo_checkpoint
):
    """The recorded golden, inside a copy of the demo bundle (tests.golden), packed: the
    archive is tested against it by default, and the JUnit report has a testcase per
    path and prompt."""
    import shutil

    from ttbundles.build import pack

    _, report, golden = demo_run
    recorded_file = GoldenFile.read(golden)
    assert recorded_file.golden == "reference" and recorded_file.max_tokens == 12
    assert [p.token_ids for p in recorded_file.prompts] == [
        p["token_ids"] for p in report["prompts"]
    ]
    bundle = tmp_path / "demo"
    shutil.copytree(DEMO, bundle)
    shutil.copy(golden, bundle / "golden.json.gz")
    document = json.loads((bundle / META).read_text())
    document["tests"]["golden"] = "golden.json.gz"
    (bundle / META).write_text(json.dumps(document, indent=2))
    archive = pack(bundle, tmp_path / "dist")
    done = serve_cli(archive, "--model", demo_checkpoint, "--format", "junit")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    root = ET.fromstring(done.stdout)
    suites = {s.get("name"): s for s in root.findall("testsuite")}
    suite = suites.pop("demo@1.0.0 vs golden.json.gz (reference)")
    cases = suite.findall("testcase")
    assert len(cases) == 16 and suite.get("failures") == "0" and root.get("tests") == "19"
    # The recorded golden holds no pooled vectors: the embeddings against transformers.
    (pooled,) = suites.values()
    assert {c.get("classname") for c in pooled.findall("testcase")} == {"demo.pooling_embed"}
    assert pooled.get("failures") == "0"
    assert {c.get("classname") for c in cases} == {
        f"demo.{p}"
        for p in (
            "prefill",
            "decode",
            "chunked_prefill",
            "prefix_cache",
            "device_sampling",
            "perplexity",
        )
    }


@pytest.mark.server
def test_rope_off_by_one_in_decode_fails_at_the_first_decode_step(
    demo_run, tmp_path, demo_checkpoint
):
    """Against the live reference and the recorded golden alike: every prompt's step 0
    (the prefill) agrees, step 1 (the first decode) is the first that fails."""
    _, _, golden = demo_run
    tests = {**demo_tests(), "paths": ["decode"], "thresholds": {"pcc": 0.999}}
    bundle = wrong_bundle(tmp_path / "rope", "rope", ROPE_ADAPTER, "RopeOffByOne", tests)
    done = serve_cli(
        bundle,
        "--model",
        demo_checkpoint,
        "--golden",
        "reference",
        "--golden",
        golden,
        "--format",
        "json",
    )
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert len(report["cases"]) == 6
    for case in report["cases"]:
        assert case["steps"][0]["pcc"] > 0.9999 and case["steps"][0]["top1"]
        pcc = [f for f in case["diagnostics"] if "PCC" in f["message"]]
        assert pcc and pcc[0]["code"] == "TTB120"
        assert pcc[0]["message"].startswith(f"decode, prompt {case['label']}, step 1: PCC")


@pytest.mark.server
def test_a_kv_cache_that_ignores_the_page_table_fails_where_a_second_block_is_read(
    tmp_path, demo_checkpoint
):
    bundle = wrong_bundle(
        tmp_path / "kv",
        "kv",
        KV_ADAPTER,
        "ContiguousReads",
        {"prompt_file": "prompts.json", "paths": ["decode"], "max_tokens": 8},
    )
    (bundle / "prompts.json").write_text(json.dumps(KV_PROMPTS))
    done = serve_cli(bundle, "--model", demo_checkpoint, "--golden", "transformers")
    assert done.returncode == 1, done.stderr[-3000:]
    assert "error TTB120 decode, prompt long, step 3: PCC" in done.stdout
    assert "prompt short" not in done.stdout.split("vs transformers")[-1].split("FAILED")[0]
    assert "FAILED: 3 cases" in done.stdout  # 2 prompts and the perplexity
    assert "━" not in done.stderr


@pytest.mark.server
def test_a_sampler_that_drops_the_seed_fails_reproducibility(tmp_path, demo_checkpoint):
    bundle = wrong_bundle(
        tmp_path / "seed",
        "seed",
        SEED_ADAPTER,
        "DropsTheSeed",
        {**demo_tests(), "paths": ["device_sampling"]},
        caps={"sample_on_device": ["all"]},
    )
    done = serve_cli(bundle, "--model", demo_checkpoint, "--golden", "reference", "-f", "json")
    assert done.returncode == 1, done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert {c["path"] for c in report["cases"]} == {"device_sampling"}
    for case in report["cases"]:
        codes = [f["code"] for f in case["diagnostics"]]
        assert "TTB121" in codes, case["diagnostics"]
        message = next(f["message"] for f in case["diagnostics"] if f["code"] == "TTB121")
        seed = case["details"]["seed"]
        assert message.startswith(f"device_sampling, prompt {case['label']}, step ")
        assert f"seed {seed} gave token" in message
        # Greedy on the device is still right: only the seed is wrong.
        assert case["summary"]["top1"] == 1.0


@pytest.mark.server
def test_a_generator_refused_at_load_reports_its_own_diagnostic(tmp_path, demo_checkpoint):
    adapter = (
        "from ttbundles.reference.generator import ReferenceLlamaGenerator\n\n\n"
        "class NeedsImages(ReferenceLlamaGenerator):\n"
        "    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, images):\n"
        "        raise AssertionError('never called')\n"
    )
    bundle = wrong_bundle(tmp_path / "mm", "mm", adapter, "NeedsImages", {"paths": ["prefill"]})
    done = serve_cli(bundle, "--model", demo_checkpoint)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    # `ttbundle test` validates first: the worker's refusal is said before any engine.
    (line,) = [line for line in done.stderr.splitlines() if " error TTB" in f" {line}"]
    assert "error TTB202" in line and "requires images" in line
    assert "pixel_values and image_grid_thw" in line
