"""ttbundles: ship Tenstorrent model bundles to vLLM.

The public API, imported lazily so that `import ttbundles` stays as cheap as the plugin
that vLLM loads in every process:

- `load_metadata(path)`: read a bundle's `vllm_metadata.json` (metadata, diagnostics);
- `validate(path, ...)`: check a bundle, an archive or a folder of bundles;
- `pack(bundle_dir, out_dir)`: validate, then write a deterministic `.ttbundle`;
- `verify(path)`: recompute an archive's or an installed bundle's digests;
- `install(archive, models_dir)` / `uninstall(name, models_dir)`: an `InstallResult`;
- `compute_registry()`: what vLLM would register, and why not the rest.

Stages live in packages of their own, each importing only those below it (the
docs/contributors/layout.md draws them; tests/test_architecture.py keeps it so): `format`,
`archive`, `check`, `registry`, `installer`, `serving` and `reference` (the only ones
that import vLLM and torch), `conformance`, `demo`, and `cli` on top.
"""

from __future__ import annotations

from importlib import import_module

# Nothing heavier than importlib here (not even typing): every Python process of the
# environment imports this package at start-up (ttbundles/torchvision_compat.pth).

_API = {
    "load_metadata": ("ttbundles.format.parse", "load_metadata"),
    "validate": ("ttbundles.check.validate", "validate_path"),
    "pack": ("ttbundles.build", "pack"),
    "verify": ("ttbundles.archive.reader", "verify"),
    "install": ("ttbundles.installer.operations", "install"),
    "uninstall": ("ttbundles.installer.operations", "uninstall"),
    "compute_registry": ("ttbundles.registry.registry", "compute"),
}

__all__ = sorted(_API)


def __getattr__(name: str) -> object:
    try:
        module, attribute = _API[name]
    except KeyError:
        raise AttributeError(f"module 'ttbundles' has no attribute {name!r}") from None
    return getattr(import_module(module), attribute)
