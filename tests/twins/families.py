"""Contract twins: one class per TT-Metal generator family, with that family's real
signatures, asserts and return forms, computing with ttbundles' reference generator.

Each is written from the TT-Metal file and commit named in its docstring (repository
tenstorrent/tt-metal). A twin records every call it gets in `RECORD`, so the tests can
check what the worker sent; the signatures are the families' own, so a keyword the worker
should not send fails the call exactly as it would on a card. This file is copied into
each twin's bundle as `adapter.py`: it imports nothing but ttbundles and torch.
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from ttbundles.reference.generator import ReferenceLlamaGenerator, ReferenceLlamaGeneratorLegacy

RECORD: list[tuple[str, dict[str, Any]]] = []
FALLBACK_MAX_TOKENS_ALL_USERS = 131_072  # models/common/model_capabilities.py
DEFAULT_SEQ_LEN = 2048  # what the twins use where the family's init takes no max_seq_len


def record(method: str, **values: Any) -> None:
    RECORD.append((method, values))
    # Served by `vllm serve` (tests/twins/http_twin.py), the calls happen in the engine
    # core's process: each is appended to the file the test reads once the server stops.
    sink = os.environ.get("TWIN_RECORD_FILE")
    if sink:
        with open(sink, "a", encoding="utf-8") as out:
            out.write(json.dumps([method, values], default=str) + "\n")


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
# Qwen3.6 27B autoport (gated delta net hybrid: the GDN state is the generator's)
# --------------------------------------------------------------------------------------


class Qwen36AutoportForCausalLM(_Wrapped):
    """`models/autoports/qwen_qwen3_6_27b/tt/generator_vllm.py` @16cfafb7
    `Qwen36ForCausalLM`: decode contract v1 (but it reads no command: `**_` swallows
    them, `reset_batch` defaults False), async decode declared, no prefix caching;
    `allocate_kv_cache` takes the attention layers' count and returns every layer (the
    GDN ones their `[conv, recurrent]` state), its page a multiple of 32; prefill
    clears the slots it fills (`reset_slots(empty_slots)`) and returns `(output,
    rope_deltas)` (zeros: text only), decode applies `slot_remap` before its step; one
    replica (`tt_data_parallel` 1), 1..32 users. The state lives in the reference's slots
    (`ReferenceQwen3_5Generator`), the commands reach it so it computes right."""

    decode_input_update_contract = 1
    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_async_decode_overlap": True,
        "supports_sample_on_device": True,
        "max_device_top_k": 32,
    }

    @classmethod
    def get_max_tokens_all_users(cls, *, max_model_len=None, max_num_seqs=None, **_):
        record("get_max_tokens_all_users", max_model_len=max_model_len, max_num_seqs=max_num_seqs)
        return 1_726_400

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size: int,
        max_seq_len: int,
        n_layers=None,
        tt_data_parallel: int = 1,
        optimizations=None,
        **_,
    ):
        from ttbundles.reference.qwen3_5 import ReferenceQwen3_5Generator

        if tt_data_parallel != 1:
            raise NotImplementedError("Qwen3.6 autoport supports one TP4 model replica")
        if not 1 <= int(max_batch_size) <= 32:
            raise ValueError("Qwen3.6 serving max_num_seqs must be in [1, 32]")
        record("initialize_vllm_model", max_batch_size=max_batch_size, max_seq_len=max_seq_len)
        core = ReferenceQwen3_5Generator.initialize_vllm_model(
            hf_config, mesh_device, max_batch_size, max_seq_len
        )
        return cls(core)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        page = int(kv_cache_shape[2])
        if page < 32 or page % 32:
            raise ValueError(f"Qwen3.6 serving page size must be a tile multiple, got {page}")
        kinds = self.core.layer_kinds
        attention = kinds.count("full_attention")
        if int(num_layers) != attention:
            raise ValueError(f"vLLM requested {num_layers} attention layers; TT built {attention}")
        record("allocate_kv_cache", num_layers=num_layers, page=page)
        caches = iter(self.core.allocate_kv_cache(kv_cache_shape, dtype, num_layers))
        state = self.core.state
        result = []
        for kind, index in zip(kinds, self.core._kind_index):
            if kind == "linear_attention":
                result.append([state.conv[index], state.recurrent[index]])
            else:
                result.append(next(caches))
        self._attention = [i for i, kind in enumerate(kinds) if kind == "full_attention"]
        return result

    def _attention_cache(self, kv_cache):
        return [kv_cache[i] for i in self._attention]

    def prefill_forward(
        self,
        tokens,
        page_table,
        kv_cache,
        prompt_lens,
        sampling_params=None,
        empty_slots=None,
        start_pos=None,
        **_,
    ):
        slots = (
            list(range(len(prompt_lens))) if empty_slots is None else [int(v) for v in empty_slots]
        )
        starts = [0] * len(slots) if start_pos is None else [int(v) for v in start_pos]
        record("prefill_forward", empty_slots=slots, start_pos=starts, **_names(_))
        # reset_slots: every slot a prefill fills is cleared first (the class serves no
        # chunked prefill: a continued chunk would lose its state here).
        for slot in slots:
            self.core.release_request(slot)
        output = self.core.prefill_forward(
            tokens,
            page_table,
            self._attention_cache(kv_cache),
            prompt_lens,
            empty_slots=slots,
            sampling_params=sampling_params,
            start_pos=start_pos,
        )
        return output, torch.zeros(len(prompt_lens), dtype=torch.int64)

    def decode_forward(
        self,
        tokens,
        start_pos,
        page_table,
        kv_cache,
        enable_trace=True,
        read_from_device=True,
        sampling_params=None,
        reset_batch=False,
        rope_deltas_all_users=None,
        prompt_tokens=None,
        output_tokens=None,
        slot_remap=None,
        **_,
    ):
        if not enable_trace:
            raise ValueError("Qwen3.6 vLLM decode requires tracing")
        if rope_deltas_all_users is not None and torch.as_tensor(rope_deltas_all_users).ne(0).any():
            raise NotImplementedError("Qwen3.6 text serving does not accept nonzero RoPE deltas")
        record(
            "decode_forward",
            read_from_device=read_from_device,
            slot_remap=None if slot_remap is None else [int(v) for v in slot_remap],
            sampled=sampling_params is not None,
            **_names(_),
        )
        commands = {k: v for k, v in _.items() if k.startswith(("reload_", "reset_"))}
        return self.core.decode_forward(
            tokens,
            start_pos,
            page_table,
            self._attention_cache(kv_cache),
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            prompt_tokens=prompt_tokens,
            output_tokens=output_tokens,
            slot_remap=slot_remap,
            **commands,
        )

    def read_decode_output(self, tt_out, async_read=False):
        return self.core.read_decode_output(tt_out, async_read=async_read)

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return self.core.process_decode_output_host(tt_out, is_tokens=is_tokens)

    def warmup_model_prefill(self, *args, **kwargs):
        del args, kwargs

    def warmup_model_decode(self, *args, **kwargs):
        del args, kwargs


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


_IGNORED_VLLM_KWARGS = {  # the module-level set of TT-Metal's file
    "page_tables_per_layer",
    "prompt_tokens",
    "output_tokens",
    "slot_remap",
    "rope_deltas_all_users",
}


class ExecutorLlama3Generator:
    """`models/common/models/llama3_8b/generator.py` `Llama3Generator` (the 2026 version
    with `_DPLlama3Generator`; before it, `models/common/models/generator.py` @02a70f75):
    a thin adapter over an executor; legacy decode form; `requires_prefill_trace_warmup`
    with `warmup_model_prefill` (once per `already_warmed_up_prefill`, which the reference
    plugin resets between its compile and capture passes); `required_block_size` 32;
    prefill and decode drop the keywords it ignores (`page_tables_per_layer`,
    `prompt_tokens`, `output_tokens`, `slot_remap`, `rope_deltas_all_users`) and forward
    the rest to the executor; decode flattens `[B, 1]` tokens. The executor here is the
    reference generator in its legacy form; the warm-up records instead of compiling."""

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "required_block_size": 32,
    }
    requires_prefill_trace_warmup = True

    def __init__(self, executor, model_args=None):
        self.executor = executor
        self.model_args = model_args
        self.already_warmed_up_prefill = False

    @classmethod
    def get_max_tokens_all_users(
        cls,
        model_name: str = "",
        num_devices: int = 1,
        tt_data_parallel: int = 1,
        max_model_len: int = 0,
        max_num_seqs: int = 1,
        **kwargs,
    ) -> int:
        return int(max_model_len)

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len,
        n_layers=None,
        tt_data_parallel=1,
        optimizations="performance",
    ):
        record("initialize_vllm_model", max_seq_len=max_seq_len, optimizations=optimizations)
        if tt_data_parallel != 1:
            raise ValueError("the twin serves one lane (TT-Metal's _DPLlama3Generator: more)")
        return cls(_load(True, hf_config, mesh_device, max_batch_size, max_seq_len))

    def prefill_forward(self, *args, **kwargs):
        self._drop_unsupported_vllm_kwargs(kwargs)
        record("prefill_forward", **_names(kwargs))
        return self.executor.prefill_forward(*args, **kwargs)

    def decode_forward(self, *args, **kwargs):
        self._drop_unsupported_vllm_kwargs(kwargs)
        tokens = kwargs.get("tokens")
        if isinstance(tokens, torch.Tensor) and tokens.dim() == 2 and tokens.shape[-1] == 1:
            kwargs["tokens"] = tokens.view(-1)
        record("decode_forward", **_names(kwargs))
        return self.executor.decode_forward(*args, **kwargs)

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return self.executor.process_decode_output_host(tt_out, is_tokens=is_tokens)

    def read_decode_output(self, tt_out, async_read=False):
        return self.executor.read_decode_output(tt_out, async_read=async_read)

    def allocate_kv_cache(self, *args, **kwargs):
        return self.executor.allocate_kv_cache(*args, **kwargs)

    @staticmethod
    def _drop_unsupported_vllm_kwargs(kwargs):
        for key in _IGNORED_VLLM_KWARGS:
            kwargs.pop(key, None)

    def warmup_model_prefill(self, *args, **kwargs):
        enable_trace = kwargs.get("enable_trace", True)
        can_sample_on_device = kwargs.get("can_sample_on_device", False)
        if self.already_warmed_up_prefill:
            return
        self.already_warmed_up_prefill = True
        record(
            "warmup_model_prefill",
            enable_trace=enable_trace,
            can_sample_on_device=can_sample_on_device,
            kv_cache=kwargs.get("kv_cache") is not None,
        )

    def warmup_model_decode(
        self, kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device, **kwargs
    ):
        record("warmup_model_decode", enable_trace=enable_trace)


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
# Autoports (models/autoports/*/tt/generator_vllm.py)
# --------------------------------------------------------------------------------------


KOLIBRI_POISON = -7  # the twin's token for a row the class computes no output for


class KolibriForCausalLM(_Wrapped):
    """`models/autoports/aleph_alpha_kolibri_1_bf16/tt/generator_vllm.py` @defe0da2
    `KolibriForCausalLM`: its declarations (decode contract v1, the capabilities with
    prefill output masks and sampling origins, no device penalties, a top-32 device
    sampler), its signatures (prefill and decode raise `TypeError` on any keyword they do
    not name), its checks (decode refuses untraced calls; host sampling, a call without
    `sampling_params` that must output, raises unless `KOLIBRI_VLLM_HOST_COMPAT=1`; a
    slot remap must be a permutation; an active slot must have a sampling origin) and its
    sampling-origin bookkeeping, computing with the reference generator (which draws by
    absolute position, so the origin changes no token here; the twin records it). Not
    kept: the TP4 mesh check and the block size 32 of its device cache (the host mesh is
    one chip; the reference pages any block size), the event log and the benchmark hook.
    A row whose chunk ends no prompt gets a poisoned token (-7): the class computes no
    output for it, and a worker reading it would serve -7."""

    def embed_input_ids(self, input_ids):
        raise NotImplementedError("Use the TT prefill/decode interface")

    def forward(self, input_ids, positions, **kwargs):
        raise NotImplementedError("Use the TT prefill/decode interface")

    def compute_logits(self, hidden_states, **kwargs):
        raise NotImplementedError("Use the TT prefill/decode interface")

    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_intermediate_prefill_output_mask": True,
        "supports_prefill_sampling_origins": True,
        "supports_device_penalties": False,
        "max_device_top_k": 32,
    }
    decode_input_update_contract = 1
    _HYBRID_KV_CACHE_GROUPS_ENABLED = True

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size,
        max_seq_len=DEFAULT_SEQ_LEN,
        tt_data_parallel=1,
        optimizations=None,
    ):
        import os

        if tt_data_parallel != 1:
            raise ValueError("Kolibri requires the authorized TP4 mesh")
        record("initialize_vllm_model", max_seq_len=max_seq_len, max_batch_size=max_batch_size)
        obj = cls(_load(False, hf_config, mesh_device, max_batch_size, max_seq_len))
        obj.batch_size = max_batch_size
        obj.host_compat = os.environ.get("KOLIBRI_VLLM_HOST_COMPAT", "0") == "1"
        obj.closed = False
        return obj

    @classmethod
    def get_max_tokens_all_users(cls, **kwargs):
        return kwargs["max_model_len"]

    def allocate_kv_cache_per_layer(self, per_layer_specs):
        record("allocate_kv_cache_per_layer", layers=len(per_layer_specs))
        return self.core.allocate_kv_cache_per_layer(per_layer_specs)

    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device, **kwargs):
        record("warmup_model_prefill", enable_trace=enable_trace)

    def warmup_model_decode(
        self, kv_cache, enable_trace, max_batch_size, num_blocks, can_sample_on_device, **kwargs
    ):
        record("warmup_model_decode", enable_trace=enable_trace)

    def _ensure_sampling_state(self):
        if not hasattr(self, "_sampling_origins"):
            self._sampling_origins = [None] * self.batch_size

    def _sampling(self, params, slots=None, positions=None):
        if params is None:
            if not self.host_compat:
                raise RuntimeError("Host sampling requires explicit KOLIBRI_VLLM_HOST_COMPAT=1")
            return False
        self._ensure_sampling_state()
        slots = list(range(self.batch_size)) if slots is None else slots
        positions = (
            [None] * len(slots)
            if positions is None
            else torch.as_tensor(positions).flatten().tolist()
        )
        for slot, position in zip(slots, positions):
            origin = self._sampling_origins[slot]
            if position is not None and position >= 0 and origin is None:
                raise ValueError(
                    f"Active sampling slot {slot} has no prefill origin at position {position}"
                )
        return True

    def prefill_forward(
        self,
        tokens,
        page_table=None,
        kv_cache=None,
        prompt_lens=None,
        empty_slots=None,
        enable_trace=True,
        sampling_params=None,
        start_pos=None,
        page_tables_per_layer=None,
        prefill_output_mask=None,
        original_prompt_lens=None,
        **kwargs,
    ):
        if kwargs:
            raise TypeError(f"Unsupported prefill options: {kwargs.keys()}")
        slots = list(range(len(prompt_lens))) if empty_slots is None else empty_slots
        self._ensure_sampling_state()
        output_mask = [True] * len(slots) if prefill_output_mask is None else prefill_output_mask
        origins = prompt_lens if original_prompt_lens is None else original_prompt_lens
        for row, slot in enumerate(slots):
            if output_mask[row]:
                self._sampling_origins[slot] = int(origins[row]) - 1
        sampled = sampling_params is not None
        if prefill_output_mask is None or any(prefill_output_mask):
            positions = [
                int(prompt_lens[row]) - 1 if output_mask[row] else -1 for row in range(len(slots))
            ]
            sampled = self._sampling(sampling_params, slots, positions=positions)
        record(
            "prefill_forward",
            ends=[int(n) for n in prompt_lens],
            starts=[int(n) for n in start_pos],
            prefill_output_mask=prefill_output_mask,
            original_prompt_lens=original_prompt_lens,
            sampled=sampled,
        )
        out = self.core.prefill_forward(
            tokens,
            page_table,
            kv_cache,
            prompt_lens,
            empty_slots=slots,
            enable_trace=enable_trace,
            sampling_params=sampling_params if sampled else None,
            start_pos=start_pos,
            page_tables_per_layer=page_tables_per_layer,
        )
        if not sampled:
            return out
        result = (out[0] if isinstance(out, tuple) else out).reshape(-1, 1).clone()
        for row, keep in enumerate(output_mask):
            if not keep:
                result[row] = KOLIBRI_POISON  # no output for a chunk that ends no prompt
        return result

    def decode_forward(
        self,
        tokens,
        start_pos,
        page_table,
        kv_cache,
        enable_trace=True,
        read_from_device=True,
        sampling_params=None,
        reload_inputs=True,
        reload_page_table=False,
        reload_sampling_params=True,
        reset_sampling_state=True,
        page_tables_per_layer=None,
        slot_remap=None,
        **kwargs,
    ):
        if kwargs:
            raise TypeError(f"Unsupported decode options: {kwargs.keys()}")
        if not enable_trace:
            raise ValueError("Kolibri serving requires decode traces")
        self._ensure_sampling_state()
        if slot_remap is not None:
            remap = torch.as_tensor(slot_remap).flatten().tolist()
            if sorted(remap) != list(range(self.batch_size)):
                raise ValueError(f"Invalid sampling slot permutation: {remap}")
            self._sampling_origins = [self._sampling_origins[slot] for slot in remap]
        sampled = sampling_params is not None
        if reload_sampling_params or reset_sampling_state or slot_remap is not None or not sampled:
            self._sampling(sampling_params, positions=start_pos)
        record(
            "decode_forward",
            reload_inputs=reload_inputs,
            read_from_device=read_from_device,
            sampled=sampled,
        )
        return self.core.decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace=enable_trace,
            read_from_device=read_from_device,
            sampling_params=sampling_params,
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            page_tables_per_layer=page_tables_per_layer,
            slot_remap=slot_remap,
        )

    def read_decode_output(self, tt_out, async_read=False):
        return self.core.read_decode_output(tt_out, async_read=async_read)

    def process_decode_output_host(self, tt_out, is_tokens=False):
        return self.core.process_decode_output_host(tt_out, is_tokens=is_tokens)

    def release_persistent_capture(self):
        """Pinned plugin shutdown hook, called while the mesh is still open."""
        record("release_persistent_capture", closed_before=self.closed)
        self.closed = True


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


# --------------------------------------------------------------------------------------
# Gemma 4 31B autoport (hybrid KV groups: sliding and global layers in their own shapes)
# --------------------------------------------------------------------------------------


GEMMA4_PAGE_BLOCK_SIZE = 64  # its PAGE_BLOCK_SIZE: get_kv_cache_spec refuses any other
GEMMA4_HOST_SAMPLING_COMPAT_ENV = "GEMMA4_31B_VLLM_HOST_SAMPLING_COMPAT"


def _gemma4_sampling_values(sampling_params, name: str) -> list[Any]:
    value = getattr(sampling_params, name)
    if isinstance(value, torch.Tensor):
        return value.reshape(-1).tolist()
    if isinstance(value, list | tuple):
        return list(value)
    return [value]


def _gemma4_require_semantic_greedy(sampling_params) -> None:
    temperatures = _gemma4_sampling_values(sampling_params, "temperature")
    top_ks = _gemma4_sampling_values(sampling_params, "top_k")
    if len(temperatures) != len(top_ks):
        raise ValueError("temperature and top_k must contain one value per fixed slot")
    if not all(float(t) <= 0.0 or int(k) == 1 for t, k in zip(temperatures, top_ks)):
        raise ValueError("on-device Gemma 4 31B serving sampling is greedy-only")


def _gemma4_swallowed(kwargs: dict[str, Any]) -> dict[str, Any]:
    """What the class's `**_` swallowed: names, with where each prefill row starts (the
    class reads no `start_pos`: a row starting past 0 would be computed wrong)."""
    kept = {name: "..." for name in kwargs}
    if kwargs.get("start_pos") is not None:
        kept["start_pos"] = [int(n) for n in torch.as_tensor(kwargs["start_pos"]).flatten()]
    return kept


class Gemma4AutoportForCausalLM(_Wrapped):
    """`models/autoports/google_gemma_4_31b/tt/generator_vllm.py` @e07e4017
    `Gemma4ForCausalLM`: its declarations (async decode with overlap, no prefix caching,
    a greedy-only device sampler, no device penalties, hybrid KV groups), its signatures
    (prefill and decode name what they read and swallow the rest in `**_`: legacy decode
    form, `reset_batch`; no `start_pos`, `empty_slots` or decode commands), its checks
    (`optimizations` must be None, `tt_data_parallel` 1, `max_batch_size` in [1, 32];
    block size 64; a KV tensor shared by layers of different sizes refused; host
    sampling, a call without `sampling_params`, raises unless
    GEMMA4_31B_VLLM_HOST_SAMPLING_COMPAT=1; device sampling greedy only, traced, active
    slots a contiguous prefix) and its decode trace's life (prepared from the host's
    tokens on a reset, a new cache or another active batch, released by a prefill or a
    host-sampled decode; otherwise the device's own token feeds the next step),
    computing with the Gemma 4 reference generator (`reference.gemma4`: each layer's
    cache in its own shape). Not kept: the context contract file (`max_seq_len` must
    equal the autoport's doc/context_contract.json: the twin takes the engine's), the
    TP4 mesh, the precision policy, the trace buffers and the hybrid pool arithmetic
    of `get_max_tokens_all_users` (its five sliding groups of ten layers and the
    reference plugin's generic terms come out negative at a tiny model's context: the
    twin answers every sequence at full length)."""

    model_capabilities = {
        "supports_async_decode": True,
        "supports_async_decode_overlap": True,
        "tt_async_decode_allows_overlap": True,
        "supports_prefix_caching": False,
        "supports_sample_on_device": True,
        "sample_on_device_policy": "greedy_only",
        "supports_device_sampling_penalties": False,
    }
    sample_on_device_policy = "greedy_only"
    _HYBRID_KV_CACHE_GROUPS_ENABLED = True

    def embed_input_ids(self, input_ids):
        raise NotImplementedError("Gemma 4 embeddings execute through the TT serving adapter")

    def forward(self, input_ids, positions, **kwargs):
        raise NotImplementedError("Gemma 4 execution enters through prefill_forward/decode_forward")

    def compute_logits(self, hidden_states, **kwargs):
        raise NotImplementedError("Gemma 4 logits are produced by the TT serving adapter")

    @classmethod
    def initialize_vllm_model(
        cls,
        hf_config,
        mesh_device,
        max_batch_size: int,
        max_seq_len: int = 262_144,
        n_layers: int | None = None,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
        **_: Any,
    ):
        import os

        from ttbundles.reference.gemma4 import ReferenceGemma4Generator

        if optimizations is not None:
            raise ValueError("Gemma 4 31B autoport always loads its selected precision config")
        if int(tt_data_parallel) != 1:
            raise ValueError(
                f"Gemma 4 31B autoport supports tt_data_parallel=1, got {tt_data_parallel}"
            )
        if not 1 <= int(max_batch_size) <= 32:
            raise ValueError(
                f"Gemma 4 31B supports max_batch_size in [1, 32], got {max_batch_size}"
            )
        record(
            "initialize_vllm_model",
            max_seq_len=max_seq_len,
            n_layers=n_layers,
            swallowed=sorted(_),
        )
        core = ReferenceGemma4Generator.initialize_vllm_model(
            hf_config, mesh_device, int(max_batch_size), int(max_seq_len), n_layers=n_layers
        )
        obj = cls(core)
        obj.host_sampling_compat = os.environ.get(GEMMA4_HOST_SAMPLING_COMPAT_ENV, "0") == "1"
        obj._decode_key = None  # what the live decode trace was prepared for
        return obj

    def _release_decode_state(self) -> None:
        self._decode_key = None

    @classmethod
    def get_max_tokens_all_users(
        cls,
        *,
        model_name: str,
        num_devices: int,
        tt_data_parallel: int,
        max_model_len: int,
        max_num_seqs: int,
    ) -> int:
        del model_name, num_devices, tt_data_parallel
        record("get_max_tokens_all_users", max_model_len=max_model_len, max_num_seqs=max_num_seqs)
        return int(max_model_len) * int(max_num_seqs)

    @classmethod
    def get_kv_cache_spec(cls, vllm_config):
        from ttbundles.reference.gemma4 import ReferenceGemma4Generator

        block_size = int(vllm_config.cache_config.block_size)
        if block_size != GEMMA4_PAGE_BLOCK_SIZE:
            raise ValueError(
                f"Gemma 4 31B requires vLLM --block-size {GEMMA4_PAGE_BLOCK_SIZE}, got {block_size}"
            )
        specs = ReferenceGemma4Generator.get_kv_cache_spec(vllm_config)
        record(
            "get_kv_cache_spec",
            kinds=sorted({type(spec).__name__ for spec in specs.values()}),
        )
        return specs

    def allocate_kv_cache_per_layer(self, per_layer_specs):
        sizes: dict[int, int] = {}
        for shape, _, tensor_idx in per_layer_specs:
            numel = int(torch.Size(shape).numel())
            if sizes.setdefault(int(tensor_idx), numel) != numel:
                raise ValueError(
                    "vLLM attempted to share one KV tensor across incompatible Gemma 4 specs: "
                    f"tensor_idx={tensor_idx}"
                )
        record(
            "allocate_kv_cache_per_layer",
            layers=len(per_layer_specs),
            shapes=sorted({tuple(int(n) for n in shape[1:]) for shape, _, _ in per_layer_specs}),
        )
        return self.core.allocate_kv_cache_per_layer(per_layer_specs)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return self.allocate_kv_cache_per_layer(
            [(kv_cache_shape, dtype, index) for index in range(num_layers)]
        )

    def _require_host_sampling_compat(self) -> None:
        if not self.host_sampling_compat:
            raise ValueError(
                f"host sampling compatibility is disabled; set {GEMMA4_HOST_SAMPLING_COMPAT_ENV}=1"
            )

    def _page_tables(self, page_tables_per_layer, page_table):
        if page_tables_per_layer is None:
            if page_table is None:
                raise ValueError("vLLM must provide a page table")
            return [page_table] * self.core.dims.num_layers
        tables = list(page_tables_per_layer)
        if len(tables) < self.core.dims.num_layers:
            raise ValueError("vLLM page_tables_per_layer does not cover every selected model layer")
        return tables

    def prefill_forward(
        self,
        tokens: torch.Tensor,
        page_table=None,
        kv_cache=None,
        prompt_lens=None,
        sampling_params=None,
        page_tables_per_layer=None,
        **_: Any,
    ):
        # A new prefill starts a new serving sequence: the decode trace is released.
        self._release_decode_state()
        if kv_cache is None:
            raise ValueError("Gemma 4 31B vLLM path requires the vLLM-owned kv_cache")
        if prompt_lens is None:
            prompt_lens = [int(tokens.shape[1])]
        prompt_lens = [int(n) for n in torch.as_tensor(prompt_lens).flatten()]
        tables = self._page_tables(page_tables_per_layer, page_table)
        record(
            "prefill_forward",
            rows=len(prompt_lens),
            per_layer=page_tables_per_layer is not None,
            sampled=sampling_params is not None,
            swallowed=_gemma4_swallowed(_),
        )
        if sampling_params is None:
            self._require_host_sampling_compat()
            return self.core.prefill_forward(
                tokens.to(torch.long), tables[0], kv_cache, prompt_lens,
                page_tables_per_layer=tables,
            )  # fmt: skip
        _gemma4_require_semantic_greedy(sampling_params)
        out = self.core.prefill_forward(
            tokens.to(torch.long), tables[0], kv_cache, prompt_lens,
            sampling_params=sampling_params, page_tables_per_layer=tables,
        )  # fmt: skip
        sampled = out[0] if isinstance(out, tuple) else out
        return sampled.reshape(-1)[: len(prompt_lens)].to(torch.int32).reshape(len(prompt_lens), 1)

    def decode_forward(
        self,
        tokens: torch.Tensor,
        start_pos: torch.Tensor,
        page_table=None,
        kv_cache=None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params=None,
        reset_batch: bool = False,
        page_tables_per_layer=None,
        perform_device_sampling: bool | None = None,
        prompt_tokens=None,
        output_tokens=None,
        slot_remap=None,
        **_: Any,
    ):
        del prompt_tokens, output_tokens, slot_remap, perform_device_sampling
        if sampling_params is None:
            self._release_decode_state()  # an eager decode never runs with the trace live
        if kv_cache is None:
            raise ValueError("Gemma 4 31B vLLM path requires the vLLM-owned kv_cache")
        tables = self._page_tables(page_tables_per_layer, page_table)
        call = dict(
            read_from_device=read_from_device,
            reset_batch=reset_batch,
            per_layer=page_tables_per_layer is not None,
            sampled=sampling_params is not None,
            swallowed=sorted(_),
        )
        if sampling_params is None:
            record("decode_forward", **call)
            self._require_host_sampling_compat()
            return self.core.decode_forward(
                tokens, start_pos, tables[0], kv_cache,
                enable_trace=False, read_from_device=read_from_device,
                page_tables_per_layer=tables,
            )  # fmt: skip
        if not enable_trace:
            raise ValueError("Gemma 4 31B on-device serving sampling requires decode tracing")
        _gemma4_require_semantic_greedy(sampling_params)
        positions = torch.as_tensor(start_pos).reshape(-1).to(torch.int32)
        active = positions >= 0
        active_batch_size = int(active.sum().item())
        if active_batch_size < 1:
            return torch.empty((0, 1), dtype=torch.int32)
        if not bool(active[:active_batch_size].all()) or bool(active[active_batch_size:].any()):
            raise ValueError(
                "Gemma 4 31B dynamic decode requires active requests in a contiguous prefix"
            )
        # The trace is prepared from the host's tokens and positions on a reset, a new KV
        # cache or another active batch; otherwise the device's own token and position
        # feed the next step (the host's may be a step stale) and only the page tables
        # are refreshed.
        key = (tuple(id(layer[0]) for layer in kv_cache), ("greedy", active_batch_size))
        prepare = bool(reset_batch) or self._decode_key != key
        record("decode_forward", **call, prepared=prepare)
        out = self.core.decode_forward(
            tokens, start_pos, tables[0], kv_cache,
            enable_trace=True, read_from_device=True, sampling_params=sampling_params,
            reload_inputs=prepare, reload_page_table=not prepare,
            reload_sampling_params=prepare, reset_sampling_state=prepare,
            page_tables_per_layer=tables,
        )  # fmt: skip
        self._decode_key = key
        sampled = out[0] if isinstance(out, tuple) else out
        return sampled.reshape(-1)[:active_batch_size].to(torch.int32).reshape(-1, 1)

    def read_decode_output(self, tt_out: Any, async_read: bool = False):
        if isinstance(tt_out, torch.Tensor):  # the device path's tokens, already on the host
            return (tt_out, []) if async_read else tt_out
        return self.core.read_decode_output(tt_out, async_read=async_read)

    def process_decode_output_host(self, tt_out: Any, *, is_tokens: bool = True):
        record("process_decode_output_host", is_tokens=is_tokens)
        if isinstance(tt_out, torch.Tensor) and is_tokens:
            return tt_out.reshape(-1).to(torch.int32).reshape(-1, 1)
        return self.core.process_decode_output_host(tt_out, is_tokens=is_tokens)

    def warmup_model_prefill(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        self.reset_warmup_state()

    def warmup_model_decode(self, *args: Any, **kwargs: Any) -> None:
        del args, kwargs
        self.reset_warmup_state()

    def reset_warmup_state(self) -> None:
        record("reset_warmup_state")
