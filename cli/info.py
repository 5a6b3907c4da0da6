"""`ttbundle list`, `inspect`, `schema`: what is registered and what a bundle holds."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from ttbundles.format.metadata import capability_flags

from .options import BundleFoldersOption, FormatOption, MeshOption
from .output import Format, Output, short_path


def list_bundles(
    models_dir: BundleFoldersOption = None,
    mesh: MeshOption = None,
    verbose: Annotated[
        bool,
        typer.Option("--verbose", "-v", help="More detail: whole paths (default: shortened)."),
    ] = False,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Also a row for each built-in that cannot be served here (by default one "
            "line counts them).",
        ),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """What vLLM would register: each TT architecture, its bundle, source and status.

    Honours EXTRA_MODELS_DIR, TT_VLLM_BUILTIN_MODELS and MESH_DEVICE, computed by the same
    code the vLLM plugin runs. A registered class this machine cannot import is shown
    "not servable" (TTB058); leftovers of interrupted installs are warned of (TTB094).
    Exits 1 where `vllm serve` would not start: a wrong mesh (TTB106), a Tenstorrent
    MESH_DEVICE without TT-Metal here (TTB107; not for --mesh, a what-if), and under
    TT_BUNDLES_STRICT=1 any skipped bundle or warning.

    Example: EXTRA_MODELS_DIR=/opt/tt-bundles ttbundle list --mesh T3K
    """
    from ttbundles.errors import TTBundleError, missing_path
    from ttbundles.installer.leftovers import leftover_diagnostics
    from ttbundles.registry.registry import Source, compute, sources, table

    # A --models-dir typed wrong is the user's error, said first (exit 1); a missing
    # EXTRA_MODELS_DIR folder is a warning, at the top (the server starts without it).
    absent = [folder for folder in models_dir or [] if not folder.is_dir()]
    if absent:
        raise TTBundleError([missing_path(folder, what="models folder") for folder in absent])
    from ttbundles.registry.servable import listing_rows, mark_unservable, refusals
    from ttbundles.serving.registration import fallbacks

    registry = compute(mesh=mesh, models_dirs=models_dir or None)
    unservable = mark_unservable(registry)
    refused = refusals(registry, what_if=mesh is not None)
    rows = table(registry) + listing_rows(registry)
    folders = sources(models_dirs=models_dir or None)
    extra = [folder for source, folder in folders if source is Source.EXTRA]
    problems = refused or (registry.problems + unservable + leftover_diagnostics(extra))
    out = Output(fmt)
    if out.is_json:
        # `ok` is the exit status: false exactly when list exits 1 (where vllm serve
        # would not start); errors about single bundles are in the diagnostics.
        from ttbundles.check.support import evidence_status

        for row in rows:  # {mesh: tested | stale | failed} from each bundle's evidence
            folder = Path(row["path"])
            row["evidence"] = evidence_status(folder) if folder.is_dir() else {}
        out.result(not refused, problems, mesh=registry.mesh, entries=rows)
    else:
        # About what the command was given (a models folder that is not there): the
        # command's own warning, on stderr and first; what it found goes to stdout.
        given = [d for d in problems if d.code == "TTB001"]
        out.diagnostics(given, stderr=True)
        problems = [d for d in problems if d not in given]
        folded = []
        if not show_all:
            folded = [
                r
                for r in rows
                if r["status"] == "unservable" and r["source"] in ("built-in", "listing")
            ]
            rows = [r for r in rows if r not in folded]
        out.table(
            f"TT architectures (mesh: {registry.mesh or 'any'})",
            [
                "architecture",
                "bundle",
                "source",
                "status",
                "capabilities",
                "signer",
                "path / reason",
            ],
            [
                [
                    r["tt_arch"] or "-",
                    _label(r),
                    r["source"],
                    "not servable" if r["status"] == "unservable" else r["status"],
                    _caps(r["capabilities"]),
                    r["signer"] or "-",
                    r["reason"] or short_path(r["path"], verbose=verbose),
                ]
                for r in rows
            ],
            head=4,
        )
        if folded:
            from ttbundles.registry.servable import not_servable_counts

            counts = not_servable_counts([r["reason"] for r in folded])
            out.line(
                f"{len(folded)} built-in{'s' * (len(folded) != 1)} not servable here "
                f"({counts}): ttbundle list --all shows them"
            )
        out.diagnostics(problems)
        for line in fallbacks(registry):
            out.line(f"note: {line}")
    if refused:
        raise typer.Exit(1)


def _label(row: dict) -> str:
    """bundle@version; a bundle whose metadata did not validate has neither, and its
    folder names it (as in the startup table)."""
    if row["bundle"]:
        return f"{row['bundle']}@{row['version'] or '-'}"
    return f"{Path(row['path']).name if row['path'] else '-'} (folder)"


def _caps(caps: dict | None) -> str:
    if not caps:
        return ""
    return ", ".join(capability_flags(caps)) or "-"


def inspect(
    path: Annotated[Path, typer.Argument(help="A bundle folder or a .ttbundle archive.")],
    fmt: FormatOption = Format.human,
) -> None:
    """Metadata, capabilities, targets, digest and files of a bundle or archive.

    Example: ttbundle inspect dist/my-bundle-1.0.0.ttbundle --format json
    """
    from ttbundles.archive.inspect import describe
    from ttbundles.trust.provenance import read_beside, read_installed
    from ttbundles.trust.signature import signer_of, signer_of_archive

    out = Output(fmt)
    data = describe(path)
    if path.is_dir():
        record = read_installed(path)
        data["signer"] = signer_of(path)
    else:
        record = read_beside(path)
        data["signer"] = signer_of_archive(path)
    data["provenance"] = record.to_dict() if record is not None else None
    if out.is_json:
        out.result(True, [], **data)
        return
    meta = data["metadata"]
    out.line(f"{meta['name']} {meta['version']}  ({data['tt_arch']})", style="bold")
    if meta.get("description"):
        out.line(meta["description"])
    out.line(f"main class:   {meta['main_class']} (from the {meta['main_class_source']})")
    out.line(f"digest:       {data['root_digest']}")
    out.line(f"signer:       {data['signer']} (claimed; ttbundle verify --key checks it)")
    record = data["provenance"]
    if record is not None:
        pulled = f" ({record['digest']})" if record.get("digest") else ""
        out.line(f"from:         {record['source']}{pulled}")
        out.line(f"installed:    {record['time'] or '-'} (signer then: {record['signer']})")
    out.line(f"capabilities: {_caps(meta['capabilities'])}")
    targets = meta.get("targets") or {}
    out.line(f"targets:      {', '.join(targets) if targets else 'any mesh'}")
    if data["evidence"] is not None:
        proven = ", ".join(f"{m} {s}" for m, s in data["evidence"].items())
        out.line(f"evidence:     {proven or 'none (ttbundle test --keep-evidence)'}")
    if meta.get("when", {}).get("env"):
        out.line("when:         " + ", ".join(f"{k}={v}" for k, v in meta["when"]["env"].items()))
    out.table(
        "files",
        ["path", "size", "sha256"],
        [[f["path"], f["size"], f["sha256"][:16]] for f in data["files"]],
    )


def schema(fmt: FormatOption = Format.human) -> None:
    """Print the JSON Schema of vllm_metadata.json (point editors at it with "$schema").

    Example: ttbundle schema > vllm_metadata.schema.json
    """
    import json

    from ttbundles.paths import schema_file

    text = schema_file().read_text(encoding="utf-8")
    out = Output(fmt)
    if out.is_json:  # the one envelope: the schema under "schema"
        out.result(True, schema=json.loads(text))
    else:
        sys.stdout.write(text)
