"""`ttbundle bench` against a real `vllm serve` (the session's demo server, through
`--url`): vLLM's own benchmark client runs both workloads, the figures come back, the
bundle's declared targets are checked (one met, one missed: exit 1, TTB116), and the
figures are kept as evidence that `ttbundle card` shows."""

from __future__ import annotations

import json
import shutil

import pytest

from ttbundles.paths import builtin_bundles_dir

pytestmark = pytest.mark.server

# As few requests as still give both workloads a spread: 4 requests, 2 at a time.
SHAPE = {"input_len": 32, "output_len": 8, "num_prompts": 4, "max_concurrency": 2}


def test_bench_measures_checks_targets_and_keeps_evidence(run_cli, demo_server, tmp_path):
    bundle = shutil.copytree(builtin_bundles_dir() / "demo", tmp_path / "demo")
    metadata_file = bundle / "vllm_metadata.json"
    document = json.loads(metadata_file.read_text())
    document["schema_version"] = 5
    document["performance"] = {
        "HOST": {
            "workload": SHAPE,
            "ttft_ms": {"p50": 60_000},  # a minute: met on any machine
            "output_throughput": 1e9,  # a billion tokens a second: missed on any
        }
    }
    metadata_file.write_text(json.dumps(document))

    done = run_cli(
        "bench",
        bundle,
        "--model",
        demo_server.model,
        "--url",
        demo_server.process.base_url,
        "--keep-evidence",
        "-f",
        "json",
    )
    assert done.returncode == 1, done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is False and answer["url"] == demo_server.process.base_url
    assert set(answer["workloads"]) == {"random", "shared_prefix"}
    for name, entry in answer["workloads"].items():
        (figures,) = entry["rounds"]
        assert figures["completed"] == 4 and figures["failed"] == 0, name
        assert 0 < figures["p50_ttft_ms"] <= figures["p99_ttft_ms"], name
        assert figures["mean_tpot_ms"] > 0 and figures["output_throughput"] > 0, name
        assert entry["summary"]["output_throughput"]["median"] == figures["output_throughput"]
    checks = {(c["workload"], c["figure"]): c["passed"] for c in answer["checks"]}
    assert checks == {
        ("random", "p50_ttft_ms"): True,
        ("shared_prefix", "p50_ttft_ms"): True,
        ("random", "output_throughput"): False,
        ("shared_prefix", "output_throughput"): False,
    }
    missed = [d for d in answer["diagnostics"] if d["code"] == "TTB116"]
    assert len(missed) == 2
    assert "output_throughput is" in missed[0]["message"]
    assert "the bundle's target is at least 1e+09 tokens/s" in missed[0]["message"]

    # The figures are kept beside the test's evidence, and the card shows them.
    kept = bundle / "evidence" / "performance" / "HOST.json"
    assert answer["evidence"] == str(kept)
    record = json.loads(kept.read_text())
    assert record["format"] == "ttbundles.performance/1" and record["passed"] is False
    assert record["workloads"]["random"]["rounds"][0]["completed"] == 4
    card = json.loads(run_cli("card", bundle, "-f", "json").stdout)
    performance = card["meshes"]["HOST"]["performance"]
    assert performance["stale"] is False and performance["passed"] is False
    assert performance["workloads"]["random"]["output_throughput"] > 0
    text = run_cli("card", bundle).stdout
    assert "### Performance (ttbundle bench" in text
    assert "| random |" in text and "| shared_prefix |" in text


def test_bench_serves_the_bundle_itself(run_cli, demo_checkpoint):
    """Without --url, the user's first call: the bundle served on the host mesh (its own
    `vllm serve`, the one server this module starts) and one workload measured; no
    targets declared, so exit 0. The --url test above checks figures, targets and
    evidence in depth."""
    done = run_cli(
        "bench",
        builtin_bundles_dir() / "demo",
        "--model",
        demo_checkpoint,
        "--workload",
        "random",
        "--input-len",
        "16",
        "--output-len",
        "4",
        "--num-prompts",
        "2",
        "--max-concurrency",
        "2",
        "-f",
        "json",
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    answer = json.loads(done.stdout)
    assert answer["ok"] is True and answer["checks"] == []
    assert answer["url"] is None  # served here, not measured at an address
    (figures,) = answer["workloads"]["random"]["rounds"]
    assert figures["completed"] == 2 and figures["failed"] == 0
    assert figures["output_throughput"] > 0
