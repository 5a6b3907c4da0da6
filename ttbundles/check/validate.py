"""Validate bundles: a folder, an archive, or a folder of bundles (an EXTRA_MODELS_DIR).

Pure checks over parsed metadata and source text; bundle code never runs here unless
`--import` asks for it, and then only in a subprocess. Every problem is collected, so a
user fixes a bundle in one round.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from ttbundles.archive.evidence import read_evidence
from ttbundles.check.adapter import check_adapter
from ttbundles.check.serving_defaults import check_serving
from ttbundles.check.tests_section import check_tests
from ttbundles.errors import Diagnostic, Report, Severity
from ttbundles.format.contract import unservable_reason
from ttbundles.format.layer_kinds import kind_name, recurrent_kind_of_architecture
from ttbundles.format.metadata import METADATA_FILE, BundleMetadata
from ttbundles.format.parse import load_metadata
from ttbundles.format.selection import overlaps


@dataclass
class CheckedBundle:
    path: Path
    metadata: BundleMetadata | None
    diagnostics: list[Diagnostic] = field(default_factory=list)

    def report(self) -> Report:
        return Report(list(self.diagnostics))


@dataclass
class ValidationResult:
    """Every bundle checked, with its diagnostics, plus those about the set as a whole."""

    bundles: list[CheckedBundle] = field(default_factory=list)
    report: Report = field(default_factory=Report)

    def ok(self, strict: bool = False, strict_unverifiable: bool = False) -> bool:
        """No errors; `strict`: no warnings either, except those that say something could
        not be checked here; `strict_unverifiable`: none of those either (`Report.ok`)."""
        return self.report.ok(strict, strict_unverifiable)

    def diagnostics(
        self, strict: bool = False, strict_unverifiable: bool = False
    ) -> list[Diagnostic]:
        """Every diagnostic, with the severity the strictness gives it."""
        return self.report.effective(strict, strict_unverifiable)


# Warnings that `ttbundle validate` allows (the bundle is well formed) but that no archive
# or installed bundle may carry: the scaffold's template, which could only fail when served.
REFUSED_FOR_RELEASE = frozenset({"TTB065"})


def release_errors(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """What refuses a bundle from being packed, installed or tested: its errors, and the
    warnings of `REFUSED_FOR_RELEASE` as errors (with their own message)."""
    return [
        replace(d, severity=Severity.ERROR) if d.code in REFUSED_FOR_RELEASE else d
        for d in diagnostics
        if d.is_error or d.code in REFUSED_FOR_RELEASE
    ]


def validate_bundle(
    path: Path, *, strict: bool = False, import_check: bool = False, timeout: float = 60.0
) -> Report:
    """Every problem of one bundle folder. `strict` is applied by `Report.ok`."""
    return check_bundle(Path(path), import_check=import_check, timeout=timeout).report()


def check_bundle(
    bundle_dir: Path, *, import_check: bool = False, timeout: float = 60.0
) -> CheckedBundle:
    loaded = load_metadata(bundle_dir)
    checked = CheckedBundle(bundle_dir, loaded.metadata, list(loaded.diagnostics))
    metadata = loaded.metadata
    if metadata is None:
        return checked
    if metadata.legacy:
        metadata = checked.metadata = legacy_as_served(bundle_dir, metadata)
    checked.diagnostics.extend(
        _locate(
            semantic_checks(metadata, str(loaded.file))
            + check_tests(bundle_dir, metadata, str(loaded.file))
            + check_serving(bundle_dir, metadata, str(loaded.file))
            + read_evidence(bundle_dir)[1]
            + check_adapter(bundle_dir, metadata),
            str(loaded.file),
        )
    )
    if import_check and not any(d.is_error for d in checked.diagnostics):
        from ttbundles.check.imports import import_check as run_import_check

        imported = run_import_check(bundle_dir, metadata, timeout=timeout)
        # The capability agreement runs in both checks; say each finding once.
        seen = {(d.code, d.pointer) for d in checked.diagnostics if d.pointer is not None}
        imported = [d for d in imported if d.pointer is None or (d.code, d.pointer) not in seen]
        checked.diagnostics.extend(_locate(imported, str(loaded.file)))
        if not any(d.code in ("TTB060", "TTB061") for d in imported):
            # What only an import could check was checked: not "run --import" again.
            checked.diagnostics = [
                replace(
                    d,
                    severity=Severity.INFO,
                    hint="checked by --import on the imported class (see any finding above)",
                )
                if d.hint and "validate --import" in d.hint and not d.is_error
                else d
                for d in checked.diagnostics
            ]
    return checked


def legacy_as_served(bundle_dir: Path, metadata: BundleMetadata) -> BundleMetadata:
    """Legacy metadata with the capabilities the registry serves it with: the class's
    `model_capabilities`, read from source (`registry._capabilities_from_class`, and
    `migrate`), so that `validate`'s verdict is `list`'s, not "declared off" for each
    capability the class supports (TTB059). A class that cannot be read keeps none."""
    from ttbundles.check.static_reader import read_bundle_class

    found = read_bundle_class(bundle_dir, metadata)
    if found is None:
        return metadata
    return metadata.model_copy(update={"capabilities": found.capabilities})


def semantic_checks(metadata: BundleMetadata, file: str) -> list[Diagnostic]:
    """Rules that span fields, beyond what the schema can say."""
    out: list[Diagnostic] = []
    for index, model in enumerate(metadata.models):
        if model.revision is None:
            out.append(
                Diagnostic(
                    "TTB037",
                    Severity.WARNING,
                    f"checkpoint {model.repo} has no pinned revision",
                    file=file,
                    pointer=f"/models/{index}",
                    hint='add "revision": "<commit sha>" so the bundle always '
                    "serves the weights it was validated with",
                )
            )
    reason = unservable_reason(metadata.arch)
    if reason is not None:
        out.append(
            Diagnostic(
                "TTB202",
                Severity.ERROR,
                f"{metadata.arch} cannot be served: {reason}",
                file=file,
                pointer="/arch",
                hint="serve a model vLLM knows (for images: Qwen2.5-VL, Qwen3-VL, "
                "Gemma 3); the worker refuses this one before loading weights",
            )
        )
    out.extend(_undeclared_recurrent_state(metadata, file))
    declared = metadata.capabilities.sample_on_device
    for mesh, target in metadata.targets.items():
        mode = target.additional_config.sample_on_device_mode
        if mode is not None and mode not in declared:
            out.append(
                Diagnostic(
                    "TTB204",
                    Severity.ERROR,
                    f"target {mesh} defaults sample_on_device_mode to {mode!r}, "
                    "which capabilities.sample_on_device does not declare",
                    file=file,
                    pointer=f"/targets/{mesh}/additional_config/sample_on_device_mode",
                    hint=f"declare {mode!r} in capabilities.sample_on_device or drop the default",
                )
            )
    return out


def _undeclared_recurrent_state(metadata: BundleMetadata, file: str) -> list[Diagnostic]:
    """TTB042: the architecture's checkpoints keep recurrent state (a gated delta net,
    Mamba or short-convolution layer) and the metadata says nothing of it, so neither
    validate nor plan can say what the bundle's class owns (the template `init` writes is
    such a bundle)."""
    kind = recurrent_kind_of_architecture(metadata.arch)
    if kind is None or metadata.capabilities.recurrent_state is not None:
        return []
    return [
        Diagnostic(
            "TTB042",
            Severity.WARNING,
            f"{metadata.arch} keeps recurrent state ({kind_name(kind)} layers: a fixed-size "
            "state per request, not a KV cache), which the metadata does not declare; "
            "such a checkpoint is refused at configuration (TTB274: not served yet)",
            file=file,
            pointer="/capabilities",
            hint='declare "recurrent_state": {"owner": "generator"} (the class keeps a state '
            'slot per request) or {"owner": "vllm"} in capabilities, with schema_version 6, '
            "and the same owner in the class's model_capabilities['recurrent_state']",
        )
    ]


def _locate(diagnostics: list[Diagnostic], file: str) -> list[Diagnostic]:
    """Add line:column to diagnostics that point into the metadata file."""
    if not diagnostics:
        return diagnostics
    from ttbundles.format.jsonpos import locate

    try:
        positions = locate(Path(file).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return diagnostics
    out = []
    for d in diagnostics:
        line_col = positions.get(d.pointer) if d.pointer is not None else None
        if line_col and d.file == file and d.line is None:
            d = replace(d, line=line_col[0], column=line_col[1])
        out.append(d)
    return out


def cross_bundle_checks(bundles: list[CheckedBundle]) -> list[Diagnostic]:
    """Problems of a set of bundles served together: shared names, ambiguous arches."""
    out: list[Diagnostic] = []
    valid = [b for b in bundles if b.metadata is not None]
    by_name: dict[str, CheckedBundle] = {}
    for bundle in valid:
        assert bundle.metadata is not None
        first = by_name.setdefault(bundle.metadata.name, bundle)
        if first is not bundle:
            out.append(
                Diagnostic(
                    "TTB070",
                    Severity.ERROR,
                    f"bundle name {bundle.metadata.name!r} is used by "
                    f"{first.path} and {bundle.path}",
                    file=str(bundle.path / METADATA_FILE),
                    pointer="/name",
                    hint="give each bundle a unique name",
                )
            )
    # Only bundles of one TT architecture can overlap: compare pairs within each group
    # (not all n^2 pairs of a large models folder). Bundles that overlap, directly or
    # through another, are one ambiguity: reported once, naming them all, in folder order.
    by_arch: dict[str, list[CheckedBundle]] = {}
    for bundle in valid:
        assert bundle.metadata is not None
        by_arch.setdefault(bundle.metadata.tt_arch, []).append(bundle)
    clusters: list[list[CheckedBundle]] = []
    for group in by_arch.values():
        clusters += _overlapping_sets(group)
    order = {id(b): n for n, b in enumerate(valid)}
    for cluster in sorted(clusters, key=lambda c: order[id(c[0])]):
        arch = cluster[0].metadata.tt_arch  # type: ignore[union-attr]
        both = "both" if len(cluster) == 2 else f"all {len(cluster)}"
        names = ", ".join(f"{b.metadata.name} ({b.path})" for b in cluster)  # type: ignore[union-attr]
        out.append(
            Diagnostic(
                "TTB071",
                Severity.ERROR,
                f"{names} {both} register {arch} for overlapping targets and conditions",
                file=str(cluster[-1].path / METADATA_FILE),
                pointer="/arch",
                hint="keep one, or give them disjoint targets or 'when' conditions that "
                "tell them apart",
            )
        )
    return out


def _overlapping_sets(group: list[CheckedBundle]) -> list[list[CheckedBundle]]:
    """The sets of bundles (of one architecture) linked by overlaps, in folder order:
    union-find over the pairs that overlap."""
    parent = list(range(len(group)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for i, a in enumerate(group):
        for j in range(i + 1, len(group)):
            if overlaps(a.metadata, group[j].metadata):  # type: ignore[arg-type]
                parent[root(j)] = root(i)
    members: dict[int, list[CheckedBundle]] = {}
    for i, bundle in enumerate(group):
        members.setdefault(root(i), []).append(bundle)
    return [m for m in members.values() if len(m) > 1]


def bundle_folders(folder: Path) -> tuple[list[Path], list[Diagnostic]]:
    """The bundles in a models folder, in registration order, and what was passed over."""
    found, skipped = [], []
    for child in sorted(folder.iterdir()):
        if not child.is_dir() or child.name.startswith("."):
            continue
        if (child / METADATA_FILE).is_file():
            found.append(child)
        else:
            skipped.append(
                Diagnostic(
                    "TTB002",
                    Severity.WARNING,
                    f"{child.name} has no {METADATA_FILE}; not a bundle, skipped",
                    file=str(child),
                )
            )
    return found, skipped


def validate_path(
    path: Path, *, import_check: bool = False, timeout: float = 60.0
) -> ValidationResult:
    """Validate whatever `path` is: a bundle, a `.ttbundle` archive, or a models folder."""
    path = Path(path)
    result = ValidationResult()
    if path.is_file() and path.name == METADATA_FILE:
        path = path.parent  # `validate DIR/vllm_metadata.json` means the bundle DIR
    elif path.is_file():
        if path.suffix != ".ttbundle" and not _starts_like_gzip(path):
            result.report.add(
                Diagnostic(
                    "TTB001",
                    Severity.ERROR,
                    "a file that is not a .ttbundle archive; a bundle is a folder",
                    file=str(path),
                    hint=f"pass the bundle's folder ({path.parent}), or a .ttbundle archive",
                )
            )
            return result
        return _validate_archive(path, import_check=import_check, timeout=timeout)
    if not path.is_dir():
        result.report.add(
            Diagnostic(
                "TTB001",
                Severity.ERROR,
                "no such file or folder",
                file=str(path),
                hint="check the path",
            )
        )
        return result
    if (path / METADATA_FILE).is_file():
        folders: list[Path] = [path]
    else:
        folders, skipped = bundle_folders(path)
        result.report.extend(skipped)
        if not folders:
            result.report.add(
                Diagnostic(
                    # The folder is there: what it lacks is the metadata (TTB001 is a
                    # path that does not exist), as pack and install say it.
                    "TTB002",
                    Severity.ERROR,
                    f"neither a bundle (no {METADATA_FILE}) nor a folder of bundles",
                    file=str(path),
                    hint="point at a bundle folder, a .ttbundle archive, or a "
                    "folder whose subfolders are bundles",
                )
            )
            return result
    for folder in folders:
        checked = check_bundle(folder, import_check=import_check, timeout=timeout)
        result.bundles.append(checked)
        result.report.extend(checked.diagnostics)
    for diagnostic in cross_bundle_checks(result.bundles):
        result.report.extend(_locate([diagnostic], diagnostic.file or ""))
    return result


def _starts_like_gzip(path: Path) -> bool:
    try:
        with path.open("rb") as handle:
            return handle.read(2) == b"\x1f\x8b"
    except OSError:
        return False


def _validate_archive(path: Path, *, import_check: bool, timeout: float) -> ValidationResult:
    from ttbundles.archive.reader import extract_verified
    from ttbundles.errors import TTBundleError

    result = ValidationResult()
    with tempfile.TemporaryDirectory(prefix="ttbundle-validate-") as tmp:
        try:
            folder = extract_verified(path, Path(tmp))
        except TTBundleError as exc:
            result.report.extend(exc.diagnostics)
            return result
        checked = check_bundle(folder, import_check=import_check, timeout=timeout)
    # Report paths inside the archive, not the temporary folder they were checked in.
    prefix = str(folder)
    checked.diagnostics = [
        replace(d, file=d.file.replace(prefix, f"{path}!", 1))
        if d.file and d.file.startswith(prefix)
        else d
        for d in checked.diagnostics
    ]
    checked.path = path
    result.bundles.append(checked)
    result.report.extend(checked.diagnostics)
    return result
