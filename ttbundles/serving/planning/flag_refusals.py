"""What the flags alone refuse: one decision for `vllm serve`, `ttbundle plan` and the
planner.

`TTPlatform.pre_register_and_update` calls `refuse_flags` with the command line as vLLM
parses it, before vLLM builds (and checks) its configuration and long before its engine
starts: a refusal there takes the seconds of vLLM's import, not the 17-35 s of an
engine's start-up, and no vLLM check speaks first with a traceback (vLLM's own refusal of
sleep mode is a pydantic error naming no flag). The planner calls it again with vLLM's
config (`settings_of`) for configurations built without a command line (`LLM(...)`,
tests): the same lines either way.

`refuse_checkpoint_length` needs the command line's model: only the parse hook calls it
(vLLM's own check of the length refuses before any planner could run).
"""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError, Diagnostic, Severity, TTBundleError

if TYPE_CHECKING:  # vLLM's config imports the platform: import it only for type hints
    from vllm.config import VllmConfig


def _error(code: str, message: str, hint: str) -> ConfigurationError:
    return ConfigurationError(Diagnostic(code, Severity.ERROR, message, hint=hint))


def settings_of(vllm_config: VllmConfig) -> SimpleNamespace:
    """vLLM's config read as the command line that asks for it (the names `refuse_flags`
    reads), so both hooks refuse through one function."""
    parallel = vllm_config.parallel_config
    model = vllm_config.model_config
    return SimpleNamespace(
        tensor_parallel_size=parallel.tensor_parallel_size,
        pipeline_parallel_size=parallel.pipeline_parallel_size,
        data_parallel_size=parallel.data_parallel_size,
        data_parallel_backend=parallel.data_parallel_backend,
        enable_lora=vllm_config.lora_config is not None,
        enable_sleep_mode=bool(getattr(model, "enable_sleep_mode", False)),
        kv_transfer_config=getattr(vllm_config, "kv_transfer_config", None),
        ec_transfer_config=getattr(vllm_config, "ec_transfer_config", None),
    )


def refuse_flags(settings: Any, mesh: str | None) -> None:
    """Refuse what Tenstorrent does not serve, from `settings` (the parsed command line,
    or `settings_of(vllm_config)`): vLLM's parallelism (TTB201), Ray's data parallelism,
    LoRA, sleep mode, KV and encoder-cache transfer (TTB202). Speculative decoding is
    admitted or refused by `serving.planning.spec_admission` (it needs the bundle)."""
    refuse_vllm_parallelism(settings, mesh)
    if (getattr(settings, "data_parallel_size", 1) or 1) > 1 and (
        getattr(settings, "data_parallel_backend", None) == "ray"
    ):
        raise _error(
            "TTB202",
            "--data-parallel-backend ray is not supported on Tenstorrent: Ray starts every "
            "rank from the head with the head's configuration, so a host could not split "
            "its own mesh, and it places ranks by one device count per node, while a TT "
            "rank is a submesh",
            "use the default backend (mp): the head with --data-parallel-size-local, the "
            "other hosts with vllm serve --headless (docs/operators/several-hosts.md)",
        )
    if getattr(settings, "enable_lora", None):
        raise _error("TTB202", "LoRA is not supported yet on Tenstorrent", "drop --enable-lora")
    if getattr(settings, "enable_sleep_mode", None):
        raise _error(
            "TTB202",
            "--enable-sleep-mode: sleep mode (offloading the weights and dropping the KV "
            "cache between requests) is not supported yet on Tenstorrent",
            "drop --enable-sleep-mode",
        )
    for flag, name in (
        ("--kv-transfer-config", "kv_transfer_config"),
        ("--ec-transfer-config", "ec_transfer_config"),
    ):
        transfer = getattr(settings, name, None)
        if transfer is None:
            continue
        connector = getattr(transfer, "kv_connector", None) or getattr(
            transfer, "ec_connector", None
        )
        what = "KV caches" if name.startswith("kv") else "encoder caches"
        raise _error(
            "TTB202",
            f"{flag}{f' ({connector})' if connector else ''}: moving {what} between "
            "instances is not supported yet on Tenstorrent (the generator keeps its cache "
            "on the device, where vLLM's connectors do not reach, and the phase-based "
            "scheduler does not drive connectors)",
            f"drop {flag}: each server prefills and decodes its own requests",
        )


def refuse_vllm_parallelism(settings: Any, mesh: str | None) -> None:
    """TTB201 for vLLM's tensor or pipeline parallelism, read from `settings` (vLLM's
    parallel config, or the parsed command line, where it comes before vLLM checks, say,
    that the heads divide by the size asked)."""
    for name in ("tensor_parallel_size", "pipeline_parallel_size"):
        value = getattr(settings, name, None)
        if value is not None and value != 1:
            raise _error(
                "TTB201",
                f"--{name.replace('_', '-')}={value}: on Tenstorrent the "
                f"mesh (MESH_DEVICE={mesh or 'unset'}) and the model implementation provide "
                "the parallelism",
                f"drop --{name.replace('_', '-')} and choose the mesh with MESH_DEVICE",
            )


# The keys vLLM derives a checkpoint's length from (the least of those present), read
# from its text config: `vllm.config.model`'s `_get_and_verify_max_len` (0.33.0, 0.34.0).
POSITION_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "model_max_length",
    "max_sequence_length",
    "max_seq_length",
    "seq_len",
)


def checkpoint_positions(config: dict[str, Any]) -> tuple[int, str] | None:
    """The positions a checkpoint's `config.json` allows and the key that says so, or
    None where vLLM would compute more than a key says (a RoPE scaling factor stretches
    them) or no key says."""
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    for rope in (text.get("rope_scaling"), text.get("rope_parameters")):
        if isinstance(rope, dict) and "factor" in rope:
            return None
    found = [
        (int(text[key]), key)
        for key in POSITION_KEYS
        if isinstance(text.get(key), int | float) and text[key] > 0
    ]
    return min(found) if found else None


def refuse_checkpoint_length(parsed: Any, mesh: str | None) -> None:
    """TTB247 for a `--max-model-len` beyond the checkpoint's positions, naming those and
    what the bundle's target serves at most, before vLLM refuses it in a traceback whose
    reason names CUDA. Silent where the checkpoint does not read here (vLLM reads it next
    and says what is wrong) or where VLLM_ALLOW_LONG_MAX_MODEL_LEN asks vLLM to allow it."""
    from ttbundles import envs

    asked = getattr(parsed, "max_model_len", None)
    if not isinstance(asked, int) or asked <= 0 or envs.VLLM_ALLOW_LONG_MAX_MODEL_LEN:
        return
    model = getattr(parsed, "model_tag", None) or getattr(parsed, "model", None)
    if not model:
        return
    from ttbundles.serving.checkpoint_files import checkpoint_folder

    try:
        config = json.loads((checkpoint_folder(str(model)) / "config.json").read_text())
    except Exception:  # noqa: BLE001 - unreadable here: vLLM's own reading says why
        return
    if not isinstance(config, dict):
        return
    positions = checkpoint_positions(config)
    if positions is None or asked <= positions[0]:
        return
    limit, key = positions
    cap = _target_cap(list(config.get("architectures") or []), mesh)
    served = f"; {cap[0]}'s target {mesh} serves at most {cap[1]}" if cap else ""
    most = min(limit, cap[1]) if cap else limit
    raise _error(
        "TTB247",
        f"--max-model-len {asked}: the checkpoint {model} has {limit} positions ({key} in "
        f"its config.json){served}",
        f"ask for at most {most}, or drop --max-model-len (the server then takes {most})",
    )


def _target_cap(architectures: list[str], mesh: str | None) -> tuple[str, int] | None:
    """(the bundle, its target's `max_model_len`) of the bundle that would serve these
    architectures on `mesh`, or None (no bundle, no target, no cap: the planner says)."""
    from ttbundles.serving.planning.selection import select_entry
    from ttbundles.serving.registration import current_registry

    try:
        entry = select_entry(architectures, current_registry())
    except TTBundleError:
        return None
    target = entry.metadata.target(mesh) if entry.metadata is not None else None
    if target is None or target.max_model_len is None:
        return None
    return entry.label, int(target.max_model_len)
