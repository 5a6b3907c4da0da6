"""Pooling (schema 5): the declared form of the contract against the class.

A bundle declaring `capabilities.pooling` is served by vLLM's pooling runner, which calls
the class in one of two forms (`format.contract`, pooling): `forward(input_ids,
attention_mask)` (the reference plugin's), or `prefill_forward(...,
return_hidden_states=True)`. Whether the method exists at all is the contract check's
(TTB053, with the methods the form requires: `contract.pooling_required_methods`); here,
whether the worker can call it as the form says (TTB271), from the source (`ast`) and
from the imported class (`inspect`), one list of keywords for both.
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import (
    HIDDEN_STATES_KEYWORD,
    POOLING_FORWARD,
    PREFILL,
)
from ttbundles.format.metadata import Pooling


def _call(pooling: Pooling) -> tuple[str, tuple[str, ...]]:
    """The method the form calls and the keywords it passes by name."""
    if pooling.form == "forward":
        return POOLING_FORWARD.name, POOLING_FORWARD.passes
    return PREFILL.name, (*PREFILL.passes[:4], HIDDEN_STATES_KEYWORD)


def _hint(pooling: Pooling) -> str:
    if pooling.form == "forward":
        return (
            "define forward(self, input_ids, attention_mask) returning one pooled row per "
            "prompt ([B, hidden] for embed, [B, num_labels] for classify), or declare the "
            'form "prefill_hidden"'
        )
    return (
        f"let prefill_forward take {HIDDEN_STATES_KEYWORD} (or **kwargs) and return the "
        "final hidden states [B, L, hidden] when it is True"
    )


def static_pooling_diagnostics(
    methods: Mapping[str, object], pooling: Pooling | None, class_name: str
) -> list[Diagnostic]:
    """TTB271 where the source shows the form's method cannot be called as the worker
    calls it; a missing method is TTB053's, an alias with no visible signature
    `--import`'s."""
    if pooling is None:
        return []
    name, keywords = _call(pooling)
    definition = methods.get(name)
    node = getattr(definition, "node", None)
    if node is None:
        return []
    args = node.args
    named = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
    lacking = [] if args.kwarg is not None else [k for k in keywords if k not in named]
    positional = [*args.posonlyargs, *args.args][1:]  # self
    required = positional[: len(positional) - len(args.defaults)]
    required += [a for a, d in zip(args.kwonlyargs, args.kw_defaults) if d is None]
    unfilled = [a.arg for a in required if a.arg not in keywords]
    problems = []
    if lacking:
        problems.append(f"does not accept {', '.join(lacking)} as keyword arguments")
    if unfilled:
        problems.append(f"requires {', '.join(unfilled)}, which the worker does not pass")
    if not problems:
        return []
    return [
        Diagnostic(
            "TTB271",
            Severity.ERROR,
            f"{class_name}.{name} {'; '.join(problems)}; pooling (form {pooling.form!r}, "
            f"tasks {', '.join(pooling.tasks)}) is declared",
            file=str(getattr(definition, "file", "")) or None,
            line=getattr(definition, "line", None),
            hint=_hint(pooling),
        )
    ]


def imported_pooling_problems(cls: type, pooling: Pooling | None) -> list[dict]:
    """TTB271 of an imported class, as JSON-ready dicts (the import subprocess's)."""
    if pooling is None:
        return []
    name, keywords = _call(pooling)
    if not hasattr(cls, name):
        return []  # TTB053's
    member = getattr(cls, name)
    try:
        signature = inspect.signature(member)
    except (TypeError, ValueError):
        return []  # a builtin: nothing to say
    if inspect.isfunction(inspect.getattr_static(cls, name)):  # unbound: drop self
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    try:
        signature.bind(**dict.fromkeys(keywords, object()))
    except TypeError as exc:
        try:
            file, line = inspect.getsourcefile(member), inspect.getsourcelines(member)[1]
        except (TypeError, OSError):
            file, line = None, None
        call = f"{name}({', '.join(f'{k}=...' for k in keywords)})"
        return [
            {
                "code": "TTB271",
                "message": f"{cls.__name__}.{name} cannot be called as {call} ({exc}); "
                f"pooling (form {pooling.form!r}) is declared",
                "hint": _hint(pooling),
                "file": file,
                "line": line,
            }
        ]
    return []
