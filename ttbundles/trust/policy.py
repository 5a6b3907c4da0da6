"""The trust policy: what may be installed, pulled and served (`TT_BUNDLES_TRUST`).

Unset (the default): every bundle may be served; its claimed signer is shown. Set to:
- a folder: every `*.pub`/`*.pem` in it is a trusted public key, and every `*.crt` in it
  is one certificate chain (sorted by name) a signing certificate may chain to;
- a `.json` file: `{"keys": [PATHS], "certificate_chains": [[PATHS], ...]}`, paths
  relative to the file, and optionally `"require_evidence": true`: a bundle is served only
  on a mesh it was proven on (fresh, passed evidence of `ttbundle test --keep-evidence`
  for the mesh being served; TTB145 otherwise), checked at registration, where the mesh
  is known;
- another file: one trusted public key.
Then install, pull and registration refuse a bundle that is unsigned (TTB140) or whose
signature does not verify against the policy (TTB141), with one line naming the bundle,
the key and what failed. Built-in bundles ship inside the ttbundles package, which the
operator installed: the policy covers the bundles added to it (EXTRA_MODELS_DIR).

This module imports no crypto: registration asks `active()` first, and only a set policy
imports `verification` (and with it model-signing).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from ttbundles import envs
from ttbundles.errors import Diagnostic, Severity, TTBundleError

if TYPE_CHECKING:
    from ttbundles.trust.verification import Trusted

VARIABLE = "TT_BUNDLES_TRUST"
KEY_SUFFIXES = (".pub", ".pem")
CERT_SUFFIX = ".crt"


def setting(environ: Mapping[str, str] | None = None) -> str | None:
    return envs.read(VARIABLE, environ)


def active(environ: Mapping[str, str] | None = None) -> bool:
    return setting(environ) is not None


def _invalid(path: str, why: str) -> TTBundleError:
    return TTBundleError.single(
        "TTB143",
        f"{VARIABLE}={path}: {why}",
        file=path,
        hint="point it to a folder of public keys (*.pub, *.pem, *.crt), one public key, "
        'or a policy file {"keys": [...], "certificate_chains": [[...]]}',
    )


def load(environ: Mapping[str, str] | None = None) -> Trusted | None:
    """The trusted keys and chains, or None when no policy is set; TTB143 if unusable."""
    from ttbundles.trust.verification import Trusted

    value = setting(environ)
    if value is None:
        return None
    path = Path(value).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.is_file())
        keys = tuple(p for p in files if p.suffix in KEY_SUFFIXES)
        certs = tuple(p for p in files if p.suffix == CERT_SUFFIX)
        trusted = Trusted(keys, (certs,) if certs else ())
    elif path.suffix == ".json":
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
            keys = tuple(path.parent / k for k in document.get("keys", []))
            chains = tuple(
                tuple(path.parent / c for c in chain)
                for chain in document.get("certificate_chains", [])
            )
            evidence = document.get("require_evidence", False)
        except (OSError, ValueError, AttributeError, TypeError) as exc:
            raise _invalid(value, f"cannot read the policy file: {exc}") from None
        if not isinstance(evidence, bool):
            raise _invalid(value, f"require_evidence must be true or false, not {evidence!r}")
        trusted = Trusted(keys, chains, require_evidence=evidence)
    elif path.is_file():
        trusted = Trusted((path,), ())
    else:
        raise _invalid(value, "no such file or folder")
    missing = [
        p for p in (*trusted.keys, *(c for ch in trusted.chains for c in ch)) if not p.is_file()
    ]
    if missing:
        raise _invalid(value, f"{missing[0]} does not exist")
    if not trusted.keys and not trusted.chains:
        raise _invalid(value, "it trusts no key and no certificate: nothing could be served")
    return trusted


def enforce_folder(folder: Path, name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Under a policy, the verified signer of the bundle at `folder` (else raises);
    without one, None."""
    trusted = load(environ)
    if trusted is None:
        return None
    from ttbundles.trust.verification import verify_folder

    return verify_folder(folder, trusted, name=name)


def enforce_archive(
    archive: Path, name: str, environ: Mapping[str, str] | None = None
) -> str | None:
    trusted = load(environ)
    if trusted is None:
        return None
    from ttbundles.trust.verification import verify_archive

    return verify_archive(archive, trusted, name=name)


def evidence_refusal(folder: Path, name: str, mesh: str) -> Diagnostic | None:
    """TTB145 when the bundle at `folder` has no fresh, passed evidence for `mesh` (a
    policy with `require_evidence`); None when it has."""
    from ttbundles.archive.evidence import read_evidence

    found, _ = read_evidence(folder)
    evidence = next((e for e in found if e.mesh == mesh), None)
    if evidence is not None and not evidence.stale and evidence.passed:
        return None
    if evidence is None:
        why = f"has no evidence for mesh {mesh}"
    elif evidence.stale:
        why = f"has stale evidence for mesh {mesh} (a file changed since it was proven)"
    else:
        why = f"failed its test on mesh {mesh} (evidence/{mesh}.json)"
    return Diagnostic(
        "TTB145",
        Severity.ERROR,
        f"bundle {name} {why}, and the trust policy ({VARIABLE}) requires evidence on the "
        "mesh being served",
        file=str(folder),
        hint=f"prove it on that mesh and sign it again: ttbundle test BUNDLE --model CKPT "
        f"--mesh {mesh} --keep-evidence, then ttbundle sign; or drop require_evidence from "
        "the policy file",
    )


def describe(environ: Mapping[str, str] | None = None) -> str:
    """One line for `doctor`."""
    value = setting(environ)
    if value is None:
        return f"permissive ({VARIABLE} unset): any bundle may be served; signers are shown"
    trusted = load(environ)
    assert trusted is not None
    line = f"{VARIABLE}={value}: only bundles signed by {trusted.describe()} are installed "
    line += "and served"
    if trusted.require_evidence:
        line += ", and served only on a mesh their evidence proves"
    return line
