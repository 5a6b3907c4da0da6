"""Import the generator class a plan chose (the worker at load; the speculative admission
at configuration, to ask its `spec_plan`)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from ttbundles.errors import ConfigurationError
from ttbundles.format.loader import PACKAGE_PREFIX, finder, package_name

if TYPE_CHECKING:
    from ttbundles.serving.planning.plan import BundleRef


def load_generator_class(bundle: BundleRef) -> type:
    """Import the class of `bundle` (the plan's bundle: main_class, path, name, version):
    bundle modules under their isolated package (the plan names it), environment classes
    as they are. No registration is re-run."""
    target = bundle.main_class
    module_name, _, class_name = target.partition(":")
    if module_name.startswith(PACKAGE_PREFIX):
        folder = Path(bundle.path)
        finder().add(package_name(folder, bundle.name), folder)
    try:
        module = importlib.import_module(module_name)
        return getattr(module, class_name)
    except Exception as exc:  # any failure of bundle code is the bundle's, said as such
        raise ConfigurationError.single(
            "TTB060",
            f"{bundle.label}: importing {target} failed: {type(exc).__name__}: {exc}",
            file=bundle.path,
            hint=f"reproduce with: ttbundle validate --import {bundle.path}",
        ) from exc
