"""What vLLM registers: every TT architecture, which bundle provides it, and why not others.

One computation serves `ttbundle list`, the general plugin and the platform, so what the
CLI shows is what the server does. Registration validates each bundle's metadata and
checks its module file exists, but never imports adapter code: the plugin runs this in
every vLLM process, so it must stay close to the cost of reading the JSON files. Only
what declares no capabilities has its class source read (with `ast`): a
`TT_MODEL_CLASS_OVERRIDES` entry and a legacy two-key bundle, whose capabilities are the
class's `model_capabilities`, as the reference plugin takes them.

Order of precedence for one TT architecture: an override, then extra bundles
(EXTRA_MODELS_DIR order), then built-ins; within a source, the bundle naming the mesh,
then the most specific `when`.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from ttbundles import envs
from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.meshes import HOST, canonical
from ttbundles.format.metadata import METADATA_FILE, SCHEMA_VERSION, BundleMetadata, slug
from ttbundles.format.modules import module_file
from ttbundles.format.parse import load_metadata
from ttbundles.paths import builtin_bundles_dir
from ttbundles.registry import overrides as overrides_
from ttbundles.registry.requirements import unmet
from ttbundles.registry.selection import applies, rank

if TYPE_CHECKING:  # the static reader is imported only where a class source is read
    from ttbundles.check.adapter import StaticClass


class Source(str, Enum):
    OVERRIDE = "override"
    EXTRA = "extra"
    BUILTIN = "built-in"


# Where an override's entry points when its module is not found on this machine.
OVERRIDE_PATH = Path(f"${overrides_.VARIABLE}")


class Status(str, Enum):
    REGISTERED = "registered"
    SHADOWED = "shadowed"
    INACTIVE = "inactive"
    SKIPPED = "skipped"
    # Registered, but its class cannot be imported on this machine (set by `servable`,
    # never by registration, which does not look).
    UNSERVABLE = "unservable"


@dataclass
class Entry:
    """One bundle as the registry sees it."""

    path: Path
    source: Source
    metadata: BundleMetadata | None
    status: Status = Status.REGISTERED
    reason: str = ""
    diagnostics: list[Diagnostic] = field(default_factory=list)
    # A TT_MODEL_CLASS_OVERRIDES entry: the item it comes from.
    override: overrides_.Override | None = None
    # The main class as its source shows it, where it was read (overrides, legacy bundles).
    static: StaticClass | None = None

    @property
    def tt_arch(self) -> str | None:
        return self.metadata.tt_arch if self.metadata else None

    @property
    def label(self) -> str:
        if self.metadata is None:
            return self.path.name
        return f"{self.metadata.name}@{self.metadata.version}"

    def class_ref(self) -> str:
        """The `module:Class` vLLM imports lazily, with bundle modules isolated."""
        assert self.metadata is not None
        if self.metadata.main_class_source == "environment":
            return self.metadata.main_class
        from ttbundles.registry.loader import qualified_class

        return qualified_class(self.path, self.metadata.name, self.metadata.main_class)

    def to_dict(self) -> dict:
        meta = self.metadata
        return {
            "tt_arch": self.tt_arch,
            "bundle": meta.name if meta else None,
            "version": meta.version if meta else None,
            "source": self.source.value,
            "path": str(self.path),
            "status": self.status.value,
            "reason": self.reason,
            "main_class": meta.main_class if meta else None,
            "capabilities": meta.capabilities.model_dump() if meta else None,
        }


@dataclass
class Registry:
    """The outcome of registration for one process's environment."""

    entries: list[Entry]
    mesh: str | None
    problems: list[Diagnostic] = field(default_factory=list)

    @property
    def registered(self) -> dict[str, Entry]:
        return {e.tt_arch: e for e in self.entries if e.status is Status.REGISTERED and e.tt_arch}

    def fatal(self) -> list[Diagnostic]:
        """What TT_BUNDLES_STRICT=1 turns into a startup failure."""
        return [d for d in self.problems if d.severity is not Severity.INFO]


def sources(
    environ: Mapping[str, str] | None = None, models_dirs: list[Path] | None = None
) -> list[tuple[Source, Path]]:
    """The folders searched, in order: EXTRA_MODELS_DIR entries, then the built-ins."""
    if models_dirs is None:
        models_dirs = [Path(p) for p in envs.read("EXTRA_MODELS_DIR", environ)]
    found = [(Source.EXTRA, Path(p)) for p in models_dirs]
    if envs.read("TT_VLLM_BUILTIN_MODELS", environ):
        found.append((Source.BUILTIN, builtin_bundles_dir()))
    return found


def compute(
    environ: Mapping[str, str] | None = None,
    *,
    mesh: str | None = None,
    models_dirs: list[Path] | None = None,
) -> Registry:
    """Decide what registers, from the environment (EXTRA_MODELS_DIR, MESH_DEVICE, ...).

    Raises ConfigurationError where the reference plugin refuses to start too: a malformed
    TT_MODEL_CLASS_OVERRIDES (TTB104), a variant selector naming no variant (TTB105), and
    a mesh that is neither a preset nor a grid (TTB106). The mesh is kept in its canonical
    spelling (`host` is HOST), so bundles' `targets` match it whatever the case.
    """
    environ = os.environ if environ is None else environ
    if mesh is None:
        mesh = canonical(envs.read("MESH_DEVICE", environ))
    else:
        mesh = canonical(mesh, source="--mesh")
    entries: list[Entry] = [override_entry(o) for o in overrides_.read(environ)]
    problems: list[Diagnostic] = []
    for source, folder in sources(environ, models_dirs):
        if not folder.is_dir():
            problems.append(
                Diagnostic(
                    "TTB001",
                    Severity.WARNING,
                    "models folder does not exist; ignored",
                    file=str(folder),
                )
            )
            continue
        names = sorted(
            e.name for e in os.scandir(folder) if not e.name.startswith(".") and e.is_dir()
        )
        for name in names:
            entry = _load(folder / name, source, mesh, environ)
            if entry is not None:
                entries.append(entry)
    check_selectors(entries, environ)
    _select(entries, problems, mesh)
    problems.extend(
        d for e in entries if e.status is Status.SKIPPED for d in e.diagnostics if d.is_error
    )
    return Registry(entries, mesh, problems)


def _load(path: Path, source: Source, mesh: str | None, environ: Mapping[str, str]) -> Entry | None:
    """The entry for one folder; None when it holds no metadata (not a bundle)."""
    loaded = load_metadata(path)
    if loaded.metadata is None and loaded.diagnostics[0].code == "TTB002":
        return None
    entry = Entry(path, source, loaded.metadata, diagnostics=loaded.diagnostics)
    errors = [d for d in loaded.diagnostics if d.is_error]
    meta = loaded.metadata
    if errors or meta is None:
        first = errors[0] if errors else None
        entry.status = Status.SKIPPED
        entry.reason = f"invalid: {first.code} {first.message}" if first else "invalid"
        return entry
    if meta.main_class_source == "bundle" and module_file(path, meta.module) is None:
        entry.status = Status.SKIPPED
        entry.reason = f"TTB050 module {meta.module!r} is not in the bundle"
        entry.diagnostics.append(
            Diagnostic(
                "TTB050",
                Severity.ERROR,
                entry.reason,
                file=str(path / METADATA_FILE),
                pointer="/main_class",
            )
        )
        return entry
    missing = unmet(meta.requires)
    if missing:
        entry.status = Status.SKIPPED
        entry.reason = "TTB100 " + "; ".join(missing)
        entry.diagnostics.append(
            Diagnostic(
                "TTB100",
                Severity.ERROR,
                "; ".join(missing),
                file=str(path / METADATA_FILE),
                pointer="/requires",
            )
        )
        return entry
    if meta.legacy:
        _capabilities_from_class(entry)
    if not applies(meta, mesh, environ):
        entry.status = Status.INACTIVE
        entry.reason = _why_inactive(meta, mesh, environ)
    return entry


def override_entry(override: overrides_.Override) -> Entry:
    """The registry's entry for one TT_MODEL_CLASS_OVERRIDES item: registered whatever
    the mesh, `when` or requirements, with the class's own capabilities."""
    from ttbundles.check.adapter import read_class

    static = read_class(override.module, override.class_name)
    metadata = BundleMetadata.model_validate(
        {
            "schema_version": SCHEMA_VERSION,
            "name": slug(f"override-{override.tt_arch}"),
            "version": "0",
            "description": f"{overrides_.VARIABLE}: {override.item}",
            "arch": override.arch,
            "main_class": override.target,
            "main_class_source": "environment",
        }
    )
    if static is not None:
        metadata.capabilities = static.capabilities
    entry = Entry(
        static.file if static is not None else OVERRIDE_PATH,
        Source.OVERRIDE,
        metadata,
        override=override,
        static=static,
    )
    if static is None:
        entry.reason = (
            f"{override.target} not found here (imported when the model loads); "
            "no capabilities read"
        )
    return entry


def _capabilities_from_class(entry: Entry) -> None:
    """A legacy bundle declares no capabilities: take the class's `model_capabilities`
    (read from source, TT-Metal's absent-means-unsupported rule), as the reference
    plugin does by importing it."""
    from ttbundles.check.adapter import read_bundle_class

    assert entry.metadata is not None
    entry.static = read_bundle_class(entry.path, entry.metadata)
    if entry.static is not None:
        entry.metadata.capabilities = entry.static.capabilities


def selectors(entries: list[Entry]) -> dict[str, list[str]]:
    """Each variant selector the built-in bundles use, with every value that names a
    variant: the `when.env` values and `when.default_for` names of the bundles found
    (built-in or extra), in a stable order."""
    variables = {
        name
        for e in entries
        if e.source is Source.BUILTIN and e.metadata is not None
        for name in (*e.metadata.when.env, *e.metadata.when.default_for)
    }
    values: dict[str, set[str]] = {name: set() for name in variables}
    for e in entries:
        if e.metadata is None:
            continue
        for mapping in (e.metadata.when.default_for, e.metadata.when.env):
            for name, value in mapping.items():
                if name in values:
                    values[name].add(value)
    defaults = {
        v for e in entries if e.metadata is not None for v in e.metadata.when.default_for.values()
    }
    return {
        name: sorted(found, key=lambda v: (v not in defaults, v))
        for name, found in sorted(values.items())
    }


def check_selectors(entries: list[Entry], environ: Mapping[str, str]) -> None:
    """A selector set to a value no bundle names is an error naming the valid ones (the
    reference plugin raises for its built-in map too; with the built-ins off there is no
    selector to check)."""
    problems = []
    for name, valid in selectors(entries).items():
        value = environ.get(name)
        if value and value not in valid:
            problems.append(
                Diagnostic(
                    "TTB105",
                    Severity.ERROR,
                    f"{name}={value!r} names no variant; pick one of [{', '.join(valid)}]",
                    hint=f"set {name} to one of those, or unset it for the default variant",
                )
            )
    if problems:
        raise ConfigurationError(problems)


def _why_inactive(meta: BundleMetadata, mesh: str | None, environ: Mapping[str, str]) -> str:
    if mesh is not None and meta.targets and mesh not in meta.targets:
        return f"TTB101 targets {', '.join(meta.targets)}, not {mesh}"
    if mesh is None and set(meta.targets) == {HOST}:
        return "TTB101 targets only the host mesh; set MESH_DEVICE=HOST to use it"
    unmatched = [f"{k}={v}" for k, v in meta.when.env.items() if environ.get(k) != v]
    return f"TTB101 applies only when {', '.join(unmatched)}"


def _select(entries: list[Entry], problems: list[Diagnostic], mesh: str | None) -> None:
    """Pick one bundle per TT architecture: extras before built-ins, then by `rank` (names
    the mesh, most specific `when`), then the first in EXTRA_MODELS_DIR order (ambiguity
    is reported)."""
    by_arch: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.status is Status.REGISTERED and entry.tt_arch:
            by_arch.setdefault(entry.tt_arch, []).append(entry)
    precedence = {Source.OVERRIDE: 0, Source.EXTRA: 1, Source.BUILTIN: 2}
    for arch, candidates in by_arch.items():
        ranked = sorted(
            candidates,
            key=lambda e: (precedence[e.source], tuple(-r for r in rank(e.metadata, mesh))),  # type: ignore[arg-type]
        )
        winner = ranked[0]
        tied: list[Entry] = []
        for loser in ranked[1:]:
            loser.status = Status.SHADOWED
            loser.reason = f"{arch} is provided by {winner.label} ({winner.source.value})"
            same_rank = loser.source is winner.source and rank(loser.metadata, mesh) == rank(
                winner.metadata, mesh
            )  # type: ignore[arg-type]
            if winner.override is not None:
                loser.reason = (
                    f"TTB103 overridden by {overrides_.VARIABLE} ({winner.override.item})"
                )
            elif loser.source is Source.BUILTIN and winner.source is Source.EXTRA:
                loser.reason = f"TTB102 shadowed by {winner.label} from {winner.path}"
            elif same_rank:
                tied.append(loser)
        if tied:
            # One ambiguity, however many bundles are in it: one warning naming them all.
            names = ", ".join(f"{e.label} ({e.path})" for e in [winner, *tied])
            both = "both" if len(tied) == 1 else f"all {len(tied) + 1}"
            problems.append(
                Diagnostic(
                    "TTB071",
                    Severity.WARNING,
                    f"{names} {both} register {arch}; the first in EXTRA_MODELS_DIR order "
                    f"({winner.label}) wins",
                    file=str(tied[-1].path / METADATA_FILE),
                    hint="remove all but one, or tell them apart with targets or 'when'",
                )
            )


def table(registry: Registry) -> list[dict]:
    """Rows for the startup log and `ttbundle list`, registered first."""
    order = {
        Status.REGISTERED: 0,
        Status.UNSERVABLE: 1,
        Status.SHADOWED: 2,
        Status.INACTIVE: 3,
        Status.SKIPPED: 4,
    }
    rows = sorted(registry.entries, key=lambda e: (order[e.status], e.tt_arch or "", str(e.path)))
    return [e.to_dict() for e in rows]


__all__ = [
    "Entry",
    "Registry",
    "Source",
    "Status",
    "check_selectors",
    "compute",
    "override_entry",
    "selectors",
    "sources",
    "table",
]
