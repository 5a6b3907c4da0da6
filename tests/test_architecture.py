"""The architecture as a test: layers that depend one way, one vLLM/torch boundary, and
no import cycles.

Layers: every top-level module and package of `ttbundles` sits in one layer (`LAYERS`),
and a module imports only its own package, the base, and packages of lower layers;
function-level and type-checking imports count too. Packages that share a layer are
peers and import neither each other. docs/contributors/layout.md draws the same layers.

Only `serving/` and `reference/` may import vLLM or torch (and `demo/checkpoint`, which
writes weights with torch when asked, inside the function that does). Every other package
is imported here in a fresh interpreter where `vllm` and `torch` cannot be imported at
all, so reaching them from a module body fails this test.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

import ttbundles

PACKAGE = Path(ttbundles.__file__).parent


def _python_files(root: Path) -> list[Path]:
    """Every .py file under `root`, through the checkout's links (ttbundles/cli and
    ttbundles/_data, which the wheel carries as folders): what the installed package has."""
    found = []
    for folder, _, names in os.walk(root, followlinks=True):
        found += [Path(folder) / n for n in names if n.endswith(".py")]
    return sorted(found)


LIGHT = [
    "ttbundles",
    "ttbundles.vllm_window",
    "ttbundles.format.metadata",
    "ttbundles.hub",
    "ttbundles.format.contract",
    "ttbundles.format.capabilities",
    "ttbundles.format.speculative",
    "ttbundles.format.parse",
    "ttbundles.format.schema",
    "ttbundles.check.validate",
    "ttbundles.check.adapter",
    "ttbundles.check.static_reader",
    "ttbundles.check.imports",
    "ttbundles.archive.reader",
    "ttbundles.archive.writer",
    "ttbundles.installer.operations",
    "ttbundles.archive.inspect",
    "ttbundles.build",
    "ttbundles.distribution.push",
    "ttbundles.distribution.pull",
    "ttbundles.trust.policy",
    "ttbundles.trust.signing",
    "ttbundles.trust.verification",
    "ttbundles.installer.admission",
    "ttbundles.registry.registry",
    "ttbundles.registry.requirements",
    "ttbundles.format.loader",
    "ttbundles.format.selection",
    "ttbundles.check.tests_section",
    "ttbundles.tt_metal",
    "ttbundles.registry.servable",
    "ttbundles.doctor",
    "ttbundles.scaffold.init",
    "ttbundles.scaffold.migrate",
    "ttbundles.serving.plugin",
    "ttbundles.demo.flow",
    "ttbundles.demo.server",
    "ttbundles.demo.query",
    "ttbundles.demo.checkpoint",
    "ttbundles.conformance.plan",
    "ttbundles.format.golden_file",
    "ttbundles.format.prompts",
    "ttbundles.conformance.metrics",
    "ttbundles.conformance.compare",
    "ttbundles.conformance.pooling",
    "ttbundles.conformance.session",
    "ttbundles.conformance.report",
    "ttbundles.cli.app",
]

BLOCKER = """
import sys
class Blocked:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("vllm", "torch"):
            raise ImportError(f"{name} is outside the boundary")
sys.meta_path.insert(0, Blocked())
import importlib
for name in sys.argv[1:]:
    importlib.import_module(name)
print("ok")
"""


def test_light_packages_import_without_vllm_or_torch(tmp_path):
    # cwd elsewhere: `python -c` puts the current folder first on sys.path.
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER, *LIGHT],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_the_blocker_really_blocks(tmp_path):
    done = subprocess.run(
        [sys.executable, "-c", BLOCKER, "ttbundles.serving.runner"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "outside the boundary" in done.stderr


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in _python_files(PACKAGE):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        modules[name] = path
    graph = {}
    for name, path in modules.items():
        deps = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                deps |= {node.module} | {f"{node.module}.{a.name}" for a in node.names}
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {
            d
            for d in deps
            if d in modules
            and d != name
            and not d.startswith(name + ".")
            and not name.startswith(d + ".")
        }
    return graph


def test_no_module_imports_itself_through_others():
    graph = _module_graph()

    def reaches(start: str, goal: str) -> bool:
        seen, todo = set(), list(graph[start])
        while todo:
            node = todo.pop()
            if node == goal:
                return True
            if node not in seen:
                seen.add(node)
                todo.extend(graph[node])
        return False

    assert [m for m in graph if reaches(m, m)] == []
    assert len(graph) > 30  # the walk saw the package


# Lowest first. A module may import the base, its own package, and lower layers.
LAYERS: list[set[str]] = [
    # The base: small utilities every layer uses (codes, errors, environment, paths,
    # writes, did-you-mean, where TT-Metal is, the torchvision import step, whether the
    # model hub answers, the tested vLLM window, the parser names vLLM has, sizes in
    # words); they import only each other.
    {
        "codes",
        "errors",
        "envs",
        "fsutil",
        "hub",
        "paths",
        "suggest",
        "tt_metal",
        "torchvision_compat",
        "units",
        "vllm_window",
        "vllm_parsers",
    },
    {"format"},  # the bundle format, its contract, selection rule and module loader
    {"archive"},  # `.ttbundle` files: manifest, writer, reader
    {"trust"},  # signatures (model-signing), the trust policy, provenance records
    {"check"},  # validate: a bundle, an archive, a folder; the static adapter check
    {"registry"},  # what registers, the index of checked bundles, servability
    {"build", "installer", "scaffold"},  # pack, install/uninstall, init/migrate
    {"distribution"},  # push and pull through OCI registries
    {"reference", "serving"},  # the only two that import torch and vLLM
    {"conformance", "doctor"},  # `ttbundle test` and `ttbundle doctor`
    {"demo"},
    {"bench"},  # `ttbundle bench`: serves as demo does, measures with vLLM's client
    {"cli"},  # the typer app, thin over all of the above
    # `python -m ttbundles`, and the package's lazy public API, which reaches everything.
    {"__main__", "__init__"},
]

# Deliberate edges against the layers, each with its reason: (importer, imported).
ALLOWED: set[tuple[str, str]] = set()


def _layer_of(module: str) -> tuple[int, str]:
    """The layer index and the top-level part (`ttbundles.format.meshes` -> format)."""
    parts = module.split(".")
    top = parts[1] if len(parts) > 1 else "__init__"
    for index, members in enumerate(LAYERS):
        if top in members:
            return index, top
    raise AssertionError(
        f"ttbundles.{top} is in no layer: place it in LAYERS in tests/test_architecture.py "
        "(and in docs/contributors/layout.md)"
    )


def _imports(path: Path, name: str, modules: set[str]) -> list[tuple[str, int]]:
    """Every ttbundles module `path` imports, at any depth of its code, with the line."""
    found = []
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[str] = []
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                # `from ttbundles import envs` imports the module ttbundles.envs.
                full = f"{base}.{alias.name}"
                targets.append(full if full in modules else base)
        elif isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) == "import_module"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            targets = [node.args[0].value]
        found += [(t, node.lineno) for t in targets if t.split(".")[0] == "ttbundles"]
    return found


def upward_imports(package: Path) -> list[str]:
    """Each import in `package` (a `ttbundles` folder) of a higher layer or of a peer."""
    files = {}
    for path in _python_files(package):
        rel = path.relative_to(package.parent).with_suffix("")
        if rel.parts[1:2] == ("_data",):
            continue  # the built-in bundles' own code (adapters), data to ttbundles
        files[".".join(rel.parts).removesuffix(".__init__")] = path
    modules = set(files)
    problems = []
    for name, path in sorted(files.items()):
        mine, my_top = _layer_of(name) if name != "ttbundles" else (len(LAYERS) - 1, "__init__")
        for target, line in _imports(path, name, modules):
            theirs, their_top = _layer_of(target)
            if their_top == my_top or theirs == 0 or (name, target) in ALLOWED:
                continue
            if theirs >= mine:
                kind = "a peer" if theirs == mine else "a higher layer"
                problems.append(f"{name} (line {line}) imports {target}, {kind}")
    return problems


def test_every_import_points_down_the_layers():
    assert upward_imports(PACKAGE) == []


def test_the_layer_check_sees_function_level_imports(tmp_path):
    package = tmp_path / "ttbundles"
    (package / "format").mkdir(parents=True)
    (package / "serving").mkdir()
    for init in ("__init__.py", "format/__init__.py", "serving/__init__.py"):
        (package / init).write_text("")
    (package / "serving" / "plugin.py").write_text("from ttbundles.format import meshes\n")
    (package / "format" / "meshes.py").write_text(
        "def f():\n    from ttbundles.serving.plugin import g\n    return g\n"
    )
    assert upward_imports(package) == [
        "ttbundles.format.meshes (line 2) imports ttbundles.serving.plugin, a higher layer"
    ]


def test_the_layer_check_refuses_a_module_in_no_layer(tmp_path):
    package = tmp_path / "ttbundles"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "newthing.py").write_text("")
    with pytest.raises(AssertionError, match="ttbundles.newthing is in no layer"):
        upward_imports(package)


def test_the_index_key_names_every_module_a_cached_verdict_depends_on():
    """The registry index trusts a record only while the code that made it is unchanged
    (`registry.index.checker`): the files it watches are exactly the modules its check
    runs, so a new import there cannot slip past the key."""
    from ttbundles.registry.index import _CHECKER_FILES

    graph = _module_graph()
    seen, todo = set(), ["ttbundles.registry.index"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo.extend(graph[name])
    files = set()
    for name in seen:
        path = PACKAGE.parent.joinpath(*name.split("."))
        files.add(
            str(
                (path / "__init__.py" if path.is_dir() else path.with_suffix(".py")).relative_to(
                    PACKAGE
                )
            )
        )
    assert sorted(files) == sorted(_CHECKER_FILES)


def _literal_environment_reads(path: Path) -> list[str]:
    """`os.getenv("X")`, `<...>environ.get("X")` and `<...>environ["X"]` read in `path`,
    as "<line> reads X"."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        target, key = None, None
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            named = getattr(owner, "attr", getattr(owner, "id", None))
            if (node.func.attr == "get" and named == "environ") or (
                node.func.attr == "getenv" and named == "os"
            ):
                target, key = node, node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and getattr(node.value, "attr", getattr(node.value, "id", None)) == "environ"
        ):
            target, key = node, node.slice
        if target is not None and isinstance(key, ast.Constant) and isinstance(key.value, str):
            found.append(f"{target.lineno} reads {key.value}")
    return found


def test_envs_is_the_one_reader_of_environment_variables():
    """Every variable ttbundles reads is in `ttbundles.envs`' table, read one way there
    (its parser, its deprecated name); other modules may only set variables for their
    children, or copy the whole environment."""
    found = []
    for path in sorted(_python_files(PACKAGE)):
        if path.name != "envs.py" and "_data" not in path.relative_to(PACKAGE).parts:
            found += [f"{path.relative_to(PACKAGE)}:{r}" for r in _literal_environment_reads(path)]
    assert found == []


def test_the_reader_check_sees_a_raw_read(tmp_path):
    module = tmp_path / "m.py"
    module.write_text('import os\nA = os.environ.get("MESH_DEVICE")\nB = os.getenv("X")\n')
    assert _literal_environment_reads(module) == ["2 reads MESH_DEVICE", "3 reads X"]


def test_no_test_skips_over_a_missing_dependency():
    """vLLM, torch and transformers are what the tests are about: a missing or broken
    install fails the run (an import error at collection), it never turns into skips."""
    tests = Path(__file__).parent
    found = [
        f"{path.relative_to(tests)}:{n}"
        for path in sorted(tests.rglob("*.py"))
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "pytest." + "importorskip(" in line  # (spelled apart: not a hit here)
    ]
    assert found == []


def test_the_plan_and_demo_command_bodies_keep_only_parsing_and_output():
    """Their logic lives in the library (serving.dry_run.plan_serve, suggest.slipped_option,
    demo.flow): the bodies stay short and import no checkpoint, hub or model code."""
    root = Path(__file__).resolve().parents[1] / "cli"
    for file, name in (("plan.py", "plan"), ("demo.py", "demo")):
        tree = ast.parse((root / file).read_text())
        [function] = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        body = function.body[1:]  # after the docstring
        assert function.end_lineno - body[0].lineno + 1 <= 70, (file, "body too long")
        imported = {
            node.module
            for node in ast.walk(function)
            if isinstance(node, ast.ImportFrom) and node.module
        }
        assert not imported & {
            "ttbundles.hub",
            "ttbundles.demo.checkpoint",
            "ttbundles.demo.vision_checkpoint",
            "ttbundles.demo.model",
        }, (file, imported)


SERVING = PACKAGE / "serving"
# The engine: vLLM's engine-side parts as the platform plugs them (worker, scheduler, lane
# coordinator), which configuration time must never reach.
ENGINE = ("ttbundles.serving.worker", "ttbundles.serving.scheduler", "ttbundles.serving.lanes")


def _wing_imports(wing: str) -> list[tuple[str, str, int]]:
    """(importer, imported, line) for every ttbundles import in `serving/<wing>`."""
    modules = {
        ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
        for p in _python_files(PACKAGE)
    }
    found = []
    for path in _python_files(SERVING / wing):
        rel = path.relative_to(PACKAGE.parent).with_suffix("")
        name = ".".join(rel.parts).removesuffix(".__init__")
        found += [(name, target, line) for target, line in _imports(path, name, modules)]
    return found


def test_serving_keeps_its_top_level_small():
    """serving/ is in wings by when the code runs (planning/, api_server/, runner/,
    compat/); what stays at its top are the entry points and the pieces every wing
    shares. A module that belongs to a wing goes there."""
    top = sorted(p.name for p in SERVING.glob("*.py"))
    assert len(top) <= 18, top


def test_planning_imports_no_runner_api_server_or_engine():
    """Configuration time decides from the bundle and vLLM's configuration alone: the
    planner never reaches the engine side, so `ttbundle plan` and the server's hook stay
    one cheap code path."""
    banned = ("ttbundles.serving.runner", "ttbundles.serving.api_server", *ENGINE)
    found = [
        f"{name} (line {line}) imports {target}"
        for name, target, line in _wing_imports("planning")
        if target.startswith(banned)
    ]
    assert found == []


def test_the_runner_takes_only_the_plan_from_planning_and_no_coordinator():
    """The runner reads the decisions through the typed plan (`planning.plan`), never the
    planner's internals; what it shares with the lane coordinator is `lane_output`."""
    found = [
        f"{name} (line {line}) imports {target}"
        for name, target, line in _wing_imports("runner")
        if (
            target.startswith("ttbundles.serving.planning")
            and target != "ttbundles.serving.planning.plan"
        )
        or target.startswith(("ttbundles.serving.api_server", *ENGINE))
    ]
    assert found == []


def test_the_wing_check_sees_an_import_across_wings():
    # The helper reads real files: the runner's states module imports lane_output (allowed),
    # and the platform's wing walk sees planning's own imports.
    runner = {target for _, target, _ in _wing_imports("runner")}
    assert "ttbundles.serving.lane_output" in runner
    assert "ttbundles.serving.planning.plan" in runner


def test_only_the_kv_package_asks_a_spec_its_class():
    """A KV kind is known in `serving/runner/kv/` alone: elsewhere a spec is asked through
    the package (`kinds`, `sizing`, `groups`), never `isinstance(spec, SlidingWindowSpec)`,
    so a new kind is one new case there."""
    kinds = {"SlidingWindowSpec", "FullAttentionSpec", "MambaSpec", "AttentionSpec"}
    found = []
    for path in _python_files(PACKAGE):
        if "kv" in path.relative_to(PACKAGE).parts[:-1] or "_data" in path.parts:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if (
                isinstance(node, ast.Call)
                and getattr(node.func, "id", None) == "isinstance"
                and len(node.args) == 2
                and (
                    {n.id for n in ast.walk(node.args[1]) if isinstance(n, ast.Name)}
                    | {n.attr for n in ast.walk(node.args[1]) if isinstance(n, ast.Attribute)}
                )
                & kinds
            ):
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert found == []


def test_the_worker_drives_one_runner_surface():
    """The worker hands every call to its runner: no branch on the runner's kind."""
    source = (SERVING / "worker.py").read_text(encoding="utf-8")
    assert "pools" not in source and "TTPoolingRunner" not in source


# The torch reference stays readable as a golden: the generator a composed surface over
# its parts (model, cache, driver, speculation, families), no function too long to read
# at once. Measured as ast spans (decorators excluded, docstrings included).
REFERENCE_CLASS_LINES = 300
REFERENCE_FUNCTION_LINES = 80


def _span(node: ast.AST) -> int:
    return node.end_lineno - node.lineno + 1  # type: ignore[attr-defined]


def test_the_reference_generator_class_stays_a_short_composed_surface():
    tree = ast.parse((PACKAGE / "reference" / "generator.py").read_text(encoding="utf-8"))
    [generator] = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ReferenceLlamaGenerator"
    ]
    assert _span(generator) < REFERENCE_CLASS_LINES


def test_no_function_in_the_reference_is_longer_than_80_lines():
    long = []
    for path in _python_files(PACKAGE / "reference"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            functions = (ast.FunctionDef, ast.AsyncFunctionDef)
            if isinstance(node, functions) and _span(node) > REFERENCE_FUNCTION_LINES:
                long.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.name}")
    assert long == []
