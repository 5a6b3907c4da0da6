"""Contract twins: one class per TT-Metal generator family, with that family's real
signatures, asserts and return forms, computing with ttbundles' reference generator.

Each is written from the TT-Metal file and commit named in its docstring (repository
tenstorrent/tt-metal). A twin records every call it gets in `RECORD`, so the tests can
check what the worker sent; the signatures are the families' own, so a keyword the worker
should not send fails the call exactly as it would on a card. This file is copied into
each twin's bundle as `adapter.py`: it imports nothing but ttbundles and torch.
"""

from __future__ import annotations

from typing import Any

import torch

from ttbundles.reference.generator import ReferenceLlamaGenerator, ReferenceLlamaGeneratorLegacy

RECORD: list[tuple[str, dict[str, Any]]] = []
FALLBACK_MAX_TOKENS_ALL_USERS = 131_072  # models/common/model_capabilities.py
DEFAULT_SEQ_LEN = 2048  # what the twins use where the family's init takes no max_seq_len


def record(method: str, **values: Any) -> None:
    RECORD.append((method, values))


def _load(legacy: bool, hf_config, mesh_device, max_batch_size, max_seq_len):
    cls = ReferenceLlamaGeneratorLegacy if legacy else ReferenceLlamaGenerator
    return cls.initialize_vllm_model(hf_config, mesh_device, max_batch_size, max_seq_len)


def _names(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the recorder keeps of a call: keyword names, and small values as they are."""
    keep = {}
    for key, value in kwargs.items():
        if isinstance(value, bool | int | str | float) or value is None:
            keep[key] = value
        elif isinstance(value, list) and len(value) <= 64:
            keep[key] = [
                v if isinstance(v, int | float | bool) or v is None else "..." for v in value
            ]
        else:
            keep[key] = "..."
    return keep


def _small(value: Any) -> Any:
    return value if isinstance(value, int | float | bool) or value is None else "..."


class _Wrapped:
    """Holds the reference generator the twin computes with."""

    def __init__(self, core: ReferenceLlamaGenerator):
        self.core = core


# --------------------------------------------------------------------------------------
# tt_transformers text generators
# --------------------------------------------------------------------------------------


class TTTransformersLlamaForCausalLM(_Wrapped):
    """`models/tt_transformers/tt/generator_vllm.py` @21a4db48 `LlamaForCausalLM` (also
    Qwen, Mistral): `prefill_forward(*args, **kwargs)` into `Generator.prefill_forward_text`,
    `decode_forward(*args, **kwargs)` into `Generator.decode_forward` (legacy form:
    `reset_batch`; the v1 commands did not exist yet: only `reload_inputs` was read from
    kwargs, the others swallowed). Decode returns `(tokens_or_logits, log_probs)`."""

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_device_grammar": True,
        "supports_chunked_prefill": True,
    }

    @classmethod
    def get_max_tokens_all_users(
        cls, model_name: str = "", num_devices: int = 1, tt_data_parallel: int = 1, **kwargs
    ) -> int:
        record(
            "get_max_tokens_all_users",
            model_name=model_name,
            num_devices=num_devices,
            tt_data_parallel=tt_data_parallel,
            **_names(kwargs),
        )
        # A model-specific budget, keyed on the checkpoint's name as TT-Metal's tables are.
        if "tiny-llama" in model_name and num_devices // tt_data_parallel == 1:
            return 4096
        return FALLBACK_MAX_TOKENS_ALL_USERS

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        n_layers=None,
        tt_data_parallel=1,
        optimizations: str = "performance",
    ):
        record(
            "initialize_vllm_model",
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            n_layers=n_layers,
            tt_data_parallel=tt_data_parallel,
            optimizations=optimizations,
        )
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))

    def allocate_kv_cache(self, *args, **kwargs):
        record("allocate_kv_cache", **_names(kwargs))
        return self.core.allocate_kv_cache(*args, **kwargs)

    def prefill_forward(self, *args, **kwargs):
        return self.prefill_forward_text(*args, **kwargs)

    def prefill_forward_text(
        self,
        tokens: torch.Tensor,
        page_table=None,
        kv_cache=None,
        prompt_lens=None,
        empty_slots=None,
        enable_trace=True,
        model_id_warmup=None,
        sampling_params=None,
        start_pos: list[int] = None,
        return_hidden_states=False,
        warmup_prefill=True,
        **kwargs,
    ):
        record(
            "prefill_forward",
            empty_slots=empty_slots,
            enable_trace=enable_trace,
            sampled=sampling_params is not None,
            **_names(kwargs),
        )
        return self.core.prefill_forward(
            tokens,
            page_table,
            kv_cache,
            prompt_lens,
            empty_slots=empty_slots,
            enable_trace=enable_trace,
            sampling_params=sampling_params,
            start_pos=start_pos,
        )

    def decode_forward(self, *args, **kwargs):
        return self._generator_decode_forward(*args, **kwargs)

    def _generator_decode_forward(
        self,
        tokens,
        start_pos,
        page_table=None,
        kv_cache=None,
        enable_trace=True,
        read_from_device=True,
        sampling_params=None,
        reset_batch=False,
        prompt_tokens=None,
        output_tokens=None,
        slot_remap=None,
        defer_device_sampling: bool = False,
        grammar_bitmask=None,
        skip_trace_precompile: bool = False,
        **kwargs,
    ):
        record(
            "decode_forward",
            reset_batch=reset_batch,
            sampled=sampling_params is not None,
            read_from_device=read_from_device,
            slot_remap=slot_remap,
            **_names(kwargs),
        )
        return self.core.decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            reset_batch=reset_batch or bool(kwargs.get("reload_inputs")),
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slot_remap=slot_remap,
        )

    def read_decode_output(self, tt_out, async_read=False):
        return self.core.read_decode_output(tt_out, async_read=async_read)

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return self.core.process_decode_output_host(tt_out, is_tokens=is_tokens)

    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device, greedy_only=False):
        record("warmup_model_prefill", enable_trace=enable_trace)


class TTTransformersLlamaV1(TTTransformersLlamaForCausalLM):
    """The same class in the decode-contract era (`models/common/decode_contract.py`
    @40f4746e and the contract test that pins `Generator.decode_forward`): the four
    commands keyword-only with the host-authoritative defaults, `reset_batch` rejected
    by name."""

    decode_input_update_contract = 1

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        n_layers=None,
        tt_data_parallel=1,
        optimizations: str = "performance",
    ):
        record(
            "initialize_vllm_model",
            max_batch_size=max_batch_size,
            max_seq_len=max_seq_len,
            tt_data_parallel=tt_data_parallel,
            optimizations=optimizations,
        )
        return cls(_load(False, hf_config, mesh_device, max_batch_size, max_seq_len))

    def _generator_decode_forward(
        self,
        tokens,
        start_pos,
        page_table=None,
        kv_cache=None,
        enable_trace=True,
        read_from_device=True,
        sampling_params=None,
        prompt_tokens=None,
        output_tokens=None,
        slot_remap=None,
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        **kwargs,
    ):
        if "reset_batch" in kwargs:
            raise ValueError(
                "reset_batch is not part of the decode input-update contract; "
                "the vLLM build driving it predates it"
            )
        record(
            "decode_forward",
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            sampled=sampling_params is not None,
            read_from_device=read_from_device,
            slot_remap=slot_remap,
            **_names(kwargs),
        )
        return self.core.decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace,
            read_from_device,
            sampling_params,
            prompt_tokens,
            output_tokens,
            slot_remap,
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            **kwargs,
        )


# --------------------------------------------------------------------------------------
# Hybrid attention (Gemma3, GPT-OSS)
# --------------------------------------------------------------------------------------


class HybridGptOssForCausalLM(TTTransformersLlamaForCausalLM):
    """`models/tt_transformers/tt/generator_vllm.py` @21a4db48 `GptOssForCausalLM`
    (`HybridAttentionForCausalLM`): the KV cache through `allocate_kv_cache_per_layer`,
    prefill/decode take `page_tables_per_layer` (ignored while hybrid groups are off),
    `optimizations` must not be passed."""

    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
    }

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        n_layers=None,
        tt_data_parallel=1,
        optimizations: str = None,
    ):
        assert optimizations is None, "Custom optimizations are not supported for this model"
        record("initialize_vllm_model", max_seq_len=max_seq_len, tt_data_parallel=tt_data_parallel)
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))

    def allocate_kv_cache_per_layer(self, per_layer_specs):
        record("allocate_kv_cache_per_layer", layers=len(per_layer_specs))
        shape, dtype, _ = per_layer_specs[0]
        return self.core.allocate_kv_cache(shape, dtype, len(per_layer_specs))

    def prefill_forward(self, *args, page_tables_per_layer=None, **kwargs):
        _record_per_layer("prefill", page_tables_per_layer, kwargs)
        return self.prefill_forward_text(*args, **kwargs)

    def decode_forward(self, *args, page_tables_per_layer=None, **kwargs):
        _record_per_layer("decode", page_tables_per_layer, kwargs)
        return self._generator_decode_forward(*args, **kwargs)


def _record_per_layer(step: str, tables, kwargs: dict[str, Any]) -> None:
    """What the Gemma-4 26B-A4B autoport checks (it raises without the per-layer tables):
    one table per layer, each the step's page table while there is one KV group."""
    same = tables is not None and all(torch.equal(t, kwargs["page_table"]) for t in tables)
    record(
        "page_tables_per_layer",
        step=step,
        layers=None if tables is None else len(tables),
        same=same,
    )


# --------------------------------------------------------------------------------------
# Mllama (cross-attention: not served yet)
# --------------------------------------------------------------------------------------


class MllamaForConditionalGeneration(TTTransformersLlamaForCausalLM):
    """`models/tt_transformers/tt/generator_vllm.py` @21a4db48: prefill requires `images`
    and `cross_page_table` and takes no `**kwargs`; the worker refuses it at load."""

    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_sample_on_device": False,
    }

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        tt_data_parallel=1,
        optimizations: str = None,
    ):
        assert optimizations is None, "Custom optimizations are not supported for this model"
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))

    def prefill_forward(self, tokens, images, page_table, kv_cache, prompt_lens, cross_page_table):
        raise AssertionError("never called: the worker refuses this class at load")


# --------------------------------------------------------------------------------------
# Qwen2.5-VL / Qwen3-VL (text prompts; mRoPE deltas)
# --------------------------------------------------------------------------------------


class Qwen2_5_VLForConditionalGeneration(_Wrapped):
    """`models/demos/qwen25_vl/tt/generator_vllm.py` @00493af6: decode contract v1;
    `optimizations` asserted None; prefill requires `enable_trace`, pops `empty_slots`,
    refuses a cached prefix, ignores sampling and returns `(logits, rope_deltas)`; decode
    pops `rope_deltas_all_users`. The twin hands out a distinct delta per request and
    checks that each decode brings every slot's back."""

    decode_input_update_contract = 1
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "max_device_top_k": 32,
    }

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        tt_data_parallel=1,
        optimizations=None,
    ):
        assert optimizations is None, "Custom optimizations are not supported for this model"
        twin = cls(_load(False, hf_config, mesh_device, max_batch_size, max_seq_len))
        twin.deltas = {}  # slot -> the rope delta handed out for its request
        return twin

    def allocate_kv_cache(self, *args, **kwargs):
        return self.core.allocate_kv_cache(*args, **kwargs)

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, enable_trace, **kwargs):
        empty_slots = kwargs.pop("empty_slots", None)
        start_pos = kwargs.pop("start_pos", None)
        assert start_pos is None or all(int(s) == 0 for s in start_pos), (
            "Prefix caching is not supported for Qwen2_5_VL"
        )
        kwargs.pop("sampling_params", None)  # the adapter calls prefill_forward_text without it
        logits = self.core.prefill_forward(
            tokens, page_table, kv_cache, prompt_lens, empty_slots=empty_slots
        )
        slots = list(empty_slots) if empty_slots is not None else list(range(len(prompt_lens)))
        deltas = torch.tensor([-(100 + int(s)) for s in slots], dtype=torch.int64)
        for slot, delta in zip(slots, deltas.tolist()):
            self.deltas[int(slot)] = delta
        record("prefill_forward", empty_slots=slots)
        return logits, deltas

    def decode_forward(self, *args, **kwargs):
        given = kwargs.pop("rope_deltas_all_users", None)
        positions = kwargs.get("start_pos")
        live = [i for i, p in enumerate(positions.tolist()) if p >= 0]
        mismatched = [i for i in live if given is None or given[i] != self.deltas.get(i)]
        record(
            "decode_forward",
            rope_deltas_ok=not mismatched,
            **_names({k: v for k, v in kwargs.items() if k.startswith("re")}),
        )
        return self.core.decode_forward(*args, **kwargs)

    def read_decode_output(self, tt_out, async_read=False):
        return self.core.read_decode_output(tt_out, async_read=async_read)

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return self.core.process_decode_output_host(tt_out, is_tokens=is_tokens)


# --------------------------------------------------------------------------------------
# Galaxy (single-execute) and DeepSeek-V3
# --------------------------------------------------------------------------------------


class GalaxyLlamaForCausalLM(TTTransformersLlamaForCausalLM):
    """`models/demos/llama3_70b_galaxy/tt/generator_vllm.py` @0be6ffc8: legacy decode;
    `optimizations` asserted None; `tt_data_parallel` must be a multiple of the mesh's
    columns (`dp_attention_factor = mesh_device.shape[1]`)."""

    model_capabilities = {"supports_prefix_caching": False}

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len=131072,
        n_layers=None,
        tt_data_parallel=1,
        optimizations=None,
    ):
        assert optimizations is None, "Custom optimizations are not supported for this model"
        factor = mesh_device.shape[1]
        assert tt_data_parallel % factor == 0, (
            f"Total DP ({tt_data_parallel}) must be divisible by dp_attention_factor ({factor})"
        )
        record("initialize_vllm_model", max_seq_len=max_seq_len, tt_data_parallel=tt_data_parallel)
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))


class DeepseekV3ForCausalLM(_Wrapped):
    """`models/demos/deepseek_v3/tt/generator_vllm.py` @01656bf7: keyword-only inputs
    (`kwargs["tokens"]`), `tt_data_parallel` must equal the chip count, the KV budget needs
    max_model_len and max_num_seqs, prefill returns tokens `[B]` or logits `[B, S, V]`,
    decode bare tensors (tokens `[B]` or logits `[B, 1, V]`), legacy `reset_batch`."""

    model_capabilities = {"supports_prefix_caching": False, "supports_sample_on_device": True}

    @classmethod
    def get_max_tokens_all_users(
        cls,
        model_name: str = "",
        num_devices: int = 1,
        tt_data_parallel: int = 1,
        max_model_len: int | None = None,
        max_num_seqs: int | None = None,
        **kwargs,
    ) -> int:
        if max_model_len is None or max_num_seqs is None:
            raise ValueError("max_model_len and max_num_seqs are required")
        record("get_max_tokens_all_users", max_model_len=max_model_len, max_num_seqs=max_num_seqs)
        return int(max_model_len) * int(max_num_seqs)

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        tt_data_parallel=1,
        optimizations: str = None,
    ):
        chips = mesh_device.shape[0] * mesh_device.shape[1]
        if tt_data_parallel != chips:
            raise ValueError(f"Expected tt_data_parallel to equal mesh world size {chips}")
        record("initialize_vllm_model", tt_data_parallel=tt_data_parallel)
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return self.core.allocate_kv_cache(kv_cache_shape, dtype, num_layers)

    def prefill_forward(self, *args, **kwargs):
        start_pos = kwargs.get("start_pos")
        assert start_pos is None or all(int(s) == 0 for s in start_pos), (
            "Prefix caching is not supported for DeepseekV3ForCausalLM"
        )
        kwargs.pop("enable_trace", None)
        tokens, prompt_lens = kwargs["tokens"], kwargs["prompt_lens"]
        out = self.core.prefill_forward(
            tokens,
            kwargs.get("page_table"),
            kwargs.get("kv_cache"),
            prompt_lens,
            empty_slots=kwargs.get("empty_slots"),
            sampling_params=kwargs.get("sampling_params"),
        )
        if isinstance(out, tuple):
            return out[0].reshape(-1)  # tokens [B]
        return out.expand(-1, tokens.shape[1], -1).contiguous()  # logits [B, S, V]

    def decode_forward(self, *args, **kwargs):
        record(
            "decode_forward",
            reset_batch=kwargs.get("reset_batch", False),
            sampled=kwargs.get("sampling_params") is not None,
        )
        primary, _ = self.core.decode_forward(
            kwargs["tokens"],
            kwargs["start_pos"],
            kwargs.get("page_table"),
            kwargs.get("kv_cache"),
            enable_trace=kwargs.get("enable_trace", False),
            sampling_params=kwargs.get("sampling_params"),
            reset_batch=kwargs.get("reset_batch", False),
        )
        return primary

    def read_decode_output(self, tt_out, async_read=False):
        return (tt_out, []) if async_read else tt_out


# --------------------------------------------------------------------------------------
# Llama-2-70B on T3000 (the oldest form)
# --------------------------------------------------------------------------------------


class T3000GenerationBase(_Wrapped):
    """`models/demos/t3000/llama2_70b/tt/llama_generation.py` (stored @01143c81)
    `TtLlamaModelForGeneration`, the base both adapter versions derive from:
    `decode_forward(tokens, start_pos, page_table=None, kv_cache=None)` returning logits
    `[B, 1, V]`, and `prefill_forward(tokens, start_pos, page_table=None, kv_cache=None,
    prompt_lens=None)`. No `enable_trace`, no `read_from_device`: a keyword the worker
    forwards through the adapter's `**kwargs` raises TypeError here, as on a card."""

    def decode_forward(self, tokens, start_pos, page_table=None, kv_cache=None):
        record("decode_forward")
        return self.core.decode_forward(tokens, start_pos, page_table, kv_cache, reset_batch=True)[
            0
        ]

    def prefill_forward(self, tokens, start_pos, page_table=None, kv_cache=None, prompt_lens=None):
        assert start_pos == 0
        record("prefill_forward")
        return self.core.prefill_forward(tokens, page_table, kv_cache, prompt_lens)


class T3000LlamaLegacy(T3000GenerationBase):
    """`models/demos/t3000/llama2_70b/tt/generator_vllm.py` @6f2ab0bf `TtLlamaForCausalLM`:
    `initialize_vllm_model(hf_config, t3k_mesh_device, max_batch_size)` and nothing else;
    prefill of four arguments into the base's with `start_pos=0`; the base's decode."""

    @classmethod
    def initialize_vllm_model(cls, hf_config, t3k_mesh_device, max_batch_size):
        record("initialize_vllm_model", mesh=type(t3k_mesh_device).__name__)
        return cls(_load(True, hf_config, t3k_mesh_device, max_batch_size, DEFAULT_SEQ_LEN))

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return self.core.allocate_kv_cache(kv_cache_shape, dtype, num_layers)

    def prefill_forward(self, tokens: torch.Tensor, page_table, kv_cache, prompt_lens):
        return super().prefill_forward(tokens, 0, page_table, kv_cache, prompt_lens)


class T3000LlamaV1(T3000LlamaLegacy):
    """The same file @0b1e81be: decode contract v1 with the four commands keyword-only
    and required, anything but a full host reload refused (`require_full_input_reload`),
    `slot_remap` accepted and ignored, and the rest forwarded whole to the base's
    `decode_forward(*args, **kwargs)`; the mesh parameter renamed `mesh_device`."""

    decode_input_update_contract = 1

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size):
        record("initialize_vllm_model", mesh=type(mesh_device).__name__)
        return cls(_load(True, hf_config, mesh_device, max_batch_size, DEFAULT_SEQ_LEN))

    def decode_forward(
        self,
        *args,
        reload_inputs: bool,
        reload_page_table: bool,
        reload_sampling_params: bool,
        reset_sampling_state: bool,
        slot_remap=None,
        **kwargs,
    ):
        rejected = [
            name
            for name, bad in (
                ("reload_inputs=False", not reload_inputs),
                ("reload_page_table=True", reload_page_table),
                ("reload_sampling_params=True", reload_sampling_params),
                ("reset_sampling_state=True", reset_sampling_state),
            )
            if bad
        ]
        if rejected:
            raise ValueError(
                f"T3000 Llama decode accepts only a full host-input reload, but got "
                f"{', '.join(rejected)}"
            )
        return super().decode_forward(*args, **kwargs)


# --------------------------------------------------------------------------------------
# Executor-based generators (models/common/models)
# --------------------------------------------------------------------------------------


class ExecutorLlama3Generator:
    """`models/common/models/generator.py` @02a70f75 `Llama3Generator`: a thin adapter over
    an executor; legacy decode form; `initialize_vllm_model(hf_config, mesh_device,
    max_batch_size, max_seq_len, n_layers=None, optimizations="performance")` (no
    `tt_data_parallel`); prefill, decode and the KV cache forwarded whole to the executor
    (`self.executor.<method>(*args, **kwargs)`); only prefix caching declared. The executor
    here is the reference generator in its legacy form."""

    model_capabilities = {"supports_prefix_caching": True}

    def __init__(self, executor, model_args=None):
        self.executor = executor
        self.model_args = model_args

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        n_layers=None,
        optimizations="performance",
    ):
        record("initialize_vllm_model", max_seq_len=max_seq_len, optimizations=optimizations)
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))

    def prefill_forward(self, *args, **kwargs):
        record("prefill_forward", **_names(kwargs))
        return self.executor.prefill_forward(*args, **kwargs)

    def decode_forward(self, *args, **kwargs):
        record("decode_forward", **_names(kwargs))
        return self.executor.decode_forward(*args, **kwargs)

    def allocate_kv_cache(self, *args, **kwargs):
        return self.executor.allocate_kv_cache(*args, **kwargs)


# --------------------------------------------------------------------------------------
# Qwen2.5-VL with images (the same TT class, served on a Qwen2.5-VL checkpoint)
# --------------------------------------------------------------------------------------


class Qwen2_5_VLWithImages(_Wrapped):
    """`models/demos/qwen25_vl/tt/generator_vllm.py` @00493af6 on its own checkpoint, with
    images: the class's signatures and checks, computing with the reference Qwen2.5-VL
    generator. Prefill requires `enable_trace`, refuses a cached prefix, and gathers every
    row's images as TT-Metal's does (`torch.concat` of each row's pixel tensors, each grid
    a `[3]` tensor stacked to `[n, 3]`), one vision pass for the batch; it returns
    `(logits, rope_deltas)`. Decode pops `rope_deltas_all_users` (the deltas of every
    slot), as TT-Metal's `update_rope_deltas` does, before the base decode."""

    decode_input_update_contract = 1
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "max_device_top_k": 32,
    }

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        tt_data_parallel=1,
        optimizations=None,
    ):
        from ttbundles.reference.vl_generator import ReferenceQwen2_5_VLGenerator

        assert optimizations is None, "Custom optimizations are not supported for this model"
        core = ReferenceQwen2_5_VLGenerator.initialize_vllm_model(
            hf_config, mesh_device, max_batch_size, max_seq_len
        )
        return cls(core)

    def allocate_kv_cache(self, *args, **kwargs):
        return self.core.allocate_kv_cache(*args, **kwargs)

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, enable_trace, **kwargs):
        empty_slots = kwargs.pop("empty_slots", None)
        start_pos = kwargs.pop("start_pos", None)
        assert start_pos is None or all(int(s) == 0 for s in start_pos), (
            "Prefix caching is not supported for Qwen2_5_VL"
        )
        kwargs.pop("sampling_params", None)
        pixel_rows = kwargs.pop("pixel_values", None) or [None] * len(prompt_lens)
        grid_rows = kwargs.pop("image_grid_thw", None) or [None] * len(prompt_lens)
        # TT-Metal's gathering: one batch of images for the vision tower.
        images = [im for pv in pixel_rows if pv is not None for im in pv]
        grids = [g for row in grid_rows if row is not None for g in row]
        for g in grids:
            assert torch.is_tensor(g) and g.ndim == 1 and g.numel() == 3
        patches = torch.concat(images, dim=0).shape[0] if images else 0
        stacked = torch.stack([g.to(torch.int64) for g in grids], dim=0) if grids else None
        assert stacked is None or int(stacked.prod(-1).sum()) == patches
        record(
            "prefill_forward",
            images=len(images),
            rows_with_images=sum(pv is not None for pv in pixel_rows),
            rows=len(prompt_lens),
        )
        return self.core.prefill_forward(
            tokens,
            page_table,
            kv_cache,
            prompt_lens,
            enable_trace,
            empty_slots=empty_slots,
            pixel_values=pixel_rows,
            image_grid_thw=grid_rows,
        )

    def decode_forward(self, *args, **kwargs):
        deltas = kwargs.pop("rope_deltas_all_users", None)
        record("decode_forward", deltas=None if deltas is None else len(deltas))
        return self.core.decode_forward(*args, rope_deltas_all_users=deltas, **kwargs)

    def read_decode_output(self, tt_out, async_read=False):
        return self.core.read_decode_output(tt_out, async_read=async_read)

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return self.core.process_decode_output_host(tt_out, is_tokens=is_tokens)


# --------------------------------------------------------------------------------------
# Block-output generators (several tokens per row per decode)
# --------------------------------------------------------------------------------------


class BlockOutputForCausalLM(_Wrapped):
    """A block-output class in the form the reference plugin (tenstorrent/vllm-tt-plugin)
    drives its block models (DiffusionGemma, Kolibri 1, Muse-Glimmer):
    `model_capabilities["output_tokens_per_step"]` = k, and a device-sampling
    `decode_forward` that answers `(tokens [B, k], log_probs)`; synchronous (no async
    decode). Computes with the reference generator's block mode (`reference.block`,
    k = 4). Decode contract v1."""

    decode_input_update_contract = 1
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": False,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": 32,
        "output_tokens_per_step": 4,
    }

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        tt_data_parallel=1,
        optimizations=None,
    ):
        from ttbundles.reference.block import ReferenceBlockGenerator

        record("initialize_vllm_model", max_seq_len=max_seq_len)
        core = ReferenceBlockGenerator.initialize_vllm_model(
            hf_config, mesh_device, max_batch_size, max_seq_len
        )
        return cls(core)

    def allocate_kv_cache(self, *args, **kwargs):
        return self.core.allocate_kv_cache(*args, **kwargs)

    def prefill_forward(self, *args, **kwargs):
        record("prefill_forward", rows=len(kwargs["prompt_lens"]))
        return self.core.prefill_forward(*args, **kwargs)

    def decode_forward(self, *args, **kwargs):
        out = self.core.decode_forward(*args, **kwargs)
        tokens = out[0]
        record(
            "decode_forward",
            device=kwargs.get("sampling_params") is not None,
            width=int(tokens.shape[1]) if tokens.dim() == 2 else 1,
        )
        return out
