"""What a method that takes `**kwargs` really accepts: follow the keywords it forwards.

TT-Metal adapters often take `(*args, **kwargs)` and hand both to another method: the
Llama-2-70B adapter's `decode_forward(*args, reload_inputs, ..., **kwargs)` ends in
`super().decode_forward(*args, **kwargs)`, whose base takes only `(tokens, start_pos,
page_table=None, kv_cache=None)`. Reading `**kwargs` as "accepts everything" sends the
worker's `enable_trace` / `read_from_device` into that base, a `TypeError` on the first
decode. So where the method's source shows that `**kwargs` is only forwarded, whole, to
methods that can be found (`super().name`, `self.name`, a module-level function), what it
accepts is its own named parameters plus what those accept, followed the same way. Where
the source is not available, or `kwargs` is read (`kwargs["tokens"]`, `.pop`, `.get`),
the method is taken at its word: it accepts everything.

Pure Python (`inspect`, `ast`); nothing is called. Shared by the worker's binding and
`validate --import`.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


@dataclass(frozen=True)
class Accepted:
    """The keywords a method accepts: `names` by name; `any`: everything besides (a
    `**kwargs` that is read, or forwarded somewhere not followed); `via`: the methods
    the keywords were followed into, for messages."""

    names: frozenset[str]
    any: bool
    via: tuple[str, ...] = ()

    def accepts(self, keyword: str) -> bool:
        return self.any or keyword in self.names


def accepted_keywords(owner: type | None, function: Callable[..., Any], depth: int = 0) -> Accepted:
    """What `function` (a method of class `owner`, or a plain function) accepts by keyword.

    `owner` is the class whose MRO `super()` and `self.` calls are resolved in (the
    instance's class for `self.`, the defining class's successors for `super()`)."""
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        return Accepted(frozenset(), True)
    params = signature.parameters
    names = frozenset(n for n, p in params.items() if p.kind in _BY_NAME)
    var_kw = next((n for n, p in params.items() if p.kind is p.VAR_KEYWORD), None)
    if var_kw is None:
        return Accepted(names, False)
    if depth > 8:
        return Accepted(names, True)
    targets = _forward_targets(function, var_kw)
    if targets is None:
        return Accepted(names, True)
    collected = set(names)
    via: list[str] = []
    for kind, name in targets:
        target, target_owner = _resolve(owner, function, kind, name)
        if target is None:
            return Accepted(names, True)
        found = accepted_keywords(target_owner, target, depth + 1)
        if found.any:
            return Accepted(frozenset(collected | found.names), True, (*via, *found.via))
        collected |= found.names
        via.append(getattr(target, "__qualname__", name))
        via.extend(found.via)
    return Accepted(frozenset(collected), False, tuple(via))


def _forward_targets(function: Callable[..., Any], var_kw: str) -> list[tuple[str, str]] | None:
    """The calls `**var_kw` is forwarded to, as (kind, name) with kind "super", "self" or
    "global"; None when the source is not readable, the mapping is used any other way, or
    a call's target is not one of those forms."""
    try:
        source = textwrap.dedent(inspect.getsource(function))
        tree = ast.parse(source)
    except (OSError, TypeError, SyntaxError, IndentationError):
        return None
    node = next(
        (n for n in tree.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)), None
    )
    if node is None:
        return None
    forwarded: set[int] = set()
    targets: list[tuple[str, str]] = []
    for call in ast.walk(node):
        if not isinstance(call, ast.Call):
            continue
        for keyword in call.keywords:
            value = keyword.value
            if keyword.arg is None and isinstance(value, ast.Name) and value.id == var_kw:
                forwarded.add(id(value))
                target = _call_target(call.func)
                if target is None:
                    return None
                targets.append(target)
    uses = [
        n
        for n in ast.walk(node)
        if isinstance(n, ast.Name) and n.id == var_kw and id(n) not in forwarded
    ]
    if uses or not targets:
        return None  # read, rebound, or never forwarded: the method handles it itself
    return targets


def _call_target(func: ast.expr) -> tuple[str, str] | None:
    if isinstance(func, ast.Attribute):
        value = func.value
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id == "super"
            and not value.args
        ):
            return ("super", func.attr)
        if isinstance(value, ast.Name) and value.id in ("self", "cls"):
            return ("self", func.attr)
        return None
    if isinstance(func, ast.Name):
        return ("global", func.id)
    return None


def _resolve(
    owner: type | None, function: Callable[..., Any], kind: str, name: str
) -> tuple[Callable[..., Any] | None, type | None]:
    raw = getattr(function, "__func__", function)
    if kind == "global":
        target = getattr(raw, "__globals__", {}).get(name)
        return (target, None) if callable(target) else (None, None)
    if owner is None:
        return None, None
    if kind == "self":
        target = getattr(owner, name, None)
        return (target, owner) if callable(target) else (None, None)
    # super(): the classes after the one that defines `function`, in `owner`'s MRO.
    mro = owner.__mro__
    defining = next(
        (i for i, cls in enumerate(mro) if _defines(cls, raw)),
        None,
    )
    if defining is None:
        return None, None
    for cls in mro[defining + 1 :]:
        if name in vars(cls):
            member = vars(cls)[name]
            target = member.__get__(None, owner) if hasattr(member, "__get__") else member
            return (target, owner) if callable(target) else (None, None)
    return None, None


def _defines(cls: type, raw: Any) -> bool:
    return any(getattr(member, "__func__", member) is raw for member in vars(cls).values())
