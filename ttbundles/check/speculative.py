"""Speculative decoding and prompt logprobs (schema 3): the declaration against the class.

A bundle declares speculative decoding in its `capabilities` (`spec_decode`, the methods it
serves; `async_spec_decode`; `spec_requirements`; `spec_hidden_handoff`; `spec_plan`),
one to one with the reference plugin's class keys (vllm-tt-plugin
`docs/SPEC_DECODE_CONTRACT.md`). The platform decides from the declaration without
importing the class, so `validate` holds the declaration to the class, as for the other
capabilities:

- the class's `model_capabilities`, by TT-Metal's rule (an absent key is "not supported"):
  declaring more than the class says is an error (TTB230), less a warning (TTB231);
- the methods the declaration needs: `spec_plan` a classmethod the worker can call with
  three positional arguments (TTB232); `custom_class` a `propose_draft_tokens`, and any
  method a `decode_forward` that takes the verify keywords (TTB233);
- `prompt_logprobs`: `prefill_forward` takes `return_prompt_logits` (TTB240).

The agreement is pure and shared by the static check (values read with `ast`) and
`validate --import` (the class attribute); the signature checks come in both forms, one
on `ast` functions, one on `inspect` signatures (run in the import subprocess).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping

from ttbundles.check.capabilities import ClassCapabilities
from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import (
    CAPABILITIES_ATTRIBUTE,
    DECODE,
    PREFILL,
    PROMPT_LOGITS_KEYWORD,
    PROPOSE_DRAFT_TOKENS,
    SPEC_DECODE_KEY,
    SPEC_KEYS,
    SPEC_LIST_KEYS,
    SPEC_PLAN,
    VERIFY_KEYWORDS,
)
from ttbundles.format.metadata import Capabilities

_PLAN_CALL = "spec_plan(vllm_config, max_num_seqs, requested_k)"
_PROPOSE_CALL = (
    "propose_draft_tokens(num_drafts, committed_tokens, committed_positions, "
    "accepted_counts, hidden=None)"
)


def declared_value(declared: Capabilities, key: str) -> object:
    """The bundle's value mirroring the class key `key` (`contract.SPEC_KEYS`)."""
    return getattr(declared, SPEC_KEYS[key])


def spec_agreement(
    caps: ClassCapabilities, declared: Capabilities, class_name: str, meta_file: str
) -> list[Diagnostic]:
    """TTB230 / TTB231 where the declaration and the class's speculative keys differ, and
    a note (the caller's unverifiable code) where the class's value is not known here."""
    out: list[Diagnostic] = []
    attribute = f"{class_name}.{CAPABILITIES_ATTRIBUTE}"
    where = f" ({caps.where})" if caps.where else ""
    speculating = bool(declared.spec_decode)
    for key, name in SPEC_KEYS.items():
        value = getattr(declared, name)
        pointer = f"/capabilities/{name}"
        why = caps.unknown.get(key) or (caps.open if key not in caps.values else None)
        if why is not None:
            if not value and key not in caps.unknown:
                continue
            code, reason = why
            out.append(
                Diagnostic(
                    code,
                    Severity.WARNING if value else Severity.INFO,
                    f"{attribute}[{key!r}] {reason}; capabilities.{name} ({value!r}) was not "
                    "compared with it",
                    file=meta_file,
                    pointer=pointer,
                    hint="run ttbundle validate --import where the class's dependencies are "
                    f"installed, to compare it{where}",
                )
            )
            continue
        if key in SPEC_LIST_KEYS:
            out.extend(
                _list_agreement(caps, key, name, value, attribute, meta_file, where, speculating)
            )
            continue
        supported = caps.values.get(key, False)
        if value and not supported:
            if caps.absent:
                state = f"is not defined, which the reference plugin reads as {key!r}: False"
            elif key in caps.values:
                state = f"has {key!r}: {caps.literals.get(key, False)!r}"
            else:
                state = f"does not list {key!r} (an absent key is not supported)"
            out.append(
                Diagnostic(
                    "TTB230",
                    Severity.ERROR,
                    f"capabilities.{name} declares {value!r}, but {attribute} {state}",
                    file=meta_file,
                    pointer=pointer,
                    hint=f"drop capabilities.{name}, or implement it and set {key!r}: True "
                    f"in the class{where}",
                )
            )
        elif supported and not value and (key == SPEC_DECODE_KEY or speculating):
            served = (
                "the bundle declares no speculative method, so speculative decoding is refused"
                if key == SPEC_DECODE_KEY
                else "so speculation runs with synchronous scheduling only"
            )
            out.append(
                Diagnostic(
                    "TTB231",
                    Severity.WARNING,
                    f"{attribute}[{key!r}] is True but capabilities.{name} is {value!r}: "
                    f"{served} (safe)",
                    file=meta_file,
                    pointer=pointer,
                    hint=(
                        'declare the methods served, e.g. "spec_decode": ["ngram"] '
                        "(schema_version 3)"
                        if key == SPEC_DECODE_KEY
                        else f"declare {name}: true to use it"
                    )
                    + f", or set {key!r}: False in the class{where}",
                )
            )
    return out


def _list_agreement(
    caps: ClassCapabilities,
    key: str,
    name: str,
    value: list[str],
    attribute: str,
    meta_file: str,
    where: str,
    speculating: bool,
) -> list[Diagnostic]:
    pointer = f"/capabilities/{name}"
    literal = caps.literals.get(key, []) if key in caps.values else []
    if not isinstance(literal, list | tuple | set | frozenset) or not all(
        isinstance(item, str) for item in literal
    ):
        return [
            Diagnostic(
                "TTB230",
                Severity.ERROR,
                f"{attribute}[{key!r}] is {literal!r}, not a list of names",
                file=meta_file,
                pointer=pointer,
                hint=f"write it as a list, e.g. {key!r}: [{', '.join(repr(v) for v in value)}]"
                f"{where}",
            )
        ]
    out = []
    beyond = [item for item in value if item not in literal]
    if beyond:
        out.append(
            Diagnostic(
                "TTB230",
                Severity.ERROR,
                f"capabilities.{name} lists {', '.join(map(repr, beyond))}, which "
                f"{attribute}[{key!r}] ({sorted(literal)!r}) does not",
                file=meta_file,
                pointer=pointer,
                hint=f"drop {', '.join(map(repr, beyond))}, or add it to the class's "
                f"{key!r}{where}",
            )
        )
    below = sorted(set(literal) - set(value))
    if below and speculating:
        out.append(
            Diagnostic(
                "TTB231",
                Severity.WARNING,
                f"{attribute}[{key!r}] has {', '.join(map(repr, below))}, which "
                f"capabilities.{name} leaves off (safe: not served)",
                file=meta_file,
                pointer=pointer,
                hint=f"list {', '.join(map(repr, below))} in capabilities.{name} to serve it",
            )
        )
    return out


def spec_from_mapping(
    values: Mapping[str, object] | None, where: str | None = None
) -> ClassCapabilities:
    """The speculative keys of a real `model_capabilities` dict (read by `--import`)."""
    if values is None:
        return ClassCapabilities(absent=True, where=where)
    present = {key: values[key] for key in SPEC_KEYS if key in values}
    return ClassCapabilities(
        values={key: bool(value) for key, value in present.items()},
        literals=dict(present),
        where=where,
    )


def json_ready(values: Mapping[str, object]) -> dict[str, object]:
    """The speculative keys of a class's dict as JSON (sets become sorted lists)."""
    out: dict[str, object] = {}
    for key in SPEC_KEYS:
        if key not in values:
            continue
        value = values[key]
        if isinstance(value, set | frozenset | tuple):
            value = sorted(value) if isinstance(value, set | frozenset) else list(value)
        out[key] = value if isinstance(value, bool | int | float | str | list) else repr(value)
    return out


# --- the methods, statically (ast) ----------------------------------------------------


def static_method_diagnostics(
    methods: Mapping[str, object],
    declared: Capabilities,
    class_name: str,
    *,
    partial: bool,
    outside: str,
    class_file: str,
    class_line: int,
) -> list[Diagnostic]:
    """TTB232 / TTB233 / TTB240 from the class's source (`methods`: name -> Definition);
    what may be inherited from outside the bundle is TTB057, not guessed."""
    needs = _required_methods(declared)
    out: list[Diagnostic] = []
    for name, code in needs:
        definition = methods.get(name)
        if definition is None:
            if partial:
                out.append(
                    Diagnostic(
                        "TTB057",
                        Severity.WARNING,
                        f"{_why(name, declared)} is declared; {name} is not in the bundle, may "
                        f"come from {outside}, outside it: not checkable here",
                        file=class_file,
                        line=class_line,
                        hint="run ttbundle validate --import where its dependencies are installed",
                    )
                )
            elif name not in (DECODE.name, PREFILL.name):  # those are TTB053 already
                out.append(
                    Diagnostic(
                        code,
                        Severity.ERROR,
                        f"{_why(name, declared)} is declared but {class_name} lacks {name}",
                        file=class_file,
                        line=class_line,
                        hint=_hint(name),
                    )
                )
            continue
        node = getattr(definition, "node", None)
        if node is None:
            continue  # an alias whose signature is not visible: --import checks it
        problem = _static_problem(name, node)
        if problem:
            out.append(
                Diagnostic(
                    code,
                    Severity.ERROR,
                    f"{class_name}.{name} {problem}; {_why(name, declared)} is declared",
                    file=str(definition.file),
                    line=definition.line,
                    hint=_hint(name),
                )
            )
    return out


def _static_problem(name: str, node: ast.AST) -> str | None:
    args = node.args  # type: ignore[attr-defined]
    positional = [*args.posonlyargs, *args.args]
    if name == SPEC_PLAN.name:
        decorators = [_decorator_name(d) for d in getattr(node, "decorator_list", [])]
        if "classmethod" not in decorators:
            return f"must be a classmethod, called as {_PLAN_CALL} before any instance exists"
        return _arity_problem(positional[1:], args, 3, (), _PLAN_CALL)
    if name == PROPOSE_DRAFT_TOKENS.name:
        return _arity_problem(positional[1:], args, 4, ("hidden",), _PROPOSE_CALL)
    keywords = VERIFY_KEYWORDS if name == DECODE.name else (PROMPT_LOGITS_KEYWORD,)
    if args.kwarg is not None:
        return None
    named = {a.arg for a in (*args.args, *args.kwonlyargs)}
    lacking = [k for k in keywords if k not in named]
    if lacking:
        return f"does not accept {', '.join(lacking)} as keyword arguments"
    return None


def _arity_problem(
    positional: list[ast.arg],
    args: ast.arguments,
    leading: int,
    keywords: tuple[str, ...],
    call: str,
) -> str | None:
    """Whether `leading` positional arguments and `keywords` by name fill the signature."""
    if len(positional) < leading and args.vararg is None:
        return f"takes {len(positional)} positional arguments; the worker calls {call}"
    with_default = len(args.defaults)
    required = positional[: len(positional) - with_default][leading:]
    unfilled = [a.arg for a in required if a.arg not in keywords]
    unfilled += [
        a.arg
        for a, default in zip(args.kwonlyargs, args.kw_defaults)
        if default is None and a.arg not in keywords
    ]
    if unfilled:
        return f"requires {', '.join(unfilled)}, which the worker does not pass ({call})"
    named = {a.arg for a in (*positional[leading:], *args.kwonlyargs)}
    lacking = [k for k in keywords if k not in named and args.kwarg is None]
    if lacking:
        return f"does not accept {', '.join(lacking)}; the worker calls {call}"
    return None


def _decorator_name(node: ast.expr) -> str:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


# --- the methods, imported (inspect) --------------------------------------------------


def imported_method_problems(cls: type, declared: Capabilities) -> list[dict]:
    """TTB232 / TTB233 / TTB240 of an imported class, as JSON-ready dicts."""
    out: list[dict] = []
    name = cls.__name__

    def problem(code: str, message: str, method: str, member: object = None) -> None:
        file, line = _line_of(member)
        out.append(
            {"code": code, "message": message, "hint": _hint(method), "file": file, "line": line}
        )

    checks = _required_methods(declared)
    for method, code in checks:
        why = _why(method, declared)
        if not hasattr(cls, method):
            if method not in (DECODE.name, PREFILL.name):
                problem(code, f"{why} is declared but {name} lacks {method}", method)
            continue
        member = getattr(cls, method)
        static = inspect.getattr_static(cls, method)
        if method == SPEC_PLAN.name and not isinstance(static, classmethod):
            problem(
                code,
                f"{name}.{method} must be a classmethod, called as {_PLAN_CALL} before any "
                f"instance exists; {why} is declared",
                method,
                member,
            )
            continue
        try:
            signature = inspect.signature(member)
        except (TypeError, ValueError):
            continue  # a builtin: nothing to say
        if inspect.isfunction(static):  # unbound: drop self
            params = list(signature.parameters.values())[1:]
            signature = signature.replace(parameters=params)
        placeholder = object()
        if method == SPEC_PLAN.name:
            trial = ((placeholder,) * 3, {})
        elif method == PROPOSE_DRAFT_TOKENS.name:
            trial = ((placeholder,) * 4, {"hidden": None})
        else:
            base = DECODE.passes[:4] if method == DECODE.name else PREFILL.passes[:4]
            extra = VERIFY_KEYWORDS if method == DECODE.name else (PROMPT_LOGITS_KEYWORD,)
            trial = ((), dict.fromkeys((*base, *extra), placeholder))
        try:
            signature.bind(*trial[0], **trial[1])
        except TypeError as exc:
            call = {
                SPEC_PLAN.name: _PLAN_CALL,
                PROPOSE_DRAFT_TOKENS.name: _PROPOSE_CALL,
            }.get(method, f"{method}(..., {', '.join(f'{k}=...' for k in trial[1])})")
            problem(
                code,
                f"{name}.{method} cannot be called as {call} ({exc}); {why} is declared",
                method,
                member,
            )
    return out


def _line_of(member: object) -> tuple[str | None, int | None]:
    if member is None:
        return None, None
    try:
        return inspect.getsourcefile(member), inspect.getsourcelines(member)[1]  # type: ignore[arg-type]
    except (TypeError, OSError):
        return None, None


def _why(method: str, declared: Capabilities) -> str:
    if method == SPEC_PLAN.name:
        return "spec_plan"
    if method == PROPOSE_DRAFT_TOKENS.name:
        return "spec_decode 'custom_class' (the model's own drafter)"
    if method == DECODE.name:
        methods = "+".join(declared.spec_decode)
        return f"spec_decode ({methods}: the target verifies drafts in decode_forward)"
    return "prompt_logprobs"


def _hint(method: str) -> str:
    if method == SPEC_PLAN.name:
        return (
            f"define @classmethod {_PLAN_CALL} returning a plan or a refusal, or declare "
            "spec_plan: false"
        )
    if method == PROPOSE_DRAFT_TOKENS.name:
        return f"define {_PROPOSE_CALL}, or drop 'custom_class' from spec_decode"
    if method == DECODE.name:
        return (
            f"take {', '.join(VERIFY_KEYWORDS)} as keyword arguments (or **kwargs) and answer "
            "a verify with a VerifyOutput, or drop spec_decode"
        )
    return (
        f"take {PROMPT_LOGITS_KEYWORD} (or **kwargs) and return [B, L, V] logits when it is "
        "True, or declare prompt_logprobs: false"
    )


def _required_methods(declared: Capabilities) -> list[tuple[str, str]]:
    """(method, code) for each method the declaration needs of the class: one list for
    the static reader and `--import`, so the two cannot drift apart."""
    needs: list[tuple[str, str]] = []
    if declared.spec_plan:
        needs.append((SPEC_PLAN.name, "TTB232"))
    if declared.spec_drafter:
        needs.append((PROPOSE_DRAFT_TOKENS.name, "TTB233"))
    if declared.spec_decode:
        needs.append((DECODE.name, "TTB233"))
    if declared.prompt_logprobs:
        needs.append((PREFILL.name, "TTB240"))
    return needs
