"""A bundle's signature file, read without any crypto: who claims to have signed it.

The signature is an OpenSSF model-signing Sigstore bundle (v0.3: a DSSE envelope over an
in-toto statement listing every file's sha256), kept as `model.sig` at the bundle's root
(model-signing's own default name), so it travels inside the archive. Reading it here
only parses JSON: the startup table and `ttbundle list` show the claimed signer for every
bundle without importing the signing stack. Only `verification` proves the claim.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

# Named where the bundle's files are (the evidence's digest leaves it out); used from here.
from ttbundles.archive.files import SIGNATURE_FILE as SIGNATURE_FILE

MAX_SIGNATURE_SIZE = 4 << 20


@dataclass(frozen=True)
class Claim:
    """What a signature says, unverified: the key's hint or the leaf certificate's
    fingerprint, and the files it lists."""

    kind: str  # "key" or "certificate"
    fingerprint: str  # hex sha256 (key: of its PEM SPKI; certificate: of its DER)
    digests: dict[str, str]  # signed file -> hex sha256
    serialization: tuple[tuple[str, str], ...] = ()  # how files were hashed (method, ...)

    @property
    def files(self) -> frozenset[str]:
        return frozenset(self.digests)

    @property
    def short(self) -> str:
        return f"{self.kind} sha256:{self.fingerprint[:16]}"


def read_claim(data: bytes) -> Claim | None:
    """The claim of a signature file's bytes; None when it is not one we can read."""
    try:
        document = json.loads(data)
        material = document["verificationMaterial"]
        payload = json.loads(base64.b64decode(document["dsseEnvelope"]["payload"]))
        files = {str(r["name"]): str(r["digest"]) for r in payload["predicate"]["resources"]}
        how = payload["predicate"].get("serialization") or {}
        serialization = tuple(
            (str(k), str(v)) for k, v in sorted(how.items()) if isinstance(v, (str, bool))
        )
        if "publicKey" in material:
            return Claim("key", str(material["publicKey"].get("hint", "")), files, serialization)
        chain = material.get("x509CertificateChain") or {}
        certificates = chain.get("certificates") or []
        if not certificates and "certificate" in material:
            certificates = [material["certificate"]]
        if certificates:
            der = base64.b64decode(certificates[0]["rawBytes"])
            return Claim("certificate", hashlib.sha256(der).hexdigest(), files, serialization)
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error):
        return None
    return None


def signer_of_archive(archive: Path) -> str:
    """`signer_of` for an archive: its `model.sig` entry, read from the archive."""
    from ttbundles.archive.reader import open_archive

    data = None
    with open_archive(Path(archive)) as tar:
        for member in tar:
            if member.name == SIGNATURE_FILE and member.isfile():
                if member.size > MAX_SIGNATURE_SIZE:
                    return "unreadable signature"
                handle = tar.extractfile(member)
                data = handle.read() if handle is not None else None
    if data is None:
        return "unsigned"
    claim = read_claim(data)
    return claim.short if claim is not None else "unreadable signature"


def signer_of(folder: Path) -> str:
    """ "unsigned", "unreadable signature", or the claimed signer (unverified)."""
    path = Path(folder) / SIGNATURE_FILE
    try:
        if path.stat().st_size > MAX_SIGNATURE_SIZE:
            return "unreadable signature"
        data = path.read_bytes()
    except FileNotFoundError:
        return "unsigned"
    except OSError:
        return "unreadable signature"
    claim = read_claim(data)
    return claim.short if claim is not None else "unreadable signature"
