"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .output import Format

FormatOption = Annotated[
    Format, typer.Option("--format", "-f", help="Output: human (default) or json.")
]
BundleFoldersOption = Annotated[
    list[Path] | None,
    typer.Option(
        "--models-dir",
        help="Folders of bundles, in order (repeatable). Default: $EXTRA_MODELS_DIR.",
        file_okay=False,
    ),
]
MeshOption = Annotated[
    str | None, typer.Option(help="The mesh to select for. Default: $MESH_DEVICE.")
]
ModelsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--models-dir",
        help="Folder of installed bundles. Default: $EXTRA_MODELS_DIR (its first entry).",
        file_okay=False,
    ),
]
