"""Read a class from its source, never importing it: its methods (own and inherited),
its `model_capabilities`, and what could not be seen.

Bundle code must not run during validation (it usually imports ttnn, which is absent
where bundles are validated), so classes are parsed with `ast`, never imported. What
cannot be seen statically (a base class from outside the bundle, a computed value) is
reported as such rather than guessed.

`read_class` is the same reading for the registry: the class of a `TT_MODEL_CLASS_OVERRIDES`
entry or of a legacy bundle, found where it lives (a folder, else the serving environment)
and read for its `model_capabilities` and methods, still without importing anything.

The contract checks over what it reads are `check.adapter`.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.check.capabilities import ClassCapabilities
from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.contract import (
    ASYNC_SPEC_DECODE_KEY,
    CAPABILITIES_ATTRIBUTE,
    CONTRACT_MARKER,
    CONTRACT_V1,
    METHODS_BY_NAME,
    SPEC_DECODE_KEY,
    SPEC_KEYS,
    SPEC_LIST_KEYS,
    SPEC_METHODS_OF_CLASS,
    TT_METAL_FLAGS,
)
from ttbundles.format.metadata import BundleMetadata, Capabilities
from ttbundles.format.modules import module_file

Function = ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda
SPEC_METHOD_NAMES = frozenset(m.name for m in SPEC_METHODS_OF_CLASS)


@dataclass(frozen=True)
class Definition:
    """Where a class attribute is defined; `node` is the function when its signature can
    be read (a `def`, a lambda, or an alias of one), None when it cannot
    (`decode_forward = OutsideBase.decode_forward`)."""

    file: Path
    line: int
    node: Function | None = None


@dataclass
class ClassInfo:
    """What could be learned about a class from source: methods, and what was not seen."""

    file: Path
    line: int
    methods: dict[str, Definition] = field(default_factory=dict)
    capabilities: ClassCapabilities | None = None
    unresolved_bases: list[str] = field(default_factory=list)
    # "module:Class" of the class, then of its bases depth-first (found or only imported):
    # which known classes it builds on, e.g. a reference generator.
    ancestors: list[str] = field(default_factory=list)
    contract: int = 0  # its decode_input_update_contract, where a literal shows it
    # `module:Class` of the class and of every base read, nearest first (the MRO as far
    # as it could be followed).
    lineage: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class SourceRoots:
    """Where module files are looked up, without importing: folders (a bundle), and the
    directories of one top-level package of the environment (`package`), every portion of
    it when it is a namespace package."""

    folders: tuple[Path, ...] = ()
    package: str | None = None
    portions: tuple[Path, ...] = ()

    def module_file(self, module: str) -> Path | None:
        for folder in self.folders:
            found = module_file(folder, module)
            if found is not None:
                return found
        top, _, rest = module.partition(".")
        if top == self.package:
            for portion in self.portions:
                found = module_file(portion, rest) if rest else portion / "__init__.py"
                if found is not None and found.is_file():
                    return found
        return None

    def describe(self) -> str:
        return ", ".join(str(p) for p in (*self.folders, *self.portions))


def compile_tree(tree: ast.Module, path: Path) -> None:
    """Compile a parsed module, executing nothing: raises what Python would raise at import
    before running a line. `ast.parse` accepts more than `compile()` does: a `from
    __future__` import after other statements, `return` or `await` outside a function,
    `nonlocal` without a binding, a name both global and assigned before. A copy of the
    tree is compiled (compiling adds fields to its nodes); warnings (an invalid escape
    sequence) are not errors and stay quiet."""
    import copy
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        compile(copy.deepcopy(tree), str(path), "exec", dont_inherit=True)


def syntax_diagnostic(exc: SyntaxError | ValueError, path: Path) -> Diagnostic:
    """TTB051 for a module Python cannot parse or compile, at its line (a `ValueError`:
    the source holds a NUL byte)."""
    if isinstance(exc, SyntaxError):
        # compile() reports the file it was given; the line is the one to fix.
        return Diagnostic(
            "TTB051",
            Severity.ERROR,
            f"syntax error: {exc.msg}",
            file=str(path),
            line=exc.lineno,
            column=exc.offset,
            hint="fix the Python syntax",
        )
    return Diagnostic(
        "TTB051",
        Severity.ERROR,
        f"not Python source: {exc}",
        file=str(path),
        hint="fix the Python syntax",
    )


def signature(before: os.stat_result, after: os.stat_result) -> tuple[int, int, int] | None:
    """(size, mtime_ns, inode) of a file read between two `fstat`s of it; None when the
    two differ (it was written while read: nothing may be concluded from it)."""
    found = (before.st_size, before.st_mtime_ns, before.st_ino)
    if found != (after.st_size, after.st_mtime_ns, after.st_ino):
        return None
    return found


class _SourceError(Exception):
    def __init__(self, diagnostic: Diagnostic):
        self.diagnostic = diagnostic


class _ClassFinder:
    """Follows class definitions and imports inside the source roots (and, with
    `follow_environment`, into the serving environment for modules outside them)."""

    def __init__(
        self, roots: SourceRoots, *, follow_environment: bool = False, shallow: bool = False
    ):
        self.roots = roots
        self.follow_environment = follow_environment
        # Only where the class is defined, not what its body and bases hold.
        self.shallow = shallow
        self._trees: dict[Path, ast.Module] = {}
        self.read: list[Path] = []
        # When a dict: each file parsed -> (size, mtime_ns, inode) of what was read, from
        # the open file before and after reading (None when it changed meanwhile), so a
        # caller keying an outcome by the files needs no second look at them.
        self.signatures: dict[Path, tuple[int, int, int] | None] | None = None
        # Also compile each tree (validate's check): see `compile_tree`.
        self.compile_check = False

    def locate(self, module: str) -> Path | None:
        path = self.roots.module_file(module)
        if path is None and self.follow_environment and module:
            found = environment_roots(module)
            path = found.module_file(module) if found is not None else None
        return path

    def parse(self, path: Path) -> ast.Module:
        if path not in self._trees:
            self.read.append(path)
            try:
                with open(path, encoding="utf-8") as handle:
                    if self.signatures is None:
                        source = handle.read()
                    else:
                        first = os.fstat(handle.fileno())
                        try:
                            source = handle.read()
                        finally:  # a file that does not decode is an outcome too
                            self.signatures[path] = signature(first, os.fstat(handle.fileno()))
                self._trees[path] = ast.parse(source, filename=str(path))
                if self.compile_check:
                    compile_tree(self._trees[path], path)
            except (SyntaxError, ValueError) as exc:
                raise _SourceError(syntax_diagnostic(exc, path)) from None
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
                if self.shallow:
                    return ClassInfo(file=path, line=node.lineno)
                return self._class_info(path, module, node, depth)
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

    def _class_info(self, path: Path, module: str, node: ast.ClassDef, depth: int) -> ClassInfo:
        info = ClassInfo(file=path, line=node.lineno, lineage=[f"{module}:{node.name}"])
        # Bases last to first, so that the first base wins, as in the MRO (a
        # simplification: a name from a later base is not known to be shadowed by an
        # earlier base outside the bundle); then the class's own body over all of them.
        for base in reversed(node.bases):
            base_name = _dotted(base)
            if base_name in (None, "object"):
                continue
            resolved = None
            if "." not in base_name:
                resolved = self.find(path, module, base_name, depth + 1)
            if resolved is None:
                info.unresolved_bases.insert(0, base_name)
                origin = (
                    self._imported(self.parse(path), module, path, base_name)
                    if "." not in base_name
                    else None
                )
                info.ancestors[:0] = [f"{origin[0]}:{origin[1]}" if origin else base_name]
            else:
                info.lineage[1:1] = resolved.lineage
                info.ancestors[:0] = resolved.ancestors
                info.methods.update(resolved.methods)
                info.unresolved_bases[:0] = resolved.unresolved_bases
                if resolved.capabilities is not None:
                    info.capabilities = resolved.capabilities
                info.contract = resolved.contract
        info.ancestors.insert(0, f"{module}:{node.name}")
        for item in node.body:
            if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                info.methods[item.name] = Definition(path, item.lineno, item)
            elif isinstance(item, ast.Assign | ast.AnnAssign) and item.value is not None:
                targets = item.targets if isinstance(item, ast.Assign) else [item.target]
                for target in targets:
                    if not isinstance(target, ast.Name):
                        continue
                    if target.id == CAPABILITIES_ATTRIBUTE:
                        # A class's dict replaces the inherited one (TT-Metal's rule).
                        info.capabilities = self._capabilities(item.value, path, module, depth)
                        info.capabilities.where = f"{path.name}:{item.lineno}"
                    elif target.id == CONTRACT_MARKER:
                        try:
                            value = ast.literal_eval(item.value)
                        except (ValueError, TypeError, SyntaxError, RecursionError):
                            value = 0
                        info.contract = CONTRACT_V1 if isinstance(value, int) and value >= 1 else 0
                    elif target.id in METHODS_BY_NAME or target.id in SPEC_METHOD_NAMES:
                        # `decode_forward = _decode`: an alias defines the method too.
                        info.methods[target.id] = self._alias(
                            item.value, info.methods, path, module, depth
                        )
        return info

    def _alias(
        self,
        value: ast.expr,
        scope: dict[str, Definition],
        path: Path,
        module: str,
        depth: int,
    ) -> Definition:
        """The definition an assignment in a class body refers to, as far as visible."""
        here = Definition(path, value.lineno)
        if isinstance(value, ast.Lambda):
            return Definition(path, value.lineno, value)
        if (
            isinstance(value, ast.Call)
            and isinstance(value.func, ast.Name)
            and value.func.id in ("classmethod", "staticmethod")
            and len(value.args) == 1
        ):
            return self._alias(value.args[0], scope, path, module, depth)
        if isinstance(value, ast.Name):
            if value.id in scope:
                return scope[value.id]
            for node in self.parse(path).body:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    node.name == value.id
                ):
                    return Definition(path, node.lineno, node)
            return here
        if isinstance(value, ast.Attribute) and isinstance(value.value, ast.Name):
            owner = self.find(path, module, value.value.id, depth + 1)
            if owner is not None and value.attr in owner.methods:
                return owner.methods[value.attr]
        return here

    def _capabilities(
        self, value: ast.expr, path: Path, module: str, depth: int
    ) -> ClassCapabilities:
        """A `model_capabilities` value, key by key: a computed value hides only its key."""
        if not isinstance(value, ast.Dict):
            return self._referenced(value, path, module, depth, whole=True)
        caps = ClassCapabilities()
        for key_node, value_node in zip(value.keys, value.values):
            if key_node is None:  # {**Base.model_capabilities, ...}: merged explicitly
                caps.update(self._referenced(value_node, path, module, depth, whole=False))
                continue
            try:
                key = ast.literal_eval(key_node)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                reason = f"has a computed key ({_source(key_node)})"
                caps.update(ClassCapabilities(open=("TTB040", reason)))
                continue
            if not isinstance(key, str):
                continue
            try:
                literal = ast.literal_eval(value_node)
                known = bool(literal)
            except (ValueError, TypeError, SyntaxError, RecursionError):
                reason = f"is computed ({_source(value_node)}), not a literal"
                caps.update(ClassCapabilities(unknown={key: ("TTB040", reason)}))
            else:
                caps.update(ClassCapabilities(values={key: known}, literals={key: literal}))
        return caps

    def _referenced(
        self, value: ast.expr, path: Path, module: str, depth: int, *, whole: bool
    ) -> ClassCapabilities:
        """The capabilities an expression stands for (the whole dict, or a `**` entry of
        one): `Base.model_capabilities` of a class the bundle defines is followed;
        anything else is not known here."""
        prefix = (
            f"is not known here: the dict is {_source(value)}"
            if whole
            else (f"may come from {_source(value)}")
        )
        if (
            isinstance(value, ast.Attribute)
            and value.attr == CAPABILITIES_ATTRIBUTE
            and isinstance(value.value, ast.Name)
        ):
            owner = self.find(path, module, value.value.id, depth + 1)
            if owner is not None and owner.capabilities is not None:
                copy = ClassCapabilities(where=owner.capabilities.where)
                copy.update(owner.capabilities)
                return copy
            if owner is None:
                return ClassCapabilities(open=("TTB057", f"{prefix} (outside the bundle)"))
            if owner.unresolved_bases:
                outside = ", ".join(owner.unresolved_bases)
                reason = f"{prefix} (inherited from {outside}, outside the bundle)"
                return ClassCapabilities(open=("TTB057", reason))
        return ClassCapabilities(open=("TTB040", f"{prefix} (computed)"))


def _source(node: ast.AST, limit: int = 60) -> str:
    text = ast.unparse(node)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _dotted(node: ast.expr) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        parent = _dotted(node.value)
        return f"{parent}.{node.attr}" if parent else None
    return None


def environment_roots(module: str) -> SourceRoots | None:
    """Where `module`'s top-level package lives, found without importing it: every
    portion of a namespace package (TT-Metal's `models` can be split over several
    folders), the folder of a plain module."""
    top = module.split(".")[0]
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    if spec.submodule_search_locations:
        portions = tuple(Path(p) for p in spec.submodule_search_locations)
        return SourceRoots(package=top, portions=portions)
    if spec.origin and spec.origin not in ("built-in", "frozen"):
        return SourceRoots(folders=(Path(spec.origin).parent,), package=top)
    return None


@dataclass(frozen=True)
class StaticClass:
    """A class as its source shows it (`read_class`): never imported."""

    file: Path
    line: int
    methods: frozenset[str]
    # What its `model_capabilities` (its own, else the nearest base's) says, per key:
    # True only for a value known to be truthy; None when no class seen defines one.
    model_capabilities: dict[str, bool] | None
    # Every base was found and read, so a method absent from `methods` is really absent.
    complete: bool
    # The literal values of the speculative keys (`contract.SPEC_KEYS`) the dict shows.
    spec_literals: dict[str, object] = field(default_factory=dict)
    # `module:Class` of the class and the bases read (`ClassInfo.lineage`).
    lineage: tuple[str, ...] = ()
    # The literal value of every key the dict shows one for (numbers such as
    # output_tokens_per_step, which the plan reads).
    literals: dict[str, object] = field(default_factory=dict)

    @property
    def capabilities(self) -> Capabilities:
        """What the class's `model_capabilities` says, as bundle capabilities.

        TT-Metal's rule: an absent key (or no dict at all, or a value not known here)
        means "not supported"; declaring less than a class supports is safe, more is not.
        `supports_sample_on_device` is one flag there: both sampling modes here.
        Speculative decoding as the reference plugin serves such a class: `ngram` with the
        master gate, `custom_class` too when its drafter proposes on the device and the
        class has `propose_draft_tokens`; left off when the keys contradict themselves.
        """
        caps = self.model_capabilities or {}
        supported = {name: caps.get(key) is True for key, name in TT_METAL_FLAGS.items()}
        sample = supported.pop("sample_on_device")
        plain = Capabilities(**supported, sample_on_device=["decode_only", "all"] if sample else [])
        spec = self._speculative(caps)
        if not spec:
            return plain
        try:
            return Capabilities(**{**plain.model_dump(), **spec})
        except ValueError:  # the class's keys contradict themselves: not served
            return plain

    def _speculative(self, caps: dict[str, bool]) -> dict[str, object]:
        if caps.get(SPEC_DECODE_KEY) is not True:
            return {}
        lists = {}
        for key in SPEC_LIST_KEYS:
            value = self.spec_literals.get(key, [])
            if not isinstance(value, list | tuple | set | frozenset):
                return {}
            lists[SPEC_KEYS[key]] = sorted(str(v) for v in value)
        methods = ["ngram"]
        if (
            "device_propose" in lists["spec_requirements"]
            and "propose_draft_tokens" in self.methods
        ):
            methods.append("custom_class")
        return {
            "spec_decode": methods,
            "async_spec_decode": caps.get(ASYNC_SPEC_DECODE_KEY) is True,
            **lists,
            "spec_plan": "spec_plan" in self.methods,
        }


def read_class(module: str, class_name: str, *, roots: Sequence[Path] = ()) -> StaticClass | None:
    """The class `module:class_name` read from source, or None where it cannot be found.

    The module is looked for under each of `roots` in turn (a bundle folder, a checkout),
    then in the serving environment (`importlib.util.find_spec` of its top-level package,
    which imports nothing). Bases imported from other modules are followed the same way,
    into the environment too, so a class deriving from a TT-Metal or ttbundles base still
    shows its inherited methods and capabilities. Unreadable sources count as not found.
    """
    candidates = [SourceRoots(folders=(Path(root),)) for root in roots]
    environment = environment_roots(module)
    if environment is not None:
        candidates.append(environment)
    for source in candidates:
        path = source.module_file(module)
        if path is None:
            continue
        finder = _ClassFinder(source, follow_environment=True)
        try:
            info = finder.find(path, module, class_name)
        except _SourceError:
            return None
        if info is None:
            return None
        caps = info.capabilities
        return StaticClass(
            file=info.file,
            line=info.line,
            methods=frozenset(info.methods),
            model_capabilities=(
                None if caps is None else {k: v is True for k, v in caps.values.items()}
            ),
            complete=not info.unresolved_bases,
            spec_literals=(
                {}
                if caps is None
                else {k: caps.literals[k] for k in SPEC_LIST_KEYS if k in caps.literals}
            ),
            lineage=tuple(info.lineage),
            literals={} if caps is None else dict(caps.literals),
        )
    return None


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
