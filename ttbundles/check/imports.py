"""`ttbundle validate --import`: import the adapter for real, in a fresh subprocess.

A subprocess, because bundle code may hang, crash, or pollute the interpreter; and with a
timeout, because importing TT-Metal code without a card can block. The adapter is
imported under the same synthetic package the loader uses when vLLM serves it, so what
passes here imports the same way in the server.
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path

from ttbundles.errors import Diagnostic, Severity
from ttbundles.format.metadata import BundleMetadata

# Keyword arguments the worker passes to each contract method.
CONTRACT_KWARGS: dict[str, tuple[str, ...]] = {
    "initialize_vllm_model": ("hf_config", "mesh_device", "max_batch_size", "max_seq_len"),
    "prefill_forward": ("tokens", "page_table", "kv_cache", "prompt_lens"),
    "decode_forward": ("tokens", "start_pos", "page_table", "kv_cache"),
    "allocate_kv_cache": ("kv_cache_shape", "dtype", "num_layers"),
    "allocate_kv_cache_per_layer": ("per_layer_specs",),
    "read_decode_output": (),
    "process_decode_output_host": (),
}


def import_check(
    bundle_dir: Path, metadata: BundleMetadata, *, timeout: float = 60.0
) -> list[Diagnostic]:
    """Import the main class in a subprocess and check the contract's signatures."""
    command = [
        sys.executable,
        "-m",
        "ttbundles.check.imports",
        str(bundle_dir),
        metadata.model_dump_json(by_alias=True),
    ]
    where = str(bundle_dir)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return [
            Diagnostic(
                "TTB061",
                Severity.ERROR,
                f"importing {metadata.main_class} took longer than {timeout:g}s",
                file=where,
                hint="raise --timeout, or make the import cheaper",
            )
        ]
    try:
        result = json.loads(done.stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        return [
            Diagnostic(
                "TTB060",
                Severity.ERROR,
                f"importing {metadata.main_class} failed: {tail}",
                file=where,
            )
        ]
    out = []
    for problem in result.get("problems", []):
        out.append(
            Diagnostic(
                problem["code"],
                Severity.ERROR,
                problem["message"],
                file=problem.get("file") or where,
                line=problem.get("line"),
                hint=problem.get("hint"),
            )
        )
    return out


def _check_in_this_process(bundle_dir: Path, metadata: BundleMetadata) -> list[dict]:
    import importlib

    from ttbundles.registry.loader import qualified_class

    if metadata.main_class_source == "bundle":
        target = qualified_class(bundle_dir, metadata.name, metadata.main_class)
    else:
        target = metadata.main_class
    module_name, _, class_name = target.partition(":")
    try:
        module = importlib.import_module(module_name)
        cls = getattr(module, class_name)
    except BaseException as exc:  # noqa: BLE001 - any failure of bundle code is reported
        return [
            {
                "code": "TTB060",
                "message": f"importing {metadata.main_class} failed: {type(exc).__name__}: {exc}",
            }
        ]
    problems = []
    wanted = ["initialize_vllm_model", "prefill_forward", "decode_forward"]
    wanted += [m for m in ("allocate_kv_cache", "allocate_kv_cache_per_layer") if hasattr(cls, m)]
    if metadata.capabilities.async_decode:
        wanted += ["read_decode_output", "process_decode_output_host"]
    for name in wanted:
        member = getattr(cls, name, None)
        if member is None:
            problems.append({"code": "TTB053", "message": f"{class_name} lacks {name}"})
            continue
        if name == "initialize_vllm_model" and not isinstance(
            inspect.getattr_static(cls, name), classmethod | staticmethod
        ):
            problems.append(
                {
                    "code": "TTB062",
                    "message": "initialize_vllm_model must be a classmethod",
                    "hint": "decorate it with @classmethod",
                }
            )
        required = list(CONTRACT_KWARGS[name])
        if name == "decode_forward" and metadata.capabilities.sample_on_device:
            required.append("sampling_params")
        problem = _accepts(member, required)
        if problem:
            code_line = _line_of(member)
            problems.append(
                {
                    "code": "TTB062",
                    "message": f"{class_name}.{name}: {problem}",
                    "file": code_line[0],
                    "line": code_line[1],
                    "hint": "accept these keyword arguments, or **kwargs",
                }
            )
    if not (hasattr(cls, "allocate_kv_cache") or hasattr(cls, "allocate_kv_cache_per_layer")):
        problems.append(
            {
                "code": "TTB053",
                "message": f"{class_name} lacks allocate_kv_cache or allocate_kv_cache_per_layer",
            }
        )
    return problems


def _accepts(function: object, names: list[str]) -> str | None:
    try:
        signature = inspect.signature(function)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    params = signature.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    accepted = {
        p.name
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    }
    missing = [n for n in names if n not in accepted]
    return f"does not accept {', '.join(missing)} as keyword arguments" if missing else None


def _line_of(member: object) -> tuple[str | None, int | None]:
    try:
        return inspect.getsourcefile(member), inspect.getsourcelines(member)[1]  # type: ignore[arg-type]
    except (TypeError, OSError):
        return None, None


if __name__ == "__main__":
    _dir, _metadata = Path(sys.argv[1]), BundleMetadata.model_validate_json(sys.argv[2])
    _problems = _check_in_this_process(_dir, _metadata)
    sys.stdout.write("\n" + json.dumps({"problems": _problems}) + "\n")
