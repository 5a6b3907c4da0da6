"""The architecture as a test: one vLLM/torch boundary, and no import cycles.

Only `serving/` and `reference/` may import vLLM or torch (and `demo/checkpoint`, which
writes weights with torch when asked, inside the function that does). Every other package
is imported here in a fresh interpreter where `vllm` and `torch` cannot be imported at
all, so reaching them from a module body fails this test.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import ttbundles

PACKAGE = Path(ttbundles.__file__).parent
LIGHT = [
    "ttbundles",
    "ttbundles.format.metadata",
    "ttbundles.format.contract",
    "ttbundles.format.parse",
    "ttbundles.format.schema",
    "ttbundles.check.validate",
    "ttbundles.check.adapter",
    "ttbundles.check.imports",
    "ttbundles.archive.reader",
    "ttbundles.archive.writer",
    "ttbundles.archive.install",
    "ttbundles.archive.inspect",
    "ttbundles.build",
    "ttbundles.registry.registry",
    "ttbundles.registry.loader",
    "ttbundles.registry.requirements",
    "ttbundles.registry.servable",
    "ttbundles.doctor",
    "ttbundles.scaffold",
    "ttbundles.serving.plugin",
    "ttbundles.demo.flow",
    "ttbundles.demo.server",
    "ttbundles.demo.query",
    "ttbundles.demo.checkpoint",
    "ttbundles.conformance.plan",
    "ttbundles.conformance.golden_file",
    "ttbundles.conformance.metrics",
    "ttbundles.conformance.compare",
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
        [sys.executable, "-c", BLOCKER, "ttbundles.serving.model_runner"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert done.returncode != 0 and "outside the boundary" in done.stderr


def _module_graph() -> dict[str, set[str]]:
    modules = {}
    for path in PACKAGE.rglob("*.py"):
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
