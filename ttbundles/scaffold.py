"""New bundles (`ttbundle init`) and legacy metadata rewritten to v1 (`ttbundle migrate`)."""

from __future__ import annotations

import difflib
import json
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


def init_bundle(
    folder: Path, *, arch: str | None, from_hf: str | None = None, name: str | None = None
) -> Path:
    """Create a bundle that validates: metadata plus an adapter template."""
    models: list[dict] = []
    if from_hf is not None:
        config, model_ref = _read_hf_config(from_hf)
        archs = config.get("architectures") or []
        if arch is None:
            if not archs:
                raise TTBundleError.single(
                    "TTB208", f"{from_hf}: config.json names no architectures", hint="pass --arch"
                )
            arch = archs[0]
        if model_ref is not None:
            models.append(model_ref)
    if arch is None:
        raise TTBundleError.single(
            "TTB031", "no architecture given", hint="pass --arch LlamaForCausalLM, or --from-hf"
        )
    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", arch):
        raise TTBundleError.single(
            "TTB033", f"architecture {arch!r} is not an identifier", hint="e.g. LlamaForCausalLM"
        )
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
    return folder


def _read_hf_config(source: str) -> tuple[dict, dict | None]:
    """config.json of a local checkpoint or a hub repo (the local cache when offline)."""
    path = Path(source)
    if path.is_dir():
        file = path / "config.json"
        if not file.is_file():
            raise TTBundleError.single(
                "TTB208",
                "no config.json in the checkpoint folder",
                file=path,
                hint="pass the folder holding the checkpoint's config.json, or --arch",
            )
        return _load_json(file), None
    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import HFValidationError

    try:
        file = Path(hf_hub_download(source, "config.json"))
    except HFValidationError as exc:
        raise TTBundleError.single(
            "TTB208",
            f"{source!r} is neither a folder nor a repository id: {exc}",
            hint="pass a checkpoint folder or 'org/name'",
        ) from None
    except Exception as exc:  # noqa: BLE001 - network, auth, offline cache miss
        raise TTBundleError.single(
            "TTB208",
            f"cannot read config.json of {source}: {type(exc).__name__}: {exc}",
            hint="download the checkpoint first, or pass its folder",
        ) from None
    revision = file.parent.name if file.parent.parent.name == "snapshots" else None
    ref = {"repo": source, **({"revision": revision} if revision else {})}
    return _load_json(file), ref


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
    from ttbundles.check.adapter import read_bundle_class

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


__all__ = ["Migration", "adapter_source", "init_bundle", "migrate_bundle", "write_json_atomic"]
