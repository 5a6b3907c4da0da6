"""Signatures (OpenSSF model signing), the trust policy and provenance.

Signed with real EC keys and a real certificate chain made here; pushed to and pulled
from a real registry where one is installed. Each refusal is one clear line with a code,
and nothing is installed or written.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests import oci_registry
from tests.bundle_factory import metadata, snapshot, write_bundle
from tests.trust_keys import certificate_chain, key_pair
from ttbundles.build import pack
from ttbundles.distribution import artifact
from ttbundles.registry.registry import Status, compute
from ttbundles.trust.signature import SIGNATURE_FILE, read_claim
from ttbundles.trust.signing import sign

needs_registry = pytest.mark.skipif(not oci_registry.available(), reason=oci_registry.MISSING)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return {"alice": key_pair(folder, "alice"), "mallory": key_pair(folder, "mallory")}


@pytest.fixture(scope="module")
def trust_alice(tmp_path_factory, keys):
    """A policy folder trusting alice's public key."""
    folder = tmp_path_factory.mktemp("trusted")
    (folder / "alice.pub").write_bytes(keys["alice"].public.read_bytes())
    return folder


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if not oci_registry.available():
        pytest.skip(oci_registry.MISSING)
    with oci_registry.running(tmp_path_factory.mktemp("registry")) as running:
        yield running


def _bundle(parent: Path, name: str = "demo", **files: str) -> Path:
    document = metadata(name, "1.0.0", main_class="adapter:Generator")
    return write_bundle(parent / name, name=name, document=document, files=files)


def _signed_archive(tmp_path: Path, key: Path, name: str = "demo") -> Path:
    folder = _bundle(tmp_path / "src", name)
    sign(folder, key)
    return pack(folder, tmp_path / "dist")


def _no_bundle_installed(models: Path, name: str = "demo") -> None:
    assert not (models / name).exists()
    if models.exists():
        assert [p.name for p in models.iterdir() if not p.name.startswith(".ttbundle")] == []


# --- signing and verifying ------------------------------------------------------------


def test_sign_lists_every_shipped_file_and_not_itself(tmp_path, keys):
    folder = _bundle(tmp_path, weights="w")
    (folder / "__pycache__").mkdir()
    (folder / "__pycache__" / "adapter.cpython-311.pyc").write_bytes(b"junk")
    sign(folder, keys["alice"].private)
    claim = read_claim((folder / SIGNATURE_FILE).read_bytes())
    assert claim is not None and claim.kind == "key"
    assert claim.files == {"adapter.py", "vllm_metadata.json", "weights"}


def test_verify_with_key(run_cli, tmp_path, keys):
    archive = _signed_archive(tmp_path, keys["alice"].private)
    done = run_cli("verify", archive, "--key", keys["alice"].public)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "signed by key" in done.stdout
    wrong = run_cli("verify", archive, "--key", keys["mallory"].public, "-f", "json")
    assert wrong.returncode == 1
    [diagnostic] = json.loads(wrong.stdout)["diagnostics"]
    assert diagnostic["code"] == "TTB141"
    assert "not a trusted key" in diagnostic["message"] and "mallory.pub" in diagnostic["message"]


def test_sign_archive_in_place(run_cli, tmp_path, keys):
    archive = pack(_bundle(tmp_path / "src"), tmp_path / "dist")
    done = run_cli("sign", archive, "--key", keys["alice"].private)
    assert done.returncode == 0, done.stderr
    assert run_cli("verify", archive, "--key", keys["alice"].public).returncode == 0
    shown = json.loads(run_cli("inspect", archive, "-f", "json").stdout)
    assert SIGNATURE_FILE in [f["path"] for f in shown["files"]]
    assert shown["signer"].startswith("key sha256:")


def test_signing_over_another_signer_needs_force(run_cli, tmp_path, keys):
    """An archive signed by alice is not re-signed by mallory in silence: TTB146 and the
    archive untouched; again by alice is fine; --force replaces the signature."""
    archive = _signed_archive(tmp_path, keys["alice"].private)
    before = archive.read_bytes()
    done = run_cli("sign", archive, "--key", keys["mallory"].private)
    assert done.returncode == 1 and "TTB146" in done.stderr, done.stdout + done.stderr
    assert "--force" in done.stderr and "Traceback" not in done.stderr
    assert archive.read_bytes() == before
    assert run_cli("sign", archive, "--key", keys["alice"].private).returncode == 0
    assert run_cli("verify", archive, "--key", keys["alice"].public).returncode == 0
    done = run_cli("sign", archive, "--key", keys["mallory"].private, "--force")
    assert done.returncode == 0, done.stderr
    assert run_cli("verify", archive, "--key", keys["mallory"].public).returncode == 0
    folder = _bundle(tmp_path / "folder")
    sign(folder, keys["alice"].private)
    done = run_cli("sign", folder, "--key", keys["mallory"].private)
    assert done.returncode == 1 and "TTB146" in done.stderr
    assert not list(folder.glob(".model.sig.*"))  # no temporary file left behind


def test_changed_or_added_file_fails(run_cli, tmp_path, keys):
    folder = _bundle(tmp_path)
    sign(folder, keys["alice"].private)
    (folder / "adapter.py").write_text("import os\n" + (folder / "adapter.py").read_text())
    done = run_cli("verify", folder, "--key", keys["alice"].public)
    assert done.returncode == 1
    assert "TTB141" in done.stdout + done.stderr
    assert "adapter.py changed since signing" in done.stdout + done.stderr
    sign(folder, keys["alice"].private)
    (folder / "extra.py").write_text("print('hi')\n")
    done = run_cli("verify", folder, "--key", keys["alice"].public)
    assert done.returncode == 1
    assert "extra.py not covered by the signature" in done.stdout + done.stderr


def test_tampered_signature_fails(run_cli, tmp_path, keys, trust_alice):
    folder = _bundle(tmp_path / "src")
    sign(folder, keys["alice"].private)
    document = json.loads((folder / SIGNATURE_FILE).read_text())
    signature = document["dsseEnvelope"]["signatures"][0]["sig"]
    document["dsseEnvelope"]["signatures"][0]["sig"] = ("A" if signature[5] != "A" else "B").join(
        (signature[:5], signature[6:])
    )
    (folder / SIGNATURE_FILE).write_text(json.dumps(document))
    archive = pack(folder, tmp_path / "dist")
    done = run_cli("verify", archive, "--key", keys["alice"].public)
    assert done.returncode == 1 and "TTB141" in done.stdout + done.stderr
    # Named as the user gave it, never our work folder (removed by then).
    assert "ttbundle-verify-" not in done.stdout + done.stderr
    models = tmp_path / "models"
    done = run_cli(
        "install", archive, "--models-dir", models, env={"TT_BUNDLES_TRUST": str(trust_alice)}
    )
    assert done.returncode == 1
    assert "TTB141" in done.stderr and "bundle demo" in done.stderr and str(archive) in done.stderr
    _no_bundle_installed(models)


def test_certificate_chain(run_cli, tmp_path):
    chain = certificate_chain(tmp_path / "pki")
    folder = _bundle(tmp_path / "src")
    done = run_cli(
        "sign",
        folder,
        "--key",
        chain.key,
        "--certificate",
        chain.certificate,
        "--certificate-chain",
        chain.root,
    )
    assert done.returncode == 0, done.stderr
    assert "certificate sha256:" in done.stdout
    ok = run_cli("verify", folder, "--certificate-chain", chain.root)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    other = certificate_chain(tmp_path / "other-pki", "stranger")
    refused = run_cli("verify", folder, "--certificate-chain", other.root)
    assert refused.returncode == 1 and "TTB141" in refused.stdout + refused.stderr
    # a policy file trusting the chain installs it
    policy = tmp_path / "policy.json"
    policy.write_text(json.dumps({"certificate_chains": [["pki/signer-root.crt"]]}))
    archive = pack(folder, tmp_path / "dist")
    done = run_cli(
        "install",
        archive,
        "--models-dir",
        tmp_path / "models",
        env={"TT_BUNDLES_TRUST": str(policy)},
    )
    assert done.returncode == 0, done.stderr


def test_bad_key_is_a_clear_error(run_cli, tmp_path):
    folder = _bundle(tmp_path)
    (tmp_path / "key.pem").write_text("not a key\n")
    done = run_cli("sign", folder, "--key", tmp_path / "key.pem")
    assert done.returncode == 1 and "TTB142" in done.stderr and "Traceback" not in done.stderr
    assert not (folder / SIGNATURE_FILE).exists()


# --- the policy on install ----------------------------------------------------------------


def test_policy_on_install(run_cli, tmp_path, keys, trust_alice):
    env = {"TT_BUNDLES_TRUST": str(trust_alice)}
    models = tmp_path / "models"
    unsigned = pack(_bundle(tmp_path / "u"), tmp_path / "dist-u")
    done = run_cli("install", unsigned, "--models-dir", models, env=env)
    assert done.returncode == 1
    [line] = [x for x in done.stderr.splitlines() if "TTB140" in x]
    assert "bundle demo is not signed" in line and "alice.pub" in line
    _no_bundle_installed(models)
    wrong = _signed_archive(tmp_path / "m", keys["mallory"].private)
    done = run_cli("install", wrong, "--models-dir", models, env=env)
    assert done.returncode == 1 and "TTB141" in done.stderr
    _no_bundle_installed(models)
    good = _signed_archive(tmp_path / "a", keys["alice"].private)
    done = run_cli("install", good, "--models-dir", models, env=env)
    assert done.returncode == 0, done.stderr
    record = json.loads((models / "demo" / ".ttbundle-provenance.json").read_text())
    assert record["signer"] == f"key {trust_alice / 'alice.pub'}"
    assert record["source"] == str(good.resolve())
    shown = run_cli("inspect", models / "demo")
    assert f"from:         {good.resolve()}" in shown.stdout
    # without a policy: installed, the signer shown as claimed
    done = run_cli("install", wrong, "--models-dir", tmp_path / "m2")
    assert done.returncode == 0
    record = json.loads((tmp_path / "m2" / "demo" / ".ttbundle-provenance.json").read_text())
    assert record["signer"].endswith("(not verified)")


def test_unusable_policy(run_cli, tmp_path):
    archive = pack(_bundle(tmp_path / "src"), tmp_path / "dist")
    done = run_cli(
        "install",
        archive,
        "--models-dir",
        tmp_path / "models",
        env={"TT_BUNDLES_TRUST": str(tmp_path / "nowhere")},
    )
    assert done.returncode == 1 and "TTB143" in done.stderr
    doctor = run_cli("doctor", "-f", "json", env={"TT_BUNDLES_TRUST": str(tmp_path / "nowhere")})
    codes = [d["code"] for d in json.loads(doctor.stdout)["diagnostics"]]
    assert codes.count("TTB143") == 1


def test_doctor_reports_the_policy(run_cli, trust_alice):
    data = json.loads(run_cli("doctor", "-f", "json").stdout)
    [check] = [c for c in data["checks"] if c["name"] == "trust policy"]
    assert check["detail"].startswith("permissive")
    data = json.loads(
        run_cli("doctor", "-f", "json", env={"TT_BUNDLES_TRUST": str(trust_alice)}).stdout
    )
    [check] = [c for c in data["checks"] if c["name"] == "trust policy"]
    assert check["status"] == "ok" and "alice.pub" in check["detail"]


# --- the policy at registration -------------------------------------------------------------


def test_policy_at_registration(tmp_path, keys, trust_alice):
    models = tmp_path / "models"
    signed = _bundle(models, "signed")
    sign(signed, keys["alice"].private)
    document = metadata("plain", "1.0.0", main_class="adapter:Generator", arch="PlainForCausalLM")
    write_bundle(models / "plain", name="plain", document=document)
    environ = {"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0"}
    permissive = {e.path.name: e for e in compute(environ, index=False).entries}
    assert permissive["plain"].status is Status.REGISTERED
    assert permissive["plain"].signer == "unsigned"
    assert permissive["signed"].signer.startswith("key sha256:")
    strict = compute({**environ, "TT_BUNDLES_TRUST": str(trust_alice)}, index=False)
    entries = {e.path.name: e for e in strict.entries}
    assert entries["signed"].status is Status.REGISTERED
    assert entries["signed"].signer == f"key {trust_alice / 'alice.pub'}"
    assert entries["plain"].status is Status.SKIPPED
    assert entries["plain"].reason.startswith("TTB140 bundle plain is not signed")
    assert [d.code for d in strict.problems] == ["TTB140"]
    # a file changed after signing is refused at the next start
    (signed / "adapter.py").write_text((signed / "adapter.py").read_text() + "\n# edited\n")
    entries = {
        e.path.name: e for e in compute({**environ, "TT_BUNDLES_TRUST": str(trust_alice)}).entries
    }
    assert entries["signed"].status is Status.SKIPPED
    assert "adapter.py changed since signing" in entries["signed"].reason


def test_startup_table_shows_signers_and_refusals(tmp_path, keys, trust_alice, caplog):
    import logging

    from ttbundles.serving.registration import log_table

    models = tmp_path / "models"
    sign(_bundle(models, "signed"), keys["alice"].private)
    document = metadata("plain", "1.0.0", main_class="adapter:Generator", arch="PlainForCausalLM")
    write_bundle(models / "plain", name="plain", document=document)
    environ = {
        "EXTRA_MODELS_DIR": str(models),
        "TT_VLLM_BUILTIN_MODELS": "0",
        "TT_BUNDLES_TRUST": str(trust_alice),
    }
    with caplog.at_level(logging.DEBUG, logger="vllm.ttbundles"):
        log_table(compute(environ, index=False))
    (table,) = [r.getMessage() for r in caplog.records if "TT architectures" in r.getMessage()]
    assert "signer" in table.splitlines()[1].split()
    (signed,) = [line for line in table.splitlines() if "signed@" in line]
    assert signed.split()[0] == "registered"
    assert f"key {trust_alice / 'alice.pub'}" in signed
    (plain,) = [line for line in table.splitlines() if "plain@" in line]
    assert plain.split()[0] == "skipped" and "TTB140 bundle plain is not signed" in plain
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len([w for w in warnings if "TTB140" in w]) == 1


def test_startup_reads_no_signature_below_debug_without_a_policy(
    tmp_path, keys, caplog, monkeypatch
):
    """Without a trust policy the signer is only the debug table's column: registration
    at vLLM's default log level (every process) opens no signature file, and the debug
    table still names the signer the bundle claims."""
    import logging

    from ttbundles.serving import registration
    from ttbundles.trust import signature

    models = tmp_path / "models"
    sign(_bundle(models, "signed"), keys["alice"].private)
    environ = {"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0"}
    reads = []
    real = signature.signer_of
    monkeypatch.setattr(signature, "signer_of", lambda folder: reads.append(folder) or real(folder))
    monkeypatch.setattr(registration, "_state", {})
    monkeypatch.setattr(registration, "current_registry", lambda: compute(environ, index=False))
    with caplog.at_level(logging.INFO, logger="vllm.ttbundles"):
        registration.checked_registry()
        registration.checked_registry()
    assert len([r for r in caplog.records if "1 registered" in r.getMessage()]) == 1
    assert reads == []
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="vllm.ttbundles"):
        registration.log_table(compute(environ, index=False))
    (table,) = [r.getMessage() for r in caplog.records if "TT architectures" in r.getMessage()]
    (row,) = [line for line in table.splitlines() if "signed@" in line]
    assert reads == [models / "signed"] and "key sha256:" in row


def test_list_shows_signers(run_cli, tmp_path, keys, trust_alice):
    models = tmp_path / "models"
    sign(_bundle(models, "signed"), keys["alice"].private)
    env = {"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0"}
    [row] = json.loads(run_cli("list", "-f", "json", env=env).stdout)["entries"]
    assert row["signer"].startswith("key sha256:")
    env["TT_BUNDLES_TRUST"] = str(trust_alice)
    [row] = json.loads(run_cli("list", "-f", "json", env=env).stdout)["entries"]
    assert row["signer"] == f"key {trust_alice / 'alice.pub'}"


def test_registration_stays_import_light_without_policy(tmp_path, keys, trust_alice):
    """No crypto, signing or HTTP client is imported to register bundles, unless a policy
    is set (then the signing stack is needed to verify)."""
    models = tmp_path / "models"
    sign(_bundle(models, "signed"), keys["alice"].private)
    probe = (
        "import sys\n"
        "from ttbundles.registry.registry import compute\n"
        "r = compute()\n"
        "assert r.entries and all(e.signer for e in r.entries if e.source.value == 'extra')\n"
        "heavy = ('model_signing', 'cryptography', 'sigstore', 'OpenSSL', 'httpx')\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & set(heavy)))\n"
    )
    env = {"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0", "PATH": "/usr/bin"}
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
    env["TT_BUNDLES_TRUST"] = str(trust_alice)
    done = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "model_signing" in done.stdout


# --- through a registry -----------------------------------------------------------------------


@needs_registry
def test_sign_push_pull_verify(run_cli, registry, tmp_path, keys, trust_alice):
    archive = _signed_archive(tmp_path, keys["alice"].private)
    ref = registry.ref("team/signed:1.0.0")
    pushed = json.loads(run_cli("push", archive, ref, "-f", "json").stdout)
    assert pushed["signature"] is not None
    # attached as a referrer: distribution 2.8 has no referrers API, so the fallback tag
    tag = artifact.fallback_tag(pushed["digest"])
    index = httpx.get(
        f"http://{registry.host}/v2/team/signed/manifests/{tag}",
        headers={"Accept": artifact.INDEX_MEDIA_TYPE},
    ).json()
    [listed] = index["manifests"]
    assert listed["digest"] == pushed["signature"]
    assert listed["artifactType"] == artifact.SIGNATURE_ARTIFACT_TYPE
    referrer = httpx.get(
        f"http://{registry.host}/v2/team/signed/manifests/{listed['digest']}",
        headers={"Accept": artifact.MANIFEST_MEDIA_TYPE},
    ).json()
    assert referrer["subject"]["digest"] == pushed["digest"]
    # pushing again lists it once
    run_cli("push", archive, ref)
    index = httpx.get(
        f"http://{registry.host}/v2/team/signed/manifests/{tag}",
        headers={"Accept": artifact.INDEX_MEDIA_TYPE},
    ).json()
    assert len(index["manifests"]) == 1
    out = tmp_path / "out"
    pulled = run_cli(
        "pull", ref, "-o", out, "-f", "json", env={"TT_BUNDLES_TRUST": str(trust_alice)}
    )
    assert pulled.returncode == 0, pulled.stdout
    assert json.loads(pulled.stdout)["signature_attached"] is True
    done = run_cli("verify", out / "demo-1.0.0.ttbundle", "--key", keys["alice"].public)
    assert done.returncode == 0, done.stdout
    models = tmp_path / "models"
    done = run_cli(
        "pull", ref, "--install", "--models-dir", models, env={"TT_BUNDLES_TRUST": str(trust_alice)}
    )
    assert done.returncode == 0, done.stderr
    record = json.loads((models / "demo" / ".ttbundle-provenance.json").read_text())
    assert record["source"] == ref and record["signer"] == f"key {trust_alice / 'alice.pub'}"


@needs_registry
def test_pull_under_policy_refuses_and_writes_nothing(
    run_cli, registry, tmp_path, keys, trust_alice
):
    env = {"TT_BUNDLES_TRUST": str(trust_alice)}
    unsigned = pack(_bundle(tmp_path / "u", "plain"), tmp_path / "dist-u")
    wrong = _signed_archive(tmp_path / "m", keys["mallory"].private, "wrong")
    for archive, code in ((unsigned, "TTB140"), (wrong, "TTB141")):
        ref = registry.ref(f"team/{archive.stem.split('-')[0]}:1")
        assert run_cli("push", archive, ref).returncode == 0
        out, models = tmp_path / f"out-{code}", tmp_path / f"models-{code}"
        done = run_cli("pull", ref, "-o", out, env=env)
        assert done.returncode == 1 and code in done.stderr, done.stderr
        assert snapshot(out) == {}
        done = run_cli("pull", ref, "--install", "--models-dir", models, env=env)
        assert done.returncode == 1 and code in done.stderr
        # the error names the reference typed, not our work file under it; the models
        # folder made for the pull is gone again
        [line] = [x for x in done.stderr.splitlines() if code in x]
        assert line.startswith(f"{ref}: error {code}") or line.startswith(f"{ref}!/"), line
        assert ".ttbundle-pull-" not in done.stderr, done.stderr
        assert not models.exists() and not out.exists()
    # unreachable: an error, and no folder left behind either
    unreachable = tmp_path / "unreachable"
    for args in (["-o", unreachable / "o" / "deep"], ["--install", "--models-dir", unreachable]):
        done = run_cli("pull", "127.0.0.1:1/team/x:1", "--plain-http", *args, env=env)
        assert done.returncode == 1 and "TTB131" in done.stderr, done.stderr
        assert not unreachable.exists()
    # a folder that was already there stays
    (tmp_path / "kept").mkdir()
    done = run_cli("pull", "127.0.0.1:1/team/x:1", "--plain-http", "-o", tmp_path / "kept")
    assert done.returncode == 1 and (tmp_path / "kept").is_dir()


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
def test_every_key_model_signing_refuses_is_one_line_with_the_recipe(run_cli, tmp_path):
    """The keys a user may have at hand: each refused key names its type and the recipe,
    and the recipe given makes a key that signs."""

    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=tmp_path)

    openssl("genrsa", "-out", "rsa.pem", "2048")
    openssl("genpkey", "-algorithm", "ed25519", "-out", "ed25519.pem")
    openssl("ecparam", "-name", "secp256k1", "-genkey", "-noout", "-out", "k1.pem")
    openssl("ecparam", "-name", "prime256v1", "-genkey", "-noout", "-out", "key.pem")
    openssl("ec", "-in", "key.pem", "-pubout", "-out", "key.pub")
    (tmp_path / "text.pem").write_text("not a key\n")
    folder = _bundle(tmp_path)
    expected = {
        "rsa.pem": "an RSA-2048 private key",
        "ed25519.pem": "an Ed25519 private key",
        "k1.pem": "an elliptic-curve private key on secp256k1",
        "key.pub": "a public key, not a private key",
        "text.pem": "not a PEM file",
    }
    for name, kind in expected.items():
        done = run_cli("sign", folder, "--key", tmp_path / name)
        assert done.returncode == 1, (name, done.stderr)
        [line] = [x for x in done.stderr.splitlines() if "TTB142" in x]
        assert kind in line, line
        assert "openssl ecparam -name prime256v1 -genkey -noout -out key.pem" in done.stderr
        assert "internal error" not in done.stderr and "Traceback" not in done.stderr
        assert not (folder / SIGNATURE_FILE).exists()
    # the recipe's key, P-384 and P-521 sign, and the public key verifies
    for curve in ("secp384r1", "secp521r1"):
        openssl("ecparam", "-name", curve, "-genkey", "-noout", "-out", f"{curve}.pem")
        # each key signs over the last one's signature: --force (TTB146 otherwise)
        done = run_cli("sign", folder, "--key", tmp_path / f"{curve}.pem", "--force")
        assert done.returncode == 0, done.stderr
    done = run_cli("sign", folder, "--key", tmp_path / "key.pem", "--force")
    assert done.returncode == 0, done.stderr
    assert run_cli("verify", folder, "--key", tmp_path / "key.pub").returncode == 0


def test_a_skipped_bundle_is_the_cause_named_first_when_the_fallback_cannot_serve(
    tmp_path, trust_alice
):
    """Under a trust policy the unsigned extra Qwen3 bundle is skipped (TTB140) and the
    built-in tt-qwen3 (TT-Metal's class, not importable here) is the fallback: the refusal
    leads with the skip and its code, not "add a bundle for this architecture"."""
    from ttbundles.errors import ConfigurationError
    from ttbundles.registry.servable import require_importable, skipped_for

    models = tmp_path / "models"
    document = metadata("mine", "1.0.0", main_class="adapter:Generator", arch="Qwen3ForCausalLM")
    write_bundle(models / "mine", name="mine", document=document)
    environ = {"EXTRA_MODELS_DIR": str(models), "TT_BUNDLES_TRUST": str(trust_alice)}
    registry = compute(environ, mesh="HOST", index=False)
    chosen = registry.registered["TTQwen3ForCausalLM"]
    assert chosen.source.value == "built-in"
    skipped = skipped_for(registry, "TTQwen3ForCausalLM")
    assert [e.path.name for e in skipped] == ["mine"]
    with pytest.raises(ConfigurationError) as excinfo:
        require_importable(chosen.class_ref(), chosen.label, skipped=skipped)
    [diagnostic] = excinfo.value.diagnostics
    assert diagnostic.code == "TTB140", diagnostic
    assert diagnostic.message.startswith("bundle mine is not signed"), diagnostic.message
    assert "fallback" in diagnostic.message and "ttbundle sign" in diagnostic.hint
    # without a skipped bundle it stays TTB058
    with pytest.raises(ConfigurationError) as excinfo:
        require_importable(chosen.class_ref(), chosen.label)
    assert excinfo.value.diagnostics[0].code == "TTB058"


def test_the_skipped_bundles_own_fix_is_the_hint_not_signing(tmp_path):
    """A bundle skipped for another reason than trust (its adapter does not define the
    class, TTB052): the hint is that code's fix, not "sign it"."""
    from ttbundles.errors import ConfigurationError
    from ttbundles.registry.servable import require_importable, skipped_for

    models = tmp_path / "models"
    document = metadata("mine", "1.0.0", main_class="adapter:Missing", arch="Qwen3ForCausalLM")
    write_bundle(models / "mine", name="mine", document=document)
    registry = compute({"EXTRA_MODELS_DIR": str(models)}, mesh="HOST", index=False)
    chosen = registry.registered["TTQwen3ForCausalLM"]
    skipped = skipped_for(registry, "TTQwen3ForCausalLM")
    assert [e.path.name for e in skipped] == ["mine"]
    with pytest.raises(ConfigurationError) as excinfo:
        require_importable(chosen.class_ref(), chosen.label, skipped=skipped)
    [diagnostic] = excinfo.value.diagnostics
    assert diagnostic.code == "TTB052", diagnostic
    assert diagnostic.hint == (
        "fix the skipped bundle: define the class main_class names in that module, or "
        "correct its name (ttbundle list shows why each bundle is skipped)"
    )


def _evidence_policy(folder: Path, keys, require: object = True) -> Path:
    """A policy file trusting alice's key and asking for evidence on the served mesh."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "alice.pub").write_bytes(keys["alice"].public.read_bytes())
    policy = folder / "policy.json"
    policy.write_text(json.dumps({"keys": ["alice.pub"], "require_evidence": require}))
    return policy


def test_policy_can_require_evidence_on_the_serving_mesh(run_cli, tmp_path, keys):
    from ttbundles.archive.evidence import write_evidence

    models = tmp_path / "models"
    proven = _bundle(models, "proven")
    write_evidence(proven, {"mesh": "HOST", "passed": True, "paths": ["prefill", "decode"]})
    sign(proven, keys["alice"].private)
    document = metadata(
        "unproven", "1.0.0", main_class="adapter:Generator", arch="OtherForCausalLM"
    )
    unproven = write_bundle(models / "unproven", name="unproven", document=document)
    sign(unproven, keys["alice"].private)
    policy = _evidence_policy(tmp_path / "policy", keys)
    environ = {
        "EXTRA_MODELS_DIR": str(models),
        "TT_VLLM_BUILTIN_MODELS": "0",
        "TT_BUNDLES_TRUST": str(policy),
    }

    def entries(mesh: str) -> dict:
        found = compute({**environ, "MESH_DEVICE": mesh}, index=False)
        return {e.path.name: e for e in found.entries}

    served = entries("HOST")
    assert served["proven"].status is Status.REGISTERED
    assert served["unproven"].status is Status.SKIPPED
    assert served["unproven"].reason == (
        "TTB145 bundle unproven has no evidence for mesh HOST, and the trust policy "
        "(TT_BUNDLES_TRUST) requires evidence on the mesh being served"
    )
    # Proven on the host mesh is not proven on another one.
    assert entries("N300")["proven"].reason.startswith(
        "TTB145 bundle proven has no evidence for mesh N300"
    )
    # Evidence of other content (signed again after an edit) or of a failed run: refused.
    (proven / "adapter.py").write_text((proven / "adapter.py").read_text() + "\n# edited\n")
    sign(proven, keys["alice"].private)
    assert "has stale evidence for mesh HOST" in entries("HOST")["proven"].reason
    write_evidence(proven, {"mesh": "HOST", "passed": False, "paths": ["prefill"]})
    sign(proven, keys["alice"].private)
    assert "failed its test on mesh HOST" in entries("HOST")["proven"].reason
    # Without require_evidence the same policy serves both; doctor says what it asks.
    lenient = _evidence_policy(tmp_path / "lenient", keys, require=False)
    found = compute({**environ, "TT_BUNDLES_TRUST": str(lenient), "MESH_DEVICE": "HOST"})
    assert {e.path.name: e.status for e in found.entries} == {
        "proven": Status.REGISTERED,
        "unproven": Status.REGISTERED,
    }
    doctor = json.loads(
        run_cli("doctor", "-f", "json", env={"TT_BUNDLES_TRUST": str(policy)}).stdout
    )
    assert "served only on a mesh their evidence proves" in json.dumps(doctor)


def test_require_evidence_must_be_a_boolean(run_cli, tmp_path, keys):
    policy = _evidence_policy(tmp_path / "policy", keys, require="yes")
    done = run_cli("doctor", "-f", "json", env={"TT_BUNDLES_TRUST": str(policy)})
    assert "TTB143" in done.stdout
    assert "require_evidence must be true or false, not 'yes'" in done.stdout
