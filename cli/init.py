"""`ttbundle init` and `ttbundle migrate`: start a bundle, or bring an old one to v1."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .output import Output


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
) -> None:
    """Create a bundle that validates: vllm_metadata.json plus an adapter template.

    Example: ttbundle init my-llama --from-hf meta-llama/Llama-3.1-8B-Instruct
    """
    from ttbundles.scaffold import init_bundle

    if arch is None and from_hf is None:
        raise typer.BadParameter("give --arch, --from-hf, or both", param_hint="--arch")
    created = init_bundle(folder, arch=arch, from_hf=from_hf, name=name)
    Output().plain(str(created))


def migrate(
    bundle: Annotated[Path, typer.Argument(help="A bundle with legacy metadata.")],
) -> None:
    """Rewrite legacy metadata (arch + main_class only) as schema_version 1, in place.

    Example: ttbundle migrate $EXTRA_MODELS_DIR/my-model
    """
    from ttbundles.scaffold import migrate_bundle

    changed = migrate_bundle(bundle)
    Output().line(
        f"{bundle}: "
        + ("migrated to schema_version 1" if changed else "already schema_version 1; nothing to do")
    )
