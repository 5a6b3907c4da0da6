"""Push and pull through a real OCI registry (Debian's docker-registry on 127.0.0.1).

Every failure is a clear error with a stable code and leaves nothing behind: the output
folder and the models folder are compared before and after.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import httpx
import pytest

from tests import oci_registry
from tests.bundle_factory import metadata, snapshot, write_bundle
from ttbundles.archive.manifest import read_manifest
from ttbundles.archive.reader import read_archive
from ttbundles.build import pack
from ttbundles.distribution import artifact
from ttbundles.distribution.client import RegistryClient
from ttbundles.distribution.credentials import credentials_for
from ttbundles.distribution.reference import parse_reference
from ttbundles.errors import TTBundleError

pytestmark = pytest.mark.skipif(not oci_registry.available(), reason=oci_registry.MISSING)

USER, PASSWORD = "alice", "s3cret-pass"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    with oci_registry.running(tmp_path_factory.mktemp("registry")) as running:
        yield running


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory):
    with oci_registry.running(
        tmp_path_factory.mktemp("auth-registry"), user=USER, password=PASSWORD
    ) as running:
        yield running


def _bundle(tmp_path: Path, name: str = "demo", version: str = "1.0.0", **files) -> Path:
    document = metadata(name, version, main_class="adapter:Generator")
    return write_bundle(
        tmp_path / "src" / name,
        name=name,
        version=version,
        document=document,
        files={k.replace("__", "/"): v for k, v in files.items()},
    )


def _archive(tmp_path: Path, **kwargs) -> Path:
    return pack(_bundle(tmp_path, **kwargs), tmp_path / "dist")


def _json(done) -> dict:
    return json.loads(done.stdout)


# --- round trip ---------------------------------------------------------------------


def test_push_pull_install_round_trip(run_cli, registry, tmp_path: Path):
    archive = _archive(tmp_path, weights__w_bin="w" * 5000)
    ref = registry.ref("team/demo:1.0.0")
    pushed = run_cli("push", archive, ref, "--format", "json")
    assert pushed.returncode == 0, pushed.stdout + pushed.stderr
    digest = _json(pushed)["digest"]
    models = tmp_path / "models"
    pulled = run_cli("pull", ref, "--install", "--models-dir", models)
    assert pulled.returncode == 0, pulled.stderr
    assert "installed demo 1.0.0" in pulled.stdout
    assert read_manifest(models / "demo").root_digest == read_archive(archive).root_digest
    record = json.loads((models / "demo" / ".ttbundle-provenance.json").read_text())
    assert record["source"] == ref and record["digest"] == digest
    assert record["signer"] == "unsigned"
    # verify on the installed copy ignores the record (never part of the bundle)
    assert run_cli("verify", models / "demo").returncode == 0
    shown = run_cli("inspect", models / "demo", "--format", "json")
    assert _json(shown)["provenance"]["digest"] == digest


def test_pull_keeps_the_archive_byte_for_byte(run_cli, registry, tmp_path: Path):
    archive = _archive(tmp_path)
    ref = registry.ref("team/bytes:1")
    assert run_cli("push", archive, ref).returncode == 0
    done = run_cli("pull", ref, "-o", tmp_path / "out")
    assert done.returncode == 0, done.stderr
    pulled = tmp_path / "out" / "demo-1.0.0.ttbundle"
    assert done.stdout.strip().splitlines()[-1] == str(pulled)
    assert pulled.read_bytes() == archive.read_bytes()
    by_digest = run_cli(
        "pull",
        _json(run_cli("push", archive, ref, "-f", "json"))["reference"],
        "-o",
        tmp_path / "out2",
    )
    assert by_digest.returncode == 0, by_digest.stderr


def test_same_bundle_same_manifest_digest(run_cli, registry, tmp_path: Path):
    folder = _bundle(tmp_path)
    first = _json(run_cli("push", folder, registry.ref("team/det:a"), "-f", "json"))
    second = _json(run_cli("push", folder, registry.ref("team/det:b"), "-f", "json"))
    archive = pack(folder, tmp_path / "dist")
    third = _json(run_cli("push", archive, registry.ref("team/det:c"), "-f", "json"))
    assert first["digest"] == second["digest"] == third["digest"]
    assert second["uploaded"] is False  # the layer was there already


def test_manifest_format(registry, tmp_path: Path):
    from ttbundles.distribution.push import push

    archive = _archive(tmp_path)
    result = push(archive, registry.ref("team/format:1"))
    body = httpx.get(
        f"http://{registry.host}/v2/team/format/manifests/1",
        headers={"Accept": artifact.MANIFEST_MEDIA_TYPE},
    ).content
    assert artifact.sha256_digest(body) == result.digest
    document = json.loads(body)
    assert document["artifactType"] == artifact.ARTIFACT_TYPE
    assert document["config"]["mediaType"] == artifact.CONFIG_MEDIA_TYPE
    [layer] = document["layers"]
    assert layer["mediaType"] == artifact.LAYER_MEDIA_TYPE
    assert layer["annotations"][artifact.OCI_TITLE] == "demo-1.0.0.ttbundle"
    notes = document["annotations"]
    assert notes[artifact.ANNOTATION_ROOT] == read_archive(archive).root_digest
    assert notes[artifact.ANNOTATION_ARCH] == "DemoForCausalLM"
    assert notes[artifact.OCI_VERSION] == "1.0.0"
    config = httpx.get(
        f"http://{registry.host}/v2/team/format/blobs/{document['config']['digest']}"
    )
    assert json.loads(config.content)["name"] == "demo"


# --- failures: a clear error, nothing written -----------------------------------------


def _blob_path(registry, digest: str) -> Path:
    hexdigest = digest.split(":", 1)[1]
    return registry.storage / "docker/registry/v2/blobs/sha256" / hexdigest[:2] / hexdigest / "data"


def test_tampered_layer_is_refused(run_cli, registry, tmp_path: Path):
    archive = _archive(tmp_path, name="tampered")
    ref = registry.ref("team/tampered:1")
    pushed = _json(run_cli("push", archive, ref, "-f", "json"))
    layer = json.loads(
        httpx.get(
            f"http://{registry.host}/v2/team/tampered/manifests/1",
            headers={"Accept": artifact.MANIFEST_MEDIA_TYPE},
        ).content
    )
    blob = _blob_path(registry, layer["layers"][0]["digest"])
    data = bytearray(blob.read_bytes())
    data[len(data) // 2] ^= 0xFF
    blob.write_bytes(bytes(data))
    out, models = tmp_path / "out", tmp_path / "models"
    out.mkdir()
    done = run_cli("pull", ref, "-o", out)
    assert done.returncode == 1
    assert "TTB135" in done.stderr and "nothing was written" in done.stderr
    assert ".ttbundle-pull-" not in done.stderr  # our part file, gone: never named
    assert snapshot(out) == {}
    done = run_cli("pull", pushed["reference"], "--install", "--models-dir", models)
    assert done.returncode == 1 and "TTB135" in done.stderr
    assert ".ttbundle-pull-" not in done.stderr
    assert not models.exists()  # a refused pull leaves no folder it made


def test_unknown_tag(run_cli, registry, tmp_path: Path):
    out = tmp_path / "out"
    done = run_cli("pull", registry.ref("team/nothing:9.9"), "-o", out, "-f", "json")
    assert done.returncode == 1
    [diagnostic] = _json(done)["diagnostics"]
    assert diagnostic["code"] == "TTB133"
    assert snapshot(out) == {}


def test_registry_down(run_cli, tmp_path: Path):
    port = oci_registry.free_port()  # nothing listens there
    out = tmp_path / "out"
    done = run_cli(
        "pull",
        f"127.0.0.1:{port}/team/x:1",
        "-o",
        out,
        env={"TT_BUNDLES_REGISTRY_TIMEOUT": "5"},
        timeout=30,
    )
    assert done.returncode == 1
    assert "TTB131" in done.stderr and f"127.0.0.1:{port}" in done.stderr
    assert snapshot(out) == {}
    pushed = run_cli("push", _archive(tmp_path), f"127.0.0.1:{port}/team/x:1", timeout=30)
    assert pushed.returncode == 1 and "TTB131" in pushed.stderr


def test_wrong_artifact_type(run_cli, registry, tmp_path: Path):
    config = b'{"architecture":"amd64","os":"linux"}'
    digest = artifact.sha256_digest(config)
    base = f"http://{registry.host}/v2/other/image"
    started = httpx.post(f"{base}/blobs/uploads/")
    location = started.headers["location"]
    if location.startswith("/"):
        location = f"http://{registry.host}{location}"
    httpx.put(f"{location}&digest={digest}", content=config).raise_for_status()
    manifest = artifact.canonical(
        {
            "schemaVersion": 2,
            "mediaType": artifact.MANIFEST_MEDIA_TYPE,
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": digest,
                "size": len(config),
            },
            "layers": [],
        }
    )
    httpx.put(
        f"{base}/manifests/1",
        content=manifest,
        headers={"Content-Type": artifact.MANIFEST_MEDIA_TYPE},
    ).raise_for_status()
    done = run_cli("pull", registry.ref("other/image:1"), "-o", tmp_path / "out")
    assert done.returncode == 1
    assert "TTB134" in done.stderr and "not a ttbundle" in done.stderr
    assert snapshot(tmp_path / "out") == {}


def test_malformed_reference(run_cli, tmp_path: Path):
    for ref in (
        "team/demo:1",
        "https://127.0.0.1:5000/x:1",
        "127.0.0.1:5000/Team:1",
        "127.0.0.1:5000/x@sha256:123",
    ):
        done = run_cli("pull", ref, "-o", tmp_path)
        assert done.returncode == 1, ref
        assert "TTB130" in done.stderr, (ref, done.stderr)


# --- auth ---------------------------------------------------------------------------


def test_auth_refused_then_accepted(run_cli, auth_registry, tmp_path: Path):
    archive = _archive(tmp_path)
    ref = auth_registry.ref("team/private:1")
    anonymous = run_cli("push", archive, ref)
    assert anonymous.returncode == 1 and "TTB132" in anonymous.stderr
    assert "anonymously" in anonymous.stderr
    wrong = {"TT_BUNDLES_REGISTRY_USERNAME": USER, "TT_BUNDLES_REGISTRY_PASSWORD": "nope"}
    refused = run_cli("push", archive, ref, env=wrong)
    assert refused.returncode == 1 and "TTB132" in refused.stderr and USER in refused.stderr
    right = {"TT_BUNDLES_REGISTRY_USERNAME": USER, "TT_BUNDLES_REGISTRY_PASSWORD": PASSWORD}
    assert run_cli("push", archive, ref, env=right).returncode == 0
    out = tmp_path / "out"
    denied = run_cli("pull", ref, "-o", out, env=wrong)
    assert denied.returncode == 1 and "TTB132" in denied.stderr
    assert snapshot(out) == {}
    # the docker config's credentials, as `docker login` writes them
    docker = tmp_path / "docker"
    docker.mkdir()
    token = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (docker / "config.json").write_text(
        json.dumps({"auths": {auth_registry.host: {"auth": token}}})
    )
    pulled = run_cli("pull", ref, "-o", out, env={"DOCKER_CONFIG": str(docker)})
    assert pulled.returncode == 0, pulled.stderr


def test_credentials_sources(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("TT_BUNDLES_REGISTRY_USERNAME", raising=False)
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    assert credentials_for("r.example:5000") is None
    (tmp_path / "config.json").write_text(
        json.dumps(
            {
                "auths": {
                    "https://r.example:5000": {"username": "u", "password": "p"},
                }
            }
        )
    )
    assert credentials_for("r.example:5000") == ("u", "p")
    monkeypatch.setenv("TT_BUNDLES_REGISTRY_USERNAME", "env-user")
    monkeypatch.setenv("TT_BUNDLES_REGISTRY_PASSWORD", "env-pass")
    assert credentials_for("r.example:5000") == ("env-user", "env-pass")


def test_plain_http_only_for_loopback_or_when_asked():
    remote = parse_reference("registry.example.com/team/demo:1")
    assert RegistryClient(remote).base.startswith("https://")
    assert RegistryClient(remote, plain_http=True).base.startswith("http://")
    for host in ("127.0.0.1:5000", "localhost:5000", "[::1]:5000"):
        assert RegistryClient(parse_reference(f"{host}/a:1")).base.startswith("http://"), host


def test_reference_parsing():
    ref = parse_reference("127.0.0.1:5000/team/llama:1.2.0")
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        "127.0.0.1:5000",
        "team/llama",
        "1.2.0",
        None,
    )
    digest = "sha256:" + "a" * 64
    ref = parse_reference(f"reg.example/llama@{digest}")
    assert ref.target == digest and ref.tag is None
    assert parse_reference("reg.example/llama").tag == "latest"
    with pytest.raises(TTBundleError) as error:
        parse_reference("llama:1")
    assert error.value.diagnostics[0].code == "TTB130"


def test_interrupted_pull_leaves_nothing(registry, tmp_path: Path):
    """A pull stopped (SIGTERM) while the archive is downloaded or verified removes its
    temporary file: the output folder is as it was."""
    import os
    import signal
    import subprocess
    import time

    from tests.conftest import TTBUNDLE

    archive = _archive(tmp_path, name="large", weights__w_bin=os.urandom(64 << 20))
    ref = registry.ref("team/large:1")
    from ttbundles.distribution.push import push

    push(archive, ref)
    out = tmp_path / "out"
    out.mkdir()
    process = subprocess.Popen(
        [TTBUNDLE, "pull", ref, "-o", str(out)], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 60
    while not any(p.name.startswith(".ttbundle-pull-") for p in out.iterdir()):
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline
        time.sleep(0.005)
    process.send_signal(signal.SIGTERM)
    process.communicate(timeout=60)
    assert process.returncode == 130
    assert list(out.iterdir()) == []


# --- token auth (the bearer-token flow) -------------------------------------------------


def _grant(user: str, kind: str, name: str, actions: list[str]) -> list[str]:
    """The token service's permissions: alice may pull and push team/*, only pull
    readonly/*, nothing else."""
    if user != USER or kind != "repository":
        return []
    if name.startswith("team/"):
        return actions
    if name.startswith("readonly/"):
        return [a for a in actions if a == "pull"]
    return []


@pytest.fixture(scope="module")
def token_registry(tmp_path_factory):
    """A registry demanding the bearer-token flow, its realm a token server issuing real
    RS256 JWTs, and both (registry, token server)."""
    folder = tmp_path_factory.mktemp("token-registry")
    tokens = oci_registry.TokenServer(USER, PASSWORD, folder / "tokens", grant=_grant)
    with tokens, oci_registry.running(folder / "registry", tokens=tokens) as running:
        yield running, tokens


RIGHT = {"TT_BUNDLES_REGISTRY_USERNAME": USER, "TT_BUNDLES_REGISTRY_PASSWORD": PASSWORD}


def _one_error(done, code: str) -> str:
    """The refusal: exit 1, one error line with `code`, no traceback; the line."""
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "Traceback" not in done.stdout
    errors = [line for line in done.stderr.splitlines() if " TTB" in line or "TTB" in line[:12]]
    (line,) = [e for e in errors if not e.lstrip().startswith("fix:")]
    assert f"error {code} " in line, done.stderr
    return line


def _repository_written(registry, repository: str) -> bool:
    return (registry.storage / "docker/registry/v2/repositories" / repository).exists()


def test_token_auth_push_and_pull(run_cli, token_registry, tmp_path: Path):
    registry, tokens = token_registry
    archive = _archive(tmp_path)
    ref = registry.ref("team/tokened:1.0.0")
    anonymous = run_cli("push", archive, ref)
    line = _one_error(anonymous, "TTB132")
    assert "anonymously" in line and "insufficient_scope" in line
    assert not _repository_written(registry, "team/tokened")
    tokens.requests.clear()
    pushed = run_cli("push", archive, ref, env=RIGHT)
    assert pushed.returncode == 0, pushed.stderr
    asked = [scope for user, scope in tokens.requests if user == USER]
    # The registry names the actions in its own order (a Go map's: either way round).
    scopes = {
        (scope.rsplit(":", 1)[0], frozenset(scope.rsplit(":", 1)[1].split(",")))
        for scope in asked
        if scope
    }
    assert ("repository:team/tokened", frozenset({"pull", "push"})) in scopes
    assert len(asked) == len(set(asked)), asked  # one token per scope, kept for the rest
    # pulled with the docker config's credentials, as `docker login` writes them
    docker = tmp_path / "docker"
    docker.mkdir()
    auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
    (docker / "config.json").write_text(json.dumps({"auths": {registry.host: {"auth": auth}}}))
    out = tmp_path / "out"
    pulled = run_cli("pull", ref, "-o", out, env={"DOCKER_CONFIG": str(docker)})
    assert pulled.returncode == 0, pulled.stderr
    (got,) = out.glob("*.ttbundle")
    assert got.read_bytes() == archive.read_bytes()


def test_token_auth_wrong_password_writes_nothing(run_cli, token_registry, tmp_path: Path):
    registry, _ = token_registry
    wrong = {**RIGHT, "TT_BUNDLES_REGISTRY_PASSWORD": "nope"}
    pushed = run_cli("push", _archive(tmp_path), registry.ref("team/wrongpw:1"), env=wrong)
    line = _one_error(pushed, "TTB132")
    assert "token service" in line and "wrong username or password" in line and USER in line
    assert not _repository_written(registry, "team/wrongpw")
    out = tmp_path / "out"
    pulled = run_cli("pull", registry.ref("team/wrongpw:1"), "-o", out, env=wrong)
    assert "wrong username or password" in _one_error(pulled, "TTB132")
    assert snapshot(out) == {}


def test_token_auth_a_token_for_the_wrong_scope_writes_nothing(
    run_cli, token_registry, tmp_path: Path
):
    """The token service grants pull only (readonly/*) or nothing (other/*): the
    registry refuses the token for what was asked (insufficient_scope)."""
    registry, _ = token_registry
    pushed = run_cli("push", _archive(tmp_path), registry.ref("readonly/demo:1"), env=RIGHT)
    line = _one_error(pushed, "TTB132")
    assert "does not grant pull and push on readonly/demo (insufficient_scope)" in line
    assert not _repository_written(registry, "readonly/demo")
    out = tmp_path / "out"
    pulled = run_cli("pull", registry.ref("other/demo:1"), "-o", out, env=RIGHT)
    assert "does not grant pull on other/demo" in _one_error(pulled, "TTB132")
    assert snapshot(out) == {}


def test_token_auth_an_expired_token_writes_nothing(run_cli, token_registry, tmp_path: Path):
    registry, tokens = token_registry
    archive = _archive(tmp_path)
    assert run_cli("push", archive, registry.ref("team/expiry:1"), env=RIGHT).returncode == 0
    tokens.lifetime = -600  # issued expired ten minutes ago
    try:
        pushed = run_cli("push", archive, registry.ref("team/expiry:2"), env=RIGHT)
        line = _one_error(pushed, "TTB132")
        assert "token service issued is not valid there (invalid_token: expired" in line
        out = tmp_path / "out"
        pulled = run_cli("pull", registry.ref("team/expiry:1"), "-o", out, env=RIGHT)
        assert "invalid_token" in _one_error(pulled, "TTB132")
        assert snapshot(out) == {}
    finally:
        tokens.lifetime = 300
    tags = registry.storage / "docker/registry/v2/repositories/team/expiry/_manifests/tags"
    assert sorted(p.name for p in tags.iterdir()) == ["1"]  # nothing of the refused push


def test_token_auth_renews_a_token_before_it_expires(run_cli, token_registry, tmp_path: Path):
    """Tokens that live 5 s (within the client's margin) are renewed before each request
    instead of being sent to expire on the way: a streamed upload cannot be sent twice."""
    registry, tokens = token_registry
    tokens.lifetime = 5
    tokens.requests.clear()
    try:
        done = run_cli("push", _archive(tmp_path), registry.ref("team/short:1"), env=RIGHT)
    finally:
        tokens.lifetime = 300
    assert done.returncode == 0, done.stderr
    pushes = [  # the actions in the registry's own order (see test_token_auth_push_and_pull)
        s
        for u, s in tokens.requests
        if s
        and s.startswith("repository:team/short:")
        and set(s.rsplit(":", 1)[1].split(",")) == {"pull", "push"}
    ]
    assert len(pushes) > 1  # renewed for the upload's later requests
