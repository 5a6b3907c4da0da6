"""The support card (`ttbundle card`, `check.support`): per mesh and feature, tested
(fresh evidence covers it), served (declared, untested) or refused (with the plan's
code); `inspect` and `list --format json` carry each mesh's evidence status; the plan
says in one line when the serving mesh has no evidence."""

from __future__ import annotations

import json
import shutil

import pytest

from ttbundles.archive.evidence import write_evidence
from ttbundles.paths import builtin_bundles_dir

EVERY_PATH = ["prefill", "decode", "chunked_prefill", "prefix_cache", "device_sampling"]


@pytest.fixture
def demo(tmp_path):
    """A copy of the demo bundle without the evidence it ships with, in a models folder
    of its own: each test writes the evidence it is about."""
    return shutil.copytree(
        builtin_bundles_dir() / "demo",
        tmp_path / "models" / "demo",
        ignore=shutil.ignore_patterns("evidence"),
    )


def _json(done) -> dict:
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_card_says_tested_served_refused_per_feature(run_cli, demo):
    write_evidence(
        demo, {"mesh": "HOST", "passed": True, "paths": EVERY_PATH, "device_mode": "all"}
    )
    card = _json(run_cli("card", demo, "-f", "json"))
    host = card["meshes"]["HOST"]
    assert host["status"] == "tested"
    status = {f["feature"]: f for f in host["features"]}
    for feature in ("text generation", "prefix_caching", "chunked_prefill"):
        assert status[feature]["status"] == "tested", feature
    assert status["sample_on_device: all"]["status"] == "tested"
    assert status["sample_on_device: decode_only"]["status"] == "served"  # another mode
    assert status["async_decode"]["status"] == "served"  # no test path proves it
    assert status["spec_decode: ngram"]["status"] == "served"
    assert status["spec_decode: custom_class"] == {
        "feature": "spec_decode: custom_class",
        "status": "refused",
        "code": "TTB235",
        "note": "refused by the plan",
    }
    assert status["images"]["status"] == "refused" and status["images"]["code"] == "TTB215"
    text = run_cli("card", demo).stdout
    assert text.startswith("---\nlibrary_name: vllm\n")
    assert "tested_meshes: [HOST]" in text and "## HOST: tested" in text
    assert "| spec_decode: custom_class | refused (TTB235: refused by the plan) |" in text


def test_the_card_says_which_pooling_tasks_are_tested(run_cli, demo):
    """The demo bundle pools (embed, token_embed): embed is proven by its pooling path,
    token_embed has none (served), classify is not declared (refused)."""
    write_evidence(demo, {"mesh": "HOST", "passed": True, "paths": [*EVERY_PATH, "pooling_embed"]})
    card = _json(run_cli("card", demo, "-f", "json"))
    status = {f["feature"]: f for f in card["meshes"]["HOST"]["features"]}
    assert status["pooling: embed"]["status"] == "tested"
    assert status["pooling: token_embed"]["status"] == "served"
    assert status["pooling: classify"]["status"] == "refused"
    assert status["pooling: classify"]["code"] == "TTB270"
    # A bundle that only pools (the form forward) does not generate text.
    meta = demo / "vllm_metadata.json"
    document = json.loads(meta.read_text())
    document["capabilities"]["pooling"] = {"tasks": ["embed"], "form": "forward"}
    meta.write_text(json.dumps(document))
    card = _json(run_cli("card", demo, "-f", "json"))
    status = {f["feature"]: f for f in card["meshes"]["HOST"]["features"]}
    assert status["text generation"]["status"] == "refused"
    assert status["text generation"]["code"] == "TTB272"


def test_a_failed_or_missing_evidence_proves_nothing(run_cli, demo):
    card = _json(run_cli("card", demo, "-f", "json"))
    assert card["meshes"]["HOST"]["status"] == "untested"
    assert {f["status"] for f in card["meshes"]["HOST"]["features"]} == {"served", "refused"}
    write_evidence(demo, {"mesh": "HOST", "passed": False, "paths": EVERY_PATH})
    card = _json(run_cli("card", demo, "-f", "json"))
    assert card["meshes"]["HOST"]["status"] == "failed"
    assert "tested" not in {f["status"] for f in card["meshes"]["HOST"]["features"]}


def test_inspect_and_list_carry_the_evidence_status(run_cli, demo):
    write_evidence(demo, {"mesh": "HOST", "passed": True, "paths": ["prefill"]})
    assert _json(run_cli("inspect", demo, "-f", "json"))["evidence"] == {"HOST": "tested"}
    assert "evidence:     HOST tested" in run_cli("inspect", demo).stdout
    listed = _json(run_cli("list", "--models-dir", demo.parent, "-f", "json"))
    (row,) = [r for r in listed["entries"] if r["path"] == str(demo)]
    assert row["evidence"] == {"HOST": "tested"}


def test_the_plan_says_when_the_mesh_has_no_evidence(run_cli, demo, demo_checkpoint):
    args = ("plan", demo_checkpoint, "--mesh", "HOST", "--models-dir", demo.parent)
    plan = _json(run_cli(*args, "-f", "json", timeout=300))
    assert plan["evidence"] == "untested"
    assert plan["evidence_note"].startswith("evidence: demo@1.0.0 has no evidence on mesh HOST")
    write_evidence(demo, {"mesh": "HOST", "passed": True, "paths": ["prefill"]})
    done = run_cli(*args, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "evidence:" not in done.stdout


def test_the_card_takes_a_bundle_name_as_list_shows_it(run_cli, demo, tmp_path):
    """`ttbundle card demo` names the bundle as `list` does: the installed one first
    (EXTRA_MODELS_DIR), as the server would pick it; a path still works; an unknown name
    is TTB001 with the closest name."""
    write_evidence(demo, {"mesh": "HOST", "passed": True, "paths": EVERY_PATH})
    env = {"EXTRA_MODELS_DIR": str(demo.parent)}
    for given in ("demo", "demo@1.0.0"):
        card = _json(run_cli("card", given, "-f", "json", env=env))
        assert card["meshes"]["HOST"]["status"] == "tested", given  # the installed copy
    builtin = _json(run_cli("card", "demo-drafter", "-f", "json", env=env))
    assert builtin["bundle"]["name"] == "demo-drafter", builtin
    done = run_cli("card", "dmeo", env=env)
    assert done.returncode == 1 and "TTB001" in done.stderr and "'demo'" in done.stderr
    assert "Traceback" not in done.stderr
