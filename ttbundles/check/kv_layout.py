"""`capabilities.kv_cache_spec` (schema 5) against the class: the declaration and the
methods it needs agree, read from source (`validate`) and from the imported class
(`validate --import`).

Declared, the platform turns vLLM's hybrid KV-cache manager on and the worker asks the
class's `get_kv_cache_spec(vllm_config)` and allocates through
`allocate_kv_cache_per_layer` (layers of several KV groups share tensors, which
`allocate_kv_cache` cannot say): both must be there (TTB054). A class that answers
`get_kv_cache_spec` without the declaration is served with one KV group, every layer
keeping the whole context: correct, but not lean, so it is a warning (TTB263).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import ALLOCATE_KV_CACHE_PER_LAYER, KV_CACHE_SPEC
from ttbundles.format.metadata import Capabilities

NEEDED = (KV_CACHE_SPEC.name, ALLOCATE_KV_CACHE_PER_LAYER.name)
_DECLARE = "declare capabilities.kv_cache_spec: true (schema_version 5)"


def _undeclared_message(class_name: str) -> str:
    return (
        f"{class_name} answers {KV_CACHE_SPEC.name} but the bundle does not declare "
        "capabilities.kv_cache_spec: it is served with one KV group, every layer keeping "
        "the whole context"
    )


def static_diagnostics(
    methods: Mapping[str, object],
    declared: Capabilities,
    class_name: str,
    *,
    partial: bool,
    outside: str,
    where: dict,
) -> list[Diagnostic]:
    """TTB054 / TTB057 / TTB263 from the class's source (`methods`: name -> Definition)."""
    if not declared.kv_cache_spec:
        if KV_CACHE_SPEC.name in methods:
            return [
                Diagnostic(
                    "TTB263",
                    Severity.WARNING,
                    _undeclared_message(class_name),
                    hint=_DECLARE + " to serve its groups on vLLM's hybrid KV-cache manager",
                    **where,
                )
            ]
        return []
    lacking = [m for m in NEEDED if m not in methods]
    if not lacking:
        return []
    if partial:
        return [
            Diagnostic(
                "TTB057",
                Severity.WARNING,
                f"kv_cache_spec is declared; {', '.join(lacking)} not in the bundle, may come "
                f"from {outside}, outside it: not checkable here",
                hint="run ttbundle validate --import where its dependencies are installed",
                **where,
            )
        ]
    return [
        Diagnostic(
            "TTB054",
            Severity.ERROR,
            f"kv_cache_spec is declared but {class_name} lacks {', '.join(lacking)}",
            hint="implement them (docs/authors/generator-contract.md#hybrid-kv-caches), or "
            "declare kv_cache_spec: false",
            **where,
        )
    ]


def imported_problems(cls: type, declared: Capabilities) -> list[dict]:
    """The same of an imported class, as JSON-ready dicts (`check.imports`); a
    `get_kv_cache_spec` that is not a classmethod is TTB062 there already."""
    name = cls.__name__
    if not declared.kv_cache_spec:
        if callable(getattr(cls, KV_CACHE_SPEC.name, None)):
            return [
                {
                    "code": "TTB263",
                    "severity": "warning",
                    "message": _undeclared_message(name),
                    "hint": _DECLARE,
                }
            ]
        return []
    # get_kv_cache_spec itself is the contract method's `needs` (TTB054 in check_class).
    if not hasattr(cls, ALLOCATE_KV_CACHE_PER_LAYER.name):
        return [
            {
                "code": "TTB054",
                "message": f"kv_cache_spec is declared but {name} lacks "
                f"{ALLOCATE_KV_CACHE_PER_LAYER.name}",
                "hint": "implement it, or declare kv_cache_spec: false",
            }
        ]
    static = inspect.getattr_static(cls, ALLOCATE_KV_CACHE_PER_LAYER.name)
    if isinstance(static, classmethod | staticmethod):
        return [
            {
                "code": "TTB062",
                "message": f"{name}.{ALLOCATE_KV_CACHE_PER_LAYER.name} must be a method",
                "hint": "make it an instance method",
            }
        ]
    return []
