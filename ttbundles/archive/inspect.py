"""What a bundle or an archive holds: metadata, identity and files, as plain data.

An archive is looked into through the reader's verified extraction into a temporary
folder (never through install), so `ttbundle inspect` trusts an archive no more than
`install` does.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from ttbundles.archive.evidence import evidence_status
from ttbundles.archive.manifest import build_manifest
from ttbundles.archive.reader import extract_verified
from ttbundles.errors import TTBundleError
from ttbundles.format.parse import load_metadata


def describe(path: Path) -> dict[str, Any]:
    """`{tt_arch, legacy, metadata, root_digest, files, path}` of a folder or archive."""
    path = Path(path)
    if path.is_file():
        with tempfile.TemporaryDirectory(prefix="ttbundle-inspect-") as tmp:
            data = describe_folder(extract_verified(path, Path(tmp)))
    else:
        data = describe_folder(path)
    data["path"] = str(path)
    return data


def describe_folder(folder: Path) -> dict[str, Any]:
    loaded = load_metadata(folder)
    if loaded.metadata is None:
        raise TTBundleError(loaded.diagnostics)
    manifest = build_manifest(folder)
    return {
        "tt_arch": loaded.metadata.tt_arch,
        "legacy": loaded.metadata.legacy,
        "metadata": loaded.metadata.model_dump(by_alias=True, exclude_none=True),
        "root_digest": manifest.root_digest,
        "files": [f.model_dump() for f in manifest.files],
        # {mesh: tested | stale | failed}: an archive's, read in its verified extracted
        # copy, is what installing it would serve with.
        "evidence": evidence_status(folder),
    }
