"""`capabilities.recurrent_state` owned by vLLM's KV manager (schema 6, owner "vllm")
against the class: what the worker hands such a class, read from source (`validate`) and
from the imported class (`validate --import`).

With that owner the worker gives every gated delta net layer a MambaSpec, allocates the
cache through `allocate_kv_cache_per_layer` (a GDN layer's entry is its state's
descriptor, which `allocate_kv_cache` cannot take; TTB261 at load) and sends each decode
row's state as `gdn_state_indices` (TTB053 at load for a decode that cannot take it).
With prefix caching declared it is vLLM's "align" mode, where the runner copies a state
from one Mamba block into another (`copy_recurrent_state`; TTB274 at plan without it).
All three are said here first: TTB054 for the missing method, TTB053 for the keyword, as the
worker would refuse them tens of seconds into a server. The owner's agreement with the
class's `model_capabilities['recurrent_state']` is `capabilities.owner_agreement`'s; the
generator-owned form needs nothing more of the contract (its `release_request` and
`note_state_slots_moved` are called where the class has them).
"""

from __future__ import annotations

import ast
import inspect
from collections.abc import Mapping

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import (
    ALLOCATE_KV_CACHE_PER_LAYER,
    COPY_STATE_METHOD,
    DECODE,
    STATE_INDICES_KEYWORD,
)
from ttbundles.format.metadata import Capabilities

_DOCS = "docs/authors/generator-contract.md#recurrent-state"
_OTHER_OWNER = "or declare capabilities.recurrent_state owner 'generator'"


def _vllm_owned(declared: Capabilities) -> bool:
    state = declared.recurrent_state
    return state is not None and state.owner == "vllm"


def _allocator_checked_here(declared: Capabilities) -> bool:
    """Declared KV groups need the same method: `kv_layout` says it then, once."""
    return not declared.kv_cache_spec


def _lacks_allocator(class_name: str) -> tuple[str, str]:
    return (
        f"capabilities.recurrent_state owner 'vllm' is declared but {class_name} lacks "
        f"{ALLOCATE_KV_CACHE_PER_LAYER.name}: a gated delta net layer's state is allocated "
        "from its descriptor, one entry per layer",
        f"implement {ALLOCATE_KV_CACHE_PER_LAYER.name}(per_layer_specs) ({_DOCS}), " + _OTHER_OWNER,
    )


def _lacks_copy(class_name: str) -> tuple[str, str]:
    return (
        "capabilities.recurrent_state owner 'vllm' and prefix_caching are declared but "
        f'{class_name} lacks {COPY_STATE_METHOD}: vLLM\'s "align" mode continues a '
        "state from one Mamba block in the next, which the runner copies through it (the "
        "plan refuses the bundle, TTB274)",
        f"implement {COPY_STATE_METHOD}(sources, targets) ({_DOCS}), or drop "
        "capabilities.prefix_caching, " + _OTHER_OWNER,
    )


def _needs_copy(declared: Capabilities) -> bool:
    return bool(declared.prefix_caching)


def _decode_takes_no_indices(class_name: str) -> tuple[str, str]:
    return (
        f"{class_name}.{DECODE.name} takes no {STATE_INDICES_KEYWORD}, which recurrent state "
        "vLLM's KV manager owns needs (each decode row's state): the worker refuses the "
        "class at load",
        f"give {DECODE.name} a {STATE_INDICES_KEYWORD}=None parameter (int32, one per row; "
        f"{_DOCS}), " + _OTHER_OWNER,
    )


def _takes(function: ast.AST, keyword: str) -> bool:
    """Whether a function node takes `keyword` by name or through **kwargs (the worker's
    rule: `serving.binding.BoundMethod.accepts`)."""
    args = function.args  # type: ignore[attr-defined]
    return args.kwarg is not None or keyword in {a.arg for a in args.args + args.kwonlyargs}


def static_diagnostics(
    methods: Mapping[str, object],
    declared: Capabilities,
    class_name: str,
    *,
    partial: bool,
    outside: str,
    where: dict,
) -> list[Diagnostic]:
    """TTB054 / TTB053 / TTB057 from the class's source (`methods`: name -> Definition)."""
    if not _vllm_owned(declared):
        return []
    out: list[Diagnostic] = []
    required = (  # (needed here, the method, what the bundle declares, the error's text)
        (
            _allocator_checked_here(declared),
            ALLOCATE_KV_CACHE_PER_LAYER.name,
            "capabilities.recurrent_state owner 'vllm' is declared",
            _lacks_allocator,
        ),
        (
            _needs_copy(declared),
            COPY_STATE_METHOD,
            "capabilities.recurrent_state owner 'vllm' and prefix_caching are declared",
            _lacks_copy,
        ),
    )
    for needed, method, declaring, lacks in required:
        if not needed or method in methods:
            continue
        if partial:
            out.append(
                Diagnostic(
                    "TTB057",
                    Severity.WARNING,
                    f"{declaring}; {method} is not in the bundle, may come from "
                    f"{outside}, outside it: not checkable here",
                    hint="run ttbundle validate --import where its dependencies are installed",
                    **where,
                )
            )
        else:
            message, hint = lacks(class_name)
            out.append(Diagnostic("TTB054", Severity.ERROR, message, hint=hint, **where))
    decode = methods.get(DECODE.name)
    node = getattr(decode, "node", None)
    if node is not None and not _takes(node, STATE_INDICES_KEYWORD):
        message, hint = _decode_takes_no_indices(class_name)
        out.append(
            Diagnostic(
                "TTB053",
                Severity.ERROR,
                message,
                file=str(decode.file),  # type: ignore[union-attr]
                line=decode.line,  # type: ignore[union-attr]
                hint=hint,
            )
        )
    return out


def imported_problems(cls: type, declared: Capabilities) -> list[dict]:
    """The same of an imported class, as JSON-ready dicts (`check.imports`)."""
    if not _vllm_owned(declared):
        return []
    name = cls.__name__
    problems: list[dict] = []
    if _allocator_checked_here(declared) and not callable(
        getattr(cls, ALLOCATE_KV_CACHE_PER_LAYER.name, None)
    ):
        message, hint = _lacks_allocator(name)
        problems.append({"code": "TTB054", "message": message, "hint": hint})
    if _needs_copy(declared) and not callable(getattr(cls, COPY_STATE_METHOD, None)):
        message, hint = _lacks_copy(name)
        problems.append({"code": "TTB054", "message": message, "hint": hint})
    decode = getattr(cls, DECODE.name, None)
    if callable(decode):
        try:
            parameters = inspect.signature(decode).parameters.values()
        except (TypeError, ValueError):
            return problems  # not introspectable: the signature checks say so
        if not any(
            p.kind is p.VAR_KEYWORD
            or (p.name == STATE_INDICES_KEYWORD and p.kind is not p.POSITIONAL_ONLY)
            for p in parameters
        ):
            message, hint = _decode_takes_no_indices(name)
            problems.append({"code": "TTB053", "message": message, "hint": hint})
    return problems
