"""The OCI form of a bundle: media types, annotations, deterministic manifests.

A bundle is one OCI image manifest (`application/vnd.oci.image.manifest.v1+json`, OCI
1.1) with our own `artifactType`, the bundle's `vllm_metadata.json` (its exact bytes) as
the config blob, and the `.ttbundle` archive as the one layer. The archive is the unit:
it carries the file manifest and root digest that `install` verifies, so a registry
moves exactly what `pack` made.

Why not ModelPack's media types (`application/vnd.cncf.model.*`): ModelPack layers are
the model's files one by one (weights, code, docs) with its own config schema; a bundle
is not a model (it points to a checkpoint) but a verified archive plus metadata that a
vLLM plugin reads. Following ModelPack would mean a second layout to keep in step with
`MANIFEST.json` and a config other tools would misread. The annotations below use the OCI
standard keys, so generic tools (`oras`, registries' UIs) still show name and version.

Deterministic: canonical JSON (sorted keys, no spaces), no creation time unless
`SOURCE_DATE_EPOCH` is set; the same archive gives the same manifest digest.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import datetime, timezone

from ttbundles import envs

ARTIFACT_TYPE = "application/vnd.tenstorrent.ttbundle.v1"
CONFIG_MEDIA_TYPE = "application/vnd.tenstorrent.ttbundle.config.v1+json"
LAYER_MEDIA_TYPE = "application/vnd.tenstorrent.ttbundle.archive.v1.tar+gzip"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"
INDEX_MEDIA_TYPE = "application/vnd.oci.image.index.v1+json"
# A signature: a Sigstore bundle (model-signing's format), attached as a referrer.
SIGNATURE_ARTIFACT_TYPE = "application/vnd.dev.sigstore.bundle.v0.3+json"
EMPTY_MEDIA_TYPE = "application/vnd.oci.empty.v1+json"
EMPTY_CONFIG = b"{}"

ANNOTATION_NAME = "dev.tenstorrent.ttbundle.name"
ANNOTATION_VERSION = "dev.tenstorrent.ttbundle.version"
ANNOTATION_ARCH = "dev.tenstorrent.ttbundle.arch"
ANNOTATION_ROOT = "dev.tenstorrent.ttbundle.root-digest"
OCI_TITLE = "org.opencontainers.image.title"
OCI_VERSION = "org.opencontainers.image.version"
OCI_CREATED = "org.opencontainers.image.created"
OCI_DESCRIPTION = "org.opencontainers.image.description"


def canonical(document: dict) -> bytes:
    """Canonical JSON bytes: what is hashed is what is sent."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    annotations: dict[str, str] | None = None
    artifact_type: str | None = None

    def to_dict(self) -> dict:
        out: dict = {"mediaType": self.media_type, "digest": self.digest, "size": self.size}
        if self.annotations:
            out["annotations"] = dict(self.annotations)
        if self.artifact_type:
            out["artifactType"] = self.artifact_type
        return out


@dataclass(frozen=True)
class BundleIdentity:
    """What the annotations say about a bundle."""

    name: str
    version: str
    arch: str
    root_digest: str
    description: str | None = None


def annotations(identity: BundleIdentity) -> dict[str, str]:
    found = {
        ANNOTATION_NAME: identity.name,
        ANNOTATION_VERSION: identity.version,
        ANNOTATION_ARCH: identity.arch,
        ANNOTATION_ROOT: identity.root_digest,
        OCI_TITLE: identity.name,
        OCI_VERSION: identity.version,
    }
    if identity.description:
        found[OCI_DESCRIPTION] = identity.description
    epoch = envs.SOURCE_DATE_EPOCH
    if epoch and epoch.isdigit():
        created = datetime.fromtimestamp(int(epoch), tz=timezone.utc)
        found[OCI_CREATED] = created.strftime("%Y-%m-%dT%H:%M:%SZ")
    return found


def bundle_manifest(config: Descriptor, layer: Descriptor, identity: BundleIdentity) -> bytes:
    """The bundle's image manifest, canonical bytes."""
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "artifactType": ARTIFACT_TYPE,
            "config": config.to_dict(),
            "layers": [layer.to_dict()],
            "annotations": annotations(identity),
        }
    )


def signature_manifest(signature: Descriptor, subject: Descriptor) -> bytes:
    """A referrer holding the signature, pointing at the bundle's manifest (`subject`)."""
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_MEDIA_TYPE,
            "artifactType": SIGNATURE_ARTIFACT_TYPE,
            "config": Descriptor(EMPTY_MEDIA_TYPE, sha256_digest(EMPTY_CONFIG), 2).to_dict(),
            "layers": [signature.to_dict()],
            "subject": subject.to_dict(),
        }
    )


def fallback_tag(digest: str) -> str:
    """The referrers tag schema's tag for `digest` (`sha256-<hex>`), used where the
    registry has no referrers API (distribution 2.8)."""
    algorithm, _, hexdigest = digest.partition(":")
    return f"{algorithm}-{hexdigest}"


def referrers_index(descriptors: list[dict]) -> bytes:
    """The fallback tag's image index: the referrers' descriptors, sorted by digest."""
    unique = {d["digest"]: d for d in descriptors}
    return canonical(
        {
            "schemaVersion": 2,
            "mediaType": INDEX_MEDIA_TYPE,
            "manifests": [unique[k] for k in sorted(unique)],
        }
    )
