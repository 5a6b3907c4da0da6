"""The device and server options of `additional_config["tt"]`, typed and checked, and the
defaults of those the user and the target left unset.

Read at configuration time by the planner, and by a scheduler or runner built without the
platform's hook (unit tests) through `plan.effective_options`.
"""

from __future__ import annotations

from typing import Any

from pydantic import ValidationError

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.tt_options import (
    SERVER_OPTION_NAMES,
    TT_OPTION_NAMES,
    ServerOptions,
    TTOptions,
)
from ttbundles.suggest import hint_for

# Effective values of the device options the user and the target left unset. The decode
# interleave cadence is the reference Tenstorrent plugin's: two prefill steps, then one
# decode step (P P D P P D ...) while a decode waits on a run of prefill steps.
TT_DEFAULTS = TTOptions(
    always_compat_sampling=False,
    trace_mode="all",
    enable_model_warmup=True,
    decode_interleave_enabled=True,
    decode_interleave_prefill_steps=2,
    decode_interleave_decode_steps=1,
)


def _error(code: str, message: str) -> ConfigurationError:
    return ConfigurationError(Diagnostic(code, Severity.ERROR, message))


def parse_tt_options(raw: Any) -> TTOptions:
    """`additional_config["tt"]`'s device options as typed options, or an error naming
    the fix (the server options there are `parse_server_options`')."""
    return _validated(TTOptions, _tt_part(raw, server=False))


def parse_server_options(raw: Any) -> ServerOptions:
    """`additional_config["tt"]`'s API-server options (`ServerOptions`), checked as the
    device options are (TTB038)."""
    return _validated(ServerOptions, _tt_part(raw, server=True))


def _tt_part(raw: Any, *, server: bool) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _error("TTB038", f"additional_config.tt must be an object, got {raw!r}")
    return {k: v for k, v in raw.items() if (k in SERVER_OPTION_NAMES) == server}


def _validated(model: type[Any], values: dict[str, Any]) -> Any:
    try:
        return model.model_validate(values)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = str(err["loc"][0]) if err["loc"] else "?"
            if err["type"] == "extra_forbidden":
                problems.append(
                    Diagnostic(
                        "TTB038",
                        Severity.ERROR,
                        f"unknown device option tt.{key}",
                        hint=hint_for(
                            key, TT_OPTION_NAMES + SERVER_OPTION_NAMES, what="device options"
                        ),
                    )
                )
            else:
                allowed = (err.get("ctx") or {}).get("expected")
                problems.append(
                    Diagnostic(
                        "TTB038",
                        Severity.ERROR,
                        f"tt.{key}={err.get('input')!r}: {err['msg']}",
                        hint=f"use {allowed}" if allowed else None,
                    )
                )
        raise ConfigurationError(problems) from None
