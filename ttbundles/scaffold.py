"""New bundles (`ttbundle init`) and legacy metadata rewritten to v1 (`ttbundle migrate`)."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from ttbundles.errors import TTBundleError
from ttbundles.format.metadata import METADATA_FILE, SCHEMA_VERSION, slug

ADAPTER_TEMPLATE = '''"""Generator for {arch}, served by vLLM on Tenstorrent hardware.

The worker calls these methods with keyword arguments; see the generator contract in
the ttbundles README. Replace each body with your TT-NN implementation.
"""


class {class_name}:
    # Keep in step with "capabilities" in vllm_metadata.json (ttbundle validate checks).
    model_capabilities = {{
        "supports_prefix_caching": False,
        "supports_async_decode": False,
        "supports_sample_on_device": False,
    }}

    def __init__(self, model, mesh_device):
        self.model = model
        self.mesh_device = mesh_device

    @classmethod
    def initialize_vllm_model(
        cls, hf_config, mesh_device, max_batch_size, max_seq_len, tt_data_parallel=1,
        optimizations=None,
    ):
        raise NotImplementedError("build the TT-NN model from hf_config here")

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        raise NotImplementedError("allocate the paged KV cache on the mesh here")

    def prefill_forward(
        self, tokens, page_table, kv_cache, prompt_lens, start_pos=None, enable_trace=False,
        sampling_params=None, empty_slots=None, **kwargs,
    ):
        raise NotImplementedError("return last-token logits [batch, 1, vocab]")

    def decode_forward(
        self, tokens, start_pos, page_table, kv_cache, enable_trace=False,
        read_from_device=True, sampling_params=None, **kwargs,
    ):
        raise NotImplementedError("return logits [batch, 1, vocab] for one step")
'''


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
    metadata["capabilities"] = {
        "prefix_caching": False,
        "async_decode": False,
        "sample_on_device": [],
    }
    folder.mkdir(parents=True, exist_ok=True)
    adapter = folder / "adapter.py"
    if not adapter.exists():
        adapter.write_text(ADAPTER_TEMPLATE.format(arch=arch, class_name=class_name))
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


def migrate_bundle(folder: Path) -> bool:
    """Rewrite legacy metadata as v1 in place. False when it already is v1."""
    from ttbundles.format.parse import load_metadata

    loaded = load_metadata(folder)
    if loaded.metadata is None:
        raise TTBundleError(loaded.diagnostics)
    if not loaded.metadata.legacy:
        return False
    meta = loaded.metadata
    # The registry takes a legacy bundle's capabilities from its class; v1 declares them.
    from ttbundles.check.adapter import read_bundle_class

    found = read_bundle_class(folder, meta)
    capabilities = found.capabilities.model_dump(exclude_defaults=True) if found else {}
    document = {
        "schema_version": SCHEMA_VERSION,
        "name": meta.name,
        "version": "0.1.0",
        "arch": meta.arch,
        "main_class": meta.main_class,
        "main_class_source": meta.main_class_source,
        **({"capabilities": capabilities} if capabilities else {}),
        **meta.extensions,
    }
    write_json_atomic(folder / METADATA_FILE, document)
    return True


def write_json_atomic(path: Path, document: dict) -> None:
    """Write JSON so that a reader sees the old file or the new one, never a part."""
    text = json.dumps(document, indent=2) + "\n"
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


__all__ = ["init_bundle", "migrate_bundle", "write_json_atomic"]
