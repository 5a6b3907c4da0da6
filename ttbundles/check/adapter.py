"""Check a bundle's generator class against the contract, statically.

Bundle code must not run during validation (it usually imports ttnn, which is absent
where bundles are validated), so the adapter is parsed with `ast`, never imported. What
cannot be seen statically (a base class from outside the bundle) is reported as such
rather than guessed.

`read_class` is the same reading for the registry: the class of a `TT_MODEL_CLASS_OVERRIDES`
entry or of a legacy bundle, found where it lives (a folder, else the serving environment)
and read for its `model_capabilities` and methods, still without importing anything.
"""

from __future__ import annotations

import ast
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.metadata import METADATA_FILE, BundleMetadata, Capabilities
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
    # Some values of the dict are not literals (expressions of the environment): only the
    # literal entries are in `capabilities`.
    capabilities_partial: bool = False
    unresolved_bases: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class StaticClass:
    """A class as its source shows it (`read_class`): never imported."""

    file: Path
    line: int
    methods: frozenset[str]
    # The class's `model_capabilities` (its own, else the nearest base's), literal entries
    # only; None when no class seen defines one.
    model_capabilities: dict[str, object] | None
    # Every base was found and read, so a method absent from `methods` is really absent.
    complete: bool

    @property
    def capabilities(self) -> Capabilities:
        """What the class's `model_capabilities` says, as bundle capabilities.

        TT-Metal's rule: an absent key (or no dict at all) means "not supported"; only a
        literal `True` counts (declaring less than a class supports is safe, more is not).
        `supports_sample_on_device` is one flag there: both sampling modes here.
        """
        caps = self.model_capabilities or {}
        return Capabilities(
            prefix_caching=caps.get("supports_prefix_caching") is True,
            async_decode=caps.get("supports_async_decode") is True,
            sample_on_device=(
                ["decode_only", "all"] if caps.get("supports_sample_on_device") is True else []
            ),
            chunked_prefill=caps.get("supports_chunked_prefill") is True,
        )


def read_class(module: str, class_name: str, *, roots: Sequence[Path] = ()) -> StaticClass | None:
    """The class `module:class_name` read from source, or None where it cannot be found.

    The module is looked for under each of `roots` in turn (a bundle folder, a checkout),
    then in the serving environment (`importlib.util.find_spec` of its top-level package,
    which imports nothing). Bases imported from other modules are followed the same way,
    into the environment too, so a class deriving from a TT-Metal or ttbundles base still
    shows its inherited methods and capabilities. Unreadable sources count as not found.
    """
    for root in [*roots, None]:
        base = _environment_root(module) if root is None else root
        if base is None:
            continue
        path = module_file(base, module)
        if path is None:
            continue
        finder = _ClassFinder(base, follow_environment=True)
        try:
            info = finder.find(path, module, class_name)
        except _SourceError:
            return None
        if info is None:
            return None
        return StaticClass(
            file=info.file,
            line=info.line,
            methods=frozenset(info.methods),
            model_capabilities=info.capabilities,
            complete=not info.unresolved_bases,
        )
    return None


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


def read_bundle_class(bundle_dir: Path, metadata: BundleMetadata) -> StaticClass | None:
    """A bundle's main class read from source (`read_class`), where the bundle's
    `main_class_source` says it lives.

    An environment class is looked for in the serving environment, then in the folders
    above the bundle: TT-Metal ships legacy bundles inside its checkout
    (`models/autoports/vllm_bundles/<name>/`) naming modules of that checkout
    (`models.autoports.<model>.tt.generator_vllm`), which is where the class is found when
    the checkout is not on the path of the process reading it.
    """
    if metadata.main_class_source == "bundle":
        return read_class(metadata.module, metadata.class_name, roots=[bundle_dir])
    found = read_class(metadata.module, metadata.class_name)
    if found is None:
        found = read_class(metadata.module, metadata.class_name, roots=list(bundle_dir.parents))
    return found


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
    if info.capabilities is not None and not info.capabilities_partial:
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
    """Follows class definitions and imports inside one source root (and, with
    `follow_environment`, into the serving environment for modules outside it)."""

    def __init__(self, root: Path, *, follow_environment: bool = False):
        self.root = root
        self.follow_environment = follow_environment
        self._trees: dict[Path, ast.Module] = {}

    def locate(self, module: str) -> Path | None:
        path = module_file(self.root, module)
        if path is None and self.follow_environment and module:
            found = _environment_root(module)
            path = module_file(found, module) if found is not None else None
        return path

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
            target_path = self.locate(target_module)
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
                    info.capabilities_partial = resolved.capabilities_partial
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                info.methods[item.name] = item
            elif isinstance(item, ast.Assign | ast.AnnAssign):
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                if (
                    any(isinstance(t, ast.Name) and t.id == "model_capabilities" for t in targets)
                    and item.value is not None
                ):
                    value, partial = _literal_dict(item.value)
                    if value is not None:
                        info.capabilities = value
                        info.capabilities_line = item.lineno
                        info.capabilities_partial = partial
        return info


def _literal_dict(node: ast.expr) -> tuple[dict | None, bool]:
    """(the dict, some entries were not literals) for a dict display; (None, False) else.

    TT-Metal writes some capabilities as expressions (`os.environ.get(...) == "1"`): those
    entries are left out, which reads them as "not supported".
    """
    try:
        value = ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        value = None
    if isinstance(value, dict):
        return value, False
    if not isinstance(node, ast.Dict):
        return None, False
    out: dict = {}
    for key, item in zip(node.keys, node.values):
        try:
            literal_key = ast.literal_eval(key) if key is not None else None
            out[literal_key] = ast.literal_eval(item)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            continue
    out.pop(None, None)
    return out, True


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
