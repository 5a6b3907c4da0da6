"""Install a `.ttbundle` into a models folder, and uninstall it, safely and atomically.

An archive is untrusted input: `ttbundles.archive.reader` verifies it whole, then
extracts it re-checking every entry, so only files listed in its manifest with exactly
the listed size and digest are written.

How a bundle is published is `installer.publish`; the locks and the leftovers of dead
operations are `installer.leftovers`.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ttbundles import envs
from ttbundles.archive.manifest import Manifest, read_manifest, verify_dir
from ttbundles.archive.reader import extract_into, extraction_failed, verified_manifest
from ttbundles.errors import InstallError, TTBundleError, missing_path
from ttbundles.format.metadata import METADATA_FILE, NAME_PATTERN
from ttbundles.installer.admission import admit
from ttbundles.installer.leftovers import TEMP_PREFIX, _Hold, _locked, _Sweep, _sweep, drop_kept
from ttbundles.installer.publish import (
    _already_installed,
    _clean_up,
    _installed_version,
    _move_aside,
    _publish,
)
from ttbundles.suggest import hint_for
from ttbundles.trust.provenance import Provenance

MODELS_DIR_ENV = "EXTRA_MODELS_DIR"
# A scheme of two letters or more, then "://" (so a Windows drive "C:/" is a path).
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]+://")


__all__ = [
    "InstallResult",
    "find_installed",
    "install",
    "resolve_models_dir",
    "uninstall",
]


@dataclass(frozen=True)
class InstallResult:
    """What `install`, `install(replace=True)` or `uninstall` did, for the CLI to render.

    `version` is the version now installed (or, after an uninstall, the one removed);
    `previous_version` the version a replace removed (None when it could not be read).
    `swap` is how a replace published: "exchange" (renameat2), "symlink" (the link
    layout), or "rename" (two renames: readers could miss the bundle for a moment).
    `layout` is "folder" (`<name>` is the bundle) or "link" (a link to `.ver-...`).
    `kept` is where a replace kept the old version for readers still inside it (the next
    install or uninstall in the folder removes it); `removed_kept` the old versions of
    earlier replaces this operation removed.
    """

    action: str  # "installed", "replaced" or "uninstalled"
    name: str
    version: str | None
    path: Path
    models_dir: Path
    previous_version: str | None = None
    swap: str | None = None
    layout: str | None = None
    removed_leftovers: tuple[Path, ...] = ()
    restored: tuple[Path, ...] = ()
    digest: str | None = None
    previous_digest: str | None = None
    kept: Path | None = None
    removed_kept: tuple[Path, ...] = ()

    @property
    def change(self) -> str | None:
        """For a replace: "upgrade", "downgrade" or "same version" (another build)."""
        if self.action != "replaced":
            return None
        return version_change(self.previous_version, self.version)

    def to_dict(self) -> dict:
        return {
            "action": self.action,
            "name": self.name,
            "version": self.version,
            "previous_version": self.previous_version,
            "digest": self.digest,
            "previous_digest": self.previous_digest,
            "change": self.change,
            "path": str(self.path),
            "models_dir": str(self.models_dir),
            "swap": self.swap,
            "layout": self.layout,
            "removed_leftovers": [str(p) for p in self.removed_leftovers],
            "restored": [str(p) for p in self.restored],
            "kept": str(self.kept) if self.kept is not None else None,
            "removed_kept": [str(p) for p in self.removed_kept],
        }


def resolve_models_dir(models_dir: Path | None) -> Path:
    """The folder given, else the first entry of `$EXTRA_MODELS_DIR` (an os.pathsep list).

    The registry searches every entry of EXTRA_MODELS_DIR; installing goes to the first,
    the one that wins.
    """
    if models_dir is not None:
        return Path(models_dir).expanduser()
    folders = envs.EXTRA_MODELS_DIR
    if folders:
        return Path(folders[0]).expanduser()
    raise InstallError.single(
        "TTB091",
        f"no models folder given and {MODELS_DIR_ENV} is not set",
        hint=f"pass --models-dir DIR, or set {MODELS_DIR_ENV}",
    )


def _refuse_unsupported_source(archive: str | os.PathLike[str]) -> Path:
    text = os.fspath(archive)
    if isinstance(archive, str) and _URL.match(text):
        raise InstallError.single(
            "TTB095",
            "a URL, not a local file: install takes a file; download the archive "
            "first, or pull it from an OCI registry",
            file=text,
            hint="ttbundle pull HOST/REPOSITORY:TAG --install, or download it (curl -fLO URL) "
            "and ttbundle install ./FILE.ttbundle",
        )
    path = Path(archive)
    if not os.path.lexists(path):
        raise InstallError(missing_path(path, what=".ttbundle archive"))
    if path.is_dir():
        raise InstallError.single(
            "TTB001",
            "a folder, not a .ttbundle archive",
            file=path,
            hint=f"pack it first (ttbundle pack {path}), then install the archive",
        )
    return path


def install(
    archive: str | os.PathLike[str],
    models_dir: Path | None,
    *,
    replace: bool = False,
    force: bool = False,
    provenance: Provenance | None = None,
) -> InstallResult:
    """Verify `archive` and install it as `models_dir/<name>`; what was done.

    `models_dir` None means `$EXTRA_MODELS_DIR` (see `resolve_models_dir`); it is created
    when missing. The installed folder keeps `MANIFEST.json`, so `ttbundle verify` works
    on it and packing it again gives the same archive, byte for byte. Leftovers of dead
    installs in the folder are removed first (`removed_leftovers`), also by an install
    that changes nothing; a replace keeps the old version for readers still inside it
    (`kept`), and every install removes the versions earlier replaces kept
    (`removed_kept`), waiting until they were replaced `leftovers.RETIRED_GRACE` ago.

    Idempotent: the same root digest already installed (and intact) is "up to date" and
    changes nothing, so a deployment script can run it every time. Another version or
    build needs `replace` (the error names both versions and digests). The extracted
    bundle gets `ttbundle validate`'s static checks before it is published: an archive
    whose manifest is consistent can still hold an adapter with a syntax error, which
    would otherwise fail only when a server loads it; `force` skips them.

    Before publishing, `installer.admission` enforces the trust policy on the extracted
    copy and writes its provenance record (`provenance`, as `pull` knows it).
    """
    archive = _refuse_unsupported_source(archive)
    models_dir = resolve_models_dir(models_dir)
    manifest = verified_manifest(archive)
    name = manifest.name
    target = models_dir / name
    installed = _installed_manifest(target)
    same = installed is not None and installed.root_digest == manifest.root_digest
    if same and verify_dir(target).ok():
        removed, restored = _sweep_only(models_dir)
        return InstallResult(
            action="up to date",
            name=name,
            version=manifest.version,
            path=target,
            models_dir=models_dir,
            digest=manifest.root_digest,
            previous_version=manifest.version,
            previous_digest=manifest.root_digest,
            removed_leftovers=removed,
            restored=restored,
            removed_kept=tuple(drop_kept(models_dir)),
        )
    if not replace and os.path.lexists(target):
        raise _installed_differs(target, installed, manifest)  # early: spare the extraction
    sweep = _Sweep()
    hold: _Hold | None = None
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
        with _locked(models_dir):
            sweep = _sweep(models_dir)
            if not replace and os.path.lexists(target):
                raise _already_installed(target)  # put back by the sweep
            hold = _Hold.start(models_dir)
            tmp = hold.path(TEMP_PREFIX, name)
            tmp.mkdir()  # permissions from the umask (mkdtemp would make it 0o700)
        removed = tuple(sweep.finish())  # before extracting: a leftover may take the room
        extract_into(archive, manifest, tmp)
        if not force:
            _static_checks(tmp, archive)
        admit(tmp, archive, name, manifest.root_digest, provenance)
        with _locked(models_dir):
            swap, previous, kept = _publish(hold, tmp, target, name, replace)
    except OSError as exc:
        raise extraction_failed(exc, models_dir) from None
    finally:
        sweep.finish()
        if hold is not None:
            _clean_up(hold, name, target)  # after a replace: the old bundle, if not kept
    refresh_index(models_dir)
    removed_kept = drop_kept(models_dir, keep=kept)  # the old versions of earlier replaces
    return InstallResult(
        action="replaced" if swap else "installed",
        name=name,
        version=manifest.version,
        path=target,
        models_dir=models_dir,
        previous_version=previous,
        swap=swap,
        layout="link" if target.is_symlink() else "folder",
        removed_leftovers=removed,
        restored=tuple(sweep.restored),
        digest=manifest.root_digest,
        previous_digest=installed.root_digest if installed is not None and swap else None,
        kept=kept,
        removed_kept=tuple(removed_kept),
    )


def version_change(old: str | None, new: str | None) -> str | None:
    """ "upgrade", "downgrade" or "same version" from `old` to `new` (PEP 440 order);
    None when either cannot be read."""
    from packaging.version import InvalidVersion, Version

    try:
        before, after = Version(old or ""), Version(new or "")
    except InvalidVersion:
        return None
    if after > before:
        return "upgrade"
    if after < before:
        return "downgrade"
    return "same version"


def short_digest(digest: str | None) -> str:
    """`sha256:` and the first 12 hex digits: enough to tell builds apart in a line."""
    if not digest:
        return "unknown digest"
    kind, _, hexdigits = digest.partition(":")
    return f"{kind}:{hexdigits[:12]}" if hexdigits else digest[:19]


def _installed_manifest(target: Path) -> Manifest | None:
    """The manifest an installed bundle kept; None when there is none to read."""
    if not target.is_dir():
        return None
    try:
        return read_manifest(target)
    except TTBundleError:
        return None


def _installed_differs(target: Path, installed: Manifest | None, new: Manifest) -> TTBundleError:
    """TTB090, naming what is installed and what the archive holds."""
    name = target.name
    if installed is None:
        return _already_installed(target)
    old = f"{installed.version} ({short_digest(installed.root_digest)})"
    fresh = f"{new.version} ({short_digest(new.root_digest)})"
    change = version_change(installed.version, new.version)
    if installed.root_digest == new.root_digest:
        what = "the installed copy was modified since it was installed"
        verb = "restore it"
    elif change == "same version":
        what = "another build of the same version"
        verb = "replace it"
    elif change is not None:
        what = f"an {change}" if change == "upgrade" else f"a {change}"
        verb = change
    else:
        what = "another version"
        verb = "replace it"
    return InstallError.single(
        "TTB090",
        f"{name} {old} is installed; this archive is {name} {fresh}: {what}",
        file=target,
        hint=f"pass --replace to {verb}",
    )


def _static_checks(folder: Path, archive: Path) -> None:
    """`ttbundle validate`'s static checks on the extracted bundle; raises TTB093 with
    the errors (located in the archive) when it has any."""
    from dataclasses import replace as with_file

    from ttbundles.check.validate import check_bundle, release_errors
    from ttbundles.errors import Diagnostic, Severity

    checked = check_bundle(folder)
    prefix = str(folder)
    errors = [
        with_file(d, file=d.file.replace(prefix, f"{archive}!", 1))
        if d.file and d.file.startswith(prefix)
        else d
        for d in release_errors(checked.diagnostics)
    ]
    if errors:
        raise InstallError(
            [
                *errors,
                Diagnostic(
                    "TTB093",
                    Severity.ERROR,
                    "install refused: ttbundle validate's checks found the errors above; "
                    "nothing was changed",
                    file=str(archive),
                    hint="fix the bundle and pack it again, or pass --force to install it as it is",
                ),
            ]
        )


def find_installed(name: str, models_dir: Path | None) -> tuple[Path, str | None]:
    """The installed bundle `name`: (its path, its version); raises TTB092 if there is none.

    Only a folder holding `vllm_metadata.json` (or a link to one) is a bundle: `name`
    must be a bundle name, not a path.
    """
    models_dir = resolve_models_dir(models_dir)
    target = models_dir / name

    def not_installed(message: str, hint: str | None = None) -> TTBundleError:
        return InstallError.single("TTB092", message, file=target, hint=hint)

    if not re.fullmatch(NAME_PATTERN, name):
        raise not_installed(f"{name!r} is not a bundle name", "give the name, not a path")
    if not models_dir.is_dir():
        raise not_installed(f"{name} is not installed: {models_dir} does not exist")
    if not os.path.lexists(target):
        installed = [
            p.name
            for p in models_dir.iterdir()
            if not p.name.startswith(".") and (p / METADATA_FILE).is_file()
        ]
        hint = hint_for(name, installed, what="installed bundles") if installed else None
        raise not_installed(f"{name} is not installed in {models_dir}", hint)
    if not (target / METADATA_FILE).is_file():
        raise not_installed(f"{target} is not a bundle (no {METADATA_FILE}); left alone")
    return target, _installed_version(target)


def uninstall(name: str, models_dir: Path | None) -> InstallResult:
    """Remove the installed bundle `name` from `models_dir`; what was done.

    The bundle is renamed out of sight first, so the registry never sees a half-deleted
    one; a link is removed, never what it points to, except the version folder of the
    link layout. Leftovers of dead installs in the folder are removed too, and so are
    the old versions replaces kept (`removed_kept`).
    """
    models_dir = resolve_models_dir(models_dir)
    target, version = find_installed(name, models_dir)  # cheap checks before the lock
    sweep = _Sweep()
    hold: _Hold | None = None
    old_version: _Sweep | None = None
    try:
        with _locked(models_dir):
            sweep = _sweep(models_dir)
            target, version = find_installed(name, models_dir)
            hold = _Hold.start(models_dir)
            old_version = _move_aside(hold, target, name)
    except OSError as exc:
        raise InstallError.single(
            "TTB093", f"cannot remove {name}: {exc.strerror or exc}", file=target
        ) from None
    finally:
        removed = sweep.finish()
        if old_version is not None:
            old_version.finish()
        if hold is not None:
            _clean_up(hold, name, target)  # the bundle, now under the operation's name
    refresh_index(models_dir)
    removed_kept = drop_kept(models_dir)
    return InstallResult(
        action="uninstalled",
        name=name,
        version=version,
        path=target,
        models_dir=models_dir,
        removed_leftovers=tuple(removed),
        restored=tuple(sweep.restored),
        removed_kept=tuple(removed_kept),
    )


def _sweep_only(models_dir: Path) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The sweep of an install that changes nothing: (leftovers removed, bundles put back).
    Best effort: a folder that cannot be locked (read-only, say) is left as it is."""
    try:
        with _locked(models_dir):
            sweep = _sweep(models_dir)
    except OSError:
        return (), ()
    return tuple(sweep.finish()), tuple(sweep.restored)


def refresh_index(models_dir: Path) -> bool:
    """Rewrite the folder's registry index (`.ttbundles-index.json`) for what is installed
    now, under the folder lock so that the last writer has seen every change; unchanged
    bundles keep their records. Best effort: a folder whose index cannot be written only
    makes vLLM processes check its bundles themselves."""
    from ttbundles.registry.index import write_folder_index

    try:
        with _locked(models_dir):
            return write_folder_index(models_dir)
    except OSError:
        return False
