"""Where a bundle's Python modules live, found on disk without importing anything."""

from __future__ import annotations

import os
from pathlib import Path

SKIP_DIRS = {"__pycache__", ".git", ".hg", ".svn", ".bzr", ".venv", "node_modules"}


def module_file(root: Path, module: str) -> Path | None:
    """The file of dotted `module` under `root` (`a.b` -> a/b.py or a/b/__init__.py)."""
    # Strings, not Paths: registration looks up every bundle's module in every process.
    base = os.path.join(str(root), *module.split("."))
    for candidate in (base + ".py", base + "/__init__.py"):
        if os.path.isfile(candidate):
            return Path(candidate)
    return None


def bundle_modules(root: Path) -> list[str]:
    """Every importable dotted module name in a bundle folder, for did-you-mean hints."""
    names: list[str] = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS for part in rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if parts and all(p.isidentifier() for p in parts):
            names.append(".".join(parts))
    return names
