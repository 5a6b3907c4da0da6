"""The one surface the worker drives, whatever the runner: generation or pooling.

vLLM 0.34's Model Runner V2 keeps one runner and puts each model kind behind a seam it
chooses once (`resolve_model_state_cls`); here the two runners answer the same calls, and
`make_runner` is the one place that chooses between them, so the worker never asks which
kind it drives.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.core.sched.output import GrammarOutput, SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheSpec

    from ttbundles.serving.planning.plan import Plan


class Runner(Protocol):
    """What `TTWorker` calls, in vLLM's order: load, the KV spec, the memory, the KV
    cache, the tasks; then each step."""

    generator_cls: type
    generator: Any

    def load_model(self) -> None: ...

    def describe(self) -> str:
        """What the start-up log says this runner serves."""
        ...

    def get_kv_cache_spec(self) -> dict[str, KVCacheSpec]: ...

    def cache_block_size_bytes(self) -> int: ...

    def determine_available_memory(self) -> int: ...

    def initialize_kv_cache(self, kv_cache_config: KVCacheConfig) -> None: ...

    def supported_tasks(self) -> tuple[str, ...]: ...

    def execute_model(self, scheduler_output: SchedulerOutput) -> Any: ...

    def sample_tokens(self, grammar_output: GrammarOutput | None) -> Any: ...

    def take_draft_token_ids(self) -> Any: ...


def make_runner(
    vllm_config: VllmConfig, generator_cls: type, mesh_device: Any, plan: Plan
) -> Runner:
    """The runner the plan serves: vLLM's pooling runner (`runner.pooling`, no KV cache of
    vLLM's) when the plan pools, the generation runner otherwise."""
    if plan.pooling is not None:
        from ttbundles.serving.runner.pooling import TTPoolingRunner

        return TTPoolingRunner(vllm_config, generator_cls, mesh_device, plan.pooling)
    from ttbundles.serving.runner.model_runner import TTModelRunner

    return TTModelRunner(vllm_config, generator_cls, mesh_device, plan)
