"""`ttbundle sign DIR|ARCHIVE --key KEY [--certificate CERT --chain CA...]`.

Signs with the OpenSSF `model-signing` package, offline: an elliptic-curve private key,
or that key with its signing certificate and chain. What is signed is exactly what
`pack` ships (`archive.files.list_files`), minus the signature itself: other files in
the folder (`__pycache__`, ignored ones) are listed as ignored paths, so verifying an
installed copy needs no guesswork. The signature goes to `model.sig` at the bundle's
root, so it travels inside the archive. Signing an archive extracts it (verified),
signs, and writes the archive again in place (deterministic, atomic).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from ttbundles.archive.files import list_files
from ttbundles.errors import TTBundleError
from ttbundles.trust.signature import SIGNATURE_FILE


def _unsigned_paths(folder: Path, signed: set[str]) -> list[str]:
    """Every file under `folder` that is not signed (relative POSIX paths)."""
    others = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        rel_root = Path(root).relative_to(folder).as_posix()
        for name in sorted(files):
            rel = name if rel_root == "." else f"{rel_root}/{name}"
            if rel not in signed:
                others.append(rel)
    return others


# What model-signing's key signer accepts (`model_signing._signing.sign_ec_key`): an
# elliptic-curve private key in PEM on one of these curves; anything else makes it fail
# deep inside (an RSA key has no `.curve`), so the key is checked here first.
SIGNING_CURVES = ("secp256r1", "secp384r1", "secp521r1")
KEY_RECIPE = (
    "make one with: openssl ecparam -name prime256v1 -genkey -noout -out key.pem "
    "(its public key for verify: openssl ec -in key.pem -pubout -out key.pub)"
)


def _key_kind(key: object) -> str:
    """A human name of a private key's type ("an RSA-2048 private key")."""
    from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, rsa, x25519

    if isinstance(key, rsa.RSAPrivateKey):
        return f"an RSA-{key.key_size} private key"
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return "an Ed25519 private key"
    if isinstance(key, ed448.Ed448PrivateKey):
        return "an Ed448 private key"
    if isinstance(key, dsa.DSAPrivateKey):
        return f"a DSA-{key.key_size} private key"
    if isinstance(key, x25519.X25519PrivateKey):
        return "an X25519 private key"
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return f"an elliptic-curve private key on {key.curve.name}"
    return f"a {type(key).__name__} key"


def check_signing_key(key: Path, password: str | None = None) -> None:
    """Refuse, in one TTB142 line with the recipe that works, a key model-signing cannot use.

    Users type `openssl genrsa` first; model-signing then fails with an AttributeError
    that reads as our bug. Naming the key's type and the command that makes a usable
    key turns that into a fix the user can apply.
    """
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    data = Path(key).read_bytes()

    def refuse(what: str) -> TTBundleError:
        return TTBundleError.single(
            "TTB142",
            f"cannot sign with {key}: it is {what}; model-signing signs with an "
            f"elliptic-curve private key (PEM) on P-256, P-384 or P-521",
            file=key,
            hint=KEY_RECIPE,
        )

    try:
        private = serialization.load_pem_private_key(data, password.encode() if password else None)
    except TypeError:
        raise refuse("an encrypted private key and no password was given") from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        if b"-----BEGIN" not in data:
            raise refuse("not a PEM file") from None
        if b"PUBLIC KEY-----" in data:
            raise refuse("a public key, not a private key") from None
        if b"CERTIFICATE-----" in data:
            raise refuse("a certificate, not a private key") from None
        raise refuse(f"a PEM file whose private key cannot be read ({exc})") from None
    if not isinstance(private, ec.EllipticCurvePrivateKey):
        raise refuse(_key_kind(private))
    if private.curve.name not in SIGNING_CURVES:
        raise refuse(_key_kind(private))


def sign_folder(
    folder: Path,
    key: Path,
    *,
    certificate: Path | None = None,
    chain: Sequence[Path] = (),
    password: str | None = None,
    force: bool = False,
) -> Path:
    """Sign the bundle folder; the signature file's path.

    A signature by another key or certificate is replaced only with `force` (TTB146
    otherwise): signing over it silently would swap whom the bundle's users trust."""
    from model_signing import hashing, signing

    from ttbundles.errors import missing_path

    # A path the user gave that is not there is TTB001, as everywhere; TTB142 is a file
    # that is there but cannot sign.
    absent = [p for p in (key, certificate, *chain) if p is not None and not Path(p).is_file()]
    if absent:
        raise TTBundleError([missing_path(p, what="file") for p in absent])
    check_signing_key(key, password)

    folder = Path(folder)
    signed = set(list_files(folder)) - {SIGNATURE_FILE}
    ignored = sorted({*_unsigned_paths(folder, signed), SIGNATURE_FILE})
    config = signing.Config()
    try:
        if certificate is not None:
            config.use_certificate_signer(
                private_key=key, signing_certificate=certificate, certificate_chain=list(chain)
            )
        else:
            config.use_elliptic_key_signer(private_key=key, password=password)
    except (OSError, ValueError, TypeError) as exc:
        raise TTBundleError.single(
            "TTB142",
            f"cannot sign with {key}{f' and {certificate}' if certificate else ''}: {exc}",
            file=key,
            hint=f"give a PEM elliptic-curve private key ({KEY_RECIPE}), "
            "and its certificate for --certificate",
        ) from None
    config.set_hashing_config(
        hashing.Config().set_ignored_paths(paths=ignored, ignore_git_paths=False)
    )
    target = folder / SIGNATURE_FILE
    tmp = folder / f".{SIGNATURE_FILE}.{os.urandom(6).hex()}.tmp"
    try:
        config.sign(folder, tmp)
    except (OSError, ValueError) as exc:
        tmp.unlink(missing_ok=True)
        raise TTBundleError.single(
            "TTB142", f"signing {folder} failed: {exc}", file=folder
        ) from None
    if not force:
        try:
            _refuse_another_signer(target, tmp)
        except TTBundleError:
            tmp.unlink(missing_ok=True)
            raise
    os.replace(tmp, target)
    return target


def _refuse_another_signer(old: Path, new: Path) -> None:
    """TTB146 when `old` (the signature in place, if any) names another signer than
    `new`. An unreadable old signature is replaced: it trusts nobody."""
    from ttbundles.trust.signature import read_claim

    if not old.is_file():
        return
    before = read_claim(old.read_bytes())
    after = read_claim(new.read_bytes())
    if before is None or after is None:
        return
    if (before.kind, before.fingerprint) != (after.kind, after.fingerprint):
        raise TTBundleError.single(
            "TTB146",
            f"{old.parent} is signed by {before.short}, not by this {after.kind} "
            f"({after.short}); not replaced",
            file=old,
            hint="sign with the key that signed it, or add --force to replace its signature",
        )


def sign(
    path: Path,
    key: Path,
    *,
    certificate: Path | None = None,
    chain: Sequence[Path] = (),
    password: str | None = None,
    force: bool = False,
) -> Path:
    """Sign a bundle folder (writes `model.sig`) or an archive (rewritten, signed); one
    signed by another signer only with `force` (TTB146)."""
    path = Path(path)
    if path.is_dir():
        return sign_folder(
            path, key, certificate=certificate, chain=chain, password=password, force=force
        )
    if not path.is_file():
        raise TTBundleError.single("TTB001", f"{path} does not exist", file=path)
    from ttbundles.archive.reader import extract_verified
    from ttbundles.archive.writer import write_archive

    with tempfile.TemporaryDirectory(prefix="ttbundle-sign-", dir=path.parent) as tmp:
        folder = extract_verified(path, Path(tmp))
        sign_folder(
            folder, key, certificate=certificate, chain=chain, password=password, force=force
        )
        out = Path(tmp) / "out"
        out.mkdir()
        written = write_archive(folder, out)
        os.replace(written, path)
        shutil.rmtree(out, ignore_errors=True)
    return path
