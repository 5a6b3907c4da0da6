"""Variants of the demo bundles: the same generator under another declared execution mode.

The built-in demo bundles (`demo`, `demo-vision`) run per submesh (`execution:
"submesh"`, the default), so `--data-parallel-size N` runs N engines. Their
single-execute variants (`demo-lanes`, `demo-vision-lanes`, `execution: "single"`) run N
in-process lanes in one engine instead, with one weights copy and a KV cache per lane, as
Galaxy-scale generators do; the reference generators support both (the vision one with a
RoPE delta per slot). A variant is written from its built-in on demand into a models
folder for EXTRA_MODELS_DIR, where it shadows the built-in for the same architecture.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from ttbundles.paths import builtin_bundles_dir

LANES_BUNDLE = "demo-lanes"


def write_lanes_bundle(models_dir: Path, builtin: str = "demo") -> Path:
    """Write (or refresh) `models_dir/<builtin>-lanes`; return the bundle's folder.

    Written into a temporary folder and renamed into place, so a server reading the
    models folder never sees half a bundle. Idempotent: a current copy is kept.
    """
    source = builtin_bundles_dir() / builtin
    name = f"{builtin}-lanes"
    metadata = json.loads((source / "vllm_metadata.json").read_text(encoding="utf-8"))
    metadata["name"] = name
    metadata["description"] = (
        f"The {builtin} bundle, single-execute: --data-parallel-size N runs N in-process "
        "lanes (one weights copy, one KV cache per lane)."
    )
    metadata["capabilities"]["execution"] = "single"
    text = json.dumps(metadata, indent=2) + "\n"
    target = models_dir / name
    adapter = (source / "adapter.py").read_bytes()
    if (
        (target / "vllm_metadata.json").is_file()
        and (target / "vllm_metadata.json").read_text(encoding="utf-8") == text
        and (target / "adapter.py").is_file()
        and (target / "adapter.py").read_bytes() == adapter
    ):
        return target
    models_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".tmp-{name}-", dir=models_dir))
    try:
        (staging / "adapter.py").write_bytes(adapter)
        (staging / "vllm_metadata.json").write_text(text, encoding="utf-8")
        mask = os.umask(0)
        os.umask(mask)
        os.chmod(staging, 0o777 & ~mask)  # mkdtemp makes it 0700; honour the umask
        if target.exists():
            old = models_dir / f".old-{name}-{os.getpid()}"
            os.rename(target, old)
            os.rename(staging, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.rename(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target
