"""The tool-call and reasoning parsers the installed vLLM has, read without importing it.

`ttbundle validate` checks a bundle's serving defaults (`serving.tool_call_parser`,
`serving.reasoning_parser`) against them; importing vLLM's parser managers costs 15 s,
so the names are read from the source of the tables vLLM registers them from
(`_TOOL_PARSERS_TO_REGISTER` in `vllm/tool_parsers/__init__.py`,
`_REASONING_PARSERS_TO_REGISTER` in `vllm/reasoning/__init__.py`, the same on 0.33.0 and
0.34.0). In a process that has imported vLLM, `registered` asks the managers themselves
(which also know parsers registered by a plugin).
"""

from __future__ import annotations

import ast
import importlib.util
import sys
from pathlib import Path
from typing import Literal

ParserKind = Literal["tool_call", "reasoning"]

# Where each table lives, as (package folder under vllm, table name).
_TABLES: dict[str, tuple[str, str]] = {
    "tool_call": ("tool_parsers", "_TOOL_PARSERS_TO_REGISTER"),
    "reasoning": ("reasoning", "_REASONING_PARSERS_TO_REGISTER"),
}


def _vllm_folder() -> Path | None:
    """The installed vLLM package's folder, found without importing it."""
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def known_names(kind: ParserKind) -> frozenset[str] | None:
    """The parser names of `kind` the installed vLLM registers; None when they cannot be
    read (no vLLM, or its table moved: then nothing is claimed either way)."""
    if "vllm" in sys.modules:
        return registered(kind)
    folder = _vllm_folder()
    if folder is None:
        return None
    package, table = _TABLES[kind]
    try:
        tree = ast.parse((folder / package / "__init__.py").read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    for node in tree.body:
        target = node.targets[0] if isinstance(node, ast.Assign) else None
        if isinstance(node, ast.AnnAssign):
            target = node.target
        value = getattr(node, "value", None)
        if isinstance(target, ast.Name) and target.id == table and isinstance(value, ast.Dict):
            names = [k.value for k in value.keys if isinstance(k, ast.Constant)]
            return frozenset(n for n in names if isinstance(n, str)) or None
    return None


def registered(kind: ParserKind) -> frozenset[str]:
    """The names vLLM's own parser manager lists (imports vLLM's parser registry)."""
    if kind == "tool_call":
        from vllm.tool_parsers import ToolParserManager

        return frozenset(ToolParserManager.list_registered())
    from vllm.reasoning import ReasoningParserManager

    return frozenset(ReasoningParserManager.list_registered())
