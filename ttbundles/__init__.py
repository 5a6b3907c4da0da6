"""ttbundles: ship Tenstorrent model bundles to vLLM.

The public API, imported lazily so that `import ttbundles` stays as cheap as the plugin
that vLLM loads in every process:

- `load_metadata(path)`: read a bundle's `vllm_metadata.json` (metadata, diagnostics);
- `validate(path, ...)`: check a bundle, an archive or a folder of bundles;
- `pack(bundle_dir, out_dir)`: validate, then write a deterministic `.ttbundle`;
- `verify(path)`: recompute an archive's or an installed bundle's digests;
- `install(archive, models_dir)` / `uninstall(name, models_dir)`: an `InstallResult`;
- `compute_registry()`: what vLLM would register, and why not the rest.

Stages live in packages of their own: `format`, `check`, `archive`, `registry`,
`serving` (the only one, with `reference`, that imports vLLM and torch), `reference`,
`demo`.
"""

from __future__ import annotations

from importlib import import_module
from pathlib import Path
from typing import Any

# In a source checkout (an editable install, or PYTHONPATH at the repository), the typer
# app lives in the repository's top-level `cli/` rather than in `ttbundles/cli/`, where
# the wheel puts it: map it, so `ttbundles.cli` is the same module either way.
_CHECKOUT_CLI = Path(__file__).resolve().parent.parent / "cli"
if (_CHECKOUT_CLI / "app.py").is_file() and not (Path(__file__).parent / "cli").exists():
    __path__.append(str(_CHECKOUT_CLI.parent))  # noqa: F821 - a package's own __path__

_API = {
    "load_metadata": ("ttbundles.format.parse", "load_metadata"),
    "validate": ("ttbundles.check.validate", "validate_path"),
    "pack": ("ttbundles.build", "pack"),
    "verify": ("ttbundles.archive.reader", "verify"),
    "install": ("ttbundles.archive.install", "install"),
    "uninstall": ("ttbundles.archive.install", "uninstall"),
    "compute_registry": ("ttbundles.registry.registry", "compute"),
}

__all__ = sorted(_API)


def __getattr__(name: str) -> Any:
    try:
        module, attribute = _API[name]
    except KeyError:
        raise AttributeError(f"module 'ttbundles' has no attribute {name!r}") from None
    return getattr(import_module(module), attribute)
