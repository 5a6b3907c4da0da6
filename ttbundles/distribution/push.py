"""`ttbundle push ARCHIVE|DIR REF`: a verified archive into an OCI registry.

A folder is packed first (validated, deterministic). The archive is verified whole
before anything is sent, so a registry only ever holds archives that `install` accepts.
Blobs the registry already has are not sent again. A signed bundle (`model.sig` inside
the archive) also gets its signature attached as a referrer (`subject` = the bundle's
manifest), and listed under the `sha256-<hex>` fallback tag for registries without the
referrers API.
"""

from __future__ import annotations

import tarfile
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

from ttbundles.archive.manifest import Manifest
from ttbundles.archive.reader import verified_manifest
from ttbundles.distribution import artifact
from ttbundles.distribution.artifact import Descriptor
from ttbundles.distribution.blobs import Progress, file_digest, upload
from ttbundles.distribution.client import RegistryClient
from ttbundles.distribution.reference import parse_reference
from ttbundles.errors import TTBundleError
from ttbundles.format.metadata import METADATA_FILE
from ttbundles.trust.signature import SIGNATURE_FILE

MAX_SMALL_MEMBER = 16 << 20


@dataclass(frozen=True)
class PushResult:
    reference: str
    digest: str
    name: str
    version: str
    root_digest: str
    size: int
    uploaded: bool
    signature: str | None  # the signature referrer's manifest digest

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def read_members(archive: Path, names: set[str]) -> dict[str, bytes]:
    """Small entries of an archive already verified, absent ones left out.

    `pack` writes entries sorted by path, so reading stops after the last name wanted
    (a bundle's weights usually sort after `vllm_metadata.json`): no second pass over
    gigabytes. The archive was checked whole before; damage here is still TTB080.
    """
    found: dict[str, bytes] = {}
    last = max(names)
    try:
        with tarfile.open(archive, mode="r|gz") as tar:
            for member in tar:
                if member.name > last:
                    break
                if member.name in names and member.isfile() and member.size <= MAX_SMALL_MEMBER:
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[member.name] = handle.read()
    except (OSError, tarfile.TarError, EOFError, zlib.error) as exc:
        raise TTBundleError.single(
            "TTB080", f"{archive}: cannot be read: {exc}", file=archive
        ) from None
    return found


def _identity(manifest: Manifest, metadata: bytes) -> artifact.BundleIdentity:
    import json

    document = json.loads(metadata)
    arch = document.get("arch") or document.get("architecture") or ""
    return artifact.BundleIdentity(
        name=manifest.name,
        version=manifest.version,
        arch=str(arch),
        root_digest=manifest.root_digest,
        description=document.get("description")
        if isinstance(document.get("description"), str)
        else None,
    )


def push(
    source: Path,
    ref: str,
    *,
    plain_http: bool = False,
    progress: Progress | None = None,
) -> PushResult:
    """Push the archive (or the folder, packed) `source` to `ref`; what was pushed."""
    reference = parse_reference(ref)
    if reference.digest is not None:
        raise TTBundleError.single(
            "TTB130",
            f"{ref}: push names a tag, not a digest (the digest is the result)",
            hint="write HOST/REPOSITORY:TAG",
        )
    source = Path(source)
    if not source.exists():
        raise TTBundleError.single("TTB001", f"{source} does not exist", file=source)
    if source.is_dir():
        from ttbundles.build import pack

        with tempfile.TemporaryDirectory(prefix="ttbundle-push-") as tmp:
            return _push_archive(pack(source, Path(tmp)), reference, plain_http, progress)
    return _push_archive(source, reference, plain_http, progress)


def _push_archive(archive, reference, plain_http: bool, progress: Progress | None) -> PushResult:
    manifest = verified_manifest(archive)
    members = read_members(archive, {METADATA_FILE, SIGNATURE_FILE})
    metadata = members.get(METADATA_FILE)
    if metadata is None:
        raise TTBundleError.single("TTB081", f"{archive}: no {METADATA_FILE}", file=archive)
    identity = _identity(manifest, metadata)
    layer_digest, layer_size = file_digest(archive)
    config = Descriptor(artifact.CONFIG_MEDIA_TYPE, artifact.sha256_digest(metadata), len(metadata))
    layer = Descriptor(
        artifact.LAYER_MEDIA_TYPE,
        layer_digest,
        layer_size,
        annotations={artifact.OCI_TITLE: f"{manifest.name}-{manifest.version}.ttbundle"},
    )
    body = artifact.bundle_manifest(config, layer, identity)
    digest = artifact.sha256_digest(body)
    signature = members.get(SIGNATURE_FILE)
    with RegistryClient(reference, plain_http=plain_http) as client:
        client.ping()
        upload(client, config.digest, config.size, data=metadata)
        sent = upload(client, layer.digest, layer.size, path=archive, progress=progress)
        _put_manifest(client, reference.target, body)
        signature_digest = None
        if signature is not None:
            subject = Descriptor(artifact.MANIFEST_MEDIA_TYPE, digest, len(body))
            signature_digest = attach_signature(client, subject, signature)
    return PushResult(
        reference=str(reference.with_digest(digest)),
        digest=digest,
        name=manifest.name,
        version=manifest.version,
        root_digest=manifest.root_digest,
        size=layer_size,
        uploaded=sent,
        signature=signature_digest,
    )


def _put_manifest(
    client: RegistryClient, target: str, body: bytes, media_type: str = artifact.MANIFEST_MEDIA_TYPE
) -> None:
    client.request(
        "PUT",
        f"manifests/{target}",
        headers={"Content-Type": media_type},
        content=body,
        ok=(201,),
        what=f"manifest {target}",
    )


def attach_signature(client: RegistryClient, subject: Descriptor, signature: bytes) -> str:
    """Push `signature` as a referrer of `subject`; its manifest digest.

    Registries with the referrers API index it from `subject`; for the others the
    `sha256-<hex>` tag's index lists it (merged with what the tag already lists).
    """
    import json

    blob = Descriptor(
        artifact.SIGNATURE_ARTIFACT_TYPE,
        artifact.sha256_digest(signature),
        len(signature),
        annotations={artifact.OCI_TITLE: SIGNATURE_FILE},
    )
    upload(client, artifact.sha256_digest(artifact.EMPTY_CONFIG), 2, data=artifact.EMPTY_CONFIG)
    upload(client, blob.digest, blob.size, data=signature)
    body = artifact.signature_manifest(blob, subject)
    digest = artifact.sha256_digest(body)
    response = client.request(
        "PUT",
        f"manifests/{digest}",
        headers={"Content-Type": artifact.MANIFEST_MEDIA_TYPE},
        content=body,
        ok=(201,),
        what="the signature's manifest",
    )
    if response.headers.get("oci-subject") == subject.digest:
        return digest  # the registry indexes referrers itself
    tag = artifact.fallback_tag(subject.digest)
    listed: list[dict] = []
    current = client.request(
        "GET",
        f"manifests/{tag}",
        headers={"Accept": artifact.INDEX_MEDIA_TYPE},
        ok=(200, 404),
        what=f"the referrers tag {tag}",
    )
    if current.status_code == 200:
        try:
            listed = list(json.loads(current.content).get("manifests", []))
        except (ValueError, AttributeError):
            listed = []
    descriptor = Descriptor(
        artifact.MANIFEST_MEDIA_TYPE,
        digest,
        len(body),
        artifact_type=artifact.SIGNATURE_ARTIFACT_TYPE,
    ).to_dict()
    _put_manifest(
        client, tag, artifact.referrers_index([*listed, descriptor]), artifact.INDEX_MEDIA_TYPE
    )
    return digest
