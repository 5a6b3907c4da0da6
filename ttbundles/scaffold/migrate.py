"""Legacy metadata rewritten as versioned metadata: `ttbundle migrate`, with the diff.

The migrated file has the lowest schema version that expresses it (`needs_version`): 1,
or 3 when the class's `model_capabilities` declares speculative decoding, which the
registry serves a legacy bundle with as the reference plugin does; 5 when the class only
pools (`forward(input_ids, attention_mask)`, no `prefill_forward`: the reference plugin's
pooling runner serves it as an embedding model)."""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.format.contract import POOLING_FORWARD, PREFILL
from ttbundles.format.metadata import (
    LATEST_SCHEMA_VERSION,
    SCHEMA_VERSION,
    BundleMetadata,
    needs_version,
)
from ttbundles.fsutil import write_text_atomic


@dataclass
class Migration:
    """What `migrate_bundle` did (or, with `dry_run`, would do) to one bundle.

    `before`/`after` are the metadata texts, `kept` the legacy keys carried over as `x-`
    extensions ({old: new}), `capabilities` what the class's `model_capabilities` declared,
    `class_note` why the class could not be read (its capabilities are then left off).
    """

    file: Path
    changed: bool
    written: bool
    before: str
    after: str
    kept: dict[str, str] = field(default_factory=dict)
    capabilities: dict = field(default_factory=dict)
    class_note: str | None = None
    version: int = SCHEMA_VERSION
    """The schema version of the file after migration (the one it had when unchanged)."""

    def diff(self) -> str:
        """A unified diff of the metadata, `before` to `after` (empty: no change)."""
        name = str(self.file)
        lines = difflib.unified_diff(
            _lines(self.before), _lines(self.after), fromfile=f"a/{name}", tofile=f"b/{name}"
        )
        return "".join(lines)


def _lines(text: str) -> list[str]:
    """Lines for a diff, a last one without a newline marked as `diff` and `patch` do."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def migrate_bundle(folder: Path, *, dry_run: bool = False) -> Migration:
    """Rewrite legacy metadata as v1 in place (unless `dry_run`); unchanged when it
    already is v1.

    Nothing of the old file is lost: the capabilities come from the class's
    `model_capabilities` (read statically, as the registry does for a legacy bundle, so
    the migrated bundle declares what it was served with), and a key legacy metadata does
    not know is kept as an `x-` extension, or refused when that name is taken.
    """
    from ttbundles.format.parse import LEGACY_KEYS, load_metadata

    loaded = load_metadata(folder)
    if loaded.metadata is None:
        raise TTBundleError(loaded.diagnostics)
    file = loaded.file
    before = file.read_text(encoding="utf-8")
    meta = loaded.metadata
    if not meta.legacy:
        return Migration(
            file,
            changed=False,
            written=False,
            before=before,
            after=before,
            version=meta.schema_version,
        )
    raw = json.loads(before)
    kept: dict[str, str] = {}
    clashes = []
    for key in raw:
        if key in LEGACY_KEYS or key.startswith("x-"):
            continue
        if f"x-{key}" in raw:
            clashes.append(key)
        kept[key] = f"x-{key}"
    if clashes:
        raise TTBundleError(
            Diagnostic(
                "TTB030",
                Severity.ERROR,
                f"legacy key {key!r} cannot be kept as 'x-{key}': the file has that key too",
                file=str(file),
                pointer=f"/{key}",
                hint=f"rename or remove one of {key!r} and 'x-{key}', then migrate again",
            )
            for key in clashes
        )
    # The registry takes a legacy bundle's capabilities from its class; v1 declares them.
    from ttbundles.check.static_reader import read_bundle_class

    found = read_bundle_class(folder, meta)
    capabilities = found.capabilities.model_dump(exclude_defaults=True) if found else {}
    if found is not None and found.complete and _pools_only(found.methods):
        # The reference plugin serves such a class with its pooling runner, task embed
        # only (a reranker as a one-wide "embedding"): said the same way in schema 5.
        capabilities["pooling"] = {"tasks": ["embed"], "form": "forward"}
    note = None
    if found is None:
        where = "the bundle" if meta.main_class_source == "bundle" else "this environment"
        note = (
            f"{meta.main_class} cannot be read in {where}: capabilities left off "
            "(declare them by hand, as the class's model_capabilities says)"
        )
    document = {
        "schema_version": SCHEMA_VERSION,
        "name": meta.name,
        "version": "0.1.0",
        "arch": meta.arch,
        "main_class": meta.main_class,
        "main_class_source": meta.main_class_source,
        **({"capabilities": capabilities} if capabilities else {}),
        **meta.extensions,
        **{new: raw[old] for old, new in kept.items()},
    }
    # Validated at the newest version, so any key the document carries (kv_cache_spec,
    # schema 5) is read; then written at the lowest version that expresses it.
    version = needs_version(
        BundleMetadata.model_validate({**document, "schema_version": LATEST_SCHEMA_VERSION})
    )
    document["schema_version"] = version
    after = json.dumps(document, indent=2) + "\n"
    if not dry_run:
        write_text_atomic(file, after)  # keeps the file's mode
    return Migration(
        file,
        changed=True,
        written=not dry_run,
        before=before,
        after=after,
        kept=kept,
        capabilities=capabilities,
        class_note=note,
        version=version,
    )


def _pools_only(methods: frozenset[str]) -> bool:
    """A class of the reference plugin's pooling form: `forward`, and no prefill."""
    return POOLING_FORWARD.name in methods and PREFILL.name not in methods
