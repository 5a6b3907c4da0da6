"""Decide the effective vLLM configuration from what the selected bundle declares.

Called from `TTPlatform.check_and_update_config` (the server) and, through the same
hook, by `ttbundle plan`: one code path, so the plan shows exactly what a server does.
Every adjustment is a `Decision` (setting, requested, effective, reason); what cannot
work raises a `ConfigurationError` before anything reaches the device. The adapter is
never imported: capabilities come from the bundle's metadata.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.format import capabilities as catalogue
from ttbundles.format.contract import unservable_reason
from ttbundles.format.meshes import is_host
from ttbundles.format.metadata import BundleMetadata, Target
from ttbundles.format.tt_options import (
    TTOptions,
)
from ttbundles.registry.registry import Registry
from ttbundles.serving.planning import command_line
from ttbundles.serving.planning.options import TT_DEFAULTS, parse_server_options, parse_tt_options
from ttbundles.serving.planning.plan import PLAN_KEY, BundleRef, Plan
from ttbundles.serving.planning.pooling import plan_runner
from ttbundles.serving.planning.selection import select_entry
from ttbundles.serving.planning.topology import plan_device_groups, plan_lanes

if TYPE_CHECKING:  # vLLM's config imports the platform: import it only for type hints
    from vllm.config import VllmConfig

logger = logging.getLogger("vllm.ttbundles")

WORKER_CLS = "ttbundles.serving.worker.TTWorker"
SCHEDULER_CLS = "ttbundles.serving.scheduler.TTScheduler"
ASYNC_SCHEDULER_CLS = "ttbundles.serving.scheduler.TTAsyncScheduler"
LANE_COORDINATOR_CLS = "ttbundles.serving.lanes.TTLaneCoordinator"


def _error(code: str, message: str, hint: str | None = None) -> ConfigurationError:
    return ConfigurationError(Diagnostic(code, Severity.ERROR, message, hint=hint))


def plan_config(vllm_config: VllmConfig, registry: Registry) -> Plan | None:
    """Turn the user's configuration into the effective one, in place."""
    model_config = vllm_config.model_config
    additional = vllm_config.additional_config
    if model_config is None:
        return None
    existing = additional.get(PLAN_KEY) if isinstance(additional, dict) else None
    if existing:  # the hook runs in every process; decide once, keep the first plan
        return None

    hf_config = model_config.hf_config
    architectures = list(getattr(hf_config, "architectures", None) or [])
    entry = select_entry(architectures, registry)
    meta = entry.metadata
    assert meta is not None
    reason = unservable_reason(meta.arch)
    if reason is not None:
        raise _error(
            "TTB202",
            f"{meta.tt_arch} ({meta.name}) cannot be served: {reason}",
            "serve a model vLLM knows (for images: Qwen2.5-VL, Qwen3-VL, Gemma 3)",
        )
    from ttbundles.serving.planning.reference_admission import refuse_unread_architecture

    refuse_unread_architecture(entry)  # a reference that does not read it: TTB041
    caps = meta.capabilities
    mesh = registry.mesh
    target = meta.target(mesh)
    plan = Plan(
        tt_arch=meta.tt_arch,
        bundle=BundleRef(
            name=meta.name,
            version=meta.version,
            source=entry.source.value,
            path=str(entry.path),
            main_class=entry.class_ref(),
            # As the bundle wrote it: what logs and errors show (never the package its
            # modules are imported under).
            declared_class=meta.main_class,
        ),
        mesh=mesh,
        options={},
    )
    plan.decide(
        "architecture",
        architectures,
        meta.tt_arch,
        f"{meta.name}@{meta.version} ({entry.source.value}) provides it",
    )

    _refuse_unsupported(vllm_config, mesh)
    plan_runner(vllm_config, plan, meta)
    _plan_evidence(plan, entry.path)

    options = _plan_options(vllm_config, plan, meta, target)
    _plan_sampling_paths(plan, entry, options)
    _plan_server(vllm_config, plan, bool(caps.input_limits()))
    _plan_dtype(vllm_config, plan)

    _plan_lengths(vllm_config, plan, target)
    from ttbundles.serving.planning.window_admission import plan_window

    plan_window(vllm_config, plan, entry)  # a window the generator does not mask: TTB250
    _plan_inputs(vllm_config, plan, meta.name, caps.input_limits())
    _plan_logprobs(vllm_config, plan, caps.prompt_logprobs)
    plan_lanes(vllm_config, plan, caps.execution, target)
    if caps.execution != "single":  # a single-execute engine opens its host's whole mesh
        plan_device_groups(vllm_config, plan)

    _plan_features(vllm_config, plan, meta)
    _plan_scheduler(vllm_config, plan)
    from ttbundles.serving.planning.recurrent import plan_recurrent_state

    # Before speculation is admitted: a state slot refuses it whatever the class says.
    plan_recurrent_state(vllm_config, plan, meta)  # the generator's slots, or TTB274
    from ttbundles.serving.planning.block_output import plan_block_output

    # Before speculation too: a block-output class refuses it with its own reason.
    options = plan_block_output(vllm_config, plan, entry, options, scheduler_cls=SCHEDULER_CLS)
    from ttbundles.serving.planning.spec_admission import plan_speculative

    plan_speculative(vllm_config, plan, meta)
    from ttbundles.serving.planning.kv_admission import plan_kv_groups

    plan_kv_groups(vllm_config, plan, caps.kv_cache_spec)
    from ttbundles.serving.planning.chat_defaults import plan_chat_defaults

    plan_chat_defaults(vllm_config, plan, meta, entry.path, command_line.COMMAND_LINE)

    plan.options = options
    plan.freeze()
    additional[PLAN_KEY] = plan.to_dict()
    return plan


def _plan_evidence(plan: Plan, bundle_dir: Any) -> None:
    """Whether the bundle was proven on this mesh (its evidence): a server running a
    target with no evidence says so in one line, not as an error."""
    from pathlib import Path

    from ttbundles.check.support import evidence_status

    mesh = plan.mesh
    folder = Path(bundle_dir)
    status = (
        evidence_status(folder).get(mesh, "untested") if mesh and folder.is_dir() else ("untested")
    )
    plan.evidence = status
    if status == "tested":
        return
    bundle = plan.bundle.label
    why = {
        "untested": "no evidence",
        "stale": "stale evidence (the bundle changed since)",
        "failed": "evidence of a failed test",
    }[status]
    plan.evidence_note = (
        f"evidence: {bundle} has {why} on mesh {mesh or 'unset'}: served, not tested "
        "(ttbundle test BUNDLE --model CKPT --keep-evidence proves it)"
    )


def _refuse_unsupported(vllm_config: VllmConfig, mesh: str | None) -> None:
    """What Tenstorrent does not do (yet), read from vLLM's config: the lines the parse
    hook gives a command line (`serving.planning.flag_refusals`), for configurations built
    without one."""
    from ttbundles.serving.planning.flag_refusals import refuse_flags, settings_of

    refuse_flags(settings_of(vllm_config), mesh)


def _plan_options(
    vllm_config: VllmConfig, plan: Plan, meta: BundleMetadata, target: Target | None
) -> TTOptions:
    """The device options: the user's values, then the target's defaults, then ours; a
    sampling mode the bundle does not declare is refused (TTB204)."""
    additional = vllm_config.additional_config
    mesh = plan.mesh
    caps = meta.capabilities
    user = parse_tt_options(additional.get("tt") if isinstance(additional, dict) else None)
    target_defaults = target.additional_config if target else TTOptions()
    options = user.merged_over(target_defaults).merged_over(TT_DEFAULTS)
    for key, value in options.model_dump(exclude_none=True).items():
        if getattr(user, key) is None:
            source = (
                ("default of target " + str(mesh))
                if getattr(target_defaults, key) is not None
                else "default"
            )
            plan.decide(f"tt.{key}", None, value, source)
        else:
            plan.decide(f"tt.{key}", value, value, "set by the user")
    mode = options.sample_on_device_mode
    if mode is not None and mode not in caps.sample_on_device:
        declared = ", ".join(caps.sample_on_device) or "none"
        raise _error(
            "TTB204",
            f"sample_on_device_mode={mode!r} is not declared by {meta.name} "
            f"(declared modes: {declared})",
            "drop sample_on_device_mode to sample on the host"
            + (f", or use one of: {declared}" if caps.sample_on_device else ""),
        )
    if mode is None:
        plan.decide(
            "sampling", None, "host", "no sample_on_device_mode: vLLM's sampler on the host"
        )
    return options


def _plan_sampling_paths(plan: Plan, entry: Any, options: TTOptions) -> None:
    """Which sampler serves structured output and log-probabilities, from the class's
    `model_capabilities` as its source shows it (the runner decides the same at load from
    the imported class, which must also take the `grammar_bitmask` keyword, and says so
    in the start-up log's `sampling:` line)."""
    if options.sample_on_device_mode is None or options.always_compat_sampling:
        return  # "sampling: host" or tt.always_compat_sampling says it all
    from ttbundles.format.contract import (
        DEVICE_GRAMMAR_KEY,
        MAX_DEVICE_LOGPROBS_KEY,
        SPLIT_SAMPLER_METHOD,
    )

    static = entry.class_source()
    caps = static.model_capabilities if static is not None else None
    if caps is None:
        plan.decide(
            "sampling.structured_output",
            None,
            "decided at load",
            "the class's model_capabilities is not readable here: the start-up log says",
        )
        return
    cls = entry.metadata.main_class
    split = SPLIT_SAMPLER_METHOD in static.methods
    grammar = bool(caps.get(DEVICE_GRAMMAR_KEY)) and not split
    plan.decide(
        "sampling.structured_output",
        None,
        "device" if grammar else "host",
        f"{cls} declares {DEVICE_GRAMMAR_KEY}: decodes send the grammar bitmask to its "
        "sampler and keep async decode (structured prefills sample on the host)"
        if grammar
        else f"{cls} declares {DEVICE_GRAMMAR_KEY} with TT-Metal's split sampler "
        f"({SPLIT_SAMPLER_METHOD}), whose run-time grammar route is not driven yet: "
        "structured batches sample on the host and drain async decode"
        if caps.get(DEVICE_GRAMMAR_KEY)
        else f"{cls} does not declare {DEVICE_GRAMMAR_KEY}: structured batches sample on "
        "the host and drain async decode",
    )
    plan.decide(
        "sampling.logprobs",
        None,
        "device" if caps.get(MAX_DEVICE_LOGPROBS_KEY) else "host",
        f"{cls} declares {MAX_DEVICE_LOGPROBS_KEY}: its sampler's top log-probs serve "
        "greedy or top-k-bounded requests up to that many, the host the others"
        if caps.get(MAX_DEVICE_LOGPROBS_KEY)
        else f"{cls} does not declare {MAX_DEVICE_LOGPROBS_KEY}: log-prob requests sample "
        "on the host",
    )


def _plan_server(vllm_config: VllmConfig, plan: Plan, images: bool) -> None:
    """The API server's options: which image URLs it fetches (`serving.api_server.media_urls`).
    Decided aloud only where images are served: a text-only server fetches none, and a
    line about image URLs in its log is noise (unless the user set the option)."""
    additional = vllm_config.additional_config
    raw = additional.get("tt") if isinstance(additional, dict) else None
    server = parse_server_options(raw)
    allow = server.allow_private_media_urls
    requested = allow if isinstance(raw, dict) and "allow_private_media_urls" in raw else None
    plan.server = server
    if not images:
        if requested is not None:
            plan.decide(
                "tt.allow_private_media_urls",
                requested,
                allow,
                "set by the user, no effect: this bundle takes no images",
            )
        return
    if requested is None:
        reason = "default: http(s) image URLs must name public addresses (TTB220)"
    elif allow is True:
        reason = "set by the user: image URLs may name any address, inside ones too"
    elif allow is False:
        reason = "set by the user: http(s) image URLs must name public addresses (TTB220)"
    else:
        reason = "set by the user: image URLs may name public addresses and these networks"
    plan.decide("tt.allow_private_media_urls", requested, allow, reason)


def _plan_dtype(vllm_config: VllmConfig, plan: Plan) -> None:
    """On the host mesh the generator is the torch reference, which loads and computes in
    float32 whatever vLLM's `--dtype` says: vLLM logs its own choice (a downcast to
    bfloat16 of a float32 checkpoint), so the plan says which one is true.

    vLLM's `--quantization` (or a checkpoint's own quantization config) is a method of
    vLLM's model layers, which no Tenstorrent engine runs: the generator loads the
    checkpoint's weights itself. vLLM serves on without a word; the plan says what the
    weights really are."""
    model_config = vllm_config.model_config
    if model_config is None:
        return
    host = is_host(plan.mesh)
    if host:
        vllm_dtype = str(model_config.dtype).removeprefix("torch.")
        plan.decide(
            "dtype",
            vllm_dtype,
            "float32",
            "the host mesh computes in float32: --dtype has no effect on HOST",
        )
    quantization = getattr(model_config, "quantization", None)
    if quantization:
        plan.decide(
            "quantization",
            str(quantization),
            "float32, not quantized" if host else "the generator's own precision",
            "the host mesh loads the checkpoint's weights in float32: --quantization has no "
            "effect on HOST"
            if host
            else "vLLM's quantization methods run in vLLM's model layers, which Tenstorrent "
            "does not run: the generator loads the weights in the precision it chooses",
        )


def _plan_features(vllm_config: VllmConfig, plan: Plan, meta: BundleMetadata) -> None:
    """vLLM's features gated by the bundle's capabilities, and the step budget they
    imply."""
    model_config = vllm_config.model_config
    caps = meta.capabilities
    sched = vllm_config.scheduler_config
    plan.async_decode = bool(caps.async_decode)
    # Each feature stays on only when the bundle declares the capability it needs.
    for section, setting, capability in catalogue.TURNED_OFF:
        config = getattr(vllm_config, section)
        requested = bool(getattr(config, setting))
        if requested and plan.pooling is not None:
            # The pooling runner pools whole prompts in the step they are scheduled, with
            # no KV cache of vLLM's: nothing to chunk, cache or overlap.
            setattr(
                config,
                setting,
                plan.decide(
                    setting,
                    True,
                    False,
                    "pooling takes whole prompts in one step, with no KV cache of vLLM's",
                ),
            )
        elif requested and not getattr(caps, capability):
            setattr(
                config,
                setting,
                plan.decide(
                    setting, True, False, f"{meta.name} does not declare capabilities.{capability}"
                ),
            )
        else:
            # vLLM turns these on unless told otherwise: on is its default, off was asked.
            plan.decide(
                setting,
                requested,
                requested,
                "on: vLLM's default" if requested else "off, as requested",
            )
    if not vllm_config.cache_config.enable_prefix_caching:
        from ttbundles.serving.planning.recurrent import settle_mamba_cache

        settle_mamba_cache(vllm_config)  # vLLM's hybrid hook set it for caching on
    if not sched.enable_chunked_prefill and (
        sched.max_num_batched_tokens < model_config.max_model_len
    ):
        sched.max_num_batched_tokens = plan.decide(
            "max_num_batched_tokens",
            sched.max_num_batched_tokens,
            model_config.max_model_len,
            "prompts prefill whole: the step budget must hold the longest prompt",
        )


def _plan_scheduler(vllm_config: VllmConfig, plan: Plan) -> None:
    """The worker and the scheduler (phase-based; the lane coordinator for lanes)."""
    parallel = vllm_config.parallel_config
    sched = vllm_config.scheduler_config
    if parallel.worker_cls == "auto":
        parallel.worker_cls = WORKER_CLS
    if sched.scheduler_cls is None:
        if plan.lanes > 1:
            sched.scheduler_cls = LANE_COORDINATOR_CLS
        else:
            sched.scheduler_cls = ASYNC_SCHEDULER_CLS if sched.async_scheduling else SCHEDULER_CLS
    elif plan.lanes > 1 and sched.scheduler_cls != LANE_COORDINATOR_CLS:
        raise _error(
            "TTB205",
            f"--scheduler-cls {sched.scheduler_cls}: {plan.lanes} in-process lanes need "
            "the lane coordinator",
            f"drop --scheduler-cls (or pass {LANE_COORDINATOR_CLS})",
        )
    plan.decide(
        "scheduler",
        None,
        sched.scheduler_cls,
        f"phase-based, {plan.lanes} lanes stepping together: prefill-only or decode-only steps"
        if plan.lanes > 1
        else "phase-based: prefill-only or decode-only steps",
    )
    interval = sched.prefill_schedule_interval
    if interval > 1:
        # vLLM's local prefill cadence (no DP coordinator on Tenstorrent: in-process lanes
        # are one engine, and MoE data parallelism is refused above).
        plan.decide(
            "prefill_schedule_interval",
            interval,
            interval,
            f"prefill runs at most once every {interval} executed steps while a decode "
            "runs; the steps between are decode steps",
        )


MAX_LOGPROBS = 20
DEFAULT_MAX_LOGPROBS = 20  # vLLM's ModelConfig.max_logprobs default
"""Log-probabilities per token Tenstorrent serves at most (the reference plugin's clamp;
devices return at most their `max_device_logprobs`, the host sampler more)."""


def _plan_logprobs(vllm_config: VllmConfig, plan: Plan, prompt_logprobs: bool) -> None:
    """max_logprobs, and whether requests may ask for prompt logprobs: only from a bundle
    declaring them (its prefill returns every position's logits), else each such request
    is refused (TTB206, HTTP 400)."""
    plan.prompt_logprobs = plan.decide(
        "prompt_logprobs",
        None,
        prompt_logprobs,
        "the bundle declares them (prefill returns every prompt position's logits)"
        if prompt_logprobs
        else "the bundle does not declare them: such requests are refused (TTB206)",
    )
    model_config = vllm_config.model_config
    requested = model_config.max_logprobs
    if requested < 0 or requested > MAX_LOGPROBS:  # -1: vLLM's "as many as the vocabulary"
        model_config.max_logprobs = plan.decide(
            "max_logprobs",
            requested,
            MAX_LOGPROBS,
            f"Tenstorrent serves at most {MAX_LOGPROBS} log-probabilities per token",
        )
    else:
        plan.decide(
            "max_logprobs",
            requested,
            requested,
            "vLLM's default" if requested == DEFAULT_MAX_LOGPROBS else "as requested",
        )


def _plan_lengths(vllm_config: VllmConfig, plan: Plan, target: Any) -> None:
    """max_model_len within the bundle's target, with where the length came from: the
    command line (`--max-model-len`), the checkpoint (its config's own limit, or a
    sentence-transformers `sentence_bert_config.json`), or vLLM's configuration as given
    in-process. A length the checkpoint set is lowered without a warning: nobody asked."""
    model_config = vllm_config.model_config
    sched = vllm_config.scheduler_config
    length = model_config.max_model_len
    source = _length_source(model_config, length)
    if target is not None and target.max_model_len is not None and length > target.max_model_len:
        if source is None or source.startswith("as requested"):
            model_config.max_model_len = plan.lowered(
                "max_model_len", length, target.max_model_len, "max_model_len"
            )
        else:  # the checkpoint's own length, not asked for: the plan says so, no warning
            model_config.max_model_len = plan.decide(
                "max_model_len",
                length,
                target.max_model_len,
                f"the bundle's target {plan.mesh} supports at most {target.max_model_len} "
                f"({length} is {source})",
            )
        if hasattr(sched, "max_model_len"):
            sched.max_model_len = target.max_model_len
    else:
        plan.decide("max_model_len", length, length, source or "as requested")


def _length_source(model_config: Any, length: int) -> str | None:
    """Where vLLM's max_model_len came from, in the plan's words; None when only vLLM's
    configuration says (a length given in-process, as `LLM(max_model_len=...)` gives it)."""
    if command_line.COMMAND_LINE.get("max_model_len") == length:
        return "as requested (--max-model-len)"
    encoder = getattr(model_config, "encoder_config", None) or {}
    if encoder.get("max_seq_length") == length:
        return f"the checkpoint's {_sentence_config(model_config.model)} (max_seq_length)"
    if getattr(model_config.hf_text_config, "max_position_embeddings", None) == length:
        return "the model's own limit (default)"
    return None


def _sentence_config(model: str) -> str:
    """The sentence-transformers file vLLM read the length from (it reads the first of
    several names, `sentence_bert_config.json` the common one)."""
    from pathlib import Path

    names = ("bert", "roberta", "distilbert", "camembert", "albert", "xlm-roberta", "xlnet")
    for name in names:
        if (Path(model) / f"sentence_{name}_config.json").is_file():
            return f"sentence_{name}_config.json"
    return "sentence-transformers config"


# The modalities vLLM's processors take; each is capped explicitly (vLLM's default is 999).
MODALITIES = ("image", "video", "audio")


def _plan_inputs(vllm_config: VllmConfig, plan: Plan, bundle: str, limits: dict[str, int]) -> None:
    """What one prompt may carry besides text: the bundle's modalities and limits.

    vLLM preprocesses images in the API server with its own processor for the
    checkpoint's architecture, as TT-Metal's vision classes have it do, and refuses a
    prompt over `limit_mm_per_prompt` there (HTTP 400, the engine never sees it). So the
    bundle's declaration becomes that limit: every modality it does not list is 0 (a
    video to an image-only bundle, an image to a text-only one), and a user's
    `--limit-mm-per-prompt` may lower a limit, never raise it past the generator's.
    """
    mm = vllm_config.model_config.multimodal_config
    if mm is None:
        reason = (
            f"{bundle} declares {_limits_text(limits)}, but vLLM has no multimodal "
            "processor for this checkpoint's architecture"
            if limits
            else f"{bundle} declares no modalities"
        )
        plan.inputs = {}
        plan.decide("inputs", None, "text only", reason)
        return
    from ttbundles.serving import compat

    configured = mm.limit_per_prompt
    requested = {
        m: o.count for m in sorted(set(MODALITIES) | set(configured)) if (o := configured.get(m))
    }
    over = {m: n for m, n in requested.items() if n > limits.get(m, 0)}
    if over:
        asked = ", ".join(f"{m}={n}" for m, n in over.items())
        raise _error(
            "TTB215",
            f"--limit-mm-per-prompt {asked}: {bundle} takes at most "
            f"{_limits_text(limits) if limits else 'text only'}",
            "lower the limit or drop --limit-mm-per-prompt (the bundle's limits apply)",
        )
    effective = {m: min(requested.get(m, limits.get(m, 0)), limits.get(m, 0)) for m in MODALITIES}
    effective.update({m: 0 for m in configured if m not in effective})
    fresh = compat.validate_limit_per_prompt(effective)
    for modality, count in effective.items():
        options = configured.get(modality)
        if options is None:
            configured[modality] = fresh[modality]
        else:
            options.count = count
    served = {m: n for m, n in effective.items() if n}
    plan.inputs = served
    if served and mm.mm_device_do_normalize:
        # vLLM's own class for this architecture may normalise pixels on its GPU and
        # have the processor leave them raw; a TT generator gets them as TT-Metal's
        # classes do (their processor registration does not declare that): normalised.
        mm.mm_device_do_normalize = plan.decide(
            "mm_device_do_normalize",
            True,
            False,
            "the processor normalises pixels; the TT generator expects them so",
        )
    plan.decide(
        "inputs",
        requested or None,
        _limits_text(served) if served else "text only",
        ("as requested, within " if requested else "")
        + (f"what {bundle} declares" if limits else f"{bundle} declares no modalities")
        + "; other modalities are refused by the API server",
    )


def _limits_text(limits: dict[str, int]) -> str:
    return "text + " + ", ".join(f"{n} {m}(s) per prompt" for m, n in limits.items())
