"""`ttbundle bench` without a server: the `performance` section (schema 5), the target
checks against figures, the command's refusals (no server at --url, options that cannot
go together), and the workloads' command lines as vLLM's own parser reads them. The run
against a real server is tests/e2e/test_bench.py."""

from __future__ import annotations

import json
import shutil

import pytest

from ttbundles.bench.figures import check_targets, summarize
from ttbundles.bench.session import workload_argv
from ttbundles.demo.server import free_port
from ttbundles.format.metadata import BenchWorkload, BundleMetadata, PerformanceTarget
from ttbundles.paths import builtin_bundles_dir

BASE = {
    "schema_version": 5,
    "name": "b",
    "version": "1.0.0",
    "arch": "LlamaForCausalLM",
    "main_class": "adapter:G",
    "targets": {"HOST": {}},
}


def _errors(document: dict) -> str:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        BundleMetadata.model_validate(document)
    return str(caught.value)


def test_performance_needs_schema_5_and_a_target_mesh():
    performance = {"HOST": {"ttft_ms": {"p99": 500}}}
    meta = BundleMetadata.model_validate({**BASE, "performance": performance})
    assert meta.performance["HOST"].ttft_ms.p99 == 500
    assert meta.performance["HOST"].workload == BenchWorkload()  # the default workload
    assert "performance needs schema_version 5" in _errors(
        {**BASE, "schema_version": 4, "performance": performance}
    )
    assert "performance names mesh N300, which is not among the targets" in _errors(
        {**BASE, "performance": {"N300": {}}}
    )
    assert "workload.prefix_len (64) must be below input_len (64)" in _errors(
        {**BASE, "performance": {"HOST": {"workload": {"input_len": 64, "prefix_len": 64}}}}
    )
    assert "greater than 0" in _errors({**BASE, "performance": {"HOST": {"tpot_ms": {"p50": 0}}}})


def _workloads(**figures: list[float]) -> dict:
    rounds = [
        {k: v[i] for k, v in figures.items()} for i in range(len(next(iter(figures.values()))))
    ]
    return {"random": {"rounds": rounds, "summary": summarize(rounds)}}


def test_targets_are_checked_on_the_median_over_rounds():
    workloads = _workloads(p99_ttft_ms=[90.0, 300.0, 110.0], output_throughput=[50.0, 10.0, 40.0])
    assert workloads["random"]["summary"]["p99_ttft_ms"] == {
        "median": 110.0,
        "min": 90.0,
        "max": 300.0,
    }
    target = PerformanceTarget.model_validate({"ttft_ms": {"p99": 120}, "output_throughput": 35})
    checks, problems = check_targets(workloads, target, "HOST")
    assert [(c["figure"], c["value"], c["passed"]) for c in checks] == [
        ("p99_ttft_ms", 110.0, True),  # one slow round does not fail it
        ("output_throughput", 40.0, True),
    ]
    assert problems == []


def test_a_missed_target_is_ttb116_naming_workload_figure_and_target():
    workloads = _workloads(p50_tpot_ms=[12.5], output_throughput=[20.0])
    target = PerformanceTarget.model_validate({"tpot_ms": {"p50": 10}, "output_throughput": 25})
    checks, problems = check_targets(workloads, target, "HOST")
    assert [c["passed"] for c in checks] == [False, False]
    assert [d.code for d in problems] == ["TTB116", "TTB116"]
    assert problems[0].message == (
        "random workload on HOST: p50_tpot_ms is 12.50 ms, the bundle's target is at most 10 ms"
    )
    assert problems[1].message == (
        "random workload on HOST: output_throughput is 20.00 tokens/s, the bundle's target "
        "is at least 25 tokens/s"
    )
    assert problems[0].pointer == "/performance/HOST" and "declare the target" in problems[0].hint
    # A figure the run did not produce cannot meet a target.
    checks, problems = check_targets(_workloads(output_throughput=[30.0]), target, "HOST")
    assert checks[0]["value"] is None and "p50_tpot_ms is not measured" in problems[0].message


@pytest.mark.parametrize("name", ["random", "shared_prefix"])
def test_the_workloads_are_vllm_bench_serve_command_lines(name):
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    shape = BenchWorkload(input_len=48, output_len=8, num_prompts=6, max_concurrency=3)
    argv = workload_argv(name, shape, base_url="http://127.0.0.1:1", model="m", tokenizer="t")
    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    args = parser.parse_args(argv)
    assert (args.num_prompts, args.max_concurrency, args.ignore_eos) == (6, 3, True)
    assert (args.temperature, args.percentile_metrics) == (0.0, "ttft,tpot,itl,e2el")
    if name == "random":
        assert args.dataset_name == "random"
        assert (args.random_input_len, args.random_output_len) == (48, 8)
    else:
        assert args.dataset_name == "prefix_repetition"
        assert args.prefix_repetition_prefix_len == 24  # half the prompt, by default
        assert args.prefix_repetition_suffix_len == 24
        assert (args.prefix_repetition_num_prefixes, args.prefix_repetition_output_len) == (1, 8)


@pytest.fixture
def demo(tmp_path):
    return shutil.copytree(builtin_bundles_dir() / "demo", tmp_path / "demo")


def test_no_server_at_url_is_ttb117_exit_1(run_cli, demo, tmp_path):
    url = f"http://127.0.0.1:{free_port()}"
    done = run_cli("bench", demo, "--model", tmp_path, "--url", url)
    assert done.returncode == 1
    assert f"error TTB117 --url {url}: nothing answers there" in done.stderr
    assert "give the address of a running vllm serve" in done.stderr
    done = run_cli("bench", demo, "--model", tmp_path, "--url", "127.0.0.1:8000", "-f", "json")
    assert done.returncode == 1
    (problem,) = json.loads(done.stdout)["diagnostics"]
    assert problem["code"] == "TTB117" and "not an http:// or https:// URL" in problem["message"]
    assert not (demo / "evidence" / "performance").exists()


def test_options_that_cannot_go_together_are_usage_errors(run_cli, demo, tmp_path):
    done = run_cli("bench", demo, "--model", tmp_path, "--url", "http://x", "--", "--foo")
    assert done.returncode == 2 and "--url measures a running one" in done.stderr
    archive = tmp_path / "demo.ttbundle"
    archive.write_bytes(b"")
    done = run_cli("bench", archive, "--model", tmp_path, "--keep-evidence")
    assert done.returncode == 2 and "is not a bundle folder" in done.stderr
