"""New bundles (`ttbundle init`) and legacy metadata rewritten to v1 (`ttbundle migrate`)."""

from __future__ import annotations

import difflib
import json
import os
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity, TTBundleError
from ttbundles.format.contract import (
    CAPABILITIES_ATTRIBUTE,
    CAPABILITY_KEYS,
    CONTRACT_MARKER,
    CONTRACT_V1,
    DECODE,
    DECODE_COMMANDS,
    DEVICE_PENALTIES_KEY,
    ESSENTIAL_KEYWORDS,
    KEYWORD_DEFAULTS,
    LEGACY_RESET_KEYWORD,
    METHODS,
    Method,
    decode_keywords,
)
from ttbundles.format.metadata import METADATA_FILE, SCHEMA_VERSION, Capabilities, slug
from ttbundles.fsutil import write_text_atomic
from ttbundles.suggest import did_you_mean

_ADAPTER_HEADER = '''"""Generator for {arch}, served by vLLM on Tenstorrent hardware.

The worker calls each method below with keyword arguments, passing those the signature
accepts (the generator contract: ttbundles.format.contract, and the README). Replace each
body with your TT-NN implementation.
"""


class {class_name}:
    # TT-Metal reads this dict from the class, and a class's dict replaces the one it
    # inherits: a key it does not list means "not supported". So every key is listed,
    # False until the generator implements it. Turn one on here and in "capabilities" of
    # vllm_metadata.json together: ttbundle validate reports a capability the bundle
    # declares but the class does not support as an error.
    {capabilities_attribute} = {{
{capabilities}    }}

    # The decode input-update contract v1 (TT-Metal models/common/decode_contract.py):
    # every decode_forward call carries the four keyword-only commands, saying what to
    # restage, and never the legacy {legacy}.
    {marker} = {version}

    def __init__(self, model, mesh_device):
        self.model = model
        self.mesh_device = mesh_device
'''


def adapter_source(arch: str, class_name: str) -> str:
    """The adapter template: the contract's methods, with the signatures the worker
    calls (`ttbundles.format.contract`), every capability off, decode contract v1."""
    keys = [*CAPABILITY_KEYS, DEVICE_PENALTIES_KEY]
    text = _ADAPTER_HEADER.format(
        arch=arch,
        class_name=class_name,
        capabilities_attribute=CAPABILITIES_ATTRIBUTE,
        capabilities="".join(f"        {json.dumps(key)}: False,\n" for key in keys),
        legacy=LEGACY_RESET_KEYWORD,
        marker=CONTRACT_MARKER,
        version=CONTRACT_V1,
    )
    seen_groups: set[str] = set()
    for method in METHODS:
        if not method.required or method.group in seen_groups:
            continue  # optional methods, and the alternatives of a group's first
        if method.group:
            seen_groups.add(method.group)
        text += "\n" + _method_source(method)
    return text


def _method_source(method: Method) -> str:
    if method is DECODE:
        keywords = [k for k in DECODE.passes if k in decode_keywords(CONTRACT_V1)]
        keyword_only = [k for k in keywords if k in DECODE_COMMANDS]
        keywords = [k for k in keywords if k not in DECODE_COMMANDS]
    else:
        keywords, keyword_only = list(method.passes), []
    essential = ESSENTIAL_KEYWORDS.get(method.name, ())
    first = "cls" if method.kind == "classmethod" else "self"
    # The readback methods' leading argument, named as TT-Metal's Generator names it.
    params = [
        first,
        *(["tt_out"] if method.leading == 1 else [f"arg{i}" for i in range(method.leading)]),
    ]
    params += [k if k in essential else f"{k}={KEYWORD_DEFAULTS.get(k)!r}" for k in keywords]
    if keyword_only:
        params += ["*", *(f"{k}={KEYWORD_DEFAULTS.get(k)!r}" for k in keyword_only)]
    lines = []
    if method.needs:
        lines.append(f"    # Called only with capabilities.{method.needs} declared.")
    if method.kind == "classmethod":
        lines.append("    @classmethod")
    one_line = f"    def {method.name}({', '.join(params)}):"
    if len(one_line) <= 88:
        lines.append(one_line)
    else:
        lines += [f"    def {method.name}(", *(f"        {p}," for p in params), "    ):"]
    doc = textwrap.wrap(f"Return {method.returns}.", width=80)
    doc[0] = '"""' + doc[0]
    doc[-1] += '"""'
    lines += [f"        {line}" for line in doc]
    lines.append("        raise NotImplementedError")
    return "\n".join(lines) + "\n"


@dataclass
class Created:
    """What `init_bundle` made: the folder, and what the author should know (`notes`:
    an `--arch` that overrode the checkpoint's, why `models` was not written)."""

    folder: Path
    notes: list[str] = field(default_factory=list)


def init_bundle(
    folder: Path, *, arch: str | None, from_hf: str | None = None, name: str | None = None
) -> Created:
    """Create a bundle that validates: metadata plus an adapter template."""
    models: list[dict] = []
    notes: list[str] = []
    config: dict = {}
    if from_hf is not None:
        config, model_ref, why_no_models = _read_hf_config(from_hf)
        archs = [a for a in config.get("architectures") or [] if isinstance(a, str)]
        if arch is None:
            if not archs:
                raise TTBundleError.single(
                    "TTB208", f"{from_hf}: config.json names no architectures", hint="pass --arch"
                )
            arch = archs[0]
        elif archs and arch not in archs:
            notes.append(
                f"--arch {arch} overrides the checkpoint's architectures ({', '.join(archs)}); "
                "vLLM picks the bundle by the checkpoint's, so this bundle serves it only "
                f"if its config.json says {arch}"
            )
        if model_ref is not None:
            models.append(model_ref)
        elif why_no_models:
            notes.append(why_no_models)
    if arch is None:
        raise TTBundleError.single(
            "TTB031", "no architecture given", hint="pass --arch LlamaForCausalLM, or --from-hf"
        )
    _check_architecture(arch, config)
    if (folder / METADATA_FILE).exists():
        raise TTBundleError.single(
            "TTB033",
            f"{folder / METADATA_FILE} already exists",
            file=folder,
            hint="choose an empty folder",
        )
    bare = arch[2:] if arch.startswith("TT") else arch
    class_name = f"TT{bare}Generator"
    metadata: dict = {
        "schema_version": SCHEMA_VERSION,
        "name": name or slug(folder.resolve().name),
        "version": "0.1.0",
        "description": f"TT-NN generator for {bare}",
        "arch": arch,
        "main_class": f"adapter:{class_name}",
        "main_class_source": "bundle",
    }
    if models:
        metadata["models"] = models
    # Every capability the class's model_capabilities mirrors, off, as in the template.
    metadata["capabilities"] = Capabilities().model_dump(include=set(CAPABILITY_KEYS.values()))
    folder.mkdir(parents=True, exist_ok=True)
    adapter = folder / "adapter.py"
    if not adapter.exists():
        adapter.write_text(adapter_source(arch, class_name))
    write_json_atomic(folder / METADATA_FILE, metadata)
    return Created(folder, notes)


def _check_architecture(arch: str, config: dict) -> None:
    """Refuse what is not a Hugging Face architecture: not an identifier, or a
    `model_type` (`llama`) where the class name (`LlamaForCausalLM`) belongs."""
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", arch):
        raise TTBundleError.single(
            "TTB033", f"architecture {arch!r} is not an identifier", hint="e.g. LlamaForCausalLM"
        )
    model_type = config.get("model_type")
    if arch != model_type and any(c.isupper() for c in arch):
        return
    by_type = architectures_by_model_type()
    known = [a for a in config.get("architectures") or [] if isinstance(a, str)]
    guess = known[0] if known else by_type.get(arch) or by_type.get(arch.lower())
    if guess is None:
        guess = did_you_mean(arch, list(by_type.values())) or (
            "".join(part.capitalize() for part in arch.split("_")) + "ForCausalLM"
        )
    raise TTBundleError.single(
        "TTB033",
        f"{arch!r} is a model_type, not an architecture: --arch takes the class name "
        'config.json lists under "architectures"',
        hint=f"did you mean --arch {guess}?",
    )


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

    try:
        file = Path(hf_hub_download(source, "config.json"))
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
            hint=f"download it first (hf download {source} config.json), or pass its folder",
        ) from None
    except Exception as exc:  # noqa: BLE001 - network, auth, a repo that does not exist
        raise TTBundleError.single(
            "TTB208",
            f"cannot read config.json of hub repository {source}: {type(exc).__name__}",
            hint="check the id and your access to it, or pass the checkpoint's folder",
        ) from None
    revision = file.parent.name if file.parent.parent.name == "snapshots" else None
    ref = {"repo": source, **({"revision": revision} if revision else {})}
    return _load_json(file), ref, None


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


@dataclass
class Migration:
    """What `migrate_bundle` did (or, with `dry_run`, would do) to one bundle.

    `before`/`after` are the metadata texts, `kept` the legacy keys carried over as `x-`
    extensions ({old: new}), `capabilities` what the class's `model_capabilities` declared,
    `class_note` why the class could not be read (its capabilities are then left off).
    """

    file: Path
    changed: bool
    written: bool
    before: str
    after: str
    kept: dict[str, str] = field(default_factory=dict)
    capabilities: dict = field(default_factory=dict)
    class_note: str | None = None

    def diff(self) -> str:
        """A unified diff of the metadata, `before` to `after` (empty: no change)."""
        name = str(self.file)
        lines = difflib.unified_diff(
            _lines(self.before), _lines(self.after), fromfile=f"a/{name}", tofile=f"b/{name}"
        )
        return "".join(lines)


def _lines(text: str) -> list[str]:
    """Lines for a diff, a last one without a newline marked as `diff` and `patch` do."""
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n\\ No newline at end of file\n"
    return lines


def migrate_bundle(folder: Path, *, dry_run: bool = False) -> Migration:
    """Rewrite legacy metadata as v1 in place (unless `dry_run`); unchanged when it
    already is v1.

    Nothing of the old file is lost: the capabilities come from the class's
    `model_capabilities` (read statically, as the registry does for a legacy bundle, so
    the migrated bundle declares what it was served with), and a key legacy metadata does
    not know is kept as an `x-` extension, or refused when that name is taken.
    """
    from ttbundles.format.parse import LEGACY_KEYS, load_metadata

    loaded = load_metadata(folder)
    if loaded.metadata is None:
        raise TTBundleError(loaded.diagnostics)
    file = loaded.file
    before = file.read_text(encoding="utf-8")
    meta = loaded.metadata
    if not meta.legacy:
        return Migration(file, changed=False, written=False, before=before, after=before)
    raw = json.loads(before)
    kept: dict[str, str] = {}
    clashes = []
    for key in raw:
        if key in LEGACY_KEYS or key.startswith("x-"):
            continue
        if f"x-{key}" in raw:
            clashes.append(key)
        kept[key] = f"x-{key}"
    if clashes:
        raise TTBundleError(
            Diagnostic(
                "TTB030",
                Severity.ERROR,
                f"legacy key {key!r} cannot be kept as 'x-{key}': the file has that key too",
                file=str(file),
                pointer=f"/{key}",
                hint=f"rename or remove one of {key!r} and 'x-{key}', then migrate again",
            )
            for key in clashes
        )
    # The registry takes a legacy bundle's capabilities from its class; v1 declares them.
    from ttbundles.check.static_reader import read_bundle_class

    found = read_bundle_class(folder, meta)
    capabilities = found.capabilities.model_dump(exclude_defaults=True) if found else {}
    note = None
    if found is None:
        where = "the bundle" if meta.main_class_source == "bundle" else "this environment"
        note = (
            f"{meta.main_class} cannot be read in {where}: capabilities left off "
            "(declare them by hand, as the class's model_capabilities says)"
        )
    document = {
        "schema_version": SCHEMA_VERSION,
        "name": meta.name,
        "version": "0.1.0",
        "arch": meta.arch,
        "main_class": meta.main_class,
        "main_class_source": meta.main_class_source,
        **({"capabilities": capabilities} if capabilities else {}),
        **meta.extensions,
        **{new: raw[old] for old, new in kept.items()},
    }
    after = json.dumps(document, indent=2) + "\n"
    if not dry_run:
        write_text_atomic(file, after)  # keeps the file's mode
    return Migration(
        file,
        changed=True,
        written=not dry_run,
        before=before,
        after=after,
        kept=kept,
        capabilities=capabilities,
        class_note=note,
    )


def write_json_atomic(path: Path, document: dict) -> None:
    """Write JSON so that a reader sees the old file or the new one, never a part; a new
    file's mode comes from the umask, an existing file keeps its own."""
    write_text_atomic(path, json.dumps(document, indent=2) + "\n")


__all__ = [
    "Created",
    "Migration",
    "architectures_by_model_type",
    "adapter_source",
    "init_bundle",
    "migrate_bundle",
    "write_json_atomic",
]
