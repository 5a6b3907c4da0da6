"""What install checks and records about an extracted bundle before publishing it.

Under a trust policy (`TT_BUNDLES_TRUST`) the extracted copy's signature must verify
(TTB140/TTB141, naming the archive: nothing is installed). Then the provenance record is
written into the copy, so it is published with the bundle in the same step: where it
came from (`provenance` given by `pull`, else the record `pull` left beside the archive,
else the archive's path) and the signer, verified or as claimed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path

from ttbundles.errors import TTBundleError
from ttbundles.trust.policy import enforce_folder
from ttbundles.trust.provenance import Provenance, read_beside
from ttbundles.trust.signature import signer_of


def admit(folder: Path, archive: Path, name: str, root: str, provenance: Provenance | None) -> None:
    """Enforce the policy on the extracted copy at `folder`, then write its record."""
    try:
        verified = enforce_folder(folder, name)
    except TTBundleError as exc:  # name the archive, not the temporary folder
        raise TTBundleError([replace(d, file=str(archive)) for d in exc.diagnostics]) from None
    claimed = signer_of(folder)
    signer = verified or (claimed if claimed == "unsigned" else f"{claimed} (not verified)")
    record = provenance or read_beside(archive)
    if record is None or record.root_digest != root:
        record = Provenance(str(Path(archive).resolve()), None, root, signer, "")
    now = datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    record.with_(signer=signer, time=now).write_into(folder)
