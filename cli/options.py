"""Options shared by several commands, defined once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from .output import Format

FormatOption = Annotated[
    Format, typer.Option("--format", "-f", help="Output: human (default) or json.")
]
ModelsDirOption = Annotated[
    Path | None,
    typer.Option(
        "--models-dir",
        help="Folder of installed bundles. Default: $EXTRA_MODELS_DIR (its first entry).",
        file_okay=False,
    ),
]
