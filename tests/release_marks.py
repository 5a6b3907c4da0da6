"""Which tests can differ between the vLLM releases of the window: the `vllm` marker.

The whole suite runs on the default release; on the others only what can differ runs
there: a test that imports vLLM, reaches code that does (`ttbundles.serving`, a command
that plans or serves), or starts vLLM processes (the `server` tier). The rest (the
format, archives, trust, the CLI's own parsing) runs the same code on every release.

The choice is made from the source, not kept by hand: `vllm_reaching(item)` follows
what the test can run.

- The test module's own module-level imports, and every import inside the test function,
  inside the fixtures it requests (transitively) and inside the module's helper functions
  they call by name.
- From there, first-party modules (`ttbundles`, `tests`) are followed through all of
  their imports, function-level ones included: a lazy import is still code the test may
  run. The one exception is the CLI's app module, which imports every command: a command
  is followed only where the test runs it (a string literal naming it in a call).
- A test in the `server` tier starts vLLM processes.

Following every import is conservative on purpose: a test wrongly taken as "can differ"
costs a minute on the other release; one wrongly left out would hide a difference.
"""

from __future__ import annotations

import ast
import os
import textwrap
from collections.abc import Iterable
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARK = "vllm"
# What, once reached, makes a test differ between releases.
RELEASE_DEPENDENT = ("vllm", "ttbundles.vllm_window")
CLI_APP = "ttbundles.cli.app"


def _first_party() -> dict[str, Path]:
    """Module name -> file, for ttbundles (through the checkout's links: ttbundles/cli)
    and tests."""
    modules: dict[str, Path] = {}
    for top in ("ttbundles", "tests"):
        for folder, _, names in os.walk(REPO / top, followlinks=True):
            if "_data" in Path(folder).relative_to(REPO).parts:
                continue  # the built-in bundles' adapters: data, imported by no test
            for name in names:
                if name.endswith(".py"):
                    path = Path(folder) / name
                    parts = path.relative_to(REPO).with_suffix("").parts
                    modules[".".join(parts).removesuffix(".__init__")] = path
    return modules


MODULES = _first_party()


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imported(module: str, nodes: Iterable[ast.AST]) -> set[str]:
    """Every module name the import statements among `nodes` may load (for `from m
    import n`, both m and m.n: n may be a submodule)."""
    is_package = MODULES.get(module, Path()).name == "__init__.py"
    names: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(module, is_package, node)
            names.add(target)
            names |= {f"{target}.{alias.name}" for alias in node.names}
    return names


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(encoding="utf-8"))


@cache
def _commands() -> dict[str, str]:
    """CLI command name -> the module of its function, read from the app's
    `app.command(...)(module.function)` lines."""
    commands: dict[str, str] = {}
    for node in ast.walk(_tree(CLI_APP)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Call)
            and isinstance(node.func.func, ast.Attribute)
            and node.func.func.attr == "command"
            and node.args
            and isinstance(node.args[0], ast.Attribute)
            and isinstance(node.args[0].value, ast.Name)
        ):
            given = node.func.args
            name = (
                given[0].value
                if given and isinstance(given[0], ast.Constant)
                else node.args[0].attr.replace("_", "-")
            )
            commands[name] = f"ttbundles.cli.{node.args[0].value.id}"
    return commands


def _edges(module: str) -> set[str]:
    """The modules `module` can load: first-party ones by name, others by top package."""
    if module == CLI_APP:  # the dispatcher: its commands are followed per test
        commands = set(_commands().values())
        names = {
            n
            for n in _imported(module, ast.walk(_tree(module)))
            if n not in commands and n.rsplit(".", 1)[0] not in commands
        }
    else:
        names = _imported(module, ast.walk(_tree(module)))
    edges = set()
    for name in names:
        if name in MODULES:
            edges.add(name)
        elif name.rsplit(".", 1)[0] in MODULES:
            edges.add(name.rsplit(".", 1)[0])
        else:
            edges.add(name.split(".")[0])
    return edges


@cache
def _reaching() -> frozenset[str]:
    """Every first-party module from which a release-dependent package can be loaded:
    the graph walked backwards from those packages, once."""
    graph = {m: _edges(m) for m in MODULES}
    users: dict[str, set[str]] = {}
    for module, edges in graph.items():
        for edge in edges:
            users.setdefault(edge, set()).add(module)
    found: set[str] = set()
    todo = [m for m in RELEASE_DEPENDENT]
    while todo:
        for user in users.get(todo.pop(), ()):
            if user not in found:
                found.add(user)
                todo.append(user)
    return frozenset(found)


def _reaches(module: str) -> bool:
    return module in _reaching()


def _search(names: set[str]) -> bool:
    """Whether loading any of `names` can load a release-dependent package."""
    for name in names:
        if name.split(".")[0] in RELEASE_DEPENDENT or name in RELEASE_DEPENDENT:
            return True
        known = name if name in MODULES else name.rsplit(".", 1)[0]
        if known in MODULES and _reaches(known):
            return True
    return False


def _module_level(tree: ast.Module) -> list[ast.AST]:
    """The statements that run when the module is imported (not function bodies)."""
    found: list[ast.AST] = []

    def visit(statements: list[ast.stmt]) -> None:
        for statement in statements:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            if isinstance(statement, ast.ClassDef):
                visit(statement.body)
                continue
            found.append(statement)
            for field in ("body", "orelse", "finalbody"):
                visit(getattr(statement, field, []) or [])
            for handler in getattr(statement, "handlers", []) or []:
                visit(handler.body)

    visit(tree.body)
    return found


def _functions(tree: ast.Module) -> dict[str, ast.AST]:
    return {
        node.name: node
        for node in tree.body
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
    }


def _body_reaches(module: str, node: ast.AST, seen: set[tuple[str, str]]) -> bool:
    """Whether a function of a test or conftest module can reach vLLM: its imports, the
    CLI commands it names in calls, and the module's functions it calls by name."""
    if _search(_imported(module, ast.walk(node))):
        return True
    if any(_search(_imported(module, ast.walk(code))) for code in _code_strings(module, node)):
        return True
    commands = _commands()
    local = _functions(_tree(module)) if module in MODULES else {}
    # A command the test may run: a string naming it, alone or first in a command line
    # (`run_cli("plan", ...)`, a parametrized "validate --bogus ."), decorators included.
    for text in (n.value for n in ast.walk(node) if isinstance(n, ast.Constant)):
        first = text.split(" ", 1)[0] if isinstance(text, str) else None
        if first in commands and _reaches(commands[first]):
            return True
    for call in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
        callee = call.func.id if isinstance(call.func, ast.Name) else None
        if callee in local and (module, callee) not in seen:
            seen.add((module, callee))
            if _body_reaches(module, local[callee], seen):
                return True
    return False


def _code_strings(module: str, node: ast.AST) -> list[ast.AST]:
    """The Python programs `node` may hand to an interpreter (`python -c CODE`): string
    literals in it, and module-level string constants it names, that parse as Python
    with an import in them."""
    constants = {}
    if module in MODULES:
        for statement in _tree(module).body:
            if (
                isinstance(statement, ast.Assign)
                and isinstance(statement.value, ast.Constant)
                and isinstance(statement.value.value, str)
            ):
                for target in statement.targets:
                    if isinstance(target, ast.Name):
                        constants[target.id] = statement.value.value
    texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
    texts += [
        constants[n.id] for n in ast.walk(node) if isinstance(n, ast.Name) and n.id in constants
    ]
    programs = []
    for text in texts:
        if isinstance(text, str) and "import " in text:
            try:
                programs.append(ast.parse(textwrap.dedent(text)))
            except SyntaxError:
                continue
    return programs


def _module_of(function) -> str | None:
    path = Path(getattr(function, "__code__", None).co_filename).resolve()
    try:
        parts = path.relative_to(REPO).with_suffix("").parts
    except ValueError:
        return None
    return ".".join(parts).removesuffix(".__init__")


def _function_node(function) -> tuple[str, ast.AST] | None:
    function = getattr(function, "__wrapped__", function)
    code = getattr(function, "__code__", None)
    module = _module_of(function) if code else None
    if module not in MODULES:
        return None
    for node in ast.walk(_tree(module)):
        if (
            isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
            and node.name == code.co_name
            # co_firstlineno is the first decorator's line where there is one
            and min([node.lineno] + [d.lineno for d in node.decorator_list])
            <= code.co_firstlineno
            <= node.end_lineno
        ):
            return module, node
    return None


@cache
def _fixture_reaches(function) -> bool:
    found = _function_node(function)
    return found is not None and _body_reaches(found[0], found[1], set())


def vllm_reaching(item: pytest.Item) -> bool:
    """Whether `item` can differ between vLLM releases (see the module's docstring)."""
    if item.get_closest_marker("server"):
        return True
    function = getattr(item, "function", None)
    found = _function_node(function) if function is not None else None
    if found is None:
        return True  # not a test function we can read (a doctest, a plugin's item): run it
    module, node = found
    if _search(_imported(module, _module_level(_tree(module)))):
        return True
    if _body_reaches(module, node, set()):
        return True
    info = getattr(item, "_fixtureinfo", None)
    for name in info.names_closure if info else ():
        for definition in info.name2fixturedefs.get(name, ()):
            if _fixture_reaches(definition.func):
                return True
    return False


def mark_release_dependent(items: list[pytest.Item]) -> None:
    """Add the `vllm` marker to every item that can differ between releases."""
    for item in items:
        if vllm_reaching(item):
            item.add_marker(MARK)


def function_reaches(module: str, name: str) -> bool:
    """`vllm_reaching` for the function `name` of `module` without its fixtures (what
    tests/test_release_marks.py holds the rules to)."""
    tree = _tree(module)
    if _search(_imported(module, _module_level(tree))):
        return True
    return _body_reaches(module, _functions(tree)[name], set())
