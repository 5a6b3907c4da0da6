"""Prove a bundle's signature: against public keys or certificate chains.

Two checks, both needed. model-signing verifies the DSSE signature and that every file
the signature lists has its digest (files it does not list are ignored there: an
installed copy also holds `MANIFEST.json`, the provenance record and `__pycache__`).
Then every file the bundle ships (`archive.files.list_files`, what `pack` would pack)
must be listed: an added module is as dangerous as a changed one.
"""

from __future__ import annotations

import hashlib
import tempfile
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path

from ttbundles.archive.files import list_files
from ttbundles.errors import TTBundleError
from ttbundles.trust.signature import SIGNATURE_FILE, Claim, read_claim


@dataclass(frozen=True)
class Trusted:
    """What may sign: public keys (PEM) and certificate chains (PEM files, root last)."""

    keys: tuple[Path, ...] = ()
    chains: tuple[tuple[Path, ...], ...] = ()
    # The policy also asks for fresh, passed evidence on the mesh being served
    # (`policy.evidence_refusal`), checked at registration where the mesh is known.
    require_evidence: bool = False

    def describe(self) -> str:
        parts = [str(k) for k in self.keys] + [" + ".join(map(str, c)) for c in self.chains]
        return ", ".join(parts) or "nothing"


def key_fingerprint(public_key: Path) -> str:
    """model-signing's key hint: sha256 of the key's PEM SubjectPublicKeyInfo."""
    from cryptography.hazmat.primitives import serialization

    try:
        key = serialization.load_pem_public_key(Path(public_key).read_bytes())
    except (OSError, ValueError) as exc:
        raise TTBundleError.single(
            "TTB143",
            f"{public_key} is not a PEM public key: {exc}",
            file=public_key,
            hint="export it with: openssl ec -in key.pem -pubout -out key.pub",
        ) from None
    pem = key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(pem).hexdigest()


def _invalid(name: str, folder: Path, why: str, hint: str | None = None) -> TTBundleError:
    return TTBundleError.single(
        "TTB141",
        f"bundle {name}: signature invalid: {why}",
        file=folder / SIGNATURE_FILE,
        hint=hint
        or "sign the bundle again (ttbundle sign) with a trusted key, or install "
        "the bundle as its signer published it",
    )


def verify_folder(folder: Path, trusted: Trusted, *, name: str | None = None) -> str:
    """Verify the bundle at `folder`; the signer, as "key FILE" or "certificate FILE".

    Raises TTB140 (no signature), TTB141 (invalid: which file, which key).
    """
    from model_signing import verifying

    folder = Path(folder)
    name = name or folder.name
    path = folder / SIGNATURE_FILE
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise TTBundleError.single(
            "TTB140",
            f"bundle {name} is not signed ({SIGNATURE_FILE} missing) and the trust "
            f"policy requires a signature from {trusted.describe()}",
            file=folder,
            hint="sign it with `ttbundle sign BUNDLE --key KEY` using a trusted key",
        ) from None
    claim = read_claim(data)
    if claim is None:
        raise _invalid(name, folder, f"{SIGNATURE_FILE} is not a model-signing signature")
    shipped = set(list_files(folder)) - {SIGNATURE_FILE}
    unsigned = sorted(shipped - claim.files)
    if unsigned:
        raise _invalid(name, folder, f"{', '.join(unsigned[:5])} not covered by the signature")
    if claim.kind == "key":
        candidates = [k for k in trusted.keys if key_fingerprint(k) == claim.fingerprint]
        if not candidates:
            raise _invalid(
                name,
                folder,
                f"signed by {claim.short}, which is not a trusted key ({trusted.describe()})",
                hint="trust the signer's public key, or install a bundle signed by a trusted key",
            )
        configs = [
            (f"key {k}", verifying.Config().use_elliptic_key_verifier(public_key=k))
            for k in candidates
        ]
    else:
        if not trusted.chains:
            raise _invalid(
                name, folder, f"signed by {claim.short}, and no certificate chain is trusted"
            )
        configs = [
            (
                f"certificate chain {' + '.join(map(str, c))}",
                verifying.Config().use_certificate_verifier(certificate_chain=list(c)),
            )
            for c in trusted.chains
        ]
    hashing_config = _hashing(folder, claim)
    failures = []
    for who, config in configs:
        config.set_ignore_unsigned_files(True)
        if hashing_config is not None:
            config.set_hashing_config(hashing_config())
        try:
            config.verify(folder, path)
            return who
        except Exception as exc:  # noqa: BLE001 - model-signing raises many kinds
            failures.append(f"{who}: {_reason(exc, folder, claim)}")
    raise _invalid(name, folder, "; ".join(failures))


SMALL_BUNDLE = 64 << 20


def _hashing(folder: Path, claim: Claim):
    """How to hash for verification, as the signature says, with one worker for a small
    bundle: model-signing's default thread pool costs more to start than hashing a few
    small files (most of the time of verifying a typical bundle, measured). None: let
    model-signing read it from the signature (a method we do not recognise)."""
    from model_signing import hashing

    how = dict(claim.serialization)
    if how.get("method") != "files" or how.get("hash_type") != "sha256":
        return None
    total = 0
    for rel in claim.digests:
        with suppress(OSError):
            total += (folder / rel).stat().st_size
    workers = 1 if total < SMALL_BUNDLE else None

    def build():
        return hashing.Config().use_file_serialization(
            hashing_algorithm="sha256",
            allow_symlinks=how.get("allow_symlinks") == "True",
            max_workers=workers,
        )

    return build


def _reason(exc: BaseException, folder: Path, claim: Claim) -> str:
    """Why verification failed, in words: the files that differ, else model-signing's."""
    from ttbundles.archive.manifest import hash_file

    changed, missing = [], []
    for rel, digest in sorted(claim.digests.items()):
        try:
            if hash_file(folder / rel)[1] != digest:
                changed.append(rel)
        except OSError:
            missing.append(rel)
    if changed or missing:
        parts = []
        if changed:
            parts.append(f"{', '.join(changed[:5])} changed since signing")
        if missing:
            parts.append(f"{', '.join(missing[:5])} missing")
        return "; ".join(parts)
    text = " ".join(str(exc).split())
    return f"the signature does not verify ({(text or type(exc).__name__)[:200]})"


def verify_archive(archive: Path, trusted: Trusted, *, name: str | None = None) -> str:
    """Verify an archive's signature (extracted, verified, into a temporary folder)."""
    from ttbundles.archive.reader import extract_verified
    from ttbundles.errors import shown_as

    with (
        tempfile.TemporaryDirectory(prefix="ttbundle-verify-") as tmp,
        shown_as(tmp, f"{archive}!"),
    ):
        folder = extract_verified(Path(archive), Path(tmp))
        with shown_as(folder, f"{archive}!"):
            return verify_folder(folder, trusted, name=name or folder.name)


def trusted_from(paths: Sequence[Path], chains: Sequence[Sequence[Path]] = ()) -> Trusted:
    return Trusted(tuple(Path(p) for p in paths), tuple(tuple(Path(p) for p in c) for c in chains))
