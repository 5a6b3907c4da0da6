"""The demo bundle's generator: ttbundles' torch reference Llama generator, on the host mesh.

It speaks TT-Metal's current generator contract (decode input-update contract v1, tuple
returns, on-device penalties and top log-probabilities). The methods below only forward
to the reference implementation. They are spelled out so that `ttbundle validate`, which
reads this file without importing it (and so cannot see into ttbundles), finds the whole
contract and the capabilities here.
"""

from __future__ import annotations

from typing import Any

from ttbundles.reference.generator import ReferenceLlamaGenerator


class DemoGenerator(ReferenceLlamaGenerator):
    """ReferenceLlamaGenerator under the demo bundle's name; see it for shapes."""

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": 20,
        "supports_device_grammar": True,
        "supports_spec_decode": True,
        "supports_async_spec_decode": True,
    }
    decode_input_update_contract = 1

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> DemoGenerator:
        return super().initialize_vllm_model(
            hf_config=hf_config,
            mesh_device=mesh_device,
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            n_layers=n_layers,
            tt_data_parallel=tt_data_parallel,
            optimizations=optimizations,
        )

    @classmethod
    def spec_plan(cls, vllm_config: Any, max_num_seqs: int, requested_k: int) -> Any:
        """Speculative decoding: up to 8 drafts, verified greedily or by logits."""
        return super().spec_plan(vllm_config, max_num_seqs, requested_k)

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
        empty_slots: Any = None,
        enable_trace: bool = True,
        sampling_params: Any = None,
        start_pos: Any = None,
        return_prompt_logits: bool = False,
        **kwargs: Any,
    ) -> Any:
        return super().prefill_forward(
            tokens=tokens,
            page_table=page_table,
            kv_cache=kv_cache,
            prompt_lens=prompt_lens,
            empty_slots=empty_slots,
            enable_trace=enable_trace,
            sampling_params=sampling_params,
            start_pos=start_pos,
            return_prompt_logits=return_prompt_logits,
            **kwargs,
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
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        num_valid_drafts: Any = None,
        accepted_counts: Any = None,
        spec_mode: str | None = None,
        grammar_bitmask: Any = None,
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
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            num_valid_drafts=num_valid_drafts,
            accepted_counts=accepted_counts,
            spec_mode=spec_mode,
            grammar_bitmask=grammar_bitmask,
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
