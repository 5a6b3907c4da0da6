"""`ttbundle init` and `ttbundle migrate`: start a bundle, or bring an old one to v1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .options import FormatOption
from .output import Format, Output


def init(
    folder: Annotated[Path, typer.Argument(help="The new bundle's folder.", file_okay=False)],
    arch: Annotated[
        str | None, typer.Option(help="Hugging Face architecture, e.g. LlamaForCausalLM.")
    ] = None,
    from_hf: Annotated[
        str | None,
        typer.Option(
            "--from-hf",
            help="Checkpoint folder or hub repo whose config.json "
            "fills arch, models and the pinned revision.",
        ),
    ] = None,
    name: Annotated[str | None, typer.Option(help="Bundle name (default: folder).")] = None,
    keep_adapter: Annotated[
        bool,
        typer.Option(
            "--keep-adapter",
            help="Keep an adapter.py already in the folder and name its class in the metadata.",
        ),
    ] = False,
    reference: Annotated[
        bool,
        typer.Option(
            "--reference",
            help="Start from the torch reference generator (Llama, Mistral, Qwen2, Qwen3, Gemma 3, "
            "Gemma 4 and Qwen3.5 text, their sequence classifiers, Qwen2.5-VL / Qwen3-VL): "
            "the bundle serves on a CPU (MESH_DEVICE=HOST) at once, and you replace its "
            "methods with TT-NN code one by one. Without it: the TT-NN template, whose "
            "methods raise until written.",
        ),
    ] = False,
    recurrent_owner: Annotated[
        str | None,
        typer.Option(
            "--recurrent-owner",
            metavar="OWNER",
            help="With --reference, for a recurrent-state family (Qwen3.5): who keeps the "
            "gated delta net state: 'generator' (default; the class keeps a slot per "
            "request, prefixes cached through snapshots) or 'vllm' (MambaSpec groups in "
            "vLLM's KV manager, read by gdn_state_indices; no prefix caching).",
        ),
    ] = None,
    fmt: FormatOption = Format.human,
) -> None:
    """Create a bundle that validates: vllm_metadata.json plus an adapter template.

    Example: ttbundle init my-llama --arch LlamaForCausalLM --reference

    Example: ttbundle init my-qwen --from-hf CHECKPOINT --reference --recurrent-owner vllm

    Example: ttbundle init my-llama --from-hf meta-llama/Llama-3.1-8B-Instruct
    """
    if arch is None and from_hf is None:
        raise typer.BadParameter("give --arch, --from-hf, or both", param_hint="--arch")
    if reference and keep_adapter:
        raise typer.BadParameter(
            "--reference writes a new adapter; --keep-adapter keeps the one there: pick one",
            param_hint="--reference",
        )
    from ttbundles.scaffold.init import init_bundle

    created = init_bundle(
        folder,
        arch=arch,
        from_hf=from_hf,
        name=name,
        keep_adapter=keep_adapter,
        reference=reference,
        recurrent_owner=recurrent_owner,
    )
    out = Output(fmt)
    if out.is_json:
        out.result(True, folder=str(created.folder), notes=list(created.notes))
        return
    for note in created.notes:
        out.err.print(f"note: {note}", highlight=False, markup=False)
    out.plain(str(created.folder))


def migrate(
    bundle: Annotated[Path, typer.Argument(help="A bundle with legacy metadata.")],
    dry_run: Annotated[
        bool,
        typer.Option("--dry-run", help="Show the change as a unified diff; write nothing."),
    ] = False,
    fmt: FormatOption = Format.human,
) -> None:
    """Rewrite legacy metadata (arch + main_class only) as versioned metadata, in place.

    Capabilities come from the class's model_capabilities (read, not imported); any other
    key is kept as an x- extension. The file keeps its permissions.

    Example: ttbundle migrate $EXTRA_MODELS_DIR/my-model --dry-run
    """
    from ttbundles.scaffold.migrate import migrate_bundle

    result = migrate_bundle(bundle, dry_run=dry_run)
    out = Output(fmt)
    if out.is_json:
        out.result(
            True,
            [],
            path=str(bundle),
            changed=result.changed,
            written=result.written,
            kept_as_extensions=result.kept,
            capabilities=result.capabilities,
            note=result.class_note,
            schema_version=result.version,
            diff=result.diff(),
        )
        return
    if not result.changed:
        out.line(f"{bundle}: already schema_version {result.version}; nothing to do")
        return
    if dry_run:
        out.plain(result.diff().rstrip("\n"))
    for old, new in result.kept.items():
        out.line(f"{bundle}: kept {old!r} as {new!r} (legacy metadata has no such key)")
    if result.capabilities:
        out.line(f"{bundle}: capabilities from the class: {', '.join(result.capabilities)}")
    if result.class_note:
        out.line(f"{bundle}: note: {result.class_note}")
    done = "would migrate" if dry_run else "migrated"
    out.line(
        f"{bundle}: {done} to schema_version {result.version}"
        + (" (dry run: nothing written)" * dry_run)
    )
