"""Bind the worker's calls to the generator class it loads, as that class declares them.

TT-Metal's generator classes do not share one signature (`format.contract`): the legacy
Llama-2-70B class takes `(hf_config, t3k_mesh_device, max_batch_size)` only, several
classes assert `optimizations is None`, v1 classes reject `reset_batch`, Mllama's prefill
requires images. So every call goes through a `BoundMethod` built once at load from the
method's real signature: it passes the keywords the signature accepts (all of them to a
`**kwargs` method, unless its source shows the `**kwargs` only forwarded to a method that
accepts fewer: `format.forwarding`), under the name the class uses, and a required
parameter the worker cannot supply is refused at load, naming it, instead of a TypeError
on the first request.

Return forms are normalised here too (`split_output`), so the model runner sees one shape
whichever generation of TT-Metal class it drives.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ttbundles.errors import ConfigurationError, TTBundleError
from ttbundles.format import contract
from ttbundles.format.contract import Method
from ttbundles.format.forwarding import accepted_keywords


class GeneratorContractError(ConfigurationError):
    """The generator class cannot be driven by this worker (found at load)."""


@dataclass(frozen=True)
class BoundMethod:
    """One contract method of one class: which worker keywords reach it, under which
    names. Calling it passes only those."""

    owner: str
    method: Method
    function: Callable[..., Any]
    names: dict[str, str]  # worker keyword -> the parameter name the class uses
    takes_any: bool  # the method has **kwargs that is not only forwarded (format.forwarding)

    def __call__(self, *leading: Any, **values: Any) -> Any:
        kwargs = {}
        for key, value in values.items():
            name = self.names.get(key)
            if name is not None:
                kwargs[name] = value
            elif self.takes_any and value is not None:
                kwargs[key] = value
        return self.function(*leading, **kwargs)

    def accepts(self, keyword: str) -> bool:
        """Whether the method can take `keyword` (by name, or through **kwargs)."""
        return keyword in self.names or self.takes_any


def bind(
    owner: Any,
    method: Method,
    offered: Iterable[str],
    *,
    class_name: str,
    optional: bool = False,
) -> BoundMethod | None:
    """`method` of `owner` (a class for classmethods, an instance otherwise) bound to the
    keywords the worker `offered`; None when an optional method is absent."""
    function = getattr(owner, method.name, None)
    if function is None:
        if optional or not method.required:
            return None
        raise GeneratorContractError.single(
            "TTB053",
            f"{class_name} has no {method.name}",
            hint="implement the generator contract (see ttbundle init's template)",
        )
    offered = tuple(offered)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C extension: trust it with everything
        return BoundMethod(class_name, method, function, {k: k for k in offered}, True)
    if method.kind == "method" and isinstance(owner, type) and inspect.isfunction(function):
        # An instance method checked on the class, before any instance (and any weights)
        # exists: `self` is not the worker's to fill.
        signature = signature.replace(parameters=list(signature.parameters.values())[1:])
    parameters = signature.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in parameters.values())
    forwarded: frozenset[str] = frozenset()
    if takes_any:
        # A **kwargs only handed on to another method accepts what that one accepts.
        accepted = accepted_keywords(owner if isinstance(owner, type) else type(owner), function)
        takes_any, forwarded = accepted.any, accepted.names
    names: dict[str, str] = {}
    for keyword in offered:
        for name in (keyword, *method.aliases.get(keyword, ())):
            parameter = parameters.get(name)
            if parameter is not None and parameter.kind not in (
                parameter.POSITIONAL_ONLY,
                parameter.VAR_POSITIONAL,
                parameter.VAR_KEYWORD,
            ):
                names[keyword] = name
                break
            if name in forwarded:
                names[keyword] = name
                break
    supplied = set(names.values())
    positional = [
        n for n, p in parameters.items() if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
    ]
    supplied |= set(positional[: method.leading])
    missing = [
        name
        for name, p in parameters.items()
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and name not in supplied
    ]
    if missing:
        multimodal = [name for name in missing if name in contract.MULTIMODAL_PARAMETERS]
        if multimodal:
            raise GeneratorContractError.single(
                "TTB202",
                f"{class_name}.{method.name} requires {', '.join(multimodal)}: "
                f"{contract.MULTIMODAL_REFUSAL}",
                hint=contract.MULTIMODAL_HINT,
            )
        raise GeneratorContractError.single(
            "TTB062",
            f"{class_name}.{method.name} requires {', '.join(missing)}, which the worker "
            f"does not supply (it passes: {', '.join(offered)})",
            hint="give those parameters defaults, or check the class against "
            "`ttbundle validate --import`",
        )
    return BoundMethod(class_name, method, function, names, takes_any)


def call_at_load(bound: BoundMethod, context: str, **values: Any) -> Any:
    """Call a load-time method (`get_max_tokens_all_users`), turning what it raises into a
    load error naming the class, the method and `context` (the model and mesh asked for).

    TT-Metal's model-specific KV budgets raise outside the checkpoints and meshes they
    know (DeepSeek-V3's accepts only DeepSeek-R1-0528 on Wormhole): that is a
    configuration the generator refuses, to be said as such before any request."""
    try:
        return bound(**values)
    except TTBundleError:
        raise
    except Exception as exc:  # noqa: BLE001 - any refusal of the generator's own code
        raise GeneratorContractError.single(
            "TTB063",
            f"{bound.owner}.{bound.method.name} refused {context}: {type(exc).__name__}: {exc}",
            hint="serve a checkpoint and mesh this generator supports, or size the KV cache "
            "yourself with --kv-cache-memory-bytes (then the worker does not ask it)",
        ) from exc


def decode_offer(version: int) -> tuple[str, ...]:
    """The decode keywords for a class of that contract version."""
    allowed = contract.decode_keywords(version)
    return tuple(k for k in contract.DECODE.passes if k in allowed)


# --- return forms ----------------------------------------------------------------------


def split_output(out: Any) -> tuple[Any, Any]:
    """`(primary, extra)` of a generator result: a bare tensor is `(tensor, None)`; a
    tuple is its first item and its second (log-probs, or rope deltas)."""
    if isinstance(out, tuple | list) and out and not _is_tensor(out):
        first = out[0]
        second = out[1] if len(out) > 1 else None
        return first, second
    return out, None


def _is_tensor(value: Any) -> bool:
    return hasattr(value, "shape") and hasattr(value, "dtype")
