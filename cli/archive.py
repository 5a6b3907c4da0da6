"""`ttbundle pack`, `verify`, `install`, `uninstall`: archives and installs."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from .options import FormatOption, ModelsDirOption
from .output import Format, Output, summary

if TYPE_CHECKING:
    from ttbundles.installer.operations import InstallResult


@contextmanager
def _progress(label: str, enabled: bool):
    """A rich progress bar on a terminal; nothing when output is piped."""
    if not enabled or not sys.stderr.isatty():
        yield None
        return
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        transient=True,
        console=Output().err,
    ) as bar:
        task = bar.add_task(label, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update


def pack(
    bundle: Annotated[Path, typer.Argument(help="The bundle folder.")],
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-o", help="Where to write the archive.")
    ] = Path("."),
    fmt: FormatOption = Format.human,
) -> None:
    """Write <name>-<version>.ttbundle: a deterministic, verifiable archive.

    Refuses an invalid bundle. The archive's path is the last line of standard output.

    Example: ttbundle pack my-bundle -o dist/
    """
    from ttbundles.build import pack as pack_bundle

    out = Output(fmt)
    with _progress(f"packing {bundle.name}", not out.is_json) as progress:
        path = pack_bundle(bundle, output_dir, progress=progress)
    if out.is_json:
        from ttbundles.archive.reader import read_archive

        manifest = read_archive(path)
        out.result(
            True,
            path=str(path),
            name=manifest.name,
            version=manifest.version,
            root_digest=manifest.root_digest,
        )
    else:
        out.plain(str(path))


def verify(
    path: Annotated[Path, typer.Argument(help="A .ttbundle archive or an installed bundle.")],
    key: Annotated[
        list[Path] | None,
        typer.Option(
            "--key",
            help="Also verify the signature: a trusted public key (repeat).",
            dir_okay=False,
        ),
    ] = None,
    chain: Annotated[
        list[Path] | None,
        typer.Option(
            "--certificate-chain",
            help="Also verify the signature: a certificate chain, root last (repeat).",
            dir_okay=False,
        ),
    ] = None,
    fmt: FormatOption = Format.human,
) -> None:
    """Recompute every digest; name each mismatched, missing or extra file.

    With --key or --certificate-chain, also verify the bundle's signature (model.sig).

    Example: ttbundle verify dist/my-bundle-1.0.0.ttbundle --key signer.pub
    """
    from ttbundles.archive.files import MANIFEST_FILE
    from ttbundles.archive.reader import verify as verify_path
    from ttbundles.errors import Report

    out = Output(fmt)
    source_folder = path.is_dir() and not (path / MANIFEST_FILE).exists()
    # A bundle folder before packing has no manifest: its signature is what to verify.
    report = Report() if (key or chain) and source_folder else verify_path(path)
    signer = None
    if report.ok() and (key or chain):
        from ttbundles.errors import TTBundleError
        from ttbundles.trust.verification import trusted_from, verify_archive, verify_folder

        trusted = trusted_from(key or [], [chain] if chain else [])
        check = verify_folder if path.is_dir() else verify_archive
        try:
            signer = check(path, trusted)
        except TTBundleError as exc:
            report.extend(exc.diagnostics)
    if out.is_json:
        out.result(
            report.ok(), report.diagnostics, path=str(path), valid=report.ok(), signer=signer
        )
    else:
        out.diagnostics(report.diagnostics)
        state = "verified" if report.ok() else "FAILED"
        signed = f", signed by {signer}" if signer else ""
        out.line(
            f"{path}: {state}{signed} ({summary(report.diagnostics)})",
            style="green" if report.ok() else "bold red",
        )
    raise typer.Exit(0 if report.ok() else 1)


def install(
    archive: Annotated[
        str, typer.Argument(help="The .ttbundle archive (a local file).", metavar="ARCHIVE")
    ],
    models_dir: ModelsDirOption = None,
    replace: Annotated[
        bool, typer.Option("--replace", help="Replace an installed bundle of the same name.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option("--force", help="Install even if the bundle fails validate's checks."),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Verify, check as `validate` does, then install atomically into the models folder.

    Says what it did on standard output: name, version (old -> new for --replace, with
    upgrade or downgrade and both digests), path. The same archive again is "up to date"
    (exit 0); another version of an installed bundle needs --replace.

    Example: EXTRA_MODELS_DIR=/opt/tt-bundles ttbundle install my-bundle-1.0.0.ttbundle
    """
    from ttbundles.installer.operations import install as install_archive

    _report(Output(fmt), install_archive(archive, models_dir, replace=replace, force=force))


def uninstall(
    name: Annotated[str, typer.Argument(help="The bundle's name.")],
    models_dir: ModelsDirOption = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Remove an installed bundle.

    Asks first when standard input is a terminal (never otherwise), unless --yes.

    Example: ttbundle uninstall my-bundle --models-dir /opt/tt-bundles --yes
    """
    from ttbundles.installer.operations import find_installed
    from ttbundles.installer.operations import uninstall as uninstall_bundle

    out = Output(fmt)
    if not yes and sys.stdin.isatty():
        path, version = find_installed(name, models_dir)
        if not _confirm(f"Remove {name} {_version(version)} at {path}?"):
            out.err.print("uninstall cancelled; nothing was removed")
            raise typer.Exit(1)
    _report(out, uninstall_bundle(name, models_dir))


def _confirm(question: str) -> bool:
    """Ask on stderr, read the answer from stdin: stdout stays for the result alone
    (click's prompt writes a space to stdout)."""
    sys.stderr.write(f"{question} [y/N]: ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _version(version: str | None) -> str:
    return version if version is not None else "(unknown version)"


def _report(out: Output, result: InstallResult) -> None:
    """What install, replace or uninstall did: JSON, or lines of plain text."""
    from ttbundles.installer.operations import short_digest

    if out.is_json:
        out.result(True, [], **result.to_dict())
        return
    for path in result.restored:
        out.plain(f"restored {path}: put back after an interrupted replace")
    for path in result.removed_leftovers:
        out.plain(f"removed {path}: leftover of an interrupted install or uninstall")
    if result.swap == "rename":
        later = (
            "it is now a link to its version folder, so later replaces are atomic"
            if result.layout == "link"
            else "links cannot be made here either, so every replace will be like this"
        )
        out.plain(
            "note: this file system cannot exchange two names, so "
            f"{result.name} was missing for a moment; {later}"
        )
    version = _version(result.version)
    if result.action == "installed":
        out.plain(f"installed {result.name} {version} at {result.path}")
    elif result.action == "up to date":
        digest = short_digest(result.digest)
        out.plain(f"up to date: {result.name} {version} ({digest}) at {result.path}")
    elif result.action == "replaced":
        previous = _version(result.previous_version)
        digests = f"{short_digest(result.previous_digest)} -> {short_digest(result.digest)}"
        change = f"{result.change}; " if result.change else ""
        out.plain(
            f"replaced {result.name} {previous} -> {version} at {result.path} ({change}{digests})"
        )
    else:
        out.plain(f"uninstalled {result.name} {version} from {result.path}")
