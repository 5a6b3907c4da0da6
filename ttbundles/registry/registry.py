"""What vLLM registers: every TT architecture, which bundle provides it, and why not others.

One computation serves `ttbundle list`, the general plugin and the platform, so what the
CLI shows is what the server does. Registration validates each bundle's metadata and
checks its adapter statically (module file present, parses, defines the main class;
`registry.index.examine`), but never imports adapter code. The plugin runs this in every
vLLM process, so what a check found is kept in an index keyed by the bundle's files
(`registry.index`) and selection reads a summary of each document (`Facts`); the model
is validated again only for the bundles a process looks into. A
`TT_MODEL_CLASS_OVERRIDES` entry and a legacy two-key bundle declare no capabilities:
their class source is read (with `ast`) for its `model_capabilities`, as the reference
plugin takes them.

Order of precedence for one TT architecture: an override, then extra bundles
(EXTRA_MODELS_DIR order), then built-ins; within a source, the bundle naming the mesh,
then the most specific `when`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from ttbundles import envs
from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.meshes import canonical
from ttbundles.format.metadata import (
    METADATA_FILE,
    SCHEMA_VERSION,
    BundleMetadata,
    slug,
    tt_arch_name,
)
from ttbundles.format.selection import applies, rank, why_inactive
from ttbundles.paths import builtin_bundles_dir
from ttbundles.registry import overrides as overrides_
from ttbundles.registry.index import Index, Record, bundle_names, examine
from ttbundles.registry.requirements import unmet

if TYPE_CHECKING:  # the static reader is imported only where a class source is read
    from ttbundles.check.static_reader import StaticClass
    from ttbundles.trust.verification import Trusted


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


class Facts:
    """What registration reads of a bundle's metadata, straight from its document.

    Selection looks at every bundle (architecture, targets, `when`, requirements), so it
    reads these instead of building a validated model per bundle: a bundle taken from the
    index (`registry.index`) is only validated again when a process looks into it (the
    one it serves). The document is one that validated (the index keeps no other), so
    the defaults below are the model's.
    """

    __slots__ = (
        "name",
        "version",
        "arch",
        "main_class",
        "main_class_source",
        "targets",
        "when",
        "requires",
        "capabilities",
        "any_requirement",
    )

    def __init__(self, document: dict, capabilities: dict | None):
        self.name: str = document["name"]
        self.version: str = document["version"]
        self.arch: str = document["arch"]
        self.main_class: str = document["main_class"]
        self.main_class_source: str = document.get("main_class_source", "bundle")
        self.targets: Collection[str] = document.get("targets") or {}
        self.when = _When(document.get("when") or {})
        self.requires: dict = document.get("requires") or {}
        self.capabilities: dict = capabilities or {}
        self.any_requirement = bool(self.requires) and _requires_any(self.requires)

    @classmethod
    def indexed(cls, summary: list, arch: str, capabilities: dict | None) -> Facts:
        """From an index's summary of a valid document (`registry.index._summary`)."""
        facts = cls.__new__(cls)
        (
            facts.name,
            facts.version,
            facts.main_class,
            facts.main_class_source,
            targets,
            env,
            default_for,
            requires,
        ) = summary
        facts.arch = arch
        facts.targets = targets or ()
        facts.when = _When.of(env or {}, default_for or {})
        facts.requires = requires or {}
        facts.capabilities = capabilities or {}
        facts.any_requirement = bool(requires) and _requires_any(requires)
        return facts

    @classmethod
    def of(cls, metadata: BundleMetadata) -> Facts:
        facts = cls.__new__(cls)
        facts.name = metadata.name
        facts.version = metadata.version
        facts.arch = metadata.arch
        facts.main_class = metadata.main_class
        facts.main_class_source = metadata.main_class_source
        facts.targets = metadata.targets
        facts.when = _When({"env": metadata.when.env, "default_for": metadata.when.default_for})
        facts.requires = metadata.requires.model_dump()
        facts.capabilities = metadata.capabilities.model_dump(mode="json")
        facts.any_requirement = _requires_any(facts.requires)
        return facts

    @property
    def tt_arch(self) -> str:
        return tt_arch_name(self.arch)


def _requires_any(requires: dict) -> bool:
    return any(requires.get(k) for k in ("python", "vllm", "ttnn", "packages"))


class _When:
    __slots__ = ("env", "default_for")

    def __init__(self, when: dict):
        self.env: dict[str, str] = when.get("env") or {}
        self.default_for: dict[str, str] = when.get("default_for") or {}

    @classmethod
    def of(cls, env: dict[str, str], default_for: dict[str, str]) -> _When:
        if not env and not default_for:
            return _NO_WHEN  # shared: nothing changes a bundle's conditions
        when = cls.__new__(cls)
        when.env = env
        when.default_for = default_for
        return when


_NO_WHEN = _When({})


@dataclass(slots=True)
class Entry:
    """One bundle as the registry sees it.

    `metadata` is the validated model; for a bundle taken from the index it is built on
    first use from the record (`facts` serves selection meanwhile).
    """

    path: Path
    source: Source
    _metadata: BundleMetadata | None
    status: Status = Status.REGISTERED
    _reason: str = ""
    # A tuple when there are none (most bundles: a list each would be a thousand objects
    # more for the cyclic collector's next pass); replaced, never changed in place.
    diagnostics: Sequence[Diagnostic] = field(default_factory=list)
    # A TT_MODEL_CLASS_OVERRIDES entry: the item it comes from.
    override: overrides_.Override | None = None
    # The main class as its source shows it, where it was read (overrides, legacy bundles).
    static: StaticClass | None = None
    facts: Facts | None = None
    record: Record | None = None
    # The folder's resolved path, where known without resolving it again.
    resolved: str | None = None
    # The architecture the metadata claims, even when it did not validate.
    claimed_arch: str | None = None
    # The signer the trust policy verified (TT_BUNDLES_TRUST), "key FILE" or "certificate ...".
    verified_signer: str | None = None
    _claimed_signer: str | None = None
    # Why an inactive bundle does not apply (mesh, environment), worded when first read:
    # most bundles of a large folder are inactive and nobody reads why. One tuple for all
    # the entries of a registration (`_load`'s `where`).
    _inactive: tuple | None = None

    @property
    def reason(self) -> str:
        """Why the bundle has its status ("" when registered)."""
        if not self._reason and self._inactive is not None:
            self._reason = why_inactive(self.facts, *self._inactive)
        return self._reason

    def outcome(self) -> tuple:
        """What registration decided for this entry, cheap to compare: no reason worded,
        no signature file read (what a process compares to log its summary once).

        Equal whenever the summary would be: an inactive entry's reason is worded lazily
        (`reason`), so only what it is worded from counts, the mesh and the variables its
        `when` reads, never the whole environment (which vLLM changes as it starts)."""
        inactive = None
        if self._inactive is not None:
            mesh, environ = self._inactive
            inactive = (mesh, tuple((k, environ.get(k)) for k in self.facts.when.env))
        return (
            self.status.value,
            self.tt_arch,
            str(self.path),
            self.label,
            self._reason if self._inactive is None else "",
            inactive,
        )

    @reason.setter
    def reason(self, value: str) -> None:
        self._reason = value
        self._inactive = None

    def __post_init__(self) -> None:
        if self.facts is None and self._metadata is not None:
            self.facts = Facts.of(self._metadata)
        if self.claimed_arch is None and self.facts is not None:
            self.claimed_arch = self.facts.arch

    @property
    def metadata(self) -> BundleMetadata | None:
        if self._metadata is None and self.record is not None:
            self._metadata = self.record.materialize()
        return self._metadata

    @property
    def tt_arch(self) -> str | None:
        return self.facts.tt_arch if self.facts else None

    @property
    def label(self) -> str:
        if self.facts is None:
            return self.path.name
        return f"{self.facts.name}@{self.facts.version}"

    def class_source(self) -> StaticClass | None:
        """The main class as its source shows it (read once, never imported): what the
        configuration asks of a class before any process imports it."""
        if self.static is None and self.metadata is not None:
            from ttbundles.check.static_reader import read_bundle_class

            self.static = read_bundle_class(self.path, self.metadata)
        return self.static

    def class_ref(self) -> str:
        """The `module:Class` vLLM imports lazily, with bundle modules isolated."""
        assert self.facts is not None
        if self.facts.main_class_source == "environment":
            return self.facts.main_class
        from ttbundles.format.loader import qualified_class

        return qualified_class(
            self.path, self.facts.name, self.facts.main_class, resolved=self.resolved
        )

    def to_dict(self, *, signer: bool = True) -> dict:
        """The entry as a row; `signer=False` leaves out the signer, which reads the
        bundle's signature file (what a caller that shows no signer need not pay for)."""
        facts = self.facts
        return {
            "tt_arch": self.tt_arch,
            "bundle": facts.name if facts else None,
            "version": facts.version if facts else None,
            "source": self.source.value,
            "path": str(self.path),
            "status": self.status.value,
            "reason": self.reason,
            "main_class": facts.main_class if facts else None,
            "capabilities": dict(facts.capabilities) if facts else None,
            "signer": self.signer if signer else None,
        }

    @property
    def signer(self) -> str | None:
        """Who signed the bundle: verified under a trust policy, else as its signature
        claims ("unsigned" when it has none); None for overrides and built-ins."""
        if self.verified_signer is not None:
            return self.verified_signer
        if self.source is not Source.EXTRA:
            return None
        if self._claimed_signer is None:  # read once: the table is built more than once
            from ttbundles.trust.signature import signer_of

            self._claimed_signer = signer_of(self.path)
        return self._claimed_signer


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
    index: bool = True,
) -> Registry:
    """Decide what registers, from the environment (EXTRA_MODELS_DIR, MESH_DEVICE, ...).

    Each bundle is checked (metadata, then its adapter statically) or taken from the
    folder's index where its files are unchanged (`registry.index`); `index=False` checks
    every bundle afresh and writes no cache.

    Raises ConfigurationError where the reference plugin refuses to start too: a malformed
    TT_MODEL_CLASS_OVERRIDES (TTB104), a variant selector naming no variant (TTB105), and
    a mesh that is neither a preset nor a grid (TTB106). The mesh is kept in its canonical
    spelling (`host` is HOST), so bundles' `targets` match it whatever the case.
    """
    # One snapshot: os.environ encodes each lookup, and selection looks up `when` variables
    # for every bundle.
    environ = dict(os.environ if environ is None else environ)
    if mesh is None:
        mesh = canonical(envs.read("MESH_DEVICE", environ))
    else:
        mesh = canonical(mesh, source="--mesh")
    entries: list[Entry] = [override_entry(o) for o in overrides_.read(environ)]
    problems: list[Diagnostic] = []
    trusted = _trust(environ)
    # Checking builds many short-lived objects (syntax trees, models): with vLLM's large
    # heap loaded, the cyclic collector would rescan it over and over (5x the time of
    # `ast.parse` itself). Reference counting frees them; the collector runs after.
    collecting = gc.isenabled()
    gc.disable()
    try:
        _scan(entries, problems, environ, models_dirs, mesh, index, trusted)
    finally:
        if collecting:
            gc.enable()
    check_selectors(entries, environ)
    _select(entries, problems, mesh)
    problems.extend(
        d for e in entries if e.status is Status.SKIPPED for d in e.diagnostics if d.is_error
    )
    return Registry(entries, mesh, problems)


def _scan(
    entries: list[Entry],
    problems: list[Diagnostic],
    environ: Mapping[str, str],
    models_dirs: list[Path] | None,
    mesh: str | None,
    index: bool,
    trusted: Trusted | None = None,
) -> None:
    """Every bundle of every models folder, checked or taken from the folder's index."""
    where = (mesh, environ)
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
        kept = Index(folder) if index else None
        child = getattr(folder, "_make_child_relpath", folder.joinpath)  # iterdir's own
        for found in bundle_names(folder):
            path = child(found.name)
            if kept is not None:
                record = kept.record(found.name)
                resolved = None if found.is_symlink() else f"{kept.resolved}/{found.name}"
            else:
                record, resolved = examine(path), None
            if record is not None:
                entry = _load(path, source, record, mesh, environ, resolved, where)
                if trusted is not None and source is Source.EXTRA:
                    _enforce(entry, trusted, mesh)
                entries.append(entry)
        if kept is not None:
            kept.save_user()


def _load(
    path: Path,
    source: Source,
    record: Record,
    mesh: str | None,
    environ: Mapping[str, str],
    resolved: str | None = None,
    where: tuple | None = None,
) -> Entry:
    """The entry for one bundle folder, from what checking it found (`record`); `where`
    is (mesh, environ) as one tuple the caller shares among entries."""
    if not record.valid:
        facts = None
    elif record.summary is not None:
        facts = Facts.indexed(record.summary, record.arch, record.capabilities)
    else:
        facts = Facts(record.document, record.capabilities)
    entry = Entry(
        path,
        source,
        record.metadata,
        diagnostics=list(record.diagnostics) if record.diagnostics else (),
        facts=facts,
        record=record,
        resolved=resolved,
        claimed_arch=record.arch,
    )
    errors = [d for d in record.diagnostics if d.is_error] if record.diagnostics else None
    if errors or facts is None:
        first = errors[0] if errors else None
        entry.status = Status.SKIPPED
        if facts is None:
            entry.reason = f"invalid: {first.code} {first.message}" if first else "invalid"
        else:
            entry.reason = f"{first.code} {first.message}" if first else "invalid"
        return entry
    if facts.any_requirement:
        missing = unmet(facts.requires)
        if missing:
            entry.status = Status.SKIPPED
            entry.reason = "TTB100 " + "; ".join(missing)
            entry.diagnostics = [
                *entry.diagnostics,
                Diagnostic(
                    "TTB100",
                    Severity.ERROR,
                    "; ".join(missing),
                    file=str(path / METADATA_FILE),
                    pointer="/requires",
                ),
            ]
            return entry
    if record.legacy:
        _capabilities_from_class(entry)
    if not applies(facts, mesh, environ):
        entry.status = Status.INACTIVE
        entry._inactive = where if where is not None else (mesh, environ)
    return entry


def _trust(environ: Mapping[str, str]) -> Trusted | None:
    """The trust policy's keys and chains, or None without a policy (nothing imported).

    An unusable policy (TTB143) stops registration: serving everything because the
    policy file has a typo would defeat it."""
    from ttbundles.trust.policy import active

    if not active(environ):
        return None
    from ttbundles.errors import TTBundleError
    from ttbundles.trust.policy import load

    try:
        return load(environ)
    except TTBundleError as exc:
        raise ConfigurationError(exc.diagnostics) from None


def _enforce(entry: Entry, trusted: Trusted, mesh: str | None = None) -> None:
    """Skip an extra bundle whose signature the policy does not accept (TTB140/TTB141),
    or, when the policy asks for evidence, that has none fresh and passed for the mesh
    served (TTB145; no mesh set: nothing is served, nothing to prove)."""
    if entry.status is Status.SKIPPED or entry.facts is None:
        return
    from ttbundles.errors import TTBundleError
    from ttbundles.trust.verification import verify_folder

    try:
        entry.verified_signer = verify_folder(entry.path, trusted, name=entry.facts.name)
        if trusted.require_evidence and mesh is not None:
            from ttbundles.trust.policy import evidence_refusal

            refusal = evidence_refusal(entry.path, entry.facts.name, mesh)
            if refusal is not None:
                raise TTBundleError([refusal])
    except TTBundleError as exc:
        first = exc.diagnostics[0]
        entry.status = Status.SKIPPED
        entry.reason = f"{first.code} {first.message}"
        entry.diagnostics = [*entry.diagnostics, *exc.diagnostics]


def override_entry(override: overrides_.Override) -> Entry:
    """The registry's entry for one TT_MODEL_CLASS_OVERRIDES item: registered whatever
    the mesh, `when` or requirements, with the class's own capabilities."""
    from ttbundles.check.static_reader import read_class

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
        metadata.capabilities = static.capabilities  # before Entry takes its facts
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
    from ttbundles.check.static_reader import read_bundle_class

    assert entry.metadata is not None
    entry.static = read_bundle_class(entry.path, entry.metadata)
    if entry.static is not None:
        entry.metadata.capabilities = entry.static.capabilities
        assert entry.facts is not None
        entry.facts.capabilities = entry.static.capabilities.model_dump(mode="json")


def selectors(entries: list[Entry]) -> dict[str, list[str]]:
    """Each variant selector the built-in bundles use, with every value that names a
    variant: the `when.env` values and `when.default_for` names of the bundles found
    (built-in or extra), in a stable order."""
    variables = {
        name
        for e in entries
        if e.source is Source.BUILTIN and e.facts is not None
        for name in (*e.facts.when.env, *e.facts.when.default_for)
    }
    values: dict[str, set[str]] = {name: set() for name in variables}
    for e in entries:
        if e.facts is None:
            continue
        for mapping in (e.facts.when.default_for, e.facts.when.env):
            for name, value in mapping.items():
                if name in values:
                    values[name].add(value)
    defaults = {
        v for e in entries if e.facts is not None for v in e.facts.when.default_for.values()
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


def _select(entries: list[Entry], problems: list[Diagnostic], mesh: str | None) -> None:
    """Pick one bundle per TT architecture: extras before built-ins, then by `rank` (names
    the mesh, most specific `when`), then the first in EXTRA_MODELS_DIR order (ambiguity
    is reported)."""
    by_arch: dict[str, list[Entry]] = {}
    for entry in entries:
        if entry.status is Status.REGISTERED and entry.tt_arch:
            by_arch.setdefault(entry.tt_arch, []).append(entry)
    precedence = {Source.OVERRIDE: 0, Source.EXTRA: 1, Source.BUILTIN: 2}

    def rank_of(entry: Entry) -> tuple[int, int]:
        assert entry.facts is not None  # it has an architecture: it was read
        return rank(entry.facts, mesh)

    for arch, candidates in by_arch.items():
        ranked = sorted(
            candidates,
            key=lambda e: (precedence[e.source], tuple(-r for r in rank_of(e))),
        )
        winner = ranked[0]
        tied: list[Entry] = []
        for loser in ranked[1:]:
            loser.status = Status.SHADOWED
            loser.reason = f"{arch} is provided by {winner.label} ({winner.source.value})"
            same_rank = loser.source is winner.source and rank_of(loser) == rank_of(winner)
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


def table(registry: Registry, *, signer: bool = True) -> list[dict]:
    """Rows for the startup log and `ttbundle list`, registered first (`signer=False`:
    without reading any signature file)."""
    order = {
        Status.REGISTERED: 0,
        Status.UNSERVABLE: 1,
        Status.SHADOWED: 2,
        Status.INACTIVE: 3,
        Status.SKIPPED: 4,
    }
    rows = sorted(registry.entries, key=lambda e: (order[e.status], e.tt_arch or "", str(e.path)))
    return [e.to_dict(signer=signer) for e in rows]


def bundle_folder(given: str | Path, environ: Mapping[str, str] | None = None) -> Path:
    """The bundle folder `given` names: a path, else a bundle's name as `ttbundle list`
    shows it (`demo`, or `demo@1.0.0` for one version), looked up where the server
    looks (EXTRA_MODELS_DIR first, then the built-ins); the first folder holding it wins,
    as the registry's order does.

    Raises ConfigurationError TTB001 when it is neither, with the closest name."""
    from ttbundles.errors import missing_path
    from ttbundles.suggest import did_you_mean

    path = Path(given)
    text = str(given)
    if path.exists() or os.sep in text or "/" in text:
        if not path.exists():
            raise ConfigurationError([missing_path(path, what="bundle folder")])
        return path
    name, _, version = text.partition("@")
    known: dict[str, Path] = {}
    for entry in compute(environ).entries:
        facts = entry.facts
        if facts is None or entry.override is not None:
            continue
        for label in (facts.name, f"{facts.name}@{facts.version}"):
            known.setdefault(label, entry.path)
    found = known.get(f"{name}@{version}" if version else name)
    if found is not None:
        return found
    diagnostic = missing_path(
        path, what="bundle folder or bundle name (as `ttbundle list` shows them)"
    )
    best = did_you_mean(text, [label for label in known if "@" not in label])
    hint = (f"did you mean {best!r}? " if best else "") + (diagnostic.hint or "")
    raise ConfigurationError([replace(diagnostic, hint=hint)])


__all__ = [
    "Entry",
    "Registry",
    "Source",
    "Status",
    "bundle_folder",
    "check_selectors",
    "compute",
    "override_entry",
    "selectors",
    "sources",
    "table",
]
