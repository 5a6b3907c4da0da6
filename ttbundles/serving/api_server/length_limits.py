"""A request refused for the context length says why the limit is what it is.

When the plan lowers `max_model_len` (the bundle's target supports less than the user
asked for, TTB246 at start-up, or than the checkpoint's own length), vLLM's later
refusals, of a generation or a pooling request alike, name only the number ("This
model's maximum context length is 512 tokens"): a client, or the operator reading its
error, cannot tell that the server was started with 2048 or the model reads 8,192. The
refusals get one sentence more, naming the bundle and its target. Installed in the API
server, which checks prompts and max_tokens before anything reaches the engine.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ttbundles.serving.planning.plan import Plan

# What vLLM's context-length refusals say (0.33.0 and 0.34.0): any of these in the message.
_LENGTH_WORDS = ("maximum context length", "maximum model length", "max_model_len")

_installed: dict[str, str] = {}


def note(plan: Plan, asked: int, effective: int) -> str:
    """The sentence a length refusal ends with: the bundle's cap, and what it lowered
    (the length the user asked for, or the checkpoint's own when nobody asked)."""
    bundle = plan.bundle.label
    if "max_model_len" in plan.lowered_settings:
        return (
            f" (ttbundles: max_model_len is {effective} on this server, not {asked}: bundle "
            f"{bundle}'s target {plan.mesh} supports at most {effective}.)"
        )
    return (
        f" (ttbundles: max_model_len is {effective} on this server, under the checkpoint's "
        f"{asked}: bundle {bundle}'s target {plan.mesh} supports at most {effective}.)"
    )


def explain(exc: BaseException, text: str) -> None:
    """Append `text` to a length refusal `exc`, in place (its class, parameter and value
    stay: vLLM answers it as before, 400)."""
    message = str(exc.args[0]) if exc.args else ""
    if text in message or not any(word in message for word in _LENGTH_WORDS):
        return
    exc.args = (message + text, *exc.args[1:])


def explain_lowered_length(plan: Plan, asked: int, effective: int) -> None:
    """Wrap vLLM's length checks (`compat.prompt_length_checks`) so their refusals end
    with `note`; once per process."""
    from ttbundles.serving import compat

    _installed["note"] = note(plan, asked, effective)
    for owner, name in compat.prompt_length_checks():
        original = getattr(owner, name)
        if getattr(original, "_ttbundles_length", False):
            continue
        setattr(owner, name, _explaining(original))


def _explaining(check: Any) -> Any:
    @functools.wraps(check)
    def explained(*args: Any, **kwargs: Any) -> Any:
        try:
            return check(*args, **kwargs)
        except Exception as exc:  # VLLMValidationError (a ValueError on 0.33.0 only)
            explain(exc, _installed["note"])
            raise

    explained._ttbundles_length = True  # type: ignore[attr-defined]
    return explained
