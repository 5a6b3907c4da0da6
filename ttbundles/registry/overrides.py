"""`TT_MODEL_CLASS_OVERRIDES`: generator classes named at launch, as the reference plugin
reads them.

`TT_MODEL_CLASS_OVERRIDES="Arch=module:Class,..."` registers `Class` for `Arch` under both
the name as written and its `TT` form, before anything else and whatever the rest of the
environment says: an override wins over every bundle for its architecture. Parsing is
strict, as in the reference plugin: an item that is not `Arch=module:Class` stops
registration with an error naming the item (and here the fix too). Whitespace around items
is ignored and empty items (a trailing comma) are skipped, also as there.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from ttbundles import envs
from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format.metadata import ARCH_PATTERN, MAIN_CLASS_PATTERN, tt_arch_name

VARIABLE = "TT_MODEL_CLASS_OVERRIDES"
CODE = "TTB104"
_EXAMPLE = "TTLlamaForCausalLM=models.tt_transformers.tt.generator_vllm:LlamaForCausalLM"


@dataclass(frozen=True)
class Override:
    """One `Arch=module:Class` item."""

    item: str  # as written (stripped), for messages
    arch: str  # as written: bare (`LlamaForCausalLM`) or TT-prefixed
    target: str  # `module:Class`

    @property
    def tt_arch(self) -> str:
        return tt_arch_name(self.arch)

    @property
    def names(self) -> tuple[str, ...]:
        """The names registered: the one written, and its TT form when that differs."""
        return (self.arch,) if self.arch == self.tt_arch else (self.arch, self.tt_arch)

    @property
    def module(self) -> str:
        return self.target.partition(":")[0]

    @property
    def class_name(self) -> str:
        return self.target.partition(":")[2]


def parse(value: str | None) -> list[Override]:
    """The items of a `TT_MODEL_CLASS_OVERRIDES` value, in order; raises
    ConfigurationError (TTB104) naming every malformed item."""
    overrides: list[Override] = []
    problems: list[Diagnostic] = []
    seen: dict[str, Override] = {}
    for raw in (value or "").split(","):
        item = raw.strip()
        if not item:
            continue
        arch, sep, target = (part.strip() for part in item.partition("="))
        problem = _problem(arch, sep, target)
        if problem is not None:
            message, hint = problem
            problems.append(_diagnostic(f"{VARIABLE} item {item!r}: {message}", hint))
            continue
        override = Override(item, arch, target)
        earlier = seen.get(override.tt_arch)
        if earlier is not None:
            problems.append(
                _diagnostic(
                    f"{VARIABLE} items {earlier.item!r} and {item!r} both override "
                    f"{override.tt_arch}",
                    "keep one class per architecture",
                )
            )
            continue
        seen[override.tt_arch] = override
        overrides.append(override)
    if problems:
        raise ConfigurationError(problems)
    return overrides


def read(environ: Mapping[str, str] | None = None) -> list[Override]:
    """The overrides `environ` (default: this process's environment) sets."""
    return parse(envs.read(VARIABLE, environ))


def _problem(arch: str, sep: str, target: str) -> tuple[str, str] | None:
    if not sep:
        return "no '=' between the architecture and the class", f"write e.g. {_EXAMPLE}"
    if not arch:
        return "the architecture before '=' is empty", f"write e.g. {_EXAMPLE}"
    if not re.match(ARCH_PATTERN, arch):
        return (
            f"architecture {arch!r} is not a Python identifier",
            "write the Hugging Face architecture, e.g. LlamaForCausalLM or TTLlamaForCausalLM",
        )
    if not target:
        return "no class after '='", f"write module:Class after '=', e.g. {_EXAMPLE}"
    if not re.match(MAIN_CLASS_PATTERN, target):
        return (
            f"{target!r} is not of the form module:Class",
            f"separate the module and the class with ':', e.g. {_EXAMPLE}",
        )
    return None


def _diagnostic(message: str, hint: str) -> Diagnostic:
    return Diagnostic(
        CODE,
        Severity.ERROR,
        message,
        hint=hint + "; items are separated by ','",
    )


__all__ = ["Override", "parse", "read"]
