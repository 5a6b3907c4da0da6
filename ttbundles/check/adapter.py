"""Check a bundle's generator class against the contract, statically.

Bundle code must not run during validation (it usually imports ttnn, which is absent
where bundles are validated), so the adapter is parsed with `ast`, never imported. What
cannot be seen statically (a base class from outside the bundle, a computed value) is
reported as such rather than guessed. The contract itself (method names, capability keys)
comes from `ttbundles.format.contract`.

The class is read by `check.static_reader`; this module holds the contract checks.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

from ttbundles.check import kv_layout, recurrent_state
from ttbundles.check.capabilities import ClassCapabilities, agreement, key_notes, owner_agreement
from ttbundles.check.pooling import static_pooling_diagnostics
from ttbundles.check.reference_archs import covers, missing_reason, reference_of
from ttbundles.check.speculative import spec_agreement, static_method_diagnostics
from ttbundles.check.static_reader import (
    ClassInfo,
    Definition,
    Function,
    SourceRoots,
    _ClassFinder,
    _SourceError,
    compile_tree,
    environment_roots,
    syntax_diagnostic,
)
from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import (
    ASYNC_METHODS,
    CONTRACT_MARKER,
    CONTRACT_V1,
    DECODE,
    DECODE_COMMANDS,
    INITIALIZE,
    KV_CACHE_METHODS,
    METHODS,
    METHODS_BY_NAME,
    MULTIMODAL_HINT,
    MULTIMODAL_PARAMETERS,
    MULTIMODAL_REFUSAL,
    REQUIRED_METHODS,
    decode_keywords,
    pooling_required_methods,
)
from ttbundles.format.metadata import METADATA_FILE, BundleMetadata
from ttbundles.format.modules import SKIP_DIRS, bundle_modules
from ttbundles.suggest import hint_for


def check_adapter(
    bundle_dir: Path,
    metadata: BundleMetadata,
    *,
    read: list[Path] | None = None,
    contract: bool = True,
    signatures: dict[Path, tuple[int, int, int] | None] | None = None,
) -> list[Diagnostic]:
    """Every contract problem of the bundle's main class that shows in its source.

    `read`, when given, receives every source file parsed: what the outcome depends on
    (the registry's index keys a bundle's check by them), and `signatures` what each was
    when read (`static_reader.signature`). `contract=False` is
    registration's check: only whether the class can be found (module present, parses,
    defines or imports the class; TTB050-052), without walking its body and bases for the
    contract, which is `validate`'s to report and costs as much again as the parse.
    """
    meta_file = str(bundle_dir / METADATA_FILE)
    roots = SourceRoots(folders=(bundle_dir,))
    if metadata.main_class_source == "environment":
        located = environment_roots(metadata.module)
        if located is None:
            return [
                Diagnostic(
                    "TTB058",
                    # validate's: a check it could not make is a warning; registration
                    # (contract=False) only notes it, once per environment bundle.
                    Severity.WARNING if contract else Severity.INFO,
                    f"{metadata.main_class} comes from the serving environment and is not "
                    "importable here: its signatures and model_capabilities are not "
                    "checkable here (what the worker would refuse at load is not known)",
                    file=meta_file,
                    pointer="/main_class",
                    hint="validate where TT-Metal is installed to check it",
                )
            ]
        roots = located
    path = roots.module_file(metadata.module)
    if path is None:
        looked_for = (
            f"{metadata.module.replace('.', '/')}.py and "
            f"{metadata.module.replace('.', '/')}/__init__.py"
        )
        if metadata.main_class_source == "environment":
            message = (
                f"module {metadata.module!r} is not in the environment's "
                f"{roots.package} (looked for {looked_for} in {roots.describe()})"
            )
            hint = "check main_class against the TT-Metal release installed here"
        else:
            message = f"module {metadata.module!r} is not in the bundle (looked for {looked_for})"
            hint = _module_hint(bundle_dir, metadata.module)
        return [
            Diagnostic(
                "TTB050", Severity.ERROR, message, file=meta_file, pointer="/main_class", hint=hint
            )
        ]
    finder = _ClassFinder(roots, shallow=not contract)
    finder.compile_check = contract
    if read is not None:
        finder.read = read
    finder.signatures = signatures
    try:
        info = finder.find(path, metadata.module, metadata.class_name)
    except _SourceError as exc:
        others = _uncompilable(bundle_dir, skip=finder.read) if contract else []
        return [exc.diagnostic, *others]
    if contract:
        # The modules the class's file and bases did not lead to (helpers imported inside
        # a method) are imported when served too: each must compile.
        broken = _uncompilable(bundle_dir, skip=finder.read)
        if broken:
            return broken
    if info is None:
        return [
            Diagnostic(
                "TTB052",
                Severity.ERROR,
                f"class {metadata.class_name!r} is not defined in {path.name}",
                file=str(path),
                hint=hint_for(metadata.class_name, finder.classes_in(path), what="classes")
                if finder.classes_in(path)
                else f"define class {metadata.class_name} in {path.name}",
            )
        ]
    if not contract:
        return []
    reference = _reference_arch(info, metadata, meta_file)
    return [*reference, *_contract_diagnostics(info, metadata, meta_file)]


def _reference_arch(info: ClassInfo, metadata: BundleMetadata, meta_file: str) -> list[Diagnostic]:
    """A class on a torch reference generator serves only what that generator reads:
    another `arch` is refused at load, tens of seconds into a server (TTB041 says it now)."""
    found = reference_of(info.ancestors)
    if found is None or covers(found[1], metadata.arch):
        return []
    base, archs = found
    missing = missing_reason(metadata.arch)
    return [
        Diagnostic(
            "TTB041",
            Severity.ERROR,
            f"arch {metadata.arch} is not one the torch reference generator this class builds "
            f"on ({base.replace(':', '.')}) reads ({', '.join(archs)})"
            + (f"; {missing}" if missing else "")
            + "; it would be refused at load",
            file=meta_file,
            pointer="/arch",
            hint=f"set arch to one of {', '.join(archs)}, or write the generator for "
            f"{metadata.arch} (ttbundle init --arch {metadata.arch} for the TT-NN template)",
        )
    ]


def _uncompilable(bundle_dir: Path, *, skip: list[Path]) -> list[Diagnostic]:
    """TTB051 for each of the bundle's Python files (`bundle_modules`' walk) that Python
    cannot compile, except those in `skip` (already read, and reported, by the finder)."""
    out = []
    done = {p.resolve() for p in skip}
    for path in sorted(bundle_dir.rglob("*.py")):
        relative = path.relative_to(bundle_dir)
        if any(part in SKIP_DIRS for part in relative.parts) or path.resolve() in done:
            continue
        try:
            source = path.read_text(encoding="utf-8")
            compile_tree(ast.parse(source, filename=str(path)), path)
        except (SyntaxError, ValueError) as exc:
            out.append(syntax_diagnostic(exc, path))
        except (OSError, UnicodeDecodeError) as exc:
            out.append(Diagnostic("TTB003", Severity.ERROR, f"cannot read: {exc}", file=str(path)))
    return out


def still_template(info: ClassInfo, async_decode: bool = True) -> list[str]:
    """The contract methods of the class whose whole body (after a docstring) is `raise
    NotImplementedError`: what `ttbundle init` wrote, not yet written by the author. The
    readback methods count only with `async_decode` (the worker calls them only then)."""
    names = [*REQUIRED_METHODS, *KV_CACHE_METHODS, *(ASYNC_METHODS if async_decode else ())]
    found = []
    for name in names:
        definition = info.methods.get(name)
        node = getattr(definition, "node", None)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        body = list(node.body)
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        if len(body) == 1 and isinstance(body[0], ast.Raise) and _names_not_implemented(body[0]):
            found.append(name)
    return found


def _names_not_implemented(node: ast.Raise) -> bool:
    exc = node.exc.func if isinstance(node.exc, ast.Call) else node.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


def _contract_diagnostics(
    info: ClassInfo, metadata: BundleMetadata, meta_file: str
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    # What is not found is an error only when every base was seen; otherwise it may be
    # inherited from code outside the bundle, which is said (TTB057), not guessed.
    partial = bool(info.unresolved_bases)
    outside = ", ".join(info.unresolved_bases)
    name = metadata.class_name
    where = {"file": str(info.file), "line": info.line}
    not_here = "run ttbundle validate --import where its dependencies are installed"
    template = still_template(info, metadata.capabilities.async_decode)
    if template:
        out.append(
            Diagnostic(
                "TTB065",
                Severity.WARNING,
                f"{name} is still the template: {', '.join(template)} only raise "
                "NotImplementedError",
                hint="write them (ttbundle init's template marks each with what it returns); "
                "validate --strict, pack, install and test refuse the template until then",
                file=str(info.methods[template[0]].file),
                line=info.methods[template[0]].line,
            )
        )
    pooling = metadata.capabilities.pooling
    required, needs_kv_cache = pooling_required_methods(pooling.form if pooling else None)
    missing = [m for m in required if m not in info.methods]
    if needs_kv_cache and not any(m in info.methods for m in KV_CACHE_METHODS):
        missing.append(" or ".join(KV_CACHE_METHODS))
    if missing and not partial:
        out.append(
            Diagnostic(
                "TTB053",
                Severity.ERROR,
                f"{name} lacks {', '.join(missing)}",
                hint="implement the generator contract (see ttbundle init's template)"
                if pooling is None or pooling.form != "forward"
                else "a pooling class of the form 'forward' needs initialize_vllm_model and "
                "forward(input_ids, attention_mask) (docs/authors/generator-contract.md)",
                **where,
            )
        )
    caps = metadata.capabilities
    out.extend(
        kv_layout.static_diagnostics(
            info.methods, caps, name, partial=partial, outside=outside, where=where
        )
    )
    out.extend(
        recurrent_state.static_diagnostics(
            info.methods, caps, name, partial=partial, outside=outside, where=where
        )
    )
    if caps.async_decode:
        lacking = [m for m in ASYNC_METHODS if m not in info.methods]
        if lacking and not partial:
            out.append(
                Diagnostic(
                    "TTB054",
                    Severity.ERROR,
                    f"async_decode is declared but {name} lacks {', '.join(lacking)}",
                    hint="implement them, or declare async_decode: false",
                    **where,
                )
            )
        elif lacking:
            out.append(
                Diagnostic(
                    "TTB057",
                    Severity.WARNING,
                    f"async_decode is declared; {', '.join(lacking)} not in the bundle, may "
                    f"come from {outside}, outside it: not checkable here",
                    hint=not_here,
                    **where,
                )
            )
    if caps.sample_on_device:
        decode = info.methods.get(DECODE.name)
        if decode is not None and decode.node is not None:
            if not _takes_keyword(decode.node, "sampling_params"):
                out.append(
                    Diagnostic(
                        "TTB055",
                        Severity.ERROR,
                        "sample_on_device is declared but decode_forward takes no sampling_params",
                        file=str(decode.file),
                        line=decode.line,
                        hint="add a sampling_params=None parameter, or declare "
                        "sample_on_device: []",
                    )
                )
        elif decode is not None or partial:
            source = (
                "is an alias whose signature is not visible here"
                if decode is not None
                else f"is not in the bundle, may come from {outside}, outside it"
            )
            out.append(
                Diagnostic(
                    "TTB057",
                    Severity.WARNING,
                    f"sample_on_device is declared; decode_forward {source}: whether it "
                    "takes sampling_params is not checkable here",
                    file=str(decode.file) if decode else str(info.file),
                    line=decode.line if decode else info.line,
                    hint=not_here,
                )
            )
    if partial and missing:
        out.append(
            Diagnostic(
                "TTB057",
                Severity.WARNING,
                f"{name} inherits from {outside}, outside the bundle; "
                f"{', '.join(missing)} not checked statically",
                hint=not_here,
                **where,
            )
        )
    out.extend(_unfillable(info, name))
    out.extend(static_pooling_diagnostics(info.methods, pooling, name))
    out.extend(
        static_method_diagnostics(
            info.methods,
            caps,
            name,
            partial=partial,
            outside=outside,
            class_file=str(info.file),
            class_line=info.line,
        )
    )
    if info.capabilities is not None:
        class_caps = info.capabilities
        out.extend(key_notes(class_caps, name, meta_file))
    elif not partial:
        # Every base was read and none defines the dict: nothing is supported.
        class_caps = ClassCapabilities(absent=True)
    else:
        # The dict may come from a base outside the bundle; say so where it matters.
        class_caps = ClassCapabilities(
            open=(
                "TTB057",
                f"is not known here: the dict is not in the bundle and may come from {outside}",
            )
        )
    out.extend(agreement(class_caps, caps, name, meta_file))
    out.extend(owner_agreement(class_caps, caps, name, meta_file))
    out.extend(spec_agreement(class_caps, caps, name, meta_file))
    return out


def _unfillable(info: ClassInfo, class_name: str) -> list[Diagnostic]:
    """Required parameters of a contract method the worker never supplies, read from the
    signature as the worker's binding reads it at load (`serving.binding`): multimodal
    inputs are TTB202 (Mllama's `images`, `cross_page_table`), anything else TTB062. The
    worker refuses such a class before it loads weights; `validate` says so first."""
    out = []
    for method in METHODS:
        definition = info.methods.get(method.name)
        if definition is None or definition.node is None:
            continue
        offered = _offered(method.name, info.contract)
        missing = [p for p in _required(definition.node, method.leading) if p not in offered]
        if method is INITIALIZE:
            missing = [p for p in missing if p != "optimizations"]  # passed when set
        if method is DECODE and info.contract >= CONTRACT_V1:
            out.extend(_lacking_commands(definition, class_name))
        if not missing:
            continue
        multimodal = [p for p in missing if p in MULTIMODAL_PARAMETERS]
        title = f"{class_name}.{method.name}"
        if multimodal:
            message = (
                f"{title} requires {', '.join(multimodal)}: {MULTIMODAL_REFUSAL}, so the "
                "worker refuses this class at load"
            )
            code, hint = "TTB202", MULTIMODAL_HINT
        else:
            message = (
                f"{title} requires {', '.join(missing)}, which the worker does not supply "
                f"(it passes: {', '.join(k for k in method.passes if k in offered)})"
            )
            code, hint = "TTB062", "give those parameters defaults"
        out.append(
            Diagnostic(
                code,
                Severity.ERROR,
                message,
                file=str(definition.file),
                line=definition.line,
                hint=hint,
            )
        )
    return out


@functools.cache
def _offered(method_name: str, version: int) -> frozenset[str]:
    """What the worker passes to a method (with the classes' aliases), per contract form."""
    method = METHODS_BY_NAME[method_name]
    offered = set(decode_keywords(version) if method is DECODE else method.passes)
    for keyword in list(offered):
        offered.update(method.aliases.get(keyword, ()))
    return frozenset(offered)


def _lacking_commands(definition: Definition, class_name: str) -> list[Diagnostic]:
    """A v1 class's decode must take the four commands the worker sends on every decode."""
    node = definition.node
    assert node is not None
    if node.args.kwarg is not None:
        return []  # may take them through **kwargs
    named = {a.arg for a in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)}
    lacking = [c for c in DECODE_COMMANDS if c not in named]
    if not lacking:
        return []
    return [
        Diagnostic(
            "TTB062",
            Severity.ERROR,
            f"{class_name} declares {CONTRACT_MARKER} = {CONTRACT_V1}, but decode_forward does "
            f"not accept {', '.join(lacking)}: the worker sends all four commands on every "
            "decode",
            file=str(definition.file),
            line=definition.line,
            hint="take them as keyword-only parameters with defaults, or drop the marker",
        )
    ]


def _required(function: Function, leading: int) -> list[str]:
    """The parameters a caller must fill by name: no default, not `*args` / `**kwargs`,
    without `self`/`cls` and the `leading` ones the worker passes by position."""
    args = function.args
    positional = [*args.posonlyargs, *args.args]
    with_default = len(args.defaults)
    required = [a.arg for a in positional[: len(positional) - with_default]]
    if not isinstance(function, ast.Lambda) or positional:
        required = required[1:] if positional else required  # self or cls
    required = required[leading:]
    posonly = {a.arg for a in args.posonlyargs}
    required = [a for a in required if a not in posonly]
    for arg, default in zip(args.kwonlyargs, args.kw_defaults):
        if default is None:
            required.append(arg.arg)
    return required


def _takes_keyword(function: Function, keyword: str) -> bool:
    args = function.args
    return args.kwarg is not None or keyword in {a.arg for a in args.args + args.kwonlyargs}


def _module_hint(bundle_dir: Path, module: str) -> str:
    modules = bundle_modules(bundle_dir)
    if not modules:
        return (
            f"add {module.replace('.', '/')}.py to the bundle, or set "
            'main_class_source: "environment" if the class comes from TT-Metal'
        )
    return hint_for(module, modules, what="bundle's modules")
