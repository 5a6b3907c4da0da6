"""The TT worker: opens the mesh, loads the bundle's generator, sizes the KV cache.

vLLM (0.33.0, "uni" executor: one worker per engine, with multi-process data
parallelism one per rank) runs it inside the engine-core process and calls, in order:
init_device, load_model, get_kv_cache_spec, get_supported_kv_cache_layouts,
determine_available_memory, initialize_from_config, compile_or_warm_up_model,
get_supported_tasks; then execute_model and sample_tokens per step. The generator is the
`TT<arch>` class our registry chose, never vLLM's resolution of the bare architecture.
"""

from __future__ import annotations

import functools
import json
import logging
import multiprocessing
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec
from vllm.v1.worker.worker_base import CompilationTimes, WorkerBase

from ttbundles import envs
from ttbundles.errors import ConfigurationError, TTBundleError
from ttbundles.format.contract import HostMesh
from ttbundles.format.meshes import is_host, mesh_shape
from ttbundles.fsutil import write_text_atomic
from ttbundles.serving import faults, host_watch
from ttbundles.serving.api_server import shutdown
from ttbundles.serving.planning.device_groups import bind_rank
from ttbundles.serving.planning.generator_class import load_generator_class
from ttbundles.serving.planning.plan import served_plan
from ttbundles.serving.runner.interface import Runner, make_runner
from ttbundles.serving.runner.lifecycle import Lifecycle
from ttbundles.serving.stats import STATS

if TYPE_CHECKING:  # only for annotations
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput

logger = logging.getLogger("vllm.ttbundles")


def _starting(method):  # noqa: ANN001, ANN202 - a decorator of worker methods
    """A ttbundles error while the engine starts ends it with one line (`faults`)."""

    @functools.wraps(method)
    def run(self, *args, **kwargs):  # noqa: ANN001, ANN002, ANN003, ANN202
        try:
            return method(self, *args, **kwargs)
        except TTBundleError as error:
            plan = getattr(self, "plan", None)
            faults.startup_failed(error, bundle=faults.bundle_label(plan) if plan else None)

    return run


class TTWorker(WorkerBase):
    def __init__(
        self, vllm_config, local_rank, rank, distributed_init_method, is_driver_worker=False
    ):
        super().__init__(vllm_config, local_rank, rank, distributed_init_method, is_driver_worker)
        plan = served_plan(vllm_config)
        if plan is None:
            raise ConfigurationError.single(
                "TTB209",
                "the TT worker started without a ttbundles plan in the configuration",
                hint="start the server with the tt platform plugin active (MESH_DEVICE set)",
            )
        self.plan = plan
        # The engine's teardown must not fail for want of an accelerator (the CPU torch).
        shutdown.tolerate_no_accelerator_at_cleanup()
        if multiprocessing.parent_process() is not None:  # vLLM's engine-core process
            faults.watch_parent()
            self._restore_signals = faults.stop_while_starting()
            if plan.dp_address:  # ranks on several hosts: this engine stops with the head
                host_watch.join(
                    plan.dp_address,
                    plan.dp_rpc_port,
                    self.parallel_config.data_parallel_index,
                    plan.host,
                )
        self._batch = 0
        self.mesh_device: Any = None
        self.model_runner: Runner | None = None
        self.lifecycle: Lifecycle | None = None  # bound at load: warm-up, release
        self._stats_file = envs.TT_BUNDLES_STATS_FILE
        # Multi-process data parallelism: this engine's rank on this node (None: one engine).
        self.dp_rank: int | None = None
        if plan.device_groups:
            self.dp_rank = self.parallel_config.data_parallel_rank_local
            if self._stats_file:
                self._stats_file = rank_stats_path(self._stats_file, self.dp_rank or 0)

    # --- device and model ---------------------------------------------------------------

    @_starting
    def init_device(self) -> None:
        self.device = torch.device("cpu")
        self._bind_device_group()
        # TT-Metal itself reads TT_VISIBLE_DEVICES when the mesh opens; said here so the
        # log shows which chips this engine was given.
        logger.info(
            "ttbundles: opening mesh %s (TT_VISIBLE_DEVICES=%s)",
            envs.MESH_DEVICE or "unset",
            envs.TT_VISIBLE_DEVICES or "unset: every chip",
        )
        self.mesh_device = open_mesh(envs.MESH_DEVICE, self.plan.submesh_shape, self._device_ids())

    def _bind_device_group(self) -> None:
        """With several data-parallel engines: this rank's chips, before TT-Metal loads.

        vLLM (0.33.0) runs each dense data-parallel rank as an independent engine core
        (`EngineCoreProc`, no collective per step) whose worker sees its node-local rank in
        `data_parallel_rank_local` and its global rank in `data_parallel_index`.
        """
        groups = self.plan.device_groups
        if not groups:
            return
        value = bind_rank(groups, self.dp_rank)
        rows, columns = self.plan.submesh_shape
        # On several hosts the global rank and the host say where this engine lives.
        logger.info(
            "ttbundles: Bound TT_VISIBLE_DEVICES=%s for local DP rank %d "
            "(DP rank %d of %d on host %s, a %dx%d submesh of %s)",
            value,
            self.dp_rank,
            self.parallel_config.data_parallel_index,
            max(self.plan.dp_size, len(groups)),
            self.plan.host or "this host",
            rows,
            columns,
            envs.MESH_DEVICE or "N150",
        )

    def _device_ids(self) -> list[int]:
        if not self.plan.device_groups or self.dp_rank is None:
            return []
        return list(self.plan.device_groups[self.dp_rank])

    @_starting
    def load_model(self, *, load_dummy_weights: bool = False) -> None:
        generator_cls = load_generator_class(self.plan.bundle)
        self.model_runner = make_runner(
            self.vllm_config, generator_cls, self.mesh_device, self.plan
        )
        try:
            self.model_runner.load_model()
        except TTBundleError:
            raise
        except Exception as exc:  # noqa: BLE001 - the generator's own code: one line
            raise faults.load_failed(generator_cls.__name__, exc) from exc
        # The warm-up and release the class asks for, bound now: a class asking for a
        # warm-up it cannot run is refused before any request.
        self.lifecycle = Lifecycle.bind(
            self.model_runner.generator, generator_cls, generator_cls.__qualname__
        )
        logger.info(
            "ttbundles: loaded %s (%s, %s) on %s",
            self.plan.tt_arch,
            self.plan.bundle.declared_class or self.plan.bundle.main_class,
            self.model_runner.describe(),
            self.mesh_device,
        )

    def get_model(self) -> Any:
        return self.model_runner.generator if self.model_runner else None

    # --- KV cache -----------------------------------------------------------------------

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]:
        """Each layer's cache, as the runner's KV layer groups say (`runner.kv`)."""
        assert self.model_runner is not None
        return self.model_runner.get_kv_cache_spec()

    def get_supported_kv_cache_layouts(self) -> list[str]:
        # The generator owns its cache layout; vLLM only needs a name to record.
        return ["LBHNC"]

    @_starting
    def determine_available_memory(self) -> int:
        """Bytes for the KV cache, as the runner sizes it (`runner.kv.sizing`)."""
        assert self.model_runner is not None
        return self.model_runner.determine_available_memory()

    @_starting
    def initialize_from_config(self, kv_cache_config: KVCacheConfig) -> None:
        assert self.model_runner is not None
        self.model_runner.initialize_kv_cache(kv_cache_config)

    @_starting
    def compile_or_warm_up_model(self) -> CompilationTimes:
        lifecycle = self.lifecycle
        if lifecycle is not None:
            options = self.plan.tt_options
            passes = lifecycle.warm_up(
                getattr(self.model_runner, "kv_cache", None),
                trace=(options.trace_mode or "all") == "all",
                sample_on_device=options.sample_on_device_mode == "all",
            )
            if passes:
                STATS.count("warmup.prefill", passes)
                logger.info("ttbundles: prefill warm-up done (%d passes)", passes)
        # Started: from here a SIGTERM is vLLM's to handle (a graceful shutdown).
        restore, self._restore_signals = getattr(self, "_restore_signals", None), None
        if restore is not None:
            restore()
        return CompilationTimes(language_model=0.0, encoder=0.0)

    def get_supported_tasks(self) -> tuple[str, ...]:
        assert self.model_runner is not None
        return tuple(self.model_runner.supported_tasks())

    def get_cache_block_size_bytes(self) -> int:
        assert self.model_runner is not None
        return self.model_runner.cache_block_size_bytes()

    # --- steps --------------------------------------------------------------------------

    def execute_model(self, scheduler_output: SchedulerOutput) -> ModelRunnerOutput | None:
        assert self.model_runner is not None
        self._batch = len(scheduler_output.num_scheduled_tokens)
        try:
            output = self.model_runner.execute_model(scheduler_output)
        except Exception as error:
            faults.step_failed(error, faults.bundle_label(self.plan), self._batch, None)
            raise
        if output is not None:
            self._write_stats()
        return output

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> ModelRunnerOutput:
        assert self.model_runner is not None
        try:
            output = self.model_runner.sample_tokens(grammar_output)
        except Exception as error:
            faults.step_failed(error, faults.bundle_label(self.plan), self._batch, None)
            raise
        self._write_stats()
        return output

    def take_draft_token_ids(self) -> DraftTokenIds | None:
        """The drafts proposed after the last step (speculative decoding), which the
        engine core hands to the scheduler before the next one."""
        assert self.model_runner is not None
        return self.model_runner.take_draft_token_ids()

    def _write_stats(self) -> None:
        if not self._stats_file:
            return
        write_text_atomic(Path(self._stats_file), json.dumps(STATS.snapshot()), keep_mode=False)

    def check_health(self) -> None:
        return

    def shutdown(self) -> None:
        lifecycle = self.lifecycle
        if lifecycle is not None and lifecycle.release_capture():
            STATS.count("shutdown.release_persistent_capture")
        logger.info("ttbundles: step counters %s", STATS.snapshot())

    def add_lora(self, lora_request: Any) -> bool:
        raise NotImplementedError("LoRA is not supported yet on Tenstorrent")

    def remove_lora(self, lora_id: int) -> bool:
        raise NotImplementedError("LoRA is not supported yet on Tenstorrent")

    def pin_lora(self, lora_id: int) -> bool:
        raise NotImplementedError("LoRA is not supported yet on Tenstorrent")

    def list_loras(self) -> set[int]:
        return set()


def open_mesh(
    name: str | None, submesh_shape: Sequence[int] = (), device_ids: Sequence[int] = ()
) -> Any:
    """The mesh the generator runs on: the host mesh, or a TT mesh through ttnn.

    A data-parallel rank opens its submesh (`submesh_shape`) over the chips its
    TT_VISIBLE_DEVICES shows; on the host mesh, a host submesh with its `device_ids`.
    The ttnn path follows TT-Metal's mesh presets; it is written but untested here (no
    Tenstorrent hardware on this project's machines).
    """
    if is_host(name):
        return HostMesh(
            shape=tuple(submesh_shape) or (1, 1),  # type: ignore[arg-type]
            device_ids=tuple(device_ids) or (0,),
        )
    import ttnn  # noqa: F401 - only on machines with the TT-Metal stack

    shape = tuple(submesh_shape) or mesh_shape(name or "N150")
    return ttnn.open_mesh_device(ttnn.MeshShape(*shape))


def rank_stats_path(path: str, rank: int) -> str:
    """`stats.json` -> `stats.dp1.json`: one counters file per data-parallel rank."""
    stem, dot, suffix = path.rpartition(".")
    if not dot or "/" in suffix:
        return f"{path}.dp{rank}"
    return f"{stem}.dp{rank}.{suffix}"
