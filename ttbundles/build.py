"""Validate, then pack: the one way a bundle becomes an archive.

A step above both stages on purpose: validation reads archives (through the reader) and
packing writes them, so neither may call the other without a cycle. Every archive made
here passed validation once.
"""

from __future__ import annotations

from pathlib import Path

from ttbundles.archive.writer import ProgressCallback, write_archive
from ttbundles.check.validate import release_errors, validate_bundle
from ttbundles.errors import InvalidBundleError


def pack(bundle_dir: Path, out_dir: Path, *, progress: ProgressCallback | None = None) -> Path:
    """Pack a valid bundle folder into `out_dir/<name>-<version>.ttbundle`; its path.

    An invalid bundle is refused before anything is written, and so is the scaffold's
    template (`release_errors`): an archive of it could only fail where it is served.
    """
    refused = release_errors(validate_bundle(Path(bundle_dir)).diagnostics)
    if refused:
        raise InvalidBundleError(refused)
    return write_archive(Path(bundle_dir), Path(out_dir), progress=progress)
