"""Every difference between the vLLM releases of the tested window, and every private
vLLM hook ttbundles uses: the file to re-read at the next vLLM bump.

Each difference is named by what it is (a part that exists or not, a field that moved),
found by looking at the installed vLLM, never by comparing version numbers; each private
hook says the releases it was checked on. The rest of the serving layer asks here and
stays release-blind. The window itself (which releases) is `ttbundles.vllm_window`.

- `V1_RUNNER_PARTS`: V1's `InputBatch`, `Sampler`, logits processors and grammar
  bitmask exist (0.33.0); removed in 0.34.0 (`host_batch` picks ours there).
- `RESUMED_IN_CACHED`: a preempted request resumes in `scheduled_cached_reqs`
  (0.33.0); 0.34.0 re-sends it in full as a new request (`prefill_token_ids`).
- `OUTPUT_INDEX`: `ModelRunnerOutput.req_id_to_index` (0.33.0); removed in 0.34.0.
- `previous_step_ids`: the scheduler's `prev_step_scheduled_req_ids`, kept for V1
  (0.33.0); gone in 0.34.0.
- `runner_protocol_env`: `VLLM_USE_V2_MODEL_RUNNER=0` selects V1's protocol (0.33.0);
  0.34.0 refuses any value but 1.
- Followed, not bridged: vLLM's default KV block size (`CacheConfig.DEFAULT_BLOCK_SIZE`)
  is 16 tokens in 0.33.0 and 64 in 0.34.0; a generator that needs one declares
  `required_block_size`.
- `NGRAM_STYLE`: the n-gram proposer's semantics: 0.33.0's `NgramProposer` (earliest
  match, only the tokens that follow it) or 0.34.0's n-gram speculator (latest match,
  always K drafts).
- `register_model_owned_drafter` / `speculative_method`: the `custom_class` speculative
  method (the generator's own drafter) is built into 0.33.0's `SpeculativeConfig`;
  0.34.0 removed it and takes custom methods through `register_speculative_method`, so
  there we register it (`compat.model_owned_drafter`), and its name moves to
  `SpeculativeConfig.custom_method`.
- `cached_request_data`: `CachedRequestData`'s fields (`resumed_req_ids`,
  `all_token_ids` in 0.33.0 only).
- `verify_logprobs`: a speculative step's logprobs, one row per sampled token. Read the
  same on both (the scheduler slices request i's rows from `LogprobsLists.
  cu_num_generated_tokens[i]`, as many as it keeps); produced differently: 0.33.0's
  rejection sampler lays them compact (rejected positions filtered out), 0.34.0's one
  row per verified position (the rejected ones never read). Ours are compact.

Private hooks (all checked on 0.33.0 and 0.34.0):
- `set_current_platform`: `vllm.platforms._current_platform` (`ttbundle plan` decides
  as the TT platform on a machine without the mesh);
- `validate_limit_per_prompt`: `MultiModalConfig._validate_limit_per_prompt` (the
  plan rewrites `--limit-mm-per-prompt` to what the bundle takes);
- `media_connector_loaders` / `replace_media_connector_loaders`: `MediaConnector.
  _load_file_url` and `_load_data_url` (clear 400s for file:// and malformed data URLs);
- `replace_media_connector_init` / `http_connection`: `MediaConnector.__init__`'s
  `connection` and vLLM's `HTTPConnection` (image URLs fetched only from public
  addresses, `serving.api_server.media_urls`);
- `replace_init_app_state`: the API server's `init_app_state`, where `vllm serve` reads
  its chat settings (the bundle's serving defaults fill those the operator left unset);
- `async_llm_class`: `AsyncLLM.shutdown` is wrapped (`serving.api_server.shutdown`: requests left
  open when `vllm serve` stops).
- `prompt_length_checks`: `TokenizeParams`' length checks and `InputProcessor.
  _validate_prompt_len` are wrapped (`serving.api_server.length_limits`: a refusal for the context
  length says why the limit is lower than asked).
- `engine_dead_reports`: the loggers and messages with which vLLM reports an
  `EngineDeadError` (`serving.api_server.shutdown` drops those a requested stop causes);
- `engine_core_module`: `vllm.v1.engine.core`, whose `cleanup_dist_env_and_memory`
  `EngineCore.shutdown` calls (`serving.api_server.shutdown` lets it end without an accelerator).
- `steady_slots`: `KVCacheManager.allocate_slots` is answered before vLLM's path for a
  steady decode row, reading the manager's coordinator, its one `FullAttentionManager`
  (`req_to_blocks`, `num_cached_block`, `_partial_hit_reqs`) and the method's parameters,
  checked at install (`serving.compat.steady_slots`).
- `steady_decode`: a steady decode step is scheduled without `Scheduler.schedule`'s
  running loop: vLLM's `schedule()` runs with `running` emptied, then the rows are added
  with its `_make_cached_request_data` (whose parameters differ: 0.33.0 takes the
  resumed requests) and `_update_after_schedule`, reading the scheduler's budgets,
  request counters and `prev_step_scheduled_req_ids` (0.33.0, Model Runner V1)
  (`serving.compat.steady_decode`).
"""

from __future__ import annotations

import functools
import importlib.util
from typing import TYPE_CHECKING, Any, Literal

import torch

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import NewRequestData, SchedulerOutput


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _has_field(cls: type, name: str) -> bool:
    fields = getattr(cls, "__dataclass_fields__", None)
    return name in fields if fields is not None else hasattr(cls, name)


V1_RUNNER_PARTS = _has_module("vllm.v1.worker.gpu_input_batch") and _has_module(
    "vllm.v1.sample.sampler"
)

# The n-gram proposer's semantics (`serving.runner.ngram`): 0.33.0's numba
# `NgramProposer` takes the earliest occurrence and proposes only the tokens that follow
# it; 0.34.0 removed it for Model Runner V2's Triton speculator, which takes the latest
# and always proposes K (padding with the last token).
NGRAM_STYLE: Literal["earliest", "latest_padded"] = (
    "earliest" if _has_module("vllm.v1.spec_decode.ngram_proposer") else "latest_padded"
)


# 0.34.0's registry of custom speculative methods (absent in 0.33.0, where `custom_class`
# is one of `SpeculativeConfig`'s own methods).
_SPECULATOR_REGISTRY = "vllm.v1.worker.gpu.spec_decode.speculator_config"
MODEL_OWNED_DRAFTER_METHOD = "custom_class"


def register_model_owned_drafter() -> None:
    """Make `--speculative-config '{"method": "custom_class", ...}'` a method vLLM knows,
    in this process (vLLM's general plugins call it in every process: the API server
    validates the method, the engine core looks its config up again). 0.33.0 has it
    built in: nothing to do. Cheap: imports only vLLM's method registry."""
    if not _has_module(_SPECULATOR_REGISTRY):
        return
    registry = importlib.import_module(_SPECULATOR_REGISTRY)
    if MODEL_OWNED_DRAFTER_METHOD in registry.registered_speculative_methods():
        return
    registry.register_speculative_method(
        MODEL_OWNED_DRAFTER_METHOD,
        "ttbundles.serving.compat.model_owned_drafter.ModelOwnedDrafterConfig",
    )


def speculative_method(config: Any) -> str:
    """The method the operator asked for: a registered custom method's name is
    `custom_method` on 0.34.0 (`method` then holds the built-in it is based on)."""
    return str(getattr(config, "custom_method", None) or config.method)


def _resumed_in_cached() -> bool:
    from vllm.v1.core.sched.output import CachedRequestData

    return _has_field(CachedRequestData, "resumed_req_ids")


def _output_index() -> bool:
    from vllm.v1.outputs import ModelRunnerOutput

    return _has_field(ModelRunnerOutput, "req_id_to_index")


def missing_part(error: ImportError) -> Exception:
    """The one error for a vLLM that lacks a part we serve with (TTB216): the part, the
    installed version, the tested window, what to do; never our ModuleNotFoundError."""
    from ttbundles import vllm_window
    from ttbundles.errors import ConfigurationError

    version = vllm_window.installed_vllm() or "(unknown)"
    part = getattr(error, "name", None) or str(error)
    return ConfigurationError.single(
        "TTB216",
        f"vLLM {version} lacks {part}, which ttbundles serves with; ttbundles is tested on "
        f"vLLM {vllm_window.window_text()}",
        hint=f"install a tested release (pip install 'vllm=={vllm_window.DEFAULT_VLLM}'), or "
        "a ttbundles release whose window includes this vLLM",
    )


# Looked at on first use, not at import: they import vLLM's output modules (seconds on a
# cold process), and vLLM's general plugins import this module in every process
# (`register_model_owned_drafter`). `require_parts` looks at them at configuration time,
# so a vLLM lacking them still ends `vllm serve` there with TTB216.
_LAZY_DIFFERENCES = {"RESUMED_IN_CACHED": _resumed_in_cached, "OUTPUT_INDEX": _output_index}


def _difference(name: str) -> bool:
    """One of `_LAZY_DIFFERENCES`, looked at once."""
    if name not in globals():
        try:
            globals()[name] = _LAZY_DIFFERENCES[name]()
        except ImportError as error:
            raise missing_part(error) from error
    return globals()[name]


def __getattr__(name: str) -> Any:
    if name not in _LAZY_DIFFERENCES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return _difference(name)


_PARTS: dict[str, Any] = {}


def _parts() -> dict[str, Any]:
    """The host batch's parts for this release, imported on first use: they import
    vLLM's CPU modules, whose import asks the current platform for kernels, so they must
    not load before the TT platform is vLLM's (`ttbundle plan` sets it first)."""
    if not _PARTS:
        for name in _LAZY_DIFFERENCES:
            _difference(name)
        try:
            if V1_RUNNER_PARTS:
                from ttbundles.serving.compat import v1_parts as parts

                _PARTS.update(batch=parts.V1HostBatch, state=parts.RequestState)
            else:
                from ttbundles.serving.compat import cpu_parts as parts

                _PARTS.update(batch=parts.HostBatch, state=parts.RequestState)
        except ImportError as error:
            raise missing_part(error) from error
    return _PARTS


# Every vLLM module ttbundles imports outside this package (at module level or in a
# function), on every release of the window: `require_modules` looks for each before an
# engine starts, so a vLLM without one (0.32.0 has no `vllm.v1.core.kv_cache_planning`
# nor `vllm.entrypoints.common.cli_args`) is refused at configuration with TTB216, not
# with a ModuleNotFoundError in the engine core after its start-up. This package imports
# its own after looking. tests/test_vllm_window.py holds the list to the imports.
VLLM_MODULES: tuple[str, ...] = (
    "vllm",
    "vllm.benchmarks.serve",
    "vllm.config",
    "vllm.engine.arg_utils",
    "vllm.entrypoints.common.cli_args",
    "vllm.exceptions",
    "vllm.model_executor.layers.mamba.mamba_utils",
    "vllm.model_executor.layers.pooler",
    "vllm.model_executor.layers.pooler.activations",
    "vllm.model_executor.layers.pooler.seqwise.heads",
    "vllm.model_executor.models.registry",
    "vllm.multimodal",
    "vllm.platforms.interface",
    "vllm.reasoning",
    "vllm.sampling_params",
    "vllm.tokenizers",
    "vllm.tool_parsers",
    "vllm.usage.usage_lib",
    "vllm.utils.argparse_utils",
    "vllm.v1.attention.backends.registry",
    "vllm.v1.core.kv_cache_coordinator",
    "vllm.v1.core.kv_cache_planning",
    "vllm.v1.core.kv_cache_utils",
    "vllm.v1.core.sched.async_scheduler",
    "vllm.v1.core.sched.interface",
    "vllm.v1.core.sched.output",
    "vllm.v1.core.sched.request_queue",
    "vllm.v1.core.sched.scheduler",
    "vllm.v1.core.single_type_kv_cache_manager",
    "vllm.v1.engine",
    "vllm.v1.engine.exceptions",
    "vllm.v1.kv_cache_interface",
    "vllm.v1.metrics.loggers",
    "vllm.v1.metrics.stats",
    "vllm.v1.outputs",
    "vllm.v1.pool.metadata",
    "vllm.v1.request",
    "vllm.v1.spec_decode.metrics",
    "vllm.v1.worker.worker_base",
)


def absent_modules(names: tuple[str, ...] | None = None) -> list[str]:
    """Those of `names` (default `VLLM_MODULES`) the installed vLLM does not have, looked
    for as files in its package folder: nothing is imported (an engine-side module
    imports vLLM's platform and kernels; the API server would pay for them)."""
    from pathlib import Path

    names = VLLM_MODULES if names is None else names

    spec = importlib.util.find_spec("vllm")
    roots = [Path(p) for p in (spec.submodule_search_locations or [])] if spec else []
    absent = []
    for name in names:
        parts = name.split(".")[1:]
        if not roots or not any(
            (root.joinpath(*parts).with_suffix(".py") if parts else root / "__init__.py").is_file()
            or root.joinpath(*parts, "__init__.py").is_file()
            for root in roots
        ):
            absent.append(name)
    return absent


def require_modules() -> None:
    """TTB216 for a vLLM that lacks a module ttbundles imports (`VLLM_MODULES`), before
    any of them is imported."""
    absent = absent_modules()
    if absent:
        raise missing_part(ModuleNotFoundError(absent[0], name=", ".join(absent)))


def require_parts() -> None:
    """Look for every module ttbundles imports and import what the worker will serve
    with now, so that a vLLM lacking a part ends `vllm serve` at configuration time with
    TTB216 (the platform calls this), before an engine starts."""
    require_modules()
    _parts()


def request_state(**fields: Any) -> Any:
    """A request's state as the host batch keeps it (V1's `CachedRequestState` on
    0.33.0, ours on 0.34.0), from its fields."""
    return _parts()["state"](**fields)


__all__ = [
    "MODEL_OWNED_DRAFTER_METHOD",
    "NGRAM_STYLE",
    "OUTPUT_INDEX",
    "RESUMED_IN_CACHED",
    "V1_RUNNER_PARTS",
    "VLLM_MODULES",
    "absent_modules",
    "host_batch",
    "missing_part",
    "request_state",
    "require_modules",
    "require_parts",
    "runner_protocol_env",
    "speculative_method",
    "model_runner_output",
    "new_request_outputs",
    "register_model_owned_drafter",
    "resumed_req_ids",
    "verify_logprobs",
]


def host_batch(vllm_config: VllmConfig, device: torch.device) -> Any:
    """The persistent batch of request rows with its host sampler: V1's `InputBatch`
    and `Sampler` where the release ships them, else ours on the release's parts
    (`compat.cpu_parts`). Both offer the same attributes and `sample`/`apply_grammar`."""
    return _parts()["batch"](vllm_config, device)


_NONE: frozenset[str] = frozenset()


def resumed_req_ids(scheduler_output: SchedulerOutput) -> Any:
    """The requests resuming from preemption in `scheduled_cached_reqs` (0.33.0); a
    release that re-sends them as new requests has none there."""
    if _difference("RESUMED_IN_CACHED"):
        return scheduler_output.scheduled_cached_reqs.resumed_req_ids
    return _NONE


def new_request_outputs(new: NewRequestData) -> list[int]:
    """The tokens a new request already generated: a preempted request re-sent in full
    carries them after its prompt in `prefill_token_ids` (0.34.0); on 0.33.0 a new
    request has none (resumption comes as a cached request)."""
    prefill = getattr(new, "prefill_token_ids", None)
    prompt = new.prompt_token_ids or []
    if _difference("RESUMED_IN_CACHED") or not prefill or len(prefill) <= len(prompt):
        return []
    return list(prefill[len(prompt) :])


def model_runner_output(
    req_ids: list[str],
    index: dict[str, int],
    sampled: list[list[int]],
    logprobs: Any,
    prompt_logprobs: dict[str, Any] | None = None,
    pooler_output: list[Any] | None = None,
) -> Any:
    """vLLM's `ModelRunnerOutput`; `index` (request id -> row) only where it has the
    field. `prompt_logprobs`: each finished prompt's `LogprobsTensors` (both releases take
    the whole prompt at once, as their own runners send it). `pooler_output`: one tensor
    per request of a pooling step (the same field in both releases)."""
    from vllm.v1.outputs import ModelRunnerOutput

    extra = {"req_id_to_index": index} if _difference("OUTPUT_INDEX") else {}
    return ModelRunnerOutput(
        req_ids=req_ids,
        sampled_token_ids=sampled,
        logprobs=logprobs,
        prompt_logprobs_dict=prompt_logprobs or {},
        pooler_output=pooler_output,
        **extra,
    )


def verify_logprobs(tensors: Any, counts: list[int]) -> Any:
    """`LogprobsLists` of a speculative step from `tensors` (`LogprobsTensors`, row per
    committed token, request by request) and each request's count of committed tokens:
    `cu_num_generated_tokens` [0, c0, c0 + c1, ...], where the scheduler of both releases
    starts request i's slice (`LogprobsLists.slice_request`). None stays None."""
    if tensors is None:
        return None
    cu = [0]
    for count in counts:
        cu.append(cu[-1] + count)
    return tensors.tolists(cu)


def runner_protocol_env() -> dict[str, str]:
    """The environment that makes vLLM speak the runner protocol the TT worker speaks.
    0.33.0 switches to Model Runner V2's protocol (resumed requests re-sent in full)
    wherever Triton is importable, so the worker pins V1's there
    (`VLLM_USE_V2_MODEL_RUNNER=0`); 0.34.0 has only V2's protocol, refuses any value
    but 1, and our worker speaks it (`RESUMED_IN_CACHED` false)."""
    return {"VLLM_USE_V2_MODEL_RUNNER": "0"} if V1_RUNNER_PARTS else {}


def merge_cached_request_data(parts: list[Any]) -> Any:
    """The lanes' `CachedRequestData` as one, field by field as the release defines it
    (lists in lane order, sets unioned, dicts merged): 0.33.0 has `resumed_req_ids` and
    `all_token_ids`, 0.34.0 neither. The fields are read once (`_cached_data_fields`):
    this runs every step of a lanes engine."""
    from vllm.v1.core.sched.output import CachedRequestData

    merged = CachedRequestData.make_empty()
    for name, kind in _cached_data_fields():
        mine = getattr(merged, name)
        if kind is list:
            for part in parts:
                mine.extend(getattr(part, name))
        elif kind is set:
            for part in parts:
                mine |= getattr(part, name)
        elif kind is dict:
            for part in parts:
                mine.update(getattr(part, name))
    return merged


@functools.cache
def _cached_data_fields() -> tuple[tuple[str, type | None], ...]:
    """`CachedRequestData`'s fields and the kind of container each is, read from an
    empty one (the merge needs the container, not the annotation)."""
    import dataclasses

    from vllm.v1.core.sched.output import CachedRequestData

    empty = CachedRequestData.make_empty()
    kinds: list[tuple[str, type | None]] = []
    for item in dataclasses.fields(CachedRequestData):
        value = getattr(empty, item.name)
        kind = next((k for k in (list, set, dict) if isinstance(value, k)), None)
        kinds.append((item.name, kind))
    return tuple(kinds)


def merge_common_prefix_blocks(merged: Any, out: Any) -> None:
    """`SchedulerOutput.num_common_prefix_blocks`, element-wise max over the lanes (the
    merged batch reserves what its most demanding lane needs); 0.33.0 still has the field
    (always empty since cascade attention went), 0.34.0 removed it."""
    theirs = getattr(out, "num_common_prefix_blocks", None)
    if not theirs:
        return
    mine = merged.num_common_prefix_blocks
    merged.num_common_prefix_blocks = (
        [max(a, b) for a, b in zip(mine, theirs, strict=True)] if mine else list(theirs)
    )


def previous_step_ids(scheduler: Any) -> set[str] | None:
    """A copy of the scheduler's record of the previous step's requests, which a
    discarded `schedule()` attempt overwrites, or None where there is none to keep:
    0.33.0 keeps it for Model Runner V1 (`prev_step_scheduled_req_ids`, unused with V2);
    0.34.0 has no such record."""
    kept = getattr(scheduler, "prev_step_scheduled_req_ids", None)
    if kept is None or getattr(scheduler, "use_v2_model_runner", False):
        return None
    return set(kept)


def restore_previous_step_ids(scheduler: Any, ids: set[str]) -> None:
    """Put back what `previous_step_ids` copied."""
    kept = scheduler.prev_step_scheduled_req_ids
    kept.clear()
    kept.update(ids)


# --- private hooks ---------------------------------------------------------------------


def set_current_platform(platform: Any) -> None:
    """Make `platform` vLLM's current platform in this process (private:
    `vllm.platforms._current_platform`; checked on 0.33.0 and 0.34.0)."""
    import vllm.platforms

    vllm.platforms._current_platform = platform


def validate_limit_per_prompt(limits: dict[str, int]) -> dict[str, Any]:
    """vLLM's own parsing of a `--limit-mm-per-prompt` mapping into its option objects
    (private: `MultiModalConfig._validate_limit_per_prompt`; checked on 0.33.0 and
    0.34.0)."""
    from vllm.config.multimodal import MultiModalConfig

    return MultiModalConfig._validate_limit_per_prompt(limits)


def media_connector_loaders() -> tuple[type, Any, Any]:
    """The media connector class and its file:// and data: URL loaders (private:
    `MediaConnector._load_file_url`, `_load_data_url`; checked on 0.33.0 and 0.34.0)."""
    from vllm.multimodal.media.connector import MediaConnector

    return MediaConnector, MediaConnector._load_file_url, MediaConnector._load_data_url


def replace_media_connector_loaders(load_file: Any, load_data: Any) -> None:
    """Put wrapped loaders in place of `media_connector_loaders`' originals."""
    from vllm.multimodal.media.connector import MediaConnector

    MediaConnector._load_file_url = load_file
    MediaConnector._load_data_url = load_data


def http_connection() -> tuple[type, Any]:
    """vLLM's `HTTPConnection` class and its global instance, the one `MediaConnector`
    fetches through by default (public; subclassed by `serving.api_server.media_urls` for its
    `get_sync_client`, `get_async_client`, `get_response` and `get_async_response`,
    identical on 0.33.0 and 0.34.0)."""
    from vllm.connections import HTTPConnection, global_http_connection

    return HTTPConnection, global_http_connection


def replace_media_connector_init(init: Any) -> Any:
    """Put `init` in place of `MediaConnector.__init__` and return the original (its
    `connection` argument and attribute: checked on 0.33.0 and 0.34.0)."""
    from vllm.multimodal.media.connector import MediaConnector

    original = MediaConnector.__init__
    MediaConnector.__init__ = init
    return original


def replace_init_app_state(init: Any) -> Any:
    """Put `init` in place of the API server's `init_app_state` where `vllm serve` calls
    it (`vllm.entrypoints.launchers.api_server.entry`, which imported it by name) and
    return the original. It reads the chat settings from the parsed command line
    (`args.tool_call_parser`, `enable_auto_tool_choice`, `chat_template`,
    `structured_outputs_config.reasoning_parser`): `serving.api_server.chat_defaults`
    fills those the operator left unset from the plan. Checked on 0.33.0 and 0.34.0."""
    from vllm.entrypoints.launchers.api_server import entry

    original = entry.init_app_state
    entry.init_app_state = init
    return original


def async_llm_class() -> type:
    """`AsyncLLM`, whose `shutdown` `serving.api_server.shutdown` wraps (checked on 0.33.0 and
    0.34.0: it leaves requests in flight open when `vllm serve` stops)."""
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM


def prompt_length_checks() -> list[tuple[type, str]]:
    """The methods whose errors refuse a request for the context length: (class, name)
    pairs, present on this release (private: `TokenizeParams.__post_init__`,
    `_text_len_check`, `_token_len_check` in `vllm.renderers.params`, and
    `InputProcessor._validate_prompt_len`; checked on 0.33.0 and 0.34.0).
    `serving.api_server.length_limits` wraps them to say why the limit is lower than asked."""
    checks: list[tuple[type, str]] = []
    try:
        from vllm.renderers.params import TokenizeParams
    except ImportError:
        TokenizeParams = None  # noqa: N806 - a class, or its absence on this release
    if TokenizeParams is not None:
        for name in ("__post_init__", "_text_len_check", "_token_len_check"):
            if hasattr(TokenizeParams, name):
                checks.append((TokenizeParams, name))
    from vllm.v1.engine.input_processor import InputProcessor

    if hasattr(InputProcessor, "_validate_prompt_len"):
        checks.append((InputProcessor, "_validate_prompt_len"))
    return checks


def engine_dead_reports() -> dict[str, frozenset[str]]:
    """Where vLLM logs, with its traceback, an `EngineDeadError` it was handed: logger
    name -> messages (`logger.exception`; checked on 0.33.0 and 0.34.0). Its own
    shutdown hands one to the output handler and, through it, to every stream in flight
    (and, with `--log-error-stack`, to every plain request's error handler)."""
    return {
        "vllm.v1.engine.async_llm": frozenset({"AsyncLLM output_handler failed."}),
        "vllm.entrypoints.openai.completion.serving": frozenset(
            {"Error in completion stream generator."}
        ),
        "vllm.entrypoints.openai.chat_completion.serving": frozenset(
            {"Error in chat completion stream generator."}
        ),
        "vllm.entrypoints.serve.exception_handling.handlers.vllm_error": frozenset(
            {"Engine Exception caught. Request id: %s"}
        ),
    }


def engine_core_module() -> Any:
    """`vllm.v1.engine.core`, where `EngineCore.shutdown` looks up
    `cleanup_dist_env_and_memory` (imported there by name; checked on 0.33.0 and
    0.34.0: on any platform but CPU it ends with `torch.accelerator.empty_cache()`)."""
    import vllm.v1.engine.core as core

    return core
