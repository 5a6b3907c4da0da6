"""The bundle's serving defaults at `vllm serve`: tool calling, reasoning, chat template.

A bundle may declare the tool-call parser, auto tool choice, reasoning parser and chat
template its models need (`serving`, schema 4), so that an operator need not know them
per model. Each is a plan decision: the operator's flag when given, else the bundle's,
else vLLM's default. The reasoning parser is an engine setting (set in the
configuration here); the others are the API server's, which vLLM reads from the parsed
command line when it builds its handlers: `serving.api_server.chat_defaults` fills those
the operator left unset just before.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError
from ttbundles.format.metadata import BundleMetadata

if TYPE_CHECKING:
    from vllm.config import VllmConfig

    from ttbundles.serving.planning.plan import Plan


def plan_chat_defaults(
    vllm_config: VllmConfig,
    plan: Plan,
    meta: BundleMetadata,
    bundle_dir: Path,
    asked: Mapping[str, Any],
) -> None:
    """Decide each chat setting the bundle declares; keep in `plan.chat` those the bundle
    supplies. `asked` holds the chat settings the operator's command line set. A parser the
    installed vLLM lacks is refused now (TTB112), not when the server builds its
    handlers."""
    serving = meta.serving
    if serving is None:
        return
    from ttbundles.check.serving_defaults import parser_problems
    from ttbundles.vllm_parsers import registered

    problems = parser_problems(meta, names=registered)
    errors = [d for d in problems if d.is_error]
    if errors:
        bundle = f"{meta.name}@{meta.version}"
        raise ConfigurationError(
            [
                replace(
                    d,
                    message=f"bundle {bundle}: {d.message}",
                    hint=f"{d.hint}; or pass the flag to vllm serve (it wins)",
                )
                for d in errors
            ]
        )
    structured = getattr(vllm_config, "structured_outputs_config", None)
    engine_reasoning = getattr(structured, "reasoning_parser", None) or None
    template = (
        str((bundle_dir / serving.chat_template).resolve())
        if serving.chat_template is not None
        else None
    )
    declared: dict[str, Any] = {
        "tool_call_parser": serving.tool_call_parser,
        "enable_auto_tool_choice": serving.auto_tool_choice or None,
        "chat_template": template,
        "reasoning_parser": serving.reasoning_parser,
    }
    where = f"{meta.name}@{meta.version}"
    for setting, ours in declared.items():
        if ours is None:
            continue
        given = asked.get(setting)
        if setting == "reasoning_parser" and given is None:
            given = engine_reasoning  # set by vLLM for the model, e.g. gpt-oss's own
        option = "--" + setting.replace("_", "-")
        if given is not None:
            plan.decide(
                setting,
                given,
                given,
                f"set by the user ({option}); bundle {where}'s default {ours!r} not applied",
            )
            continue
        plan.chat[setting] = plan.decide(
            setting, None, ours, f"default of bundle {where} (serving.{setting})"
        )
    if "reasoning_parser" in plan.chat and structured is not None:
        structured.reasoning_parser = plan.chat["reasoning_parser"]
