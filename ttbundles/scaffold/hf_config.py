"""A Hugging Face checkpoint's config.json, read for `ttbundle init --from-hf`: a local
folder or a snapshot in the hub cache (never downloaded), and which architecture a
`model_type` names."""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

from ttbundles.errors import TTBundleError
from ttbundles.suggest import did_you_mean


def architectures_by_model_type() -> dict[str, str]:
    """transformers' model_type -> architecture names (causal LM, then image-text-to-text),
    read from its source with `ast`: importing transformers takes seconds."""
    import ast
    import importlib.util

    try:
        spec = importlib.util.find_spec("transformers")
    except (ImportError, ValueError):
        return {}
    if spec is None or not spec.submodule_search_locations:
        return {}
    source = Path(spec.submodule_search_locations[0]) / "models" / "auto" / "modeling_auto.py"
    try:
        tree = ast.parse(source.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, ValueError):
        return {}
    wanted = ("MODEL_FOR_CAUSAL_LM_MAPPING_NAMES", "MODEL_FOR_IMAGE_TEXT_TO_TEXT_MAPPING_NAMES")
    found: dict[str, str] = {}
    for table in wanted:
        for node in tree.body:
            if not (
                isinstance(node, ast.Assign)
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == table
                and isinstance(node.value, ast.Call)
                and node.value.args
            ):
                continue
            try:
                pairs = ast.literal_eval(node.value.args[0])
            except (ValueError, TypeError, SyntaxError):
                continue
            for pair in pairs:
                if isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[1], str):
                    found.setdefault(pair[0], pair[1])
    return found


# What a checkpoint folder in the hub cache looks like: .../models--org--name/snapshots/sha
_SNAPSHOT = re.compile(r"^models--(?P<org>[^/]+?)--(?P<name>[^/]+)$")


def _looks_like_path(source: str) -> bool:
    """A local path, not a hub id: `./x`, `../x`, `/x`, `~/x`, `x/` or `a/b/c`."""
    return (
        source.startswith((".", "/", "~"))
        or source.endswith(("/", os.sep))
        or source.count("/") > 1
        or (os.sep != "/" and os.sep in source)
    )


def _read_hf_config(source: str) -> tuple[dict, dict | None, str | None]:
    """config.json of a local checkpoint or a hub repo (the local cache when offline),
    the `models` entry it gives, and why there is none when there is none."""
    path = Path(source).expanduser()
    if path.is_file() and path.name == "config.json":
        path = path.parent
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise TTBundleError.single(
                "TTB208",
                "no config.json in the checkpoint folder",
                file=path,
                hint="pass the folder holding the checkpoint's config.json, or --arch",
            )
        config = _load_json(file)
        return (config, *_local_model_ref(path.resolve(), config))
    if _looks_like_path(source) or path.exists():
        parent = path.parent
        siblings = sorted(p.name for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []
        near = did_you_mean(path.name, siblings)
        raise TTBundleError.single(
            "TTB001",
            "no such checkpoint folder" if not path.exists() else "not a checkpoint folder",
            file=path,
            hint=f"did you mean {parent / near}?"
            if near
            else "pass the folder holding the checkpoint's config.json, or a hub id 'org/name'",
        )
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    from ttbundles.hub import hub_reachable

    try:
        with _hub_quiet():
            file = Path(
                hf_hub_download(source, "config.json", local_files_only=not hub_reachable())
            )
    except HFValidationError:
        raise TTBundleError.single(
            "TTB208",
            f"{source!r} is neither a folder here nor a hub repository id",
            hint="pass a checkpoint folder, or a hub id 'org/name'",
        ) from None
    except LocalEntryNotFoundError:
        raise TTBundleError.single(
            "TTB208",
            f"{source!r} is not a folder here, and its config.json is not in the hub "
            "cache (and the hub cannot be reached, or HF_HUB_OFFLINE is set)",
            hint=_cached_repo_hint(source)
            or f"download it first (hf download {source} config.json), or pass its folder",
        ) from None
    except Exception as exc:  # noqa: BLE001 - network, auth, a repo that does not exist
        raise TTBundleError.single(
            "TTB208",
            f"cannot read config.json of hub repository {source}: {type(exc).__name__}",
            hint=_cached_repo_hint(source)
            or "check the id and your access to it, or pass the checkpoint's folder",
        ) from None
    revision = file.parent.name if file.parent.parent.name == "snapshots" else None
    ref = {"repo": source, **({"revision": revision} if revision else {})}
    return _load_json(file), ref, None


@contextlib.contextmanager
def _hub_quiet() -> Iterator[None]:
    """huggingface_hub's own warnings off (a line per retry when the hub cannot be
    reached): the error this module raises says what failed and what to do."""
    import logging

    hub = logging.getLogger("huggingface_hub")
    level = hub.level
    hub.setLevel(logging.ERROR)
    try:
        yield
    finally:
        hub.setLevel(level)


def _cached_repo_hint(source: str) -> str | None:
    """ "did you mean ORG/NAME?" from the repositories in the hub cache (`hf/qwne` ->
    `Qwen/...`), when one is close; None otherwise."""
    from ttbundles.suggest import did_you_mean

    try:
        from huggingface_hub.constants import HF_HUB_CACHE

        names = [p.name for p in Path(HF_HUB_CACHE).iterdir() if p.name.startswith("models--")]
    except (ImportError, OSError):
        return None
    repos = [
        f"{m['org']}/{m['name']}" for m in (_SNAPSHOT.match(n) for n in names) if m is not None
    ]
    best = did_you_mean(source, repos)
    return f"did you mean {best}? (in the hub cache)" if best is not None else None


def _local_model_ref(folder: Path, config: dict) -> tuple[dict | None, str | None]:
    """`models` for a local checkpoint: a hub-cache snapshot names its repo and commit;
    any other folder cannot say which repo and revision it is, and the reason says so."""
    if folder.parent.name == "snapshots":
        match = _SNAPSHOT.match(folder.parent.parent.name)
        if match:
            repo = f"{match['org']}/{match['name']}"
            return {"repo": repo, "revision": folder.name}, None
    named = config.get("_name_or_path")
    from ttbundles.format.metadata import REPO_PATTERN

    suggestion = (
        f'{{"repo": "{named}", "revision": "<commit sha>"}}'
        if isinstance(named, str) and re.fullmatch(REPO_PATTERN, named)
        else '{"repo": "org/name", "revision": "<commit sha>"}'
    )
    return None, (
        f"models not written: {folder.name} is a local folder, which names no hub "
        f"repository or revision; add {suggestion} to models by hand if it has one"
    )


def _load_json(file: Path) -> dict:
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise TTBundleError.single(
            "TTB208",
            f"cannot read: {exc}",
            file=file,
            hint="fix or re-download config.json, or pass --arch",
        ) from None
    if not isinstance(data, dict):
        raise TTBundleError.single(
            "TTB208",
            "config.json is not an object",
            file=file,
            hint="fix or re-download config.json, or pass --arch",
        )
    return data
