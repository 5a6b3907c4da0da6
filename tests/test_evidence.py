"""Evidence kept in the bundle (`ttbundle test --keep-evidence`, `archive.evidence`):
what it records, the content digest that makes it stale once the bundle changes, and
that packing carries it under the manifest digest."""

from __future__ import annotations

import json
import shutil

import pytest

from ttbundles.archive.evidence import content_digest, read_evidence, write_evidence
from ttbundles.archive.reader import verify
from ttbundles.build import pack
from ttbundles.check.validate import validate_bundle, validate_path
from ttbundles.paths import builtin_bundles_dir


def test_evidence_is_fresh_until_the_bundle_changes(make_bundle):
    folder = make_bundle("b")
    before = content_digest(folder)
    path = write_evidence(folder, {"mesh": "HOST", "passed": True})
    assert path == folder / "evidence" / "HOST.json"
    assert content_digest(folder) == before  # the evidence does not prove itself
    found, problems = read_evidence(folder)
    assert [(e.mesh, e.passed, e.stale) for e in found] == [("HOST", True, False)]
    assert problems == []
    (folder / "adapter.py").write_text((folder / "adapter.py").read_text() + "\n# edited\n")
    found, problems = read_evidence(folder)
    assert found[0].stale
    (stale,) = problems
    assert stale.code == "TTB114" and "evidence for mesh HOST is stale" in stale.message
    assert "--keep-evidence" in stale.hint
    report = validate_bundle(folder)
    assert report.ok() and not report.ok(strict=True)  # a warning


def test_an_unreadable_evidence_file_is_an_error(make_bundle):
    folder = make_bundle("b", files={"evidence/HOST.json": "{not json"})
    (problem,) = read_evidence(folder)[1]
    assert problem.code == "TTB115" and problem.is_error


def test_packing_keeps_the_evidence_under_the_manifest_digest(make_bundle, tmp_path):
    folder = make_bundle("b")
    write_evidence(folder, {"mesh": "HOST", "passed": True})
    archive = pack(folder, tmp_path / "dist")
    assert verify(archive).ok()
    listed = validate_path(archive)
    assert listed.ok(strict=True), [str(d) for d in listed.report.diagnostics]
    from ttbundles.archive.reader import read_archive

    assert "evidence/HOST.json" in read_archive(archive).by_path()


@pytest.mark.server  # ttbundle test serves the bundle through vLLM's engine
def test_ttbundle_test_keeps_its_evidence_in_the_bundle(run_cli, demo_checkpoint, tmp_path):
    """The demo bundle, proven on the host mesh (the prefill path): the evidence names
    what ran and what it found, validate finds it fresh, an edit to the adapter stales it."""
    folder = shutil.copytree(builtin_bundles_dir() / "demo", tmp_path / "demo")
    done = run_cli(
        "test",
        folder,
        "--model",
        demo_checkpoint,
        "--path",
        "prefill",
        "--keep-evidence",
        "-f",
        "json",
        timeout=900,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["evidence"] == str(folder / "evidence" / "HOST.json")
    record = json.loads((folder / "evidence" / "HOST.json").read_text())
    assert record["mesh"] == "HOST" and record["passed"] is True
    assert record["target"] == {"max_model_len": 512, "max_num_seqs": 32}
    assert record["paths"] == ["prefill"] and record["thresholds"]["pcc"] == 0.999
    assert record["versions"]["vllm"] and record["versions"]["ttbundles"]
    assert record["cases"] and all(c["figures"]["pcc_min"] >= 0.999 for c in record["cases"])
    assert record["bundle_digest"] == content_digest(folder)
    assert record["recorded_at"].endswith("+00:00")
    assert validate_bundle(folder).ok(strict=True)
    card = _card(run_cli, folder)
    host = card["meshes"]["HOST"]
    assert host["status"] == "tested" and host["evidence"]["passed"]
    status = {f["feature"]: f for f in host["features"]}
    assert status["text generation"]["status"] == "served"  # decode did not run
    (folder / "adapter.py").write_text((folder / "adapter.py").read_text() + "\n# edited\n")
    assert [d.code for d in validate_bundle(folder).diagnostics] == ["TTB114"]
    card = _card(run_cli, folder)
    assert card["meshes"]["HOST"]["status"] == "stale"
    assert card["diagnostics"][0]["code"] == "TTB114"


def _card(run_cli, folder) -> dict:
    done = run_cli("card", folder, "-f", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_keep_evidence_needs_a_folder(run_cli, tmp_path):
    archive = tmp_path / "b.ttbundle"
    archive.write_bytes(b"x")
    done = run_cli("test", archive, "--model", "ckpt", "--keep-evidence")
    assert done.returncode == 2 and "--keep-evidence" in done.stderr


def test_signing_and_packing_keep_the_evidence_verifiable(run_cli, make_bundle, tmp_path):
    from tests.trust_keys import key_pair
    from ttbundles.trust.signing import sign

    keys = key_pair(tmp_path / "keys", "alice")
    folder = make_bundle("b")
    write_evidence(folder, {"mesh": "HOST", "passed": True, "paths": ["prefill", "decode"]})
    sign(folder, keys.private)  # the signature covers the evidence; the evidence stays fresh
    assert [(e.mesh, e.stale) for e in read_evidence(folder)[0]] == [("HOST", False)]
    verified = run_cli("verify", folder, "--key", keys.public)
    assert verified.returncode == 0, verified.stderr
    archive = pack(folder, tmp_path / "dist")
    assert verify(archive).ok()
    # inspect of the archive: its evidence as installing it would serve it.
    for target in (archive, folder):
        data = json.loads(run_cli("inspect", target, "-f", "json").stdout)
        assert data["evidence"] == {"HOST": "tested"}, target
    assert "evidence:     HOST tested" in run_cli("inspect", archive).stdout
    # An edit: the signature no longer verifies, and the evidence is stale, packed or not.
    (folder / "adapter.py").write_text((folder / "adapter.py").read_text() + "\n# edited\n")
    assert run_cli("verify", folder, "--key", keys.public).returncode == 1
    assert [(e.mesh, e.stale) for e in read_evidence(folder)[0]] == [("HOST", True)]
    sign(folder, keys.private)  # signed again: verifies, and the evidence is still stale
    assert run_cli("verify", folder, "--key", keys.public).returncode == 0
    edited = pack(folder, tmp_path / "dist-edited")
    data = json.loads(run_cli("inspect", edited, "-f", "json").stdout)
    assert data["evidence"] == {"HOST": "stale"}
