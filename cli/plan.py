"""`ttbundle plan`: which bundle serves a model, and every configuration decision."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import FormatOption
from .output import Format, Output


def plan(
    ctx: typer.Context,
    model: Annotated[str, typer.Option("--model", help="Checkpoint folder or hub repo.")],
    mesh: Annotated[
        str | None, typer.Option(help="Mesh to plan for (default: $MESH_DEVICE).")
    ] = None,
    fmt: FormatOption = Format.human,
) -> None:
    """Print what `vllm serve` would decide, and fail with the error it would give.

    Any further options are vllm serve options.

    Example: ttbundle plan --model ./ckpt --mesh HOST --max-model-len 2048 --async-scheduling
    """
    from ttbundles.serving.dry_run import make_plan

    result = make_plan(model, list(ctx.args), mesh=mesh)
    out = Output(fmt)
    if out.is_json:
        out.result(True, [], **result)
        return
    bundle = result["bundle"]
    out.line(
        f"{result['tt_arch']}: {bundle['name']}@{bundle['version']} ({bundle['source']}, "
        f"{bundle['path']}) on mesh {result['mesh'] or 'unset'}",
        style="bold",
    )
    out.table(
        "decisions",
        ["setting", "requested", "effective", "reason"],
        [[d["setting"], d["requested"], d["effective"], d["reason"]] for d in result["decisions"]],
        head=3,
    )
