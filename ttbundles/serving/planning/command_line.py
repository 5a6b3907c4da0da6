"""What the command line of this `vllm serve` asked for, recorded as vLLM parses it.

A limit the plan lowers is a warning when the user asked for more and an INFO decision
when it was only vLLM's or the model's default; the bundle's chat defaults apply only
where the operator passed nothing. vLLM's config no longer says which values were typed,
so `TTPlatform.pre_register_and_update` records them here from the parsed arguments
(`record_command_line`), once per process, before the configuration hook plans.
"""

from __future__ import annotations

from typing import Any

# Setting name -> the value the command line gave (`vllm serve --max-model-len 2048`).
COMMAND_LINE: dict[str, Any] = {}
ASKED_SETTINGS = ("max_model_len", "max_num_seqs", "max_num_batched_tokens")
# vllm serve's chat settings: what the operator passed wins over the bundle's serving
# defaults. Unset is None, False or "" (vLLM's defaults); each parse says them afresh.
CHAT_SETTINGS = ("tool_call_parser", "enable_auto_tool_choice", "chat_template", "reasoning_parser")


def record_command_line(parsed: Any) -> None:
    """Keep the settings of `ASKED_SETTINGS` the parsed command line gives (not None),
    and the chat settings it sets. A parse states the whole command line: what an
    earlier parse in this process gave (`ttbundle plan` run in-process again) is gone."""
    COMMAND_LINE.clear()
    for name in ASKED_SETTINGS:
        value = getattr(parsed, name, None)
        if value is not None:
            COMMAND_LINE[name] = value
    for name in CHAT_SETTINGS:
        value = getattr(parsed, name, None)
        if value:
            COMMAND_LINE[name] = value
        else:
            COMMAND_LINE.pop(name, None)
