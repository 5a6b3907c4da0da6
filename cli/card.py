"""`ttbundle card`: what a bundle was tested on, what it serves untested, what it refuses."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from .options import FormatOption
from .output import Format, Output


def card(
    bundle: Annotated[
        str,
        typer.Argument(
            help="A bundle folder, or a bundle's name as `ttbundle list` shows it (demo, "
            "demo@1.0.0).",
            show_default=False,
        ),
    ],
    fmt: FormatOption = Format.human,
) -> None:
    """Print the bundle's support card: per target mesh and feature, tested (its evidence
    on that mesh covers it), served (the plan admits it, untested) or refused (with the
    plan's code).

    human: Markdown with Hugging Face model-card front matter (a README.md for the hub);
    json: the same as data. Evidence comes from ttbundle test --keep-evidence.

    Example: ttbundle card demo > README.md
    """
    from ttbundles.check.support import support_card, to_markdown
    from ttbundles.errors import TTBundleError
    from ttbundles.format.parse import load_metadata
    from ttbundles.registry.registry import bundle_folder

    out = Output(fmt)
    folder = bundle_folder(bundle)
    loaded = load_metadata(folder)
    if loaded.metadata is None:
        raise TTBundleError([d for d in loaded.diagnostics if d.is_error] or loaded.diagnostics)
    data = support_card(folder, loaded.metadata)
    problems = data.pop("diagnostics")
    if out.is_json:
        out.result(True, problems, **data)
        return
    sys.stdout.write(to_markdown(data))
    out.diagnostics(problems, stderr=True)
