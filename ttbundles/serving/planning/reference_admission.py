"""A bundle built on a torch reference generator serves only the architectures that
generator reads: anything else is refused at configuration (TTB041, the code `validate`
gives the same bundle), so `vllm serve` and `ttbundle plan` say it before a process
imports the class, rather than the generator refusing at load tens of seconds later. For
a family the reference does not cover yet (Gemma 4), the message says what is missing.

The class is read from source (`Entry.class_source`), never imported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ttbundles.check.reference_archs import covers, missing_reason, reference_of
from ttbundles.errors import ConfigurationError

if TYPE_CHECKING:
    from ttbundles.registry.registry import Entry


def refuse_unread_architecture(entry: Entry) -> None:
    """TTB041 when the bundle's class builds on a reference generator that does not read
    the bundle's architecture (the one the checkpoint named to select it)."""
    meta = entry.metadata
    static = entry.class_source()
    if meta is None or static is None:
        return
    found = reference_of(static.lineage)
    if found is None or covers(found[1], meta.arch):
        return
    base, archs = found
    missing = missing_reason(meta.arch)
    raise ConfigurationError.single(
        "TTB041",
        f"{meta.name}@{meta.version} serves {meta.arch} with {meta.main_class}, which builds "
        f"on the torch reference generator {base.replace(':', '.')}; it reads "
        f"{', '.join(archs)} only" + (f": {missing}" if missing else ""),
        hint=f"serve {meta.arch} with a generator written for it (ttbundle init --arch "
        f"{meta.arch} for the TT-NN template), or a checkpoint of one of those architectures",
    )
