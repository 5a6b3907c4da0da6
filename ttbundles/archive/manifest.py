"""`MANIFEST.json`: every file of a bundle with its size and SHA-256, and the root digest.

The root digest is the bundle's identity: a SHA-256 over the canonical JSON of the sorted
file list, so two bundles with the same files have the same identity whatever archive,
folder or machine they come from, and any change to any file changes it. `name` and
`version` are carried for people and tools; they are checked against
`vllm_metadata.json`, whose bytes the digest covers.

The manifest is written by `pack` as the archive's last entry, kept in an installed
bundle's folder, and never lists itself. Hashing always streams (1 MiB chunks), so a
multi-GB weight file is never held in memory.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from ttbundles.archive.files import MANIFEST_FILE, list_files, scan_files, unsafe_reason
from ttbundles.errors import (
    ArchiveError,
    Diagnostic,
    InvalidBundleError,
    Report,
    Severity,
    TTBundleError,
)
from ttbundles.format.metadata import METADATA_FILE, NAME_PATTERN
from ttbundles.format.parse import load_metadata

MANIFEST_VERSION = 1
# Every manifest version this release reads, with what it changed.
SUPPORTED_MANIFEST_VERSIONS: dict[int, str] = {
    1: "files with size and sha256; root digest over the sorted file list",
}
CHUNK_SIZE = 1 << 20
DIGEST_ALGORITHM = "sha256"
SHA256_PATTERN = r"^[0-9a-f]{64}$"
ROOT_DIGEST_PATTERN = r"^sha256:[0-9a-f]{64}$"

__all__ = [
    "MANIFEST_FILE",
    "FileEntry",
    "Manifest",
    "build_manifest",
    "bundle_identity",
    "compare_files",
    "hash_file",
    "parse_manifest",
    "read_manifest",
    "root_digest",
    "verify_dir",
]


class FileEntry(BaseModel):
    """One file of the bundle, as packed."""

    # Strict: a size of "12" or true is a damaged manifest, not something to coerce.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    path: str = Field(description="Relative POSIX path inside the bundle.")
    size: int = Field(ge=0, description="Size in bytes.")
    sha256: str = Field(pattern=SHA256_PATTERN, description="Lower-case hex SHA-256.")

    @field_validator("path")
    @classmethod
    def _safe_path(cls, value: str) -> str:
        reason = unsafe_reason(value)
        if reason is not None:
            raise PydanticCustomError(
                "TTB081", "unsafe path {path!r}: {reason}", {"path": value, "reason": reason}
            )
        if value == MANIFEST_FILE:
            raise PydanticCustomError("TTB081", "the manifest cannot list itself")
        return value


class Manifest(BaseModel):
    """`MANIFEST.json`, version 1."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    manifest_version: int = Field(description="Version of this format.")
    name: str = Field(pattern=NAME_PATTERN, max_length=64, description="Bundle name.")
    version: str = Field(min_length=1, description="Bundle version.")
    files: list[FileEntry] = Field(description="Every file, sorted by path.")
    root_digest: str = Field(
        pattern=ROOT_DIGEST_PATTERN, description="'sha256:<hex>' over the file list."
    )

    @field_validator("manifest_version")
    @classmethod
    def _supported(cls, value: int) -> int:
        if value not in SUPPORTED_MANIFEST_VERSIONS:
            raise PydanticCustomError(
                "TTB081",
                "manifest_version {value} is not supported (this ttbundles reads {known})",
                {
                    "value": value,
                    "known": ", ".join(map(str, SUPPORTED_MANIFEST_VERSIONS)),
                    "hint": "upgrade ttbundles to read this archive",
                },
            )
        return value

    @model_validator(mode="after")
    def _unique_paths(self) -> Manifest:
        seen: set[str] = set()
        for entry in self.files:
            if entry.path in seen:
                raise PydanticCustomError(
                    "TTB081", "{path!r} is listed twice", {"path": entry.path}
                )
            seen.add(entry.path)
        return self

    @classmethod
    def create(cls, name: str, version: str, files: Iterable[FileEntry]) -> Manifest:
        """A manifest over `files`, sorted, with its root digest computed."""
        entries = sorted(files, key=lambda f: f.path)
        return cls(
            manifest_version=MANIFEST_VERSION,
            name=name,
            version=version,
            files=entries,
            root_digest=root_digest(entries),
        )

    def to_bytes(self) -> bytes:
        """Deterministic serialisation (field order, 2-space indent, UTF-8, final newline).

        The bytes are part of the archive, so they must not depend on dict order or
        platform; they are also pleasant to read in an installed folder.
        """
        text = json.dumps(self.model_dump(mode="json"), indent=2, ensure_ascii=False)
        return (text + "\n").encode("utf-8")

    def by_path(self) -> dict[str, FileEntry]:
        return {entry.path: entry for entry in self.files}

    @property
    def total_size(self) -> int:
        return sum(entry.size for entry in self.files)


def root_digest(files: Iterable[FileEntry]) -> str:
    """`sha256:<hex>` over the canonical JSON of the sorted (path, size, sha256) list.

    Canonical: keys sorted, separators `,` and `:`, no ASCII escaping, UTF-8. Anyone can
    recompute it with a few lines of any language, which is the point of an identity.
    """
    listing = sorted(
        ({"path": f.path, "size": f.size, "sha256": f.sha256} for f in files),
        key=lambda item: item["path"],
    )
    canonical = json.dumps(listing, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return f"{DIGEST_ALGORITHM}:{hashlib.sha256(canonical.encode('utf-8')).hexdigest()}"


def hash_file(path: Path) -> tuple[int, str]:
    """(size, sha256 hex) of a file, read once in fixed-size chunks."""
    digest = hashlib.sha256()
    size = 0
    buffer = bytearray(CHUNK_SIZE)
    view = memoryview(buffer)
    with open(path, "rb") as handle:
        while True:
            count = handle.readinto(buffer)
            if not count:
                break
            digest.update(view[:count])
            size += count
    return size, digest.hexdigest()


def _pointer(loc: tuple[Any, ...]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in loc)


def _manifest_diagnostics(exc: ValidationError, *, file: str) -> list[Diagnostic]:
    diagnostics = []
    for error in exc.errors():
        ctx = error.get("ctx") or {}
        hint = ctx.get("hint")
        diagnostics.append(
            Diagnostic(
                code="TTB081",
                severity=Severity.ERROR,
                message=error["msg"],
                file=file,
                pointer=_pointer(error["loc"]),
                hint=hint if isinstance(hint, str) else None,
            )
        )
    return diagnostics


def parse_manifest(data: bytes, *, source: str) -> Manifest:
    """A manifest from its bytes; every problem in it is a TTB081 naming `source`."""

    def bad(message: str, hint: str | None = None) -> TTBundleError:
        return ArchiveError.single("TTB081", message, file=source, hint=hint)

    try:
        document = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise bad(f"{MANIFEST_FILE} is not UTF-8") from None
    except json.JSONDecodeError as exc:
        raise bad(f"{MANIFEST_FILE} is not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(document, dict):
        raise bad(f"{MANIFEST_FILE} is not a JSON object")
    try:
        return Manifest.model_validate(document)
    except ValidationError as exc:
        raise ArchiveError(_manifest_diagnostics(exc, file=source)) from None


def read_manifest(path: Path) -> Manifest:
    """The manifest of a bundle folder, or of a `MANIFEST.json` file given directly."""
    path = Path(path)
    file = path / MANIFEST_FILE if path.is_dir() else path
    try:
        data = file.read_bytes()
    except FileNotFoundError:
        raise ArchiveError.single(
            "TTB081",
            f"no {MANIFEST_FILE}",
            file=file,
            hint="a manifest is written by 'ttbundle pack' and kept by 'ttbundle install'",
        ) from None
    except OSError as exc:
        raise ArchiveError.single(
            "TTB081", f"cannot read {MANIFEST_FILE}: {exc}", file=file
        ) from None
    return parse_manifest(data, source=str(file))


def bundle_identity(bundle_dir: Path) -> tuple[str, str]:
    """(name, version) of a bundle folder, as its metadata gives them.

    Read through `parse.load_metadata`, so a legacy two-key bundle packs under the name
    and version the registry gives it (its folder's name, version "0").
    """
    loaded = load_metadata(Path(bundle_dir))
    if loaded.metadata is None:
        errors = [d for d in loaded.diagnostics if d.is_error]
        raise InvalidBundleError(errors or loaded.diagnostics)
    return loaded.metadata.name, loaded.metadata.version


def build_manifest(bundle_dir: Path) -> Manifest:
    """The manifest of a bundle folder as it is now (reads every file once)."""
    bundle_dir = Path(bundle_dir)
    name, version = bundle_identity(bundle_dir)
    entries = []
    for rel in list_files(bundle_dir):
        size, sha256 = hash_file(bundle_dir / rel)
        entries.append(FileEntry(path=rel, size=size, sha256=sha256))
    return Manifest.create(name, version, entries)


def compare_files(
    manifest: Manifest,
    found: Mapping[str, tuple[int, str]],
    *,
    locate: Callable[[str], str],
    oversize_code: str = "TTB082",
    skip: Collection[str] = (),
) -> list[Diagnostic]:
    """Every difference between the manifest and the files found, in path order.

    `found` maps a path to its (size, sha256); a path in the manifest but not in
    `found` is missing, the reverse is extra; paths in `skip` were already reported
    (unreadable, unsafe) and are not reported twice. `oversize_code` lets archives report an
    entry larger than announced (TTB087) apart from a plain mismatch. The root digest is
    recomputed from the manifest's own list: a manifest edited by hand is caught even
    when the files agree with it.
    """
    diagnostics: list[Diagnostic] = []

    def add(code: str, path: str, message: str, hint: str | None = None) -> None:
        diagnostics.append(
            Diagnostic(
                code=code,
                severity=Severity.ERROR,
                message=f"{path}: {message}",
                file=locate(path),
                hint=hint,
            )
        )

    expected = manifest.by_path()
    for path in sorted((set(expected) | set(found)) - set(skip)):
        entry = expected.get(path)
        actual = found.get(path)
        if entry is None:
            add(
                "TTB084",
                path,
                "present but not listed in the manifest",
                "remove it, or pack the bundle again to list it",
            )
        elif actual is None:
            add("TTB083", path, f"listed in the manifest ({entry.size} bytes) but missing")
        else:
            size, sha256 = actual
            if size > entry.size:
                add(
                    oversize_code,
                    path,
                    f"{size} bytes, larger than the {entry.size} the manifest says",
                )
            elif size != entry.size:
                add("TTB082", path, f"{size} bytes, the manifest says {entry.size}")
            elif sha256 != entry.sha256:
                add("TTB082", path, f"sha256 {sha256} differs from the manifest's {entry.sha256}")
    computed = root_digest(manifest.files)
    if computed != manifest.root_digest:
        diagnostics.append(
            Diagnostic(
                code="TTB088",
                severity=Severity.ERROR,
                message=f"root digest {manifest.root_digest} does not match the file list "
                f"({computed}): the manifest was edited",
                file=locate(MANIFEST_FILE),
                hint="get the bundle again from its source",
            )
        )
    return diagnostics


def check_identity(manifest: Manifest, metadata: bytes | None, *, file: str) -> list[Diagnostic]:
    """The manifest's name and version must be those of `vllm_metadata.json`.

    The root digest does not cover `name`, and install picks the folder from it, so a
    manifest renamed by hand must not go unnoticed. Unreadable metadata is left to
    validation.
    """
    if metadata is None:
        return []
    try:
        document = json.loads(metadata.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return []
    if not isinstance(document, dict):
        return []
    diagnostics = []
    for key in ("name", "version"):
        declared = document.get(key)
        if declared is not None and declared != getattr(manifest, key):
            diagnostics.append(
                Diagnostic(
                    code="TTB081",
                    severity=Severity.ERROR,
                    message=f"manifest {key} {getattr(manifest, key)!r} differs from "
                    f"{METADATA_FILE}'s {declared!r}",
                    file=file,
                    pointer=f"/{key}",
                    hint="pack the bundle again",
                )
            )
    return diagnostics


def verify_dir(bundle_dir: Path) -> Report:
    """Compare a bundle folder with its `MANIFEST.json`; every difference is reported.

    Uses the same listing rules as `pack`, so `__pycache__/` written by importing the
    adapter does not count as an extra file.
    """
    bundle_dir = Path(bundle_dir)
    report = Report()
    if not bundle_dir.is_dir():
        report.add(
            Diagnostic(
                code="TTB001",
                severity=Severity.ERROR,
                message="not a folder",
                file=str(bundle_dir),
            )
        )
        return report
    try:
        manifest = read_manifest(bundle_dir)
        files, problems = scan_files(bundle_dir)
    except (ArchiveError, InvalidBundleError) as exc:
        report.extend(exc.diagnostics)
        return report
    report.extend(problems)
    expected = manifest.by_path()
    found: dict[str, tuple[int, str]] = {}
    unreadable: set[str] = set()
    for rel in files:
        if rel not in expected:
            found[rel] = (0, "")  # extra: no need to read it
            continue
        try:
            found[rel] = hash_file(bundle_dir / rel)
        except OSError as exc:
            report.add(
                Diagnostic(
                    code="TTB003",
                    severity=Severity.ERROR,
                    message=f"{rel}: cannot be read: {exc}",
                    file=str(bundle_dir / rel),
                )
            )
            unreadable.add(rel)
    report.extend(
        compare_files(manifest, found, locate=lambda rel: str(bundle_dir / rel), skip=unreadable)
    )
    metadata = None
    if METADATA_FILE in expected:
        try:
            metadata = (bundle_dir / METADATA_FILE).read_bytes()
        except OSError:
            metadata = None
    report.extend(check_identity(manifest, metadata, file=str(bundle_dir / MANIFEST_FILE)))
    return report
