"""One way to build a real `VllmConfig` in-process, shared by the tests and benchmarks
that drive vLLM's schedulers and the lane coordinator without an engine.

The TT platform's configuration hook is bypassed (it would plan for a mesh and load the
checkpoint's bundle); a caller that needs the plan it would store passes it in
`additional_config`. `VLLM_USE_V2_MODEL_RUNNER` is chosen explicitly, since it changes
the scheduler's bookkeeping.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from vllm.config import CacheConfig, DeviceConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.platforms import current_platform
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec


def runner_env(v2_runner: bool | None) -> dict[str, str]:
    """The environment that picks vLLM's runner protocol: None, the release's own as the
    TT platform sets it (`compat.runner_protocol_env`); True or False, V2's or V1's,
    where the release has both (0.33.0). V1's on a release without it skips the test."""
    from ttbundles.serving import compat

    if v2_runner is None:
        return compat.runner_protocol_env()
    if not compat.V1_RUNNER_PARTS:
        if not v2_runner:
            pytest.skip("this vLLM release has no Model Runner V1 (removed in 0.34.0)")
        return {}
    return {"VLLM_USE_V2_MODEL_RUNNER": "1" if v2_runner else "0"}


def vllm_config(
    checkpoint: Path,
    *,
    max_num_seqs: int,
    max_num_batched_tokens: int,
    max_model_len: int,
    block_size: int,
    async_scheduling: bool = False,
    prefix_caching: bool = False,
    additional_config: dict[str, Any] | None = None,
    v2_runner: bool | None = None,
    hf_overrides: dict[str, Any] | None = None,
    **scheduler: Any,
) -> VllmConfig:
    """A CPU, float32 config of `checkpoint` with chunked prefill; `scheduler` holds more
    `SchedulerConfig` fields (policy, prefill_schedule_interval, ...)."""
    bypass = classmethod(lambda cls_, config: None)
    env = runner_env(v2_runner)
    with (
        mock.patch.dict(os.environ, env),
        mock.patch.object(type(current_platform), "check_and_update_config", bypass),
    ):
        return VllmConfig(
            model_config=ModelConfig(
                model=str(checkpoint),
                max_model_len=max_model_len,
                dtype="float32",
                skip_tokenizer_init=True,
                **({"hf_overrides": hf_overrides} if hf_overrides else {}),
            ),
            scheduler_config=SchedulerConfig(
                max_num_seqs=max_num_seqs,
                max_num_batched_tokens=max_num_batched_tokens,
                max_model_len=max_model_len,
                enable_chunked_prefill=True,
                is_encoder_decoder=False,
                async_scheduling=async_scheduling,
                **scheduler,
            ),
            cache_config=CacheConfig(block_size=block_size, enable_prefix_caching=prefix_caching),
            device_config=DeviceConfig(device="cpu"),
            additional_config=dict(additional_config or {}),
        )


def kv_cache_config(num_blocks: int, block_size: int) -> KVCacheConfig:
    """One full-attention group of `num_blocks` blocks (the tiny checkpoints' shape)."""
    spec = FullAttentionSpec(
        block_size=block_size, num_kv_heads=2, head_size=16, dtype=torch.float32
    )
    return KVCacheConfig(
        num_blocks=num_blocks,
        kv_cache_tensors=[],
        kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)],
    )
