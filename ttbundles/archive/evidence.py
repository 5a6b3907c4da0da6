"""What a bundle was proven on, kept inside it: `evidence/<MESH>.json`.

`ttbundle test --keep-evidence` writes one file per mesh: the mesh and its target, the
versions it ran with, the paths and thresholds, pass or fail with the figures, the date,
and the digest of the bundle content it proved. The file is an ordinary file of the
bundle, so the archive's manifest digest (and a signature over it) covers it once packed.

The content digest is the manifest's root digest (`root_digest`) over the bundle's files
less `evidence/` itself and the signature: recording evidence does not change what it
proves, nor does signing the bundle afterwards (the signature covers the evidence, not the
other way round), and editing anything else (the adapter, the metadata) does, which makes
the evidence stale.

`ttbundle bench --keep-evidence` keeps its figures beside, in `evidence/performance/
<MESH>.json` (same digest, same staleness): a bench run does not replace what a test
proved, nor the other way round.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ttbundles.archive.files import SIGNATURE_FILE, list_files
from ttbundles.archive.manifest import FileEntry, hash_file, root_digest
from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.fsutil import write_text_atomic

EVIDENCE_DIR = "evidence"
EVIDENCE_FORMAT = "ttbundles.evidence/1"
PERFORMANCE_DIR = f"{EVIDENCE_DIR}/performance"
PERFORMANCE_FORMAT = "ttbundles.performance/1"


def content_digest(bundle_dir: Path) -> str:
    """The root digest of the bundle's files other than its evidence and signature."""
    entries = []
    for rel in list_files(bundle_dir):
        if rel.startswith(EVIDENCE_DIR + "/") or rel == SIGNATURE_FILE:
            continue
        size, sha256 = hash_file(bundle_dir / rel)
        entries.append(FileEntry(path=rel, size=size, sha256=sha256))
    return root_digest(entries)


def evidence_file(bundle_dir: Path, mesh: str) -> Path:
    return bundle_dir / EVIDENCE_DIR / f"{mesh}.json"


def performance_file(bundle_dir: Path, mesh: str) -> Path:
    return bundle_dir / PERFORMANCE_DIR / f"{mesh}.json"


def write_evidence(bundle_dir: Path, record: dict[str, Any], *, performance: bool = False) -> Path:
    """Write `record` (what a run proved, with its `mesh`) as the mesh's evidence, with
    the digest of the content it proved; replaces that mesh's earlier evidence (of the
    same kind: a test's, or with `performance` a bench run's figures)."""
    if performance:
        path, kind = performance_file(bundle_dir, record["mesh"]), PERFORMANCE_FORMAT
    else:
        path, kind = evidence_file(bundle_dir, record["mesh"]), EVIDENCE_FORMAT
    document = {
        "format": kind,
        **record,
        "bundle_digest": content_digest(bundle_dir),
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, json.dumps(document, indent=2, sort_keys=False) + "\n")
    return path


@dataclass
class Evidence:
    """One mesh's evidence as read back: `stale` when the bundle content changed since."""

    mesh: str
    file: Path
    record: dict[str, Any]
    stale: bool

    @property
    def passed(self) -> bool:
        return bool(self.record.get("passed"))


def read_evidence(
    bundle_dir: Path, *, performance: bool = False
) -> tuple[list[Evidence], list[Diagnostic]]:
    """Every mesh's evidence in the bundle (with `performance`: its bench figures), and
    what is wrong with it: TTB114 (a warning) for evidence recorded on other content,
    TTB115 for a file that does not read."""
    folder = bundle_dir / (PERFORMANCE_DIR if performance else EVIDENCE_DIR)
    kind = PERFORMANCE_FORMAT if performance else EVIDENCE_FORMAT
    again = "bench" if performance else "test"
    if not folder.is_dir():
        return [], []
    found: list[Evidence] = []
    problems: list[Diagnostic] = []
    digest: str | None = None
    for path in sorted(folder.glob("*.json")):
        try:
            record = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(record, dict) or record.get("format") != kind:
                raise ValueError(f"not {kind}")
            mesh, recorded = str(record["mesh"]), str(record["bundle_digest"])
        except (OSError, ValueError, KeyError) as exc:
            problems.append(
                Diagnostic(
                    "TTB115",
                    Severity.ERROR,
                    f"evidence file {path.name} does not read: {exc}",
                    file=str(path),
                    hint=f"record it again (ttbundle {again} --keep-evidence) or remove it",
                )
            )
            continue
        if digest is None:
            try:
                digest = content_digest(bundle_dir)
            except TTBundleError as exc:  # a file that cannot be hashed: said once
                return found, problems + exc.diagnostics
        stale = recorded != digest
        found.append(Evidence(mesh, path, record, stale))
        if stale:
            problems.append(
                Diagnostic(
                    "TTB114",
                    Severity.WARNING,
                    f"{'performance ' if performance else ''}evidence for mesh {mesh} is "
                    f"stale: recorded on bundle content {recorded[:19]}..., the bundle is now "
                    f"{digest[:19]}... (a file changed since it was proven)",
                    file=str(path),
                    hint=f"prove it again: ttbundle {again} BUNDLE --model CKPT --mesh {mesh} "
                    "--keep-evidence",
                )
            )
    return found, problems


def mesh_status(evidence: Evidence | None) -> str:
    """One word for a mesh: tested (fresh, passed evidence), stale, failed, untested."""
    if evidence is None:
        return "untested"
    if evidence.stale:
        return "stale"
    return "tested" if evidence.passed else "failed"


def evidence_status(bundle_dir: Path) -> dict[str, str]:
    """{mesh: status} for every mesh with evidence ({}: none), for `inspect` and `list`."""
    found, _ = read_evidence(bundle_dir)
    return {e.mesh: mesh_status(e) for e in found}
