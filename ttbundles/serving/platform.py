"""The Tenstorrent platform for vLLM, on a TT mesh or on the host mesh.

vLLM asks the platform to shape the configuration (`check_and_update_config`) and to
vet requests (`validate_request`); everything bundle-specific is decided by the
configuration plan from the bundle's declared capabilities.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from vllm.exceptions import VLLMValidationError
from vllm.platforms.interface import Platform, PlatformEnum

from ttbundles.serving.planning.plan import SpeculativePlan
from ttbundles.serving.plugin import report_errors_cleanly

if TYPE_CHECKING:  # importing vLLM's config here would be circular at platform load
    from vllm.config import VllmConfig

    from ttbundles.serving.planning.plan import Plan


@dataclass
class Served:
    """What this process checks requests against and answers vLLM with, from the served
    plan (the configuration hook sets it; vLLM then calls the platform's class methods,
    which have nothing else to read it from)."""

    # What a speculating launch refuses per request (None: not speculating).
    speculative: SpeculativePlan | None = None
    # The bundle declares prompt logprobs: requests may ask for them.
    prompt_logprobs: bool = False
    # The plan serves the bundle's KV groups: `support_hybrid_kv_cache`'s answer.
    kv_groups: bool = False
    # The image placeholder tokens of this model (None: no images served).
    placeholders: Any = None
    # The stop-signal handlers are in place (once, in `vllm serve`).
    stop_installed: bool = False


class UnsupportedRequestError(VLLMValidationError, ValueError):
    """A request the platform cannot serve: vLLM answers it with HTTP 400 (a client
    error), the engine keeps running."""


class TTPlatform(Platform):
    _enum = PlatformEnum.OOT
    device_name: str = "tt"
    # torch knows no "tt" device; uses_host_device_handling keeps vLLM from building one.
    device_type: str = "tt"
    dispatch_key: str = "CPU"
    device_control_env_var: str = "TT_VISIBLE_DEVICES"
    simple_compile_backend: str = "eager"
    # torch here is the CPU build: any process group vLLM makes (none for dense
    # data-parallel engines, which run independently) goes over gloo.
    dist_backend: str = "gloo"
    # Set by `ttbundle plan`, which decides for a mesh that need not be attached here.
    planning: bool = False
    served: ClassVar[Served] = Served()

    def is_sleep_mode_available(self) -> bool:
        """True so that vLLM's model config lets `enable_sleep_mode` through to the
        planner, which refuses it in one line with its fix (TTB202); vLLM's own refusal
        is a pydantic traceback that names no flag."""
        return True

    def uses_host_device_handling(self) -> bool:
        return True

    @classmethod
    def import_kernels(cls) -> None:
        """No compiled vLLM kernels: the generator runs the model (an empty vLLM build)."""

    @classmethod
    def set_device(cls, device: Any) -> None:
        """Nothing to select per thread: the worker opens its (sub)mesh itself."""

    @classmethod
    def is_pin_memory_available(cls) -> bool:
        return False

    @classmethod
    def get_device_name(cls, device_id: int = 0) -> str:
        from ttbundles import envs

        return f"Tenstorrent {envs.MESH_DEVICE or 'mesh'}"

    @classmethod
    def pre_register_and_update(cls, parser: Any = None) -> None:
        """With `vllm serve`'s parser: check the parsed command line as soon as it is
        parsed, before vLLM builds (and checks) its configuration from it.

        What the flags alone refuse is refused here (`planning.flag_refusals`), in
        `vllm serve` and `ttbundle plan` alike, before vLLM's own checks and its engine:
        vLLM checks `--tensor-parallel-size 2` against the checkpoint's heads and
        `--enable-sleep-mode` against the platform in tracebacks, and an engine's
        start-up costs 17-35 s before the planner could say it. The settings the user
        asked for are recorded too (a lowered one is then a warning).
        """
        if parser is None or getattr(parser, "_ttbundles", False):
            return
        parse_known_args = parser.parse_known_args

        def checked(*args: Any, **kwargs: Any) -> Any:
            parsed, rest = parse_known_args(*args, **kwargs)
            from ttbundles import envs
            from ttbundles.serving import compat
            from ttbundles.serving.planning.command_line import record_command_line
            from ttbundles.serving.planning.flag_refusals import (
                refuse_checkpoint_length,
                refuse_flags,
            )

            report_errors_cleanly()
            # A vLLM outside the window that lacks a module we import: TTB216 first.
            compat.require_modules()
            refuse_flags(parsed, envs.MESH_DEVICE)
            refuse_checkpoint_length(parsed, envs.MESH_DEVICE)
            record_command_line(parsed)
            return parsed, rest

        parser.parse_known_args = checked
        parser._ttbundles = True

    @classmethod
    def check_and_update_config(cls, vllm_config: VllmConfig) -> None:
        import os

        # Configuration errors are raised inside vLLM's config construction: uncaught, they
        # end `vllm serve` with their message (a vLLM lacking a part we serve with, too:
        # importing `compat` says so, TTB216).
        report_errors_cleanly()
        from ttbundles.serving import api_server, compat

        compat.require_parts()
        # The runner protocol the TT worker speaks on this release (see there).
        for name, value in compat.runner_protocol_env().items():
            os.environ.setdefault(name, value)
        from ttbundles import envs
        from ttbundles.format.meshes import mesh_or_none
        from ttbundles.registry import servable
        from ttbundles.serving.faults import report_path, watch_stop_signals
        from ttbundles.serving.planning.configuration import plan_config
        from ttbundles.serving.registration import checked_registry

        if report_path() and not cls.served.stop_installed:  # once, in `vllm serve`
            cls.served.stop_installed = True
            watch_stop_signals()
            api_server.install_stop_handling()
        # What would otherwise fail after the engine started: a mesh this machine cannot
        # open (TT-Metal absent), then a class it cannot import. `ttbundle plan` plans for
        # meshes attached elsewhere: it skips the device check (and says so).
        mesh = mesh_or_none(envs.MESH_DEVICE)
        if not cls.planning:
            servable.require_device(mesh)
        # The API server may not run the general plugins itself: its startup table,
        # warnings and strict mode come from here.
        from ttbundles.serving.api_server import image_requests
        from ttbundles.serving.planning.plan import served_plan

        registry = checked_registry()
        plan = plan_config(vllm_config, registry)
        # None when this configuration was planned before (vLLM calls the hook again in
        # the engine core): the plan it carries.
        served = plan if plan is not None else served_plan(vllm_config)
        # For validate_request: what a speculating launch refuses per request.
        cls.served.speculative = served.speculative if served is not None else None
        if served is not None:
            cls.served.prompt_logprobs = served.prompt_logprobs
            # For support_hybrid_kv_cache, which vLLM asks right after this hook.
            cls.served.kv_groups = served.kv_groups
        if served is not None and served.inputs and vllm_config.model_config is not None:
            # For validate_request, in this process (the API server's requests).
            cls.served.placeholders = image_requests.placeholder_tokens(
                vllm_config.model_config.hf_config
            )
        if plan is not None:
            api_server.install(plan, planning=cls.planning)
            if servable.opens_here(mesh):
                servable.require_importable(
                    plan.bundle.main_class,
                    plan.bundle.label,
                    skipped=servable.skipped_for(registry, plan.tt_arch),
                )
            plan.log()
            if plan.dp_address and not cls.planning:
                _watch_hosts(plan)

    @classmethod
    def validate_request(cls, processed_inputs: Any, params: Any) -> None:
        tokens = cls.served.placeholders
        if tokens and isinstance(processed_inputs, dict):
            from ttbundles.serving.api_server.image_requests import check_placeholders

            check_placeholders(
                processed_inputs.get("prompt_token_ids") or (),
                processed_inputs.get("mm_placeholders") or {},
                tokens,
            )
        speculative = cls.served.speculative
        if speculative is not None:
            from ttbundles.serving.planning.spec_admission import refusal_message, request_refusal

            refusal = request_refusal(speculative, params)
            if refusal is not None:
                # No value: vLLM would append its repr (a StructuredOutputsParams is
                # hundreds of characters); the message names what the client sent.
                raise UnsupportedRequestError(
                    refusal_message(speculative, refusal), parameter=refusal[1]
                )
        prompt_logprobs = getattr(params, "prompt_logprobs", None)
        if prompt_logprobs is None:
            return
        if not cls.served.prompt_logprobs:
            raise UnsupportedRequestError(
                "TTB206: prompt logprobs are not supported by this model's bundle (it does "
                "not declare capabilities.prompt_logprobs); drop prompt_logprobs (or echo "
                "with logprobs) from the request",
                parameter="prompt_logprobs",
                value=prompt_logprobs,
            )
        # Scores of chosen ids, a first scored row: not served (the whole prompt is).
        unserved = [
            name
            for name in ("prompt_logprob_token_ids", "prompt_logprob_start")
            if getattr(params, name, None)
        ]
        if unserved:
            raise UnsupportedRequestError(
                f"TTB206: {', '.join(unserved)} is not supported on Tenstorrent (prompt "
                "logprobs of the whole prompt are); drop it from the request",
                parameter=unserved[0],
                value=getattr(params, unserved[0], None),
            )

    @classmethod
    def support_hybrid_kv_cache(cls) -> bool:
        """vLLM's hybrid KV-cache manager, when the plan serves the bundle's KV groups
        (`serving.planning.kv_admission`): its class declares them (`get_kv_cache_spec`). False
        otherwise: vLLM then gives every layer the whole context."""
        return cls.served.kv_groups


def _watch_hosts(plan: Plan) -> None:
    """On the head of a multi-host server (`vllm serve` with rank 0, not --headless):
    listen for every engine's connection, and stop the server when another host's
    rank is gone (`serving.host_watch`)."""
    import sys

    from ttbundles.serving import faults, host_watch

    if plan.dp_start_rank != 0 or "--headless" in sys.argv or not faults.serving_process():
        return
    first = plan.dp_start_rank
    host_watch.listen(plan.dp_address, plan.dp_rpc_port, range(first, first + plan.dp_local))
