"""Capability agreement: a bundle's declared `capabilities` against the class's own
`model_capabilities`, by TT-Metal's rule.

TT-Metal (`models/common/model_capabilities.py`) reads the class attribute, and a
subclass's dict *replaces* the inherited one, so a key the class does not list means "not
supported". Hence, per key of `contract.CAPABILITY_KEYS`:

- the bundle declares a capability the class does not support (False, or absent): an
  error, TTB056; the platform would switch on something the generator cannot do;
- the bundle declares less than the class supports: safe (the feature stays off), a
  warning, TTB059;
- the class's value cannot be known here (computed, or from code outside the bundle): that
  key is not compared, with a note naming it; a warning when the bundle switches the
  capability on, since only then could a disagreement hide.

Shared by the static check (values read with `ast`) and `validate --import` (the real
class attribute); pure, no I/O.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import (
    CAPABILITIES_ATTRIBUTE,
    CAPABILITY_KEYS,
    OUTPUT_TOKENS_PER_STEP_KEY,
    RECURRENT_STATE_KEY,
)
from ttbundles.format.contract_keys import KNOWN_CAPABILITY_KEYS
from ttbundles.format.metadata import Capabilities


@dataclass
class ClassCapabilities:
    """What is known of a class's `model_capabilities`.

    `values`: keys whose value is known (as TT-Metal reads it: truthy or not); `unknown`:
    keys the class lists whose value is not known here, with (code, why); `open`: set when
    keys beyond those listed may exist (an unresolved `**spread`, a computed dict), with
    (code, why). A key in none of them is absent: not supported.
    """

    values: dict[str, bool] = field(default_factory=dict)
    unknown: dict[str, tuple[str, str]] = field(default_factory=dict)
    open: tuple[str, str] | None = None
    where: str | None = None
    """`file:line` of the definition, for hints."""
    literals: dict[str, object] = field(default_factory=dict)
    """The literal value of each key in `values` (numbers such as max_device_top_k)."""
    absent: bool = False
    """No class seen defines the attribute at all: TT-Metal and the reference plugin read
    that as "nothing supported", so every declared capability is compared with False."""

    def update(self, other: ClassCapabilities) -> None:
        """Apply `other` over these, as a later `**other` entry of a dict literal does."""
        if other.open is not None:
            # Anything listed so far may be overridden by keys `other` does not show.
            for key in list(self.values):
                self.unknown[key] = other.open
            self.values.clear()
            self.open = other.open
        for key, value in other.values.items():
            self.values[key] = value
            self.unknown.pop(key, None)
            if key in other.literals:
                self.literals[key] = other.literals[key]
            else:
                self.literals.pop(key, None)
        for key, why in other.unknown.items():
            self.unknown[key] = why
            self.values.pop(key, None)
            self.literals.pop(key, None)


def agreement(
    caps: ClassCapabilities, declared: Capabilities, class_name: str, meta_file: str
) -> list[Diagnostic]:
    """TTB056 / TTB059 per key where class and bundle differ, and a note per key that
    could not be compared."""
    out: list[Diagnostic] = []
    where = f" ({caps.where})" if caps.where else ""
    for key, name in CAPABILITY_KEYS.items():
        value = getattr(declared, name)
        on = bool(value)
        pointer = f"/capabilities/{name}"
        attribute = f"{class_name}.{CAPABILITIES_ATTRIBUTE}"
        why = caps.unknown.get(key) or (caps.open if key not in caps.values else None)
        if why is not None:
            code, reason = why
            listed = key in caps.unknown
            if not (on or listed):
                continue  # nothing declared, nothing the class names: nothing to say
            out.append(
                Diagnostic(
                    code,
                    Severity.WARNING if on else Severity.INFO,
                    f"{attribute}[{key!r}] {reason}; capabilities.{name} "
                    f"({value!r}) was not compared with it",
                    file=meta_file,
                    pointer=pointer,
                    hint="run ttbundle validate --import where the class's dependencies "
                    f"are installed, to compare it{where}",
                )
            )
            continue
        supported = caps.values.get(key, False)
        if on and not supported:
            if caps.absent:
                state = (
                    f"is not defined: {class_name} and its bases have no "
                    f"{CAPABILITIES_ATTRIBUTE}, which TT-Metal and the reference plugin read as "
                    f"nothing supported, so {key!r} is off"
                )
            elif key in caps.values:
                state = f"has {key!r}: False"
            else:
                state = (
                    f"does not list {key!r} (TT-Metal reads an absent key as not supported, "
                    "and a class's dict replaces the one it inherits)"
                )
            out.append(
                Diagnostic(
                    "TTB056",
                    Severity.ERROR,
                    f"capabilities.{name} declares {value!r}, but {attribute} {state}",
                    file=meta_file,
                    pointer=pointer,
                    hint=f"declare {name}: {getattr(Capabilities(), name)!r}, or implement it "
                    f"and set {key!r}: True in the class{where}",
                )
            )
        elif supported and not on:
            out.append(
                Diagnostic(
                    "TTB059",
                    Severity.WARNING,
                    f"{attribute}[{key!r}] is True but capabilities.{name} is {value!r}: "
                    "the bundle declares less than the class supports, so it stays off (safe)",
                    file=meta_file,
                    pointer=pointer,
                    hint=f"declare it in capabilities.{name} to use it, or set {key!r}: False "
                    f"in the class{where}",
                )
            )
    return out


def owner_agreement(
    caps: ClassCapabilities, declared: Capabilities, class_name: str, meta_file: str
) -> list[Diagnostic]:
    """TTB056 when the class names another owner of the recurrent state than the bundle:
    the two forms hand the class different things (its own slots, or vLLM's state
    indices), so a mismatch would feed it the wrong one. Whether the key is there at all
    is `agreement`'s."""
    state = declared.recurrent_state
    owner = caps.literals.get(RECURRENT_STATE_KEY)
    if state is None or not isinstance(owner, str) or owner == state.owner:
        return []
    return [
        Diagnostic(
            "TTB056",
            Severity.ERROR,
            f"capabilities.recurrent_state.owner is {state.owner!r}, but "
            f"{class_name}.{CAPABILITIES_ATTRIBUTE}[{RECURRENT_STATE_KEY!r}] is {owner!r}",
            file=meta_file,
            pointer="/capabilities/recurrent_state/owner",
            hint=f"name one owner in both: the class keeps the state ('generator') or "
            f"vLLM's KV manager does ('vllm'){f' ({caps.where})' if caps.where else ''}",
        )
    ]


def key_notes(caps: ClassCapabilities, class_name: str, meta_file: str) -> list[Diagnostic]:
    """What the class's other keys mean here (`contract_keys.KNOWN_CAPABILITY_KEYS`): a
    block width that is no positive integer (TTB275, as the plan refuses it), a
    `fabric_config` not applied (warning), a key ttbundles does not know (a note, for
    `validate -v`)."""
    out: list[Diagnostic] = []
    attribute = f"{class_name}.{CAPABILITIES_ATTRIBUTE}"
    steps = caps.literals.get(OUTPUT_TOKENS_PER_STEP_KEY, 1)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        out.append(
            Diagnostic(
                "TTB275",
                Severity.ERROR,
                f"{attribute}[{OUTPUT_TOKENS_PER_STEP_KEY!r}] is {steps!r}: the tokens one "
                "decode returns per row must be a positive integer",
                file=meta_file,
                hint="declare output_tokens_per_step as an int: 1, or k > 1 for block "
                "output (docs/authors/generator-contract.md#block-output)",
            )
        )
    if "fabric_config" in caps.values or "fabric_config" in caps.unknown:
        out.append(
            Diagnostic(
                "TTB064",
                Severity.WARNING,
                f"{attribute} declares fabric_config, which this worker does not apply: the "
                "mesh opens with the device option tt.fabric_config (or the default)",
                file=meta_file,
                hint="set --additional-config.tt.fabric_config to the fabric the class needs",
            )
        )
    for key in sorted({*caps.values, *caps.unknown} - set(KNOWN_CAPABILITY_KEYS)):
        out.append(
            Diagnostic(
                "TTB064",
                Severity.INFO,
                f"{attribute} has {key!r}, a key ttbundles does not know: it has no effect "
                "here (the reference plugin ignores keys it does not read too)",
                file=meta_file,
                hint="check the key against vllm-tt-plugin docs/MODEL_CAPABILITIES.md",
            )
        )
    return out


def from_mapping(
    values: Mapping[str, object] | None, where: str | None = None
) -> ClassCapabilities:
    """A real `model_capabilities` dict (read by `--import`), as TT-Metal reads it; None
    when the class has no such attribute (nothing supported)."""
    if values is None:
        return ClassCapabilities(absent=True, where=where)
    return ClassCapabilities(
        values={key: bool(values[key]) for key in CAPABILITY_KEYS if key in values},
        where=where,
        literals={key: values[key] for key in CAPABILITY_KEYS if key in values},
    )
