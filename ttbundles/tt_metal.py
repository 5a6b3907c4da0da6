"""Where TT-Metal is, found without importing it.

A base utility: the platform plugin asks it whether to activate, the registry's
servability checks and `ttbundle doctor` whether this machine can open a device mesh.
Importing ttnn is slow and has side effects, so nothing here ever does.
"""

from __future__ import annotations


def ttnn_origin() -> str | None:
    """Where ttnn would be imported from, found without importing it; None if absent."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("ttnn")
    except (ImportError, ValueError):
        return None
    if spec is None:
        return None
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or "ttnn"
