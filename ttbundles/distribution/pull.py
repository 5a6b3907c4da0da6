"""`ttbundle pull REF [-o DIR] [--install]`: a bundle from an OCI registry, verified.

Order: the manifest (its digest checked when REF names one; its artifact type must be a
ttbundle's), the config, then the archive layer streamed into a temporary file beside
the destination while hashing; then the archive's own manifest (every file's digest,
the root digest, which must be the annotation's), a signature attached in the registry
(which must be the one inside the archive), and the trust policy. Only then is the
archive renamed to `<name>-<version>.ttbundle` (or installed). Any failure, or an
interrupt, removes the temporary file: nothing is written.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from ttbundles.archive.reader import verified_manifest
from ttbundles.distribution import artifact
from ttbundles.distribution.blobs import Progress, download, fetch_bytes, mismatch
from ttbundles.distribution.client import RegistryClient
from ttbundles.distribution.push import read_members
from ttbundles.distribution.reference import Reference, parse_reference
from ttbundles.errors import TTBundleError, relocated
from ttbundles.format.metadata import METADATA_FILE
from ttbundles.fsutil import folder_kept_on_success
from ttbundles.trust.provenance import Provenance
from ttbundles.trust.signature import SIGNATURE_FILE, read_claim

if TYPE_CHECKING:
    from ttbundles.installer.operations import InstallResult

MAX_MANIFEST = 4 << 20
MAX_CONFIG = 4 << 20
MAX_SIGNATURE = 4 << 20
PART_PREFIX = ".ttbundle-pull-"


@dataclass(frozen=True)
class PullResult:
    reference: str
    digest: str
    name: str
    version: str
    root_digest: str
    archive: Path | None
    signature_attached: bool
    provenance: Provenance

    def to_dict(self) -> dict:
        return {
            "reference": self.reference,
            "digest": self.digest,
            "name": self.name,
            "version": self.version,
            "root_digest": self.root_digest,
            "archive": str(self.archive) if self.archive else None,
            "signature_attached": self.signature_attached,
        }


def _manifest(client: RegistryClient, reference: Reference) -> tuple[dict, bytes, str]:
    response = client.request(
        "GET",
        f"manifests/{reference.target}",
        headers={"Accept": f"{artifact.MANIFEST_MEDIA_TYPE}, {artifact.INDEX_MEDIA_TYPE}"},
        what=f"manifest {reference.target}",
    )
    body = response.content
    if len(body) > MAX_MANIFEST:
        raise TTBundleError.single("TTB134", f"{reference}: the manifest is too large")
    digest = artifact.sha256_digest(body)
    expected = reference.digest or response.headers.get("docker-content-digest")
    if expected and expected.startswith("sha256:") and expected != digest:
        raise mismatch("the manifest", expected, digest, reference)
    try:
        document = json.loads(body)
    except ValueError:
        raise TTBundleError.single("TTB134", f"{reference}: the manifest is not JSON") from None
    kind = document.get("artifactType") or document.get("config", {}).get("mediaType")
    if kind not in (artifact.ARTIFACT_TYPE, artifact.CONFIG_MEDIA_TYPE):
        raise TTBundleError.single(
            "TTB134",
            f"{reference} is not a ttbundle: its artifact type is {kind!r}, "
            f"not {artifact.ARTIFACT_TYPE!r}",
            hint="pull a reference that `ttbundle push` wrote",
        )
    layers = [
        layer
        for layer in document.get("layers", [])
        if isinstance(layer, dict) and layer.get("mediaType") == artifact.LAYER_MEDIA_TYPE
    ]
    if len(layers) != 1:
        raise TTBundleError.single(
            "TTB134",
            f"{reference}: expected one {artifact.LAYER_MEDIA_TYPE} layer, found {len(layers)}",
        )
    return document, body, digest


def _descriptor(document: dict, reference: Reference, what: str) -> tuple[str, int]:
    """(digest, size) of a descriptor in a manifest; TTB134 when it is malformed."""
    digest, size = document.get("digest"), document.get("size")
    if not (isinstance(digest, str) and digest.startswith("sha256:") and isinstance(size, int)):
        raise TTBundleError.single(
            "TTB134", f"{reference}: the manifest's {what} has no valid digest and size"
        )
    return digest, size


def _attached_signature(client: RegistryClient, digest: str) -> bytes | None:
    """The signature attached to manifest `digest`: the referrers API, else the tag."""
    response = client.request(
        "GET",
        f"referrers/{digest}",
        headers={"Accept": artifact.INDEX_MEDIA_TYPE},
        ok=(200, 404),
        what="the referrers",
    )
    if response.status_code == 404:
        response = client.request(
            "GET",
            f"manifests/{artifact.fallback_tag(digest)}",
            headers={"Accept": artifact.INDEX_MEDIA_TYPE},
            ok=(200, 404),
            what="the referrers tag",
        )
        if response.status_code == 404:
            return None
    try:
        listed = json.loads(response.content).get("manifests", [])
    except (ValueError, AttributeError):
        return None
    for entry in listed:
        if entry.get("artifactType") != artifact.SIGNATURE_ARTIFACT_TYPE:
            continue
        body = fetch_bytes_manifest(client, entry["digest"])
        document = json.loads(body)
        if document.get("subject", {}).get("digest") != digest:
            continue
        layer = document["layers"][0]
        return fetch_bytes(
            client, layer["digest"], int(layer["size"]), MAX_SIGNATURE, "the signature"
        )
    return None


def fetch_bytes_manifest(client: RegistryClient, digest: str) -> bytes:
    body = client.request(
        "GET",
        f"manifests/{digest}",
        headers={"Accept": artifact.MANIFEST_MEDIA_TYPE},
        what=f"manifest {digest}",
    ).content
    actual = artifact.sha256_digest(body)
    if actual != digest:
        raise mismatch("a referrer's manifest", digest, actual, client.ref)
    return body


def _claimed(signature: bytes | None) -> str:
    if signature is None:
        return "unsigned"
    claim = read_claim(signature)
    return f"{claim.short} (not verified)" if claim else "unreadable signature"


def pull(
    ref: str,
    output_dir: Path = Path("."),
    *,
    plain_http: bool = False,
    progress: Progress | None = None,
    keep: bool = True,
) -> tuple[PullResult, Path]:
    """Download and verify `ref` into `output_dir`; (result, the verified archive).

    `keep=False` leaves the archive under its temporary name for the caller (install)
    to use and delete.
    """
    from ttbundles.trust.policy import enforce_archive

    reference = parse_reference(ref)
    output_dir = Path(output_dir)
    # A folder made here and left empty by a failure is removed again.
    with (
        folder_kept_on_success(output_dir),
        RegistryClient(reference, plain_http=plain_http) as client,
    ):
        document, _, digest = _manifest(client, reference)
        config_digest, config_size = _descriptor(document.get("config") or {}, reference, "config")
        metadata = fetch_bytes(client, config_digest, config_size, MAX_CONFIG, "the config")
        layer = next(
            x for x in document["layers"] if x.get("mediaType") == artifact.LAYER_MEDIA_TYPE
        )
        layer_digest, layer_size = _descriptor(layer, reference, "archive layer")
        part = output_dir / f"{PART_PREFIX}{secrets.token_hex(8)}.ttbundle"
        try:
            download(client, layer_digest, layer_size, part, progress=progress)
            manifest = verified_manifest(part)
            annotations = document.get("annotations") or {}
            claimed = annotations.get(artifact.ANNOTATION_ROOT)
            if claimed is not None and claimed != manifest.root_digest:
                raise mismatch(
                    "the archive's root digest", claimed, manifest.root_digest, reference
                )
            members = read_members(part, {METADATA_FILE, SIGNATURE_FILE})
            if members.get(METADATA_FILE) != metadata:
                raise TTBundleError.single(
                    "TTB135",
                    f"{reference}: the config is not the archive's {METADATA_FILE}; "
                    "nothing was written",
                    hint="push the bundle again with `ttbundle push`",
                )
            attached = _attached_signature(client, digest)
            inside = members.get(SIGNATURE_FILE)
            if attached is not None and inside is not None and attached != inside:
                raise TTBundleError.single(
                    "TTB141",
                    f"{reference}: the signature attached in the registry is not the one in "
                    "the archive; nothing was written",
                    hint="sign and push the bundle again",
                )
            # Installing checks the policy on the extracted copy itself (keep=False).
            verified = enforce_archive(part, manifest.name) if keep else None
            provenance = Provenance(
                source=str(reference),
                digest=digest,
                root_digest=manifest.root_digest,
                signer=verified or _claimed(inside),
                time=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
            )
            final = part
            if keep:
                final = output_dir / f"{manifest.name}-{manifest.version}.ttbundle"
                os.replace(part, final)
                provenance.write_beside(final)
        except BaseException as exc:
            part.unlink(missing_ok=True)
            if isinstance(exc, TTBundleError):
                # The part file was ours, and is gone: name the reference the user typed.
                exc.diagnostics = relocated(exc.diagnostics, part, f"{reference}!")
            raise
    result = PullResult(
        reference=str(reference.with_digest(digest)),
        digest=digest,
        name=manifest.name,
        version=manifest.version,
        root_digest=manifest.root_digest,
        archive=final if keep else None,
        signature_attached=attached is not None,
        provenance=provenance,
    )
    return result, final


def pull_install(
    ref: str,
    models_dir: Path,
    *,
    replace: bool = False,
    plain_http: bool = False,
    progress: Progress | None = None,
) -> tuple[PullResult, InstallResult]:
    """Pull `ref` and install it into `models_dir` (`pull --install`).

    The archive is ours, in a work folder inside `models_dir` removed on the way out:
    errors name the registry reference the user typed (the archive as REF, a file in it
    as REF!/path), never that folder, and a models folder made here is removed again
    when nothing was installed.
    """
    import tempfile

    from ttbundles.errors import shown_as
    from ttbundles.installer.leftovers import LOCK_FILE
    from ttbundles.installer.operations import install

    with (
        folder_kept_on_success(Path(models_dir), ours=(LOCK_FILE,)) as target,
        tempfile.TemporaryDirectory(prefix=PART_PREFIX, dir=target) as tmp,
        shown_as(tmp, ref),
    ):
        result, archive = pull(ref, Path(tmp), plain_http=plain_http, progress=progress, keep=False)
        with shown_as(archive, f"{ref}!"):
            installed = install(archive, target, replace=replace, provenance=result.provenance)
    return result, installed
