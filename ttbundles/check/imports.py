"""`ttbundle validate --import`: import the adapter for real, in a fresh subprocess.

A subprocess, because bundle code may hang, crash, or pollute the interpreter; and with a
timeout, because importing TT-Metal code without a card can block. The adapter is
imported under the same synthetic package the loader uses when vLLM serves it, so what
passes here imports the same way in the server.

The signatures are checked against `ttbundles.format.contract`: each contract method must
accept the inputs it cannot work without, must not require a parameter the worker never
passes, and a v1 class's `decode_forward` must take the four commands. The class's real
`model_capabilities` is compared with the declared capabilities by the same rule as the
static check (`check.capabilities`).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from ttbundles.check import kv_layout, recurrent_state
from ttbundles.check.capabilities import agreement, from_mapping, owner_agreement
from ttbundles.check.pooling import imported_pooling_problems
from ttbundles.check.speculative import (
    imported_method_problems,
    json_ready,
    spec_agreement,
    spec_from_mapping,
)
from ttbundles.errors import Diagnostic, Severity
from ttbundles.format import contract_keys
from ttbundles.format.contract import (
    CAPABILITIES_ATTRIBUTE,
    CAPABILITY_KEYS,
    CONTRACT_MARKER,
    CONTRACT_V1,
    DECODE,
    DECODE_COMMANDS,
    ESSENTIAL_KEYWORDS,
    INITIALIZE,
    KV_CACHE_METHODS,
    LEGACY_RESET_KEYWORD,
    METHODS,
    MULTIMODAL_PARAMETERS,
    POOLING_FORWARD,
    PREFILL,
    PREFILL_IMAGE_INPUTS,
    SAFE_COMMAND_DEFAULTS,
    Method,
    contract_version,
    decode_keywords,
    pooling_required_methods,
)
from ttbundles.format.forwarding import accepted_keywords
from ttbundles.format.metadata import METADATA_FILE, BundleMetadata

_POSITIONAL = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
_BY_NAME = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
_VARIADIC = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)


def import_check(
    bundle_dir: Path, metadata: BundleMetadata, *, timeout: float = 60.0
) -> list[Diagnostic]:
    """Import the main class in a subprocess and check the contract's signatures."""
    command = [
        sys.executable,
        "-m",
        "ttbundles.check.imports",
        str(bundle_dir),
        metadata.model_dump_json(by_alias=True),
    ]
    where = str(bundle_dir)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [
            Diagnostic(
                "TTB061",
                Severity.ERROR,
                f"importing {metadata.main_class} took longer than {timeout:g}s",
                file=where,
                hint="raise --timeout, or make the import cheaper",
            )
        ]
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [
            Diagnostic(
                "TTB060",
                Severity.ERROR,
                f"importing {metadata.main_class} failed: {tail}",
                file=where,
            )
        ]
    out = [
        Diagnostic(
            problem["code"],
            Severity(problem.get("severity", "error")),
            problem["message"],
            file=problem.get("file") or where,
            line=problem.get("line"),
            hint=problem.get("hint"),
        )
        for problem in result.get("problems", [])
    ]
    capabilities = result.get("capabilities")
    if capabilities is not None or result.get("has_capabilities") is False:
        meta_file = str(bundle_dir / METADATA_FILE)
        name = metadata.class_name
        class_caps = from_mapping(capabilities)
        out.extend(agreement(class_caps, metadata.capabilities, name, meta_file))
        out.extend(owner_agreement(class_caps, metadata.capabilities, name, meta_file))
        speculative = result.get("speculative") if capabilities is not None else None
        out.extend(
            spec_agreement(spec_from_mapping(speculative), metadata.capabilities, name, meta_file)
        )
    return out


def _check_in_this_process(bundle_dir: Path, metadata: BundleMetadata) -> dict:
    import importlib

    from ttbundles.format.loader import qualified_class

    if metadata.main_class_source == "bundle":
        target = qualified_class(bundle_dir, metadata.name, metadata.main_class)
    else:
        target = metadata.main_class
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except BaseException as exc:  # noqa: BLE001 - any failure of bundle code is reported
        message = f"importing {metadata.main_class} failed: {type(exc).__name__}: {exc}"
        return {"problems": [{"code": "TTB060", "message": message}]}
    caps = getattr(cls, CAPABILITIES_ATTRIBUTE, None)
    problems = check_class(cls, metadata)
    return {
        "problems": problems,
        # None: the class has no dict at all, which TT-Metal reads as nothing supported.
        "capabilities": {k: bool(caps[k]) for k in CAPABILITY_KEYS if k in caps}
        if isinstance(caps, Mapping)
        else None,
        "has_capabilities": isinstance(caps, Mapping),
        "speculative": json_ready(caps) if isinstance(caps, Mapping) else None,
    }


def check_class(cls: type, metadata: BundleMetadata) -> list[dict]:
    """Contract problems of an imported class, as JSON-ready dicts (code, message, ...)."""
    name = metadata.class_name
    declared = metadata.capabilities
    problems: list[dict] = []
    pooling = declared.pooling
    required, needs_kv_cache = pooling_required_methods(pooling.form if pooling else None)
    if pooling is not None and pooling.form == "forward":
        # The forward form has no KV cache, prefill or decode: only its two methods.
        for method in (INITIALIZE, POOLING_FORWARD):
            if not hasattr(cls, method.name):
                problems.append({"code": "TTB053", "message": f"{name} lacks {method.name}"})
            elif method is INITIALIZE:
                problems.extend(_check_method(cls, name, method, False))
        problems.extend(imported_pooling_problems(cls, pooling))
        return problems
    for method in METHODS:
        if not hasattr(cls, method.name):
            if method.name in required:
                problems.append({"code": "TTB053", "message": f"{name} lacks {method.name}"})
            elif method.needs and getattr(declared, method.needs):
                problems.append(
                    {
                        "code": "TTB054",
                        "message": f"{method.needs} is declared but {name} lacks {method.name}",
                        "hint": f"implement it, or declare {method.needs}: false",
                    }
                )
            continue
        if method.needs and not getattr(declared, method.needs):
            continue  # the worker never calls it
        images = bool(declared.input_limits().get("image"))
        problems.extend(
            _check_method(cls, name, method, bool(declared.sample_on_device), images=images)
        )
    if needs_kv_cache and not any(hasattr(cls, m) for m in KV_CACHE_METHODS):
        problems.append(
            {"code": "TTB053", "message": f"{name} lacks {' or '.join(KV_CACHE_METHODS)}"}
        )
    problems.extend(imported_method_problems(cls, declared))
    problems.extend(kv_layout.imported_problems(cls, declared))
    problems.extend(recurrent_state.imported_problems(cls, declared))
    problems.extend(imported_pooling_problems(cls, pooling))
    problems.extend(newest_key_problems(cls, name))
    return problems


def newest_key_problems(cls: type, name: str) -> list[dict]:
    """What the worker refuses at load of the keys that ask for a call or a keyword
    (`format.contract_keys`): the prefill warm-up without its method (TTB053), a
    prefill keyword a capability asks for that prefill cannot take (TTB062)."""
    problems: list[dict] = []
    if getattr(cls, contract_keys.PREFILL_WARMUP_ATTRIBUTE, False) is True and not hasattr(
        cls, contract_keys.WARMUP_PREFILL
    ):
        problems.append(
            {
                "code": "TTB053",
                "message": f"{name} declares {contract_keys.PREFILL_WARMUP_ATTRIBUTE} but "
                f"lacks {contract_keys.WARMUP_PREFILL}",
                "hint": "implement it, or drop the attribute (docs/reference/contract-keys.md)",
            }
        )
    capabilities = getattr(cls, CAPABILITIES_ATTRIBUTE, None) or {}
    prefill = getattr(cls, PREFILL.name, None)
    if not isinstance(capabilities, Mapping) or prefill is None:
        return problems
    try:
        accepted = accepted_keywords(cls, prefill)
    except (TypeError, ValueError):  # no signature to read: the worker trusts it too
        return problems
    for keyword, key in contract_keys.PREFILL_KEYWORDS_ASKED.items():
        if capabilities.get(key) is True and not accepted.accepts(keyword):
            problems.append(
                {
                    "code": "TTB062",
                    "message": f"{name}.{PREFILL.name} takes no {keyword}, though its "
                    f"{CAPABILITIES_ATTRIBUTE} declare {key}",
                    "hint": "take the keyword in prefill_forward, or drop the key",
                }
            )
    return problems


def _check_method(
    cls: type, class_name: str, method: Method, sample_on_device: bool, *, images: bool = False
) -> list[dict]:
    static = inspect.getattr_static(cls, method.name)
    member = getattr(cls, method.name)
    file, line = _line_of(member)
    title = f"{class_name}.{method.name}"

    def problem(message: str, hint: str) -> dict:
        return {"code": "TTB062", "message": message, "file": file, "line": line, "hint": hint}

    out = []
    if method.kind == "classmethod" and not isinstance(static, classmethod):
        out.append(problem(f"{title} must be a classmethod", "decorate it with @classmethod"))
    params = _parameters(member, static)
    if params is None:
        return out  # a builtin or an object whose signature Python cannot tell
    version = contract_version(cls)
    keywords = decode_keywords(version) if method is DECODE else frozenset(method.passes)
    if method is PREFILL and images:
        keywords |= frozenset(PREFILL_IMAGE_INPUTS)
    supplied = set(keywords)
    for keyword in keywords:
        supplied.update(method.aliases.get(keyword, ()))
    takes_any = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    named = {p.name for p in params if p.kind in _BY_NAME}

    def accepts(keyword: str) -> bool:
        return takes_any or bool(named & {keyword, *method.aliases.get(keyword, ())})

    essential = list(ESSENTIAL_KEYWORDS.get(method.name, ()))
    if method is DECODE and sample_on_device:
        essential.append("sampling_params")
    if method is PREFILL and images:
        essential.append("pixel_values")  # the bundle serves images: they must get in
    refused = [k for k in essential if not accepts(k)]
    if refused:
        out.append(
            problem(
                f"{title}: does not accept {', '.join(refused)} as keyword arguments",
                "accept these keyword arguments, or **kwargs",
            )
        )
    # Required parameters the worker cannot fill, grouped by why.
    unfilled: dict[str, list[str]] = {}
    positional = method.leading
    for param in params:
        if param.kind in _VARIADIC:
            continue
        if param.kind in _POSITIONAL and positional > 0:
            positional -= 1  # filled by position (the readback methods' device output)
            continue
        if param.default is not inspect.Parameter.empty:
            continue
        if param.kind in _BY_NAME and param.name in supplied:
            continue
        unfilled.setdefault(_why_unfilled(param.name, version), []).append(param.name)
    passed = ", ".join(k for k in method.passes if k in keywords)
    for why, names in unfilled.items():
        found = problem(
            f"{title} requires {', '.join(names)}, {why}",
            f"give {'it' if len(names) == 1 else 'them'} a default; the worker passes "
            f"{passed or 'no keywords'}",
        )
        if all(n in MULTIMODAL_PARAMETERS for n in names):
            found["code"] = "TTB202"  # the worker's own refusal (serving.binding)
        out.append(found)
    if method is DECODE and version >= CONTRACT_V1 and not takes_any:
        lacking = [c for c in DECODE_COMMANDS if c not in named]
        if lacking:
            out.append(
                problem(
                    f"{class_name} declares {CONTRACT_MARKER} = {CONTRACT_V1}, but "
                    f"decode_forward does not accept {', '.join(lacking)}: the worker sends "
                    "all four commands on every decode",
                    "take them as keyword-only parameters ("
                    + ", ".join(f"{k}={v}" for k, v in SAFE_COMMAND_DEFAULTS.items())
                    + f"), or set {CONTRACT_MARKER} = 0 to get {LEGACY_RESET_KEYWORD} instead",
                )
            )
    return out


def _why_unfilled(parameter: str, version: int) -> str:
    if parameter in MULTIMODAL_PARAMETERS:
        return (
            "which the worker does not pass: it sends images as pixel_values and "
            "image_grid_thw, not Mllama-style cross-attention inputs"
        )
    if parameter in PREFILL_IMAGE_INPUTS:
        return "which the worker passes only to a bundle that declares image input"
    if parameter in DECODE_COMMANDS and version < CONTRACT_V1:
        return (
            f"which the worker passes only to a class declaring {CONTRACT_MARKER} = {CONTRACT_V1}"
        )
    if parameter == LEGACY_RESET_KEYWORD and version >= CONTRACT_V1:
        return f"which a class declaring {CONTRACT_MARKER} = {CONTRACT_V1} never receives"
    return "which the worker does not pass"


def _parameters(member: object, static: object) -> list[inspect.Parameter] | None:
    """The parameters a caller fills: without `self` (or a misplaced `cls`)."""
    try:
        params = list(inspect.signature(member).parameters.values())  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    # A plain function read from the class still has its first parameter (`self`, or
    # `cls` when @classmethod is missing); a classmethod comes bound, a staticmethod has
    # none.
    if inspect.isfunction(static) and params and params[0].kind in _POSITIONAL:
        params = params[1:]
    return params


def _line_of(member: object) -> tuple[str | None, int | None]:
    try:
        return inspect.getsourcefile(member), inspect.getsourcelines(member)[1]  # type: ignore[arg-type]
    except (TypeError, OSError):
        return None, None


if __name__ == "__main__":
    _dir, _metadata = Path(sys.argv[1]), BundleMetadata.model_validate_json(sys.argv[2])
    sys.stdout.write("\n" + json.dumps(_check_in_this_process(_dir, _metadata)) + "\n")
