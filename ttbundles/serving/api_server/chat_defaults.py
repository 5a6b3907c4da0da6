"""The bundle's chat defaults applied in the API server: the tool-call parser, auto tool
choice and chat template the plan decided (`serving.planning.chat_defaults`) are the API
server's settings, which vLLM reads from the parsed command line when it builds its
handlers; they are filled in there just before (`compat.replace_init_app_state`), where
the operator left them unset.
"""

from __future__ import annotations

from typing import Any

_state: dict[str, Any] = {}


def install(chat: dict[str, Any]) -> None:
    """In the API server's process: fill the chat settings of `chat` (the plan's) into
    the parsed command line when vLLM builds its handlers. Once per process."""
    _state["chat"] = dict(chat)
    if _state.get("installed") or not chat:
        return
    _state["installed"] = True
    from ttbundles.serving import compat

    original: Any = None

    async def init_app_state(engine_client: Any, state: Any, args: Any, *rest: Any, **kw: Any):
        apply(args, _state["chat"])
        return await original(engine_client, state, args, *rest, **kw)

    original = compat.replace_init_app_state(init_app_state)


def apply(args: Any, chat: dict[str, Any]) -> None:
    """Set each of `chat`'s settings on the parsed command line `args` where it is unset
    (the operator's flag wins, even one given after the plan)."""
    for setting, value in chat.items():
        if setting == "reasoning_parser":
            structured = getattr(args, "structured_outputs_config", None)
            if structured is not None and not getattr(structured, "reasoning_parser", None):
                structured.reasoning_parser = value
            continue
        if not getattr(args, setting, None):
            setattr(args, setting, value)
