"""Where ttbundles' own files are: those shipped with it (the schema, the built-in
bundles), the user cache, and a `--model` path as the user typed it.

The shipped files live in `ttbundles/_data/`, installed or not: in a source checkout
`ttbundles/_data/bundles` and `ttbundles/_data/schemas` are symbolic links to the repo
root's `bundles/` and `schemas/` (where they are edited), which the wheel build follows,
so an editable install and a wheel find them at the same place. The user cache is
one folder for everything ttbundles keeps between runs (the registry's index of checked
bundles, the demo's checkpoints and logs).
"""

from __future__ import annotations

import os
from pathlib import Path

from ttbundles import envs

_PACKAGE = Path(__file__).resolve().parent
SCHEMA_FILE_NAME = "vllm_metadata.schema.json"


def _data_dir(name: str) -> Path:
    return _PACKAGE / "_data" / name


def builtin_bundles_dir() -> Path:
    return _data_dir("bundles")


def schema_file() -> Path:
    return _data_dir("schemas") / SCHEMA_FILE_NAME


def model_argument(text: str) -> str:
    """A `--model` as the user typed it, made safe to hand to another process.

    A folder that exists here becomes absolute: the process it goes to may run in
    another folder (the test harness runs in a temporary one), where `./ckpt` names
    nothing and reads as a malformed hub repository id. Something written as a path
    (`./x`, `../x`, `/x`, `~/x`) that does not exist is TTB001, the code every command
    gives for a missing path; anything else is a hub repository id and stays as it is.
    """
    path = Path(text).expanduser()
    if path.exists():
        return str(path.absolute())
    if text.startswith((".", "/", "~")) or text.endswith(("/", "\\")):
        from ttbundles.errors import TTBundleError, missing_path

        raise TTBundleError(missing_path(text, what="model checkpoint folder"))
    return text


def user_cache_dir() -> Path:
    """`$XDG_CACHE_HOME/ttbundles`, else `~/.cache/ttbundles`."""
    base = envs.XDG_CACHE_HOME or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "ttbundles"
