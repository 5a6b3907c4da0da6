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


def sign_folder(
    folder: Path,
    key: Path,
    *,
    certificate: Path | None = None,
    chain: Sequence[Path] = (),
    password: str | None = None,
) -> Path:
    """Sign the bundle folder; the signature file's path."""
    from model_signing import hashing, signing

    from ttbundles.errors import missing_path

    # A path the user gave that is not there is TTB001, as everywhere; TTB142 is a file
    # that is there but cannot sign.
    absent = [p for p in (key, certificate, *chain) if p is not None and not Path(p).is_file()]
    if absent:
        raise TTBundleError([missing_path(p, what="file") for p in absent])

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
            hint="give a PEM elliptic-curve private key (openssl ecparam -name prime256v1 "
            "-genkey -noout -out key.pem), and its certificate for --certificate",
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
    os.replace(tmp, target)
    return target


def sign(
    path: Path,
    key: Path,
    *,
    certificate: Path | None = None,
    chain: Sequence[Path] = (),
    password: str | None = None,
) -> Path:
    """Sign a bundle folder (writes `model.sig`) or an archive (rewritten, signed)."""
    path = Path(path)
    if path.is_dir():
        return sign_folder(path, key, certificate=certificate, chain=chain, password=password)
    if not path.is_file():
        raise TTBundleError.single("TTB001", f"{path} does not exist", file=path)
    from ttbundles.archive.reader import extract_verified
    from ttbundles.archive.writer import write_archive

    with tempfile.TemporaryDirectory(prefix="ttbundle-sign-", dir=path.parent) as tmp:
        folder = extract_verified(path, Path(tmp))
        sign_folder(folder, key, certificate=certificate, chain=chain, password=password)
        out = Path(tmp) / "out"
        out.mkdir()
        written = write_archive(folder, out)
        os.replace(written, path)
        shutil.rmtree(out, ignore_errors=True)
    return path
