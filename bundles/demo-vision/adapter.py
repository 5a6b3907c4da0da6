"""The demo-vision bundle's generator: ttbundles' torch reference Qwen2.5-VL generator.

It speaks TT-Metal's Qwen2.5-VL vLLM contract (`models/demos/qwen25_vl/tt/
generator_vllm.py`): images arrive in `prefill_forward` as per-row lists of
`pixel_values` and `image_grid_thw`, prefill returns `(logits, rope_deltas)`, decode takes
`rope_deltas_all_users` and places each token at `pos + delta`. The methods below only
forward to the reference implementation; they are spelled out so that `ttbundle
validate`, which reads this file without importing it, finds the whole contract here.
"""

from __future__ import annotations

from typing import Any

from ttbundles.reference.vl_generator import ReferenceQwen2_5_VLGenerator


class DemoVisionGenerator(ReferenceQwen2_5_VLGenerator):
    """ReferenceQwen2_5_VLGenerator under the demo-vision bundle's name."""

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_top_k": 20,
    }
    decode_input_update_contract = 1

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> DemoVisionGenerator:
        return super().initialize_vllm_model(
            hf_config=hf_config,
            mesh_device=mesh_device,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            tt_data_parallel=tt_data_parallel,
            optimizations=optimizations,
        )

    def allocate_kv_cache(self, kv_cache_shape: Any, dtype: Any, num_layers: int) -> Any:
        return super().allocate_kv_cache(
            kv_cache_shape=kv_cache_shape, dtype=dtype, num_layers=num_layers
        )

    def prefill_forward(
        self,
        tokens: Any,
        page_table: Any,
        kv_cache: Any,
        prompt_lens: Any,
        enable_trace: bool = True,
        **kwargs: Any,
    ) -> Any:
        return super().prefill_forward(
            tokens, page_table, kv_cache, prompt_lens, enable_trace, **kwargs
        )

    def decode_forward(
        self,
        tokens: Any,
        start_pos: Any,
        page_table: Any = None,
        kv_cache: Any = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: Any = None,
        prompt_tokens: Any = None,
        output_tokens: Any = None,
        slot_remap: Any = None,
        rope_deltas_all_users: Any = None,
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        **kwargs: Any,
    ) -> Any:
        return super().decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slot_remap=slot_remap,
            rope_deltas_all_users=rope_deltas_all_users,
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            **kwargs,
        )

    def read_decode_output(self, out: Any, async_read: bool = False) -> Any:
        return super().read_decode_output(out, async_read=async_read)

    def process_decode_output_host(self, host_out: Any, is_tokens: bool = False) -> Any:
        return super().process_decode_output_host(host_out, is_tokens=is_tokens)

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up on the host."""

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to warm up on the host."""
