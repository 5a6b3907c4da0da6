"""Read `vllm_metadata.json` into a `BundleMetadata`, collecting every problem.

Reading never raises for bad input: it returns what it could build plus diagnostics
(JSON syntax, schema, legacy form), each with the file, a JSON pointer and line:column.
Validation of everything beyond the document itself lives in `validate`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, get_args

from pydantic import BaseModel, ValidationError

from ttbundles.errors import Diagnostic, Severity, missing_path
from ttbundles.format.jsonpos import locate, pointer
from ttbundles.format.meshes import MESH_NAMES
from ttbundles.format.meshes import suggest as suggest_mesh
from ttbundles.format.metadata import (
    EXTENSION_PREFIX,
    METADATA_FILE,
    NO_EXTENSIONS,
    SCHEMA_VERSION,
    SUPPORTED_SCHEMA_VERSIONS,
    TOP_EXTENSIONS,
    BundleMetadata,
    BundleTests,
    Capabilities,
    ImagePrompt,
    Modality,
    ModelRef,
    Requires,
    SeededSampling,
    Target,
    TestImage,
    Thresholds,
    When,
    slug,
)
from ttbundles.format.tt_options import TTOptions
from ttbundles.suggest import did_you_mean, hint_for

# The two keys of the reference plugin's metadata form.
LEGACY_KEYS = ("arch", "main_class")

_TYPE_HINTS = {
    "bool": "write true or false, without quotes",
    "int": "write a whole number without quotes, e.g. 4096",
    "float": "write a number without quotes, e.g. 0.99",
    "string": "write a string in double quotes",
    "dict": "write an object: {...}",
    "model": "write an object: {...}",
    "list": "write an array: [...]",
}
_PATTERN_HINTS = {
    "name": "lowercase letters, digits, '.', '_' and '-', starting with a letter or digit",
    "arch": "a Python identifier, e.g. 'LlamaForCausalLM'",
    "repo": "'org/name', e.g. 'meta-llama/Llama-3.1-8B-Instruct'",
    "license": "an SPDX license id, e.g. 'Apache-2.0'",
    "env": "an environment variable name: letters, digits and '_'",
}


@dataclass
class LoadedMetadata:
    """The outcome of reading one metadata file: the model if it could be built."""

    file: Path
    metadata: BundleMetadata | None
    diagnostics: list[Diagnostic] = field(default_factory=list)
    document: Any = None


def load_metadata(bundle_dir: Path) -> LoadedMetadata:
    """Read and check `bundle_dir/vllm_metadata.json`."""
    file = bundle_dir / METADATA_FILE
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        if not bundle_dir.exists():
            return LoadedMetadata(file, None, [missing_path(bundle_dir, what="bundle folder")])
        return LoadedMetadata(
            file,
            None,
            [
                _diag(
                    "TTB002",
                    f"no {METADATA_FILE} in {bundle_dir}",
                    str(file),
                    hint=f"create one: ttbundle init {bundle_dir} --arch <HFArch>",
                )
            ],
        )
    except (OSError, UnicodeDecodeError) as exc:
        return LoadedMetadata(file, None, [_diag("TTB003", f"cannot read: {exc}", str(file))])
    return parse_metadata(text, file=file, bundle_dir=bundle_dir)


def parse_metadata(text: str, *, file: Path, bundle_dir: Path | None = None) -> LoadedMetadata:
    """Parse metadata text; `bundle_dir` (when given) resolves the legacy form."""
    fname = str(file)
    try:
        document = json.loads(text)
    except json.JSONDecodeError as exc:
        return LoadedMetadata(
            file,
            None,
            [
                Diagnostic(
                    code="TTB010",
                    severity=Severity.ERROR,
                    message=f"invalid JSON: {exc.msg}",
                    file=fname,
                    line=exc.lineno,
                    column=exc.colno,
                    hint="fix the JSON syntax at that position",
                )
            ],
        )
    if not isinstance(document, dict):
        return LoadedMetadata(
            file,
            None,
            [
                _diag(
                    "TTB011",
                    "metadata must be a JSON object",
                    fname,
                    pointer="",
                    hint='start the file with {"schema_version": 1, ...}',
                )
            ],
            document,
        )

    diagnostics: list[Diagnostic] = []
    if "schema_version" not in document:
        document, diagnostics = _from_legacy(document, fname, bundle_dir)
        if document is None:
            return _located(LoadedMetadata(file, None, diagnostics), text)
    else:
        version = document["schema_version"]
        if (
            isinstance(version, int)
            and not isinstance(version, bool)
            and (version not in SUPPORTED_SCHEMA_VERSIONS)
        ):
            supported = ", ".join(str(v) for v in SUPPORTED_SCHEMA_VERSIONS)
            diagnostics.append(
                _diag(
                    "TTB020",
                    f"schema_version {version} is not supported; this release "
                    f"reads version {supported}",
                    fname,
                    pointer="/schema_version",
                    hint="upgrade ttbundles, or write the bundle for schema_version "
                    f"{SCHEMA_VERSION}",
                )
            )
            return _located(LoadedMetadata(file, None, diagnostics, document), text)

    metadata: BundleMetadata | None = None
    try:
        metadata = BundleMetadata.model_validate(
            document, context={NO_EXTENSIONS: _extensions_known(text, document)}
        )
    except ValidationError as exc:
        diagnostics.extend(diagnostics_from_validation(exc, fname))
    else:
        if diagnostics and diagnostics[0].code == "TTB021":
            metadata.legacy_ = True
    return _located(LoadedMetadata(file, metadata, diagnostics, document), text)


def _extensions_known(text: str, document: dict) -> bool | str:
    """What the raw text tells validation about `x-*` keys (`NO_EXTENSIONS`): True when
    there are none (nor a reserved key), TOP_EXTENSIONS when every `"x-` in the text is
    one of the document's own keys, False when objects inside may have some."""
    if "\\u0000" in text:
        return False
    found = text.count('"x-')
    if not found:
        return True
    own = sum(1 for key in document if key.startswith(EXTENSION_PREFIX))
    return TOP_EXTENSIONS if own == found else False


def _from_legacy(
    document: dict, fname: str, bundle_dir: Path | None
) -> tuple[dict | None, list[Diagnostic]]:
    """Turn the reference plugin's two-key form into a v1 document, with a warning."""
    v1_only = [k for k in BundleMetadata.model_fields if k not in LEGACY_KEYS]
    v1_keys = [k for k in document if k in v1_only or k == "$schema"]
    if v1_keys:
        return None, [
            _diag(
                "TTB031",
                "schema_version is missing",
                fname,
                pointer="",
                hint=f'add "schema_version": {SCHEMA_VERSION} (the file uses v1 keys: '
                f"{', '.join(v1_keys)})",
            )
        ]
    diagnostics: list[Diagnostic] = []
    missing = [k for k in LEGACY_KEYS if k not in document]
    for key in missing:
        diagnostics.append(
            _diag(
                "TTB031",
                f"required field {key!r} is missing",
                fname,
                pointer="",
                hint=f"add {key!r}, or write schema_version {SCHEMA_VERSION} metadata "
                "(ttbundle init)",
            )
        )
    if missing:
        return None, diagnostics
    for key in document:
        if key not in LEGACY_KEYS and not key.startswith("x-"):
            diagnostics.append(
                _diag(
                    "TTB030",
                    f"key {key!r} is ignored in legacy metadata",
                    fname,
                    pointer=f"{pointer([key])}#key",
                    severity=Severity.WARNING,
                    hint="run ttbundle migrate to write schema_version 1 metadata",
                )
            )
    diagnostics.insert(
        0,
        _diag(
            "TTB021",
            "legacy metadata (only arch and main_class, no schema_version)",
            fname,
            pointer="",
            severity=Severity.WARNING,
            hint="run: ttbundle migrate " + (str(bundle_dir) if bundle_dir else "<bundle>"),
        ),
    )
    main_class = document["main_class"]
    source = "environment"
    if bundle_dir is not None and isinstance(main_class, str):
        from ttbundles.format.modules import module_file

        if module_file(bundle_dir, main_class.partition(":")[0]) is not None:
            source = "bundle"
    converted = {
        "schema_version": SCHEMA_VERSION,
        "name": slug(bundle_dir.name if bundle_dir is not None else str(document["arch"])),
        "version": "0",
        "arch": document["arch"],
        "main_class": main_class,
        "main_class_source": source,
    }
    converted.update({k: v for k, v in document.items() if k.startswith("x-")})
    return converted, diagnostics


def diagnostics_from_validation(exc: ValidationError, fname: str | None) -> list[Diagnostic]:
    """Translate pydantic's errors into our codes, pointers and fix hints."""
    out: list[Diagnostic] = []
    for error in exc.errors():
        loc = tuple(error["loc"])
        kind = error["type"]
        value = error.get("input")
        ctx = error.get("ctx") or {}
        in_tt = "additional_config" in loc
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
            key = loc[-1]
            if loc[0] == "targets" and len(loc) == 2:
                out.append(
                    _diag(
                        "TTB035",
                        f"unknown mesh {key!r}",
                        fname,
                        pointer=pointer(loc) + "#key",
                        hint=_mesh_hint(str(key)),
                    )
                )
            elif loc[-2:-1] == ("modalities",):
                known = list(get_args(Modality))
                out.append(
                    _diag(
                        "TTB033",
                        f"unknown modality {key!r}",
                        fname,
                        pointer=pointer(loc) + "#key",
                        hint=hint_for(str(key), known, what="modalities"),
                    )
                )
            else:
                out.append(
                    _diag(
                        "TTB033",
                        f"invalid key {key!r}",
                        fname,
                        pointer=pointer(loc) + "#key",
                        hint=_PATTERN_HINTS["env"],
                    )
                )
            continue
        where = pointer(loc)
        field_name = str(loc[-1]) if loc else ""
        label = _label(loc)
        if kind.startswith("TTB"):
            if kind == "TTB020" and not loc:
                where = "/schema_version"  # the version check spans the document
            out.append(_diag(kind, error["msg"], fname, pointer=where, hint=ctx.get("hint")))
        elif kind == "missing":
            out.append(
                _diag(
                    "TTB031",
                    f"required field {field_name!r} is missing",
                    fname,
                    pointer=pointer(loc[:-1]),
                    hint=f"add {field_name!r}",
                )
            )
        elif kind == "extra_forbidden":
            model = _model_at(loc[:-1])
            allowed = [_alias(model, f) for f in model.model_fields]
            allowed = [name for name in allowed if not name.startswith("\x00")]
            # The device options mirror --additional-config.tt: no extensions there.
            note = "" if model is TTOptions else "; free extensions start with 'x-'"
            out.append(
                _diag(
                    "TTB038" if in_tt else "TTB030",
                    f"unknown key {field_name!r}",
                    fname,
                    pointer=where + "#key",
                    hint=hint_for(field_name, allowed, what="known keys") + note,
                )
            )
        elif kind == "string_pattern_mismatch":
            if field_name == "main_class":
                out.append(
                    _diag(
                        "TTB036",
                        f"main_class {value!r} is not of the form 'module:Class'",
                        fname,
                        pointer=where,
                        hint="write e.g. 'adapter:Generator' (adapter.py in the "
                        "bundle, class Generator)",
                    )
                )
            else:
                hint_key = "env" if "env" in loc else field_name
                out.append(
                    _diag(
                        "TTB033",
                        f"{label} {value!r} is not valid",
                        fname,
                        pointer=where,
                        hint=_PATTERN_HINTS.get(hint_key, f"match {ctx.get('pattern')}"),
                    )
                )
        elif kind == "literal_error":
            expected = str(ctx.get("expected"))
            hint = f"use {expected}"
            if isinstance(value, str):
                close = did_you_mean(value, re.findall(r"'([^']*)'", expected))
                if close is not None:
                    hint = f"did you mean {close!r}? ({hint})"
            out.append(
                _diag(
                    "TTB038" if in_tt else "TTB033",
                    f"{label} {value!r} is not allowed",
                    fname,
                    pointer=where,
                    hint=hint,
                )
            )
        elif kind.endswith("_type") or kind.endswith("_parsing") or kind == "model_attributes_type":
            out.append(
                _diag(
                    "TTB038" if in_tt else "TTB032",
                    f"{label}: {error['msg'].lower()}, got {_json_type(value)}",
                    fname,
                    pointer=where,
                    hint=_TYPE_HINTS.get(kind.split("_")[0], "change the value's type"),
                )
            )
        else:
            message, hint = _constraint(kind, ctx, label, value, error["msg"])
            out.append(
                _diag("TTB038" if in_tt else "TTB033", message, fname, pointer=where, hint=hint)
            )
    return out


# pydantic's bound checks, in our words: (what the value must be, the comparison).
_BOUNDS = {
    "greater_than": ("gt", "greater than"),
    "greater_than_equal": ("ge", "at least"),
    "less_than": ("lt", "less than"),
    "less_than_equal": ("le", "at most"),
}


def _constraint(kind: str, ctx: dict, label: str, value: object, raw: str) -> tuple[str, str]:
    """A failed constraint said as our messages say things (what the value is, what it
    must be) with a fix line, instead of pydantic's wording ("Input should be greater
    than 0")."""
    shown = json.dumps(value) if isinstance(value, (int, float, str, bool)) else repr(value)
    if kind in _BOUNDS:
        key, words = _BOUNDS[kind]
        limit = ctx.get(key)
        return f"{label} is {shown}; it must be {words} {limit}", (
            f"set {label} to a number {words} {limit}, or remove it for the default"
        )
    if kind in ("too_short", "too_long"):
        least, most = ctx.get("min_length"), ctx.get("max_length")
        need = f"at least {least}" if kind == "too_short" else f"at most {most}"
        return f"{label} has {ctx.get('actual_length')} entries; it needs {need}", (
            f"give {label} {need} entries"
        )
    if kind == "multiple_of":
        return f"{label} is {shown}; it must be a multiple of {ctx.get('multiple_of')}", (
            f"set {label} to a multiple of {ctx.get('multiple_of')}"
        )
    if kind == "int_from_float":
        return f"{label} is {shown}; it must be a whole number", f"write {label} without a fraction"
    # A validator of ours (value_error) words its own message; keep it, minus the prefix.
    text = raw.removeprefix("Value error, ")
    return f"{label}: {text}", f"fix {label} (ttbundle schema shows what it takes)"


def _label(loc: tuple) -> str:
    """How a field is named in a message: 'sample_on_device[0]', 'repo', 'value'."""
    label = ""
    for item in loc:
        label = f"{label}[{item}]" if isinstance(item, int) else str(item)
    return label or "value"


def _model_at(loc: tuple) -> type[BaseModel]:
    """The model class describing the object at `loc` (for did-you-mean on unknown keys)."""
    model: type[BaseModel] = BundleMetadata
    items = list(loc)
    while items:
        head = items.pop(0)
        if model is BundleMetadata and head == "targets":
            if items:
                items.pop(0)  # the mesh name
            model = Target
        elif model is BundleMetadata and head == "models":
            if items:
                items.pop(0)
            model = ModelRef
        else:
            model = {
                "capabilities": Capabilities,
                "requires": Requires,
                "when": When,
                "additional_config": TTOptions,
                "tests": BundleTests,
                "sampling": SeededSampling,
                "thresholds": Thresholds,
                "image_prompts": ImagePrompt,
                "images": TestImage,
            }.get(str(head), model)
    return model


def _alias(model: type[BaseModel], name: str) -> str:
    return model.model_fields[name].alias or name


def _json_type(value: Any) -> str:
    return {
        bool: "a boolean",
        int: "a number",
        float: "a number",
        str: "a string",
        list: "an array",
        dict: "an object",
        type(None): "null",
    }.get(type(value), type(value).__name__)


def _diag(
    code: str,
    message: str,
    file: str | None,
    *,
    pointer: str | None = None,
    hint: str | None = None,
    severity: Severity = Severity.ERROR,
) -> Diagnostic:
    return Diagnostic(
        code=code, severity=severity, message=message, file=file, pointer=pointer, hint=hint
    )


def _located(loaded: LoadedMetadata, text: str) -> LoadedMetadata:
    """Fill line:column for diagnostics with a pointer (only when there are any)."""
    if not any(d.pointer is not None for d in loaded.diagnostics):
        return loaded
    positions = locate(text)
    located = []
    for d in loaded.diagnostics:
        if d.pointer is not None and d.line is None:
            line_col = positions.get(d.pointer) or positions.get(d.pointer.split("#")[0])
            ptr = d.pointer.split("#")[0]
            if line_col:
                d = replace(d, pointer=ptr, line=line_col[0], column=line_col[1])
            else:
                d = replace(d, pointer=ptr)
        located.append(d)
    loaded.diagnostics = located
    return loaded


def _mesh_hint(name: str) -> str:
    """Did-you-mean from the same alias table as MESH_DEVICE (T3000 -> T3K)."""
    best = suggest_mesh(name)
    if best is not None:
        return f"did you mean {best!r}?"
    return hint_for(name, MESH_NAMES, what="mesh names")
