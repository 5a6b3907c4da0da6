"""Check a bundle's generator class against the contract, statically.

Bundle code must not run during validation (it usually imports ttnn, which is absent
where bundles are validated), so the adapter is parsed with `ast`, never imported. What
cannot be seen statically (a base class from outside the bundle) is reported as such
rather than guessed.
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.metadata import METADATA_FILE, BundleMetadata
from ttbundles.format.modules import bundle_modules, module_file
from ttbundles.suggest import hint_for

REQUIRED_METHODS = ("initialize_vllm_model", "prefill_forward", "decode_forward")
KV_CACHE_METHODS = ("allocate_kv_cache", "allocate_kv_cache_per_layer")
ASYNC_METHODS = ("read_decode_output", "process_decode_output_host")
# TT-Metal's class-level `model_capabilities` keys, and the declared capability each mirrors.
CAPABILITY_KEYS = {
    "supports_prefix_caching": "prefix_caching",
    "supports_async_decode": "async_decode",
    "supports_sample_on_device": "sample_on_device",
    "supports_chunked_prefill": "chunked_prefill",
}


@dataclass
class ClassInfo:
    """What could be learned about a class from source: methods, and what was not seen."""

    file: Path
    line: int
    methods: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = field(default_factory=dict)
    capabilities: dict[str, object] | None = None
    capabilities_line: int | None = None
    unresolved_bases: list[str] = field(default_factory=list)


def check_adapter(bundle_dir: Path, metadata: BundleMetadata) -> list[Diagnostic]:
    """Every contract problem of the bundle's main class that shows in its source."""
    meta_file = str(bundle_dir / METADATA_FILE)
    root = bundle_dir
    if metadata.main_class_source == "environment":
        located = _environment_root(metadata.module)
        if located is None:
            return [
                Diagnostic(
                    "TTB058",
                    Severity.INFO,
                    f"{metadata.main_class} comes from the serving environment and is not "
                    "importable here; not checked",
                    file=meta_file,
                    pointer="/main_class",
                    hint="validate where TT-Metal is installed to check it",
                )
            ]
        root = located
    path = module_file(root, metadata.module)
    if path is None:
        return [
            Diagnostic(
                "TTB050",
                Severity.ERROR,
                f"module {metadata.module!r} is not in the bundle "
                f"(looked for {metadata.module.replace('.', '/')}.py and "
                f"{metadata.module.replace('.', '/')}/__init__.py)",
                file=meta_file,
                pointer="/main_class",
                hint=_module_hint(bundle_dir, metadata.module),
            )
        ]
    finder = _ClassFinder(root)
    try:
        info = finder.find(path, metadata.module, metadata.class_name)
    except _SourceError as exc:
        return [exc.diagnostic]
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
    return _contract_diagnostics(info, metadata, meta_file)


def _contract_diagnostics(
    info: ClassInfo, metadata: BundleMetadata, meta_file: str
) -> list[Diagnostic]:
    out: list[Diagnostic] = []
    # Missing methods are errors only when every base was seen; otherwise they may be
    # inherited from code outside the bundle.
    partial = bool(info.unresolved_bases)
    severity = Severity.WARNING if partial else Severity.ERROR
    where = {"file": str(info.file), "line": info.line}
    missing = [m for m in REQUIRED_METHODS if m not in info.methods]
    if not any(m in info.methods for m in KV_CACHE_METHODS):
        missing.append(" or ".join(KV_CACHE_METHODS))
    if missing and not partial:
        out.append(
            Diagnostic(
                "TTB053",
                Severity.ERROR,
                f"{metadata.class_name} lacks {', '.join(missing)}",
                hint="implement the generator contract (see ttbundle init's template)",
                **where,
            )
        )
    caps = metadata.capabilities
    if caps.async_decode:
        lacking = [m for m in ASYNC_METHODS if m not in info.methods]
        if lacking and not partial:
            out.append(
                Diagnostic(
                    "TTB054",
                    severity,
                    f"async_decode is declared but {metadata.class_name} lacks "
                    f"{', '.join(lacking)}",
                    hint="implement them, or declare async_decode: false",
                    **where,
                )
            )
    if caps.sample_on_device and "decode_forward" in info.methods:
        func = info.methods["decode_forward"]
        names = {a.arg for a in func.args.args + func.args.kwonlyargs}
        if "sampling_params" not in names and func.args.kwarg is None:
            out.append(
                Diagnostic(
                    "TTB055",
                    Severity.ERROR,
                    "sample_on_device is declared but decode_forward takes no sampling_params",
                    file=str(info.file),
                    line=func.lineno,
                    hint="add a sampling_params=None parameter, or declare sample_on_device: []",
                )
            )
    if partial and missing:
        out.append(
            Diagnostic(
                "TTB057",
                Severity.WARNING,
                f"{metadata.class_name} inherits from {', '.join(info.unresolved_bases)}"
                f", outside the bundle; {', '.join(missing)} not checked statically",
                hint="run ttbundle validate --import where its dependencies are installed",
                **where,
            )
        )
    if info.capabilities is not None:
        for key, value in info.capabilities.items():
            declared_name = CAPABILITY_KEYS.get(key)
            if declared_name is None or not isinstance(value, bool):
                continue
            declared = bool(getattr(caps, declared_name))
            if declared != value:
                out.append(
                    Diagnostic(
                        "TTB056",
                        Severity.ERROR,
                        f"model_capabilities[{key!r}] is {value} in the class but "
                        f"capabilities.{declared_name} declares "
                        f"{getattr(caps, declared_name)!r}",
                        file=meta_file,
                        pointer=f"/capabilities/{declared_name}",
                        hint=f"make them agree ({info.file.name}:{info.capabilities_line})",
                    )
                )
    return out


class _SourceError(Exception):
    def __init__(self, diagnostic: Diagnostic):
        self.diagnostic = diagnostic


class _ClassFinder:
    """Follows class definitions and imports inside one source root."""

    def __init__(self, root: Path):
        self.root = root
        self._trees: dict[Path, ast.Module] = {}

    def parse(self, path: Path) -> ast.Module:
        if path not in self._trees:
            try:
                source = path.read_text(encoding="utf-8")
                self._trees[path] = ast.parse(source, filename=str(path))
            except SyntaxError as exc:
                raise _SourceError(
                    Diagnostic(
                        "TTB051",
                        Severity.ERROR,
                        f"syntax error: {exc.msg}",
                        file=str(path),
                        line=exc.lineno,
                        column=exc.offset,
                        hint="fix the Python syntax",
                    )
                ) from None
            except (OSError, UnicodeDecodeError) as exc:
                raise _SourceError(
                    Diagnostic("TTB003", Severity.ERROR, f"cannot read: {exc}", file=str(path))
                ) from None
        return self._trees[path]

    def classes_in(self, path: Path) -> list[str]:
        return [n.name for n in self.parse(path).body if isinstance(n, ast.ClassDef)]

    def find(self, path: Path, module: str, name: str, depth: int = 0) -> ClassInfo | None:
        """The class `name` as seen from `module` (defined there or imported into it)."""
        if depth > 16:
            return None
        tree = self.parse(path)
        for node in tree.body:
            if isinstance(node, ast.ClassDef) and node.name == name:
                return self._class_info(path, module, node, tree, depth)
        target = self._imported(tree, module, path, name)
        if target is not None:
            target_module, target_name = target
            target_path = module_file(self.root, target_module)
            if target_path is not None:
                return self.find(target_path, target_module, target_name, depth + 1)
        return None

    def _imported(
        self, tree: ast.Module, module: str, path: Path, name: str
    ) -> tuple[str, str] | None:
        """Where `name` is imported from in `tree`, as (absolute module, name)."""
        for node in tree.body:
            if isinstance(node, ast.ImportFrom):
                for alias in node.names:
                    if (alias.asname or alias.name) == name:
                        return self._absolute(node, module, path), alias.name
        return None

    def _absolute(self, node: ast.ImportFrom, module: str, path: Path) -> str:
        if not node.level:
            return node.module or ""
        package = module.split(".")
        if path.name != "__init__.py":
            package = package[:-1]
        package = package[: len(package) - (node.level - 1)] if node.level > 1 else package
        return ".".join([*package, *([node.module] if node.module else [])])

    def _class_info(
        self, path: Path, module: str, node: ast.ClassDef, tree: ast.Module, depth: int
    ) -> ClassInfo:
        info = ClassInfo(file=path, line=node.lineno)
        # Bases first, so the class's own definitions override inherited ones.
        for base in node.bases:
            base_name = _dotted(base)
            if base_name in (None, "object"):
                continue
            resolved = None
            if "." not in base_name:
                resolved = self.find(path, module, base_name, depth + 1)
            if resolved is None:
                info.unresolved_bases.append(base_name)
            else:
                info.methods.update(resolved.methods)
                info.unresolved_bases.extend(resolved.unresolved_bases)
                if resolved.capabilities is not None:
                    info.capabilities = resolved.capabilities
                    info.capabilities_line = resolved.capabilities_line
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                info.methods[item.name] = item
            elif isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                if (
                    any(isinstance(t, ast.Name) and t.id == "model_capabilities" for t in targets)
                    and item.value is not None
                ):
                    try:
                        value = ast.literal_eval(item.value)
                    except ValueError:
                        continue
                    if isinstance(value, dict):
                        info.capabilities = value
                        info.capabilities_line = item.lineno
        return info


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = _dotted(node.value)
        return f"{parent}.{node.attr}" if parent else None
    return None


def _environment_root(module: str) -> Path | None:
    """The folder holding `module`'s top-level package, found without importing it."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations))).parent
    if spec.origin:
        return Path(spec.origin).parent
    return None


def _module_hint(bundle_dir: Path, module: str) -> str:
    modules = bundle_modules(bundle_dir)
    if not modules:
        return (
            f"add {module.replace('.', '/')}.py to the bundle, or set "
            'main_class_source: "environment" if the class comes from TT-Metal'
        )
    return hint_for(module, modules, what="bundle's modules")
