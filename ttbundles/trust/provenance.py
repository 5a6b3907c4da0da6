"""Where an installed bundle came from: the record install and pull write.

`.ttbundle-provenance.json` inside the installed folder (it moves with the bundle on a
replace, and `pack`/`verify` never see it: `archive.files.always_skipped`), holding the
source (a registry reference or an archive path), the manifest digest when pulled, the
root digest, the signer as verified or claimed, and the time of install. `pull` without
`--install` writes the same record beside the archive (`<archive>.provenance.json`), and
installing that archive carries it over. The record is information for people
(`ttbundle inspect`), not a security boundary: the policy checks signatures, not this.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ttbundles.archive.files import PROVENANCE_FILE
from ttbundles.fsutil import atomic_file

SIDECAR_SUFFIX = ".provenance.json"


@dataclass(frozen=True)
class Provenance:
    source: str
    digest: str | None
    root_digest: str
    signer: str | None
    time: str

    def to_dict(self) -> dict:
        return asdict(self)

    def with_(self, **changes: object) -> Provenance:
        return replace(self, **changes)  # type: ignore[arg-type]

    def _write(self, path: Path) -> None:
        with atomic_file(path) as out:
            out.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    def write_into(self, folder: Path) -> None:
        self._write(Path(folder) / PROVENANCE_FILE)

    def write_beside(self, archive: Path) -> None:
        self._write(Path(str(archive) + SIDECAR_SUFFIX))


def _read(path: Path) -> Provenance | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return Provenance(**{k: data.get(k) for k in Provenance.__dataclass_fields__})
    except (OSError, ValueError, TypeError):
        return None


def read_installed(folder: Path) -> Provenance | None:
    """The record of an installed bundle, or None (installed before records, or copied)."""
    return _read(Path(folder) / PROVENANCE_FILE)


def read_beside(archive: Path) -> Provenance | None:
    """The record `pull` left beside an archive, or None."""
    return _read(Path(str(archive) + SIDECAR_SUFFIX))
