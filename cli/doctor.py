"""`ttbundle doctor`: will `vllm serve` start here, and if not, why."""

from __future__ import annotations

import typer

from .options import FormatOption
from .output import Format, Output

_MARK = {"ok": "ok", "warning": "warn", "error": "FAIL", "info": "-"}


def doctor(fmt: FormatOption = Format.human) -> None:
    """Check this environment as `vllm serve` would meet it: ttnn, the mesh, the platform
    plugin, vLLM and torch, the bundles that register for this mesh. Exits 1 when
    `vllm serve` would fail to start here.

    Example: MESH_DEVICE=T3K ttbundle doctor --format json
    """
    from ttbundles.doctor import diagnose

    report = diagnose()
    out = Output(fmt)
    if out.is_json:
        # The one JSON shape: ok, the report's data, its problems as `diagnostics`.
        data = {k: v for k, v in report.to_dict().items() if k not in ("ok", "problems")}
        out.result(report.ok, report.problems, **data)
    else:
        width = max(len(c.name) for c in report.checks)
        for check in report.checks:
            out.line(f"{_MARK[check.status]:<4}  {check.name:<{width}}  {check.detail}")
        out.diagnostics(report.problems)
        errors = sum(d.is_error for d in report.problems)
        out.line(
            "vllm serve would start here"
            if report.ok
            else f"vllm serve would fail here ({errors} error{'s' * (errors != 1)})",
            style="bold",
        )
    if not report.ok:
        raise typer.Exit(1)
