"""Where the files shipped with ttbundles are: the schema and the built-in bundles.

Installed, they live in `ttbundles/_data/`; in a source checkout, at the repo root
(`schemas/`, `bundles/`), which is where they are edited.
"""

from __future__ import annotations

from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
SCHEMA_FILE_NAME = "vllm_metadata.schema.json"


def _data_dir(name: str) -> Path:
    installed = _PACKAGE / "_data" / name
    return installed if installed.is_dir() else _PACKAGE.parent / name


def builtin_bundles_dir() -> Path:
    return _data_dir("bundles")


def schema_file() -> Path:
    return _data_dir("schemas") / SCHEMA_FILE_NAME
