"""New bundles: `ttbundle init` writes a bundle folder whose adapter template follows the
generator contract (`format.contract`) and whose metadata validates."""

from __future__ import annotations

import json
import re
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from ttbundles.check.reference_archs import missing_reason
from ttbundles.errors import TTBundleError
from ttbundles.format.attention_window import attention_window
from ttbundles.format.contract import (
    CAPABILITIES_ATTRIBUTE,
    CONTRACT_MARKER,
    CONTRACT_V1,
    DECODE,
    DECODE_COMMANDS,
    DEVICE_PENALTIES_KEY,
    ESSENTIAL_KEYWORDS,
    KEYWORD_DEFAULTS,
    LEGACY_RESET_KEYWORD,
    METHODS,
    TT_METAL_FLAGS,
    Method,
    decode_keywords,
)
from ttbundles.format.metadata import METADATA_FILE, SCHEMA_VERSION, Capabilities, slug
from ttbundles.fsutil import write_json_atomic
from ttbundles.scaffold.hf_config import _read_hf_config, architectures_by_model_type
from ttbundles.scaffold.reference import (
    HYBRID_FAMILIES,
    RECURRENT_FAMILIES,
    RECURRENT_OWNERS,
    REFERENCE_BASES,
    reference_adapter_source,
    reference_capabilities,
    reference_pooling,
    reference_targets,
)
from ttbundles.suggest import did_you_mean

LATEST_FEATURES_SCHEMA_VERSION = 5  # kv_cache_spec and pooling (format.metadata.ADDED_IN)
RECURRENT_SCHEMA_VERSION = 6  # capabilities.recurrent_state

_ADAPTER_HEADER = '''"""Generator for {arch}, served by vLLM on Tenstorrent hardware.

The worker calls each method below with keyword arguments, passing those the signature
accepts (the generator contract: ttbundles.format.contract; the docs explain it). Replace each
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
    keys = [*TT_METAL_FLAGS, DEVICE_PENALTIES_KEY]
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
    folder: Path,
    *,
    arch: str | None,
    from_hf: str | None = None,
    name: str | None = None,
    keep_adapter: bool = False,
    reference: bool = False,
    recurrent_owner: str | None = None,
) -> Created:
    """Create a bundle that validates: metadata plus an adapter template.

    With `reference`, the adapter builds on the torch reference generator for the
    architecture's family (`scaffold.reference`) and the metadata declares what it does:
    a bundle that serves on the host mesh at once, to be replaced by TT-NN code.

    An `adapter.py` already in the folder is never mixed with silently: without
    `keep_adapter` it is refused (TTB039); with it, the adapter stays and the metadata
    names its class (the template's name when it defines it, else its only class).

    `recurrent_owner` (with `reference`, a recurrent family only; TTB033 otherwise): who
    keeps the state, the generator (the default: a slot per request, prefixes cached
    through snapshots) or vLLM's KV manager ('vllm': MambaSpec groups, no prefix cache)."""
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
    if reference:
        _check_reference_family(arch)
    owner = _recurrent_owner(arch, recurrent_owner, reference)
    if (folder / METADATA_FILE).exists():
        raise TTBundleError.single(
            "TTB039",
            f"{folder / METADATA_FILE} already exists",
            file=folder,
            hint="choose an empty folder",
        )
    bare = arch[2:] if arch.startswith("TT") else arch
    class_name = f"TT{bare}Generator"
    adapter = folder / "adapter.py"
    if adapter.exists():
        if not keep_adapter:
            raise TTBundleError.single(
                "TTB039",
                f"{adapter} already exists: init writes a new adapter template",
                file=adapter,
                hint="choose an empty folder, or pass --keep-adapter to keep it and write "
                "metadata naming its class",
            )
        class_name = _existing_class(adapter, class_name)
        notes.append(f"kept the existing {adapter}; main_class is adapter:{class_name}")
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
    # Every capability the class's model_capabilities mirrors: off, as in the template, or
    # what a kept class declares (read from source, as `migrate` reads it).
    capabilities = Capabilities()
    # A checkpoint with a sliding window (or a family that always has one): the
    # reference's KV groups (its sliding layers keep their window and the tokens in
    # flight), which need schema_version 5; a recurrent family's attention layers too.
    kv_groups = (
        reference
        and (attention_window(config) is not None if config else arch in HYBRID_FAMILIES)
        or (reference and arch in RECURRENT_FAMILIES)
    )
    if reference:
        metadata["description"] = f"{bare}, from the torch reference generator (to TT-NN)"
        capabilities = Capabilities(**reference_capabilities(arch, owner), kv_cache_spec=kv_groups)
        metadata["targets"], length_note = reference_targets(config)
        notes.append(length_note)
    elif adapter.exists():
        from ttbundles.check.static_reader import read_class

        found = read_class("adapter", class_name, roots=[folder])
        if found is not None:
            capabilities = found.capabilities
            on = [k for k, v in capabilities.model_dump(exclude_defaults=True).items() if v]
            if on:
                notes.append(f"capabilities from the class: {', '.join(on)}")
    # A reference bundle declares all the reference serves (speculation, prompt logprobs
    # too), as the demo bundle on the same reference does.
    declared = set(TT_METAL_FLAGS.values())
    if reference:
        declared |= set(reference_capabilities(arch, owner))
    metadata["capabilities"] = capabilities.model_dump(include=declared)
    if kv_groups:
        metadata["capabilities"]["kv_cache_spec"] = True
    if reference:
        # Schema 5: pooling (and the KV groups above).
        # Schema 6: a recurrent family's state, owned by the class (no pooling yet: the
        # pooling runner hands out no state slots).
        if arch in RECURRENT_FAMILIES:
            metadata["schema_version"] = RECURRENT_SCHEMA_VERSION
        else:
            metadata["capabilities"]["pooling"] = reference_pooling(arch)
            metadata["schema_version"] = LATEST_FEATURES_SCHEMA_VERSION
    folder.mkdir(parents=True, exist_ok=True)
    if reference:
        adapter.write_text(
            reference_adapter_source(
                arch, class_name, str(folder), kv_groups=kv_groups, recurrent_owner=owner
            )
        )
    elif not adapter.exists():
        adapter.write_text(adapter_source(arch, class_name))
    write_json_atomic(folder / METADATA_FILE, metadata)
    return Created(folder, notes)


def _existing_class(adapter: Path, preferred: str) -> str:
    """The class an existing adapter offers: `preferred` when defined, else the only
    class; TTB052 when that cannot be told (read with `ast`, never imported)."""
    import ast

    try:
        tree = ast.parse(adapter.read_text(encoding="utf-8"), filename=str(adapter))
    except (OSError, SyntaxError, UnicodeDecodeError) as exc:
        raise TTBundleError.single(
            "TTB051", f"cannot read the existing adapter: {exc}", file=adapter
        ) from None
    classes = [node.name for node in tree.body if isinstance(node, ast.ClassDef)]
    if preferred in classes:
        return preferred
    if len(classes) == 1:
        return classes[0]
    raise TTBundleError.single(
        "TTB052",
        f"the existing adapter defines {len(classes)} classes"
        + (f" ({', '.join(classes)})" if classes else "")
        + ": which one is the generator cannot be told",
        file=adapter,
        hint="leave one generator class in it, or choose an empty folder",
    )


def _recurrent_owner(arch: str, asked: str | None, reference: bool) -> str:
    """Who keeps the state of a reference bundle's recurrent layers: `asked`, refused
    (TTB033) for an owner no reference class serves, without `reference`, or for an
    architecture that keeps no recurrent state; the generator when not asked."""
    if asked is None:
        return RECURRENT_OWNERS[0]
    owners = ", ".join(RECURRENT_OWNERS)
    if asked not in RECURRENT_OWNERS:
        raise TTBundleError.single(
            "TTB033",
            f"--recurrent-owner {asked!r} is not an owner of recurrent state ({owners})",
            hint="pass --recurrent-owner generator or --recurrent-owner vllm",
        )
    if not reference:
        raise TTBundleError.single(
            "TTB033",
            "--recurrent-owner chooses the reference class of a recurrent family: it needs "
            "--reference",
            hint="add --reference, or drop --recurrent-owner (the TT-NN template declares "
            "no state: write capabilities.recurrent_state by hand)",
        )
    if arch not in RECURRENT_FAMILIES:
        families = ", ".join(sorted(RECURRENT_FAMILIES))
        raise TTBundleError.single(
            "TTB033",
            f"--recurrent-owner {asked}: {arch} keeps no recurrent state (every layer is "
            f"attention); the reference's recurrent families are {families}",
            hint="drop --recurrent-owner for this architecture",
        )
    return asked


def _check_reference_family(arch: str) -> None:
    """`--reference` needs a family the torch reference generator reads."""
    if arch in REFERENCE_BASES:
        return
    families = ", ".join(REFERENCE_BASES)
    missing = missing_reason(arch)
    raise TTBundleError.single(
        "TTB041",
        f"the torch reference generator does not cover {arch} (it reads {families})"
        + (f": {missing}" if missing else ""),
        hint=f"init without --reference for the TT-NN template, or pick one of {families}",
    )


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
