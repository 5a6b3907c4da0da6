"""Fidelity to TT-Metal and the reference plugin as they are today (issue 22), fast tier.

Each test is built from a real class's signature and return form (the contract twins in
`tests/twins/families.py`, whose bases match the real bases) or from a bundle whose
source has the real class's shape; none imports TT-Metal.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.bundle_factory import contract_adapter
from ttbundles.check.validate import validate_bundle
from ttbundles.format import contract, contract_keys
from ttbundles.format.forwarding import accepted_keywords
from ttbundles.serving.binding import bind, decode_offer

sys.path.insert(0, str(Path(__file__).parent / "twins"))
import families  # noqa: E402 - the twins module, copied into bundles by the server tests

# --- **kwargs that forward ----------------------------------------------------------------


def test_llama2_70b_v1_decode_forwards_its_kwargs_to_a_base_that_takes_four(monkeypatch):
    """@0b1e81be: `decode_forward(*args, reload_*, slot_remap=None, **kwargs)` ends in
    `super().decode_forward(*args, **kwargs)`; the base takes (tokens, start_pos,
    page_table=None, kv_cache=None). The worker must not send it enable_trace."""
    twin = families.T3000LlamaV1.__new__(families.T3000LlamaV1)
    accepted = accepted_keywords(type(twin), twin.decode_forward)
    assert not accepted.any
    assert {"tokens", "start_pos", "page_table", "kv_cache", "slot_remap"} <= accepted.names
    assert not accepted.accepts("enable_trace") and not accepted.accepts("read_from_device")
    assert "T3000GenerationBase.decode_forward" in accepted.via

    decode = bind(twin, contract.DECODE, decode_offer(1), class_name="TtLlamaForCausalLM")
    assert not decode.accepts("enable_trace") and not decode.accepts("sampling_params")
    seen = {}

    def base(tokens, start_pos, page_table=None, kv_cache=None):  # the real base's form
        seen.update(tokens=tokens, start_pos=start_pos, page_table=page_table)
        return "logits"

    # The base's own form, recording what reached it (the twin's base computes with the
    # reference generator, which this fast test does not load).
    monkeypatch.setattr(
        families.T3000GenerationBase,
        "decode_forward",
        lambda self, tokens, start_pos, page_table=None, kv_cache=None: base(
            tokens, start_pos, page_table, kv_cache
        ),
    )
    out = decode(
        tokens=1,
        start_pos=2,
        page_table=3,
        kv_cache=4,
        enable_trace=True,
        read_from_device=True,
        slot_remap=[0],
        reload_inputs=True,
        reload_page_table=False,
        reload_sampling_params=False,
        reset_sampling_state=False,
    )
    assert out == "logits" and seen == {"tokens": 1, "start_pos": 2, "page_table": 3}


def test_a_kwargs_the_method_reads_itself_still_accepts_everything():
    """DeepSeek-V3 reads `kwargs["tokens"]`; Qwen2.5-VL pops: not forwarding only."""
    for cls in (families.DeepseekV3ForCausalLM, families.Qwen2_5_VLForConditionalGeneration):
        twin = cls.__new__(cls)
        assert accepted_keywords(cls, twin.decode_forward).any, cls.__name__


def test_forwarding_to_a_method_with_kwargs_that_reads_them_accepts_everything():
    """tt_transformers' adapter forwards to `Generator.decode_forward`, which reads
    `kwargs.get("reload_inputs")`: every keyword still reaches it."""
    cls = families.TTTransformersLlamaForCausalLM
    accepted = accepted_keywords(cls, cls.__new__(cls).decode_forward)
    assert accepted.any and "reset_batch" in accepted.names


def test_forwarding_to_a_module_function_and_self_method():
    def target(tokens, start_pos, page_table=None):
        return tokens

    class Adapter:
        def decode_forward(self, *args, **kwargs):
            return self._inner(*args, **kwargs)

        def _inner(self, tokens, start_pos, kv_cache=None):
            return tokens

    accepted = accepted_keywords(Adapter, Adapter().decode_forward)
    assert accepted.names >= {"tokens", "start_pos", "kv_cache"} and not accepted.any
    assert not accepted.accepts("enable_trace")
    assert accepted_keywords(None, target).names == {"tokens", "start_pos", "page_table"}


def test_twins_follow_their_real_bases():
    """The Llama-2-70B twins have no decode of their own (legacy) or one that forwards
    (v1): the base's signature is the real one."""
    import inspect

    params = list(inspect.signature(families.T3000GenerationBase.decode_forward).parameters)
    assert params == ["self", "tokens", "start_pos", "page_table", "kv_cache"]
    assert "decode_forward" not in vars(families.T3000LlamaLegacy)


# --- DeepSeek-V3's KV budget raises outside one model on Wormhole ------------------------


def _is_wormhole_b0() -> bool:
    return False  # the host mesh: `models.common.utility_functions.is_wormhole_b0()` is False


class DeepseekOffWormhole(families.DeepseekV3ForCausalLM):
    """`models/demos/deepseek_v3/tt/generator_vllm.py` @01656bf7: the budget exists only
    for DeepSeek-R1-0528 on Wormhole; any other model or device raises ValueError."""

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
        if "DeepSeek-R1-0528" in model_name and _is_wormhole_b0():
            return int(max_model_len) * int(max_num_seqs)
        raise ValueError("DeepSeek-R1-0528 not supported on non-Wormhole devices")


def test_a_kv_budget_that_raises_is_a_load_error_naming_model_and_class():
    from ttbundles.serving.binding import GeneratorContractError, call_at_load

    budget = bind(
        DeepseekOffWormhole,
        contract.MAX_TOKENS,
        contract.MAX_TOKENS.passes,
        class_name="DeepseekV3ForCausalLM",
    )
    with pytest.raises(GeneratorContractError) as info:
        call_at_load(
            budget,
            "model 'deepseek-ai/DeepSeek-V3' on 1 device(s)",
            model_name="deepseek-ai/DeepSeek-V3",
            num_devices=1,
            tt_data_parallel=1,
            max_model_len=256,
            max_num_seqs=4,
        )
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB063"
    assert "DeepseekV3ForCausalLM.get_max_tokens_all_users" in diagnostic.message
    assert "deepseek-ai/DeepSeek-V3" in diagnostic.message
    assert "non-Wormhole" in diagnostic.message and "--kv-cache-memory-bytes" in diagnostic.hint


# --- a class with no model_capabilities at all -------------------------------------------

NO_CAPABILITIES = contract_adapter("TtLlamaForCausalLM")  # like Llama-2-70B: no dict at all
DECLARED = {
    "capabilities": {
        "prefix_caching": True,
        "chunked_prefill": True,
        "sample_on_device": ["decode_only"],
    }
}


def test_declared_capabilities_over_a_class_without_a_dict_are_errors(make_bundle):
    """Statically, and by `--import` on its own (the real class, imported)."""
    from ttbundles.check.imports import import_check
    from ttbundles.format.parse import load_metadata

    folder = make_bundle(
        "llama2",
        adapter=NO_CAPABILITIES,
        metadata={"main_class": "adapter:TtLlamaForCausalLM", **DECLARED},
    )
    expected = [
        ("TTB056", "/capabilities/chunked_prefill"),
        ("TTB056", "/capabilities/prefix_caching"),
        ("TTB056", "/capabilities/sample_on_device"),
    ]
    static = [d for d in validate_bundle(folder).diagnostics if d.is_error]
    imported = [d for d in import_check(folder, load_metadata(folder).metadata) if d.is_error]
    for found in (static, imported):
        assert sorted((d.code, d.pointer) for d in found) == expected
        assert "no model_capabilities" in found[0].message
        assert "nothing supported" in found[0].message


# --- the environment's class, read from source that cannot be imported here ---------------

MLLAMA_SOURCE = '''import ttnn  # absent here: the class is read, never imported


class MllamaForConditionalGeneration:
    """tt_transformers generator_vllm.py @21a4db48: prefill requires images and
    cross_page_table, and takes no **kwargs."""

    model_capabilities = {
        "supports_prefix_caching": False,
        "supports_async_decode": True,
        "supports_sample_on_device": False,
    }

    @classmethod
    def initialize_vllm_model(
        cls, hf_config, mesh_device, max_batch_size, max_seq_len, tt_data_parallel=1,
        optimizations: str = None,
    ):
        return cls()

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def prefill_forward(self, tokens, images, page_table, kv_cache, prompt_lens, cross_page_table):
        return None

    def decode_forward(self, *args, **kwargs):
        return None
'''
LLAMA2_70B_SOURCE = """import ttnn  # absent here


class TtLlamaModelForGeneration:
    def decode_forward(self, tokens, start_pos, page_table=None, kv_cache=None):
        return None

    def prefill_forward(self, tokens, start_pos, page_table=None, kv_cache=None, prompt_lens=None):
        return None


class TtLlamaForCausalLM(TtLlamaModelForGeneration):
    decode_input_update_contract = 1

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size):
        return cls()

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens):
        return super().prefill_forward(tokens, 0, page_table, kv_cache, prompt_lens)

    def decode_forward(
        self, *args, reload_inputs: bool, reload_page_table: bool,
        reload_sampling_params: bool, reset_sampling_state: bool, slot_remap=None, **kwargs,
    ):
        return super().decode_forward(*args, **kwargs)

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None
"""


def _environment_bundle(tmp_path, monkeypatch, name, arch, module_source, class_name, caps):
    from tests.bundle_factory import metadata, write_bundle

    lib = tmp_path / "lib" / "tt_metal_like"
    lib.mkdir(parents=True, exist_ok=True)
    (lib / "__init__.py").touch()
    (lib / f"{name}.py").write_text(module_source)
    monkeypatch.syspath_prepend(str(tmp_path / "lib"))
    document = metadata(
        name,
        arch=arch,
        main_class=f"tt_metal_like.{name}:{class_name}",
        main_class_source="environment",
        capabilities=caps,
    )
    return write_bundle(tmp_path / "models" / name, document=document)


def test_validate_gives_the_workers_mllama_refusal_without_importing(tmp_path, monkeypatch):
    folder = _environment_bundle(
        tmp_path,
        monkeypatch,
        "mllama",
        "MllamaForConditionalGeneration",
        MLLAMA_SOURCE,
        "MllamaForConditionalGeneration",
        {},
    )
    errors = validate_bundle(folder).errors
    assert [(d.code, d.pointer) for d in errors] == [("TTB202", "/arch"), ("TTB202", None)]
    assert "vLLM removed in 0.10.2" in errors[0].message
    # The signature, as the worker's binding refuses it (serving.binding: TTB202).
    assert "prefill_forward requires images, cross_page_table" in errors[1].message
    assert "the worker sends images only as pixel_values and image_grid_thw" in errors[1].message


def test_validate_llama2_70b_shape_without_capabilities(tmp_path, monkeypatch):
    folder = _environment_bundle(
        tmp_path,
        monkeypatch,
        "llama2_70b",
        "LlamaForCausalLM",
        LLAMA2_70B_SOURCE,
        "TtLlamaForCausalLM",
        {"prefix_caching": True},
    )
    errors = validate_bundle(folder).errors
    assert [(d.code, d.pointer) for d in errors] == [("TTB056", "/capabilities/prefix_caching")]
    assert "no model_capabilities" in errors[0].message
    # Declaring nothing over the same class is valid: the v1 decode takes the commands
    # (keyword-only, no defaults: the worker always sends them).
    clean = _environment_bundle(
        tmp_path,
        monkeypatch,
        "llama2_ok",
        "LlamaForCausalLM",
        LLAMA2_70B_SOURCE,
        "TtLlamaForCausalLM",
        {},
    )
    assert validate_bundle(clean).errors == []


# --- keys the contract does not mirror ------------------------------------------------------


def _with_capabilities(body: str) -> str:
    return contract_adapter("DemoGenerator", attributes=f"    model_capabilities = {body}\n")


def test_every_key_a_class_carries_is_accounted_for(make_bundle):
    """Gemma-4 26B-A4B autoport keys (a test pins them in TT-Metal) plus two the plugin
    documents: known keys say nothing, an unknown one is a note (`validate -v`), and a
    fabric_config the worker does not apply is a warning."""
    adapter = _with_capabilities(
        '{"supports_prefix_caching": False, "supports_async_decode": True,'
        ' "supports_async_decode_overlap": True, "supports_sample_on_device": True,'
        ' "supports_device_penalties": False, "supports_device_seeded_sampling": False,'
        ' "max_device_top_k": 32, "state_slots_are_stateless": True,'
        ' "fabric_config": {"fabric": "FABRIC_1D"}, "output_tokens_per_step": 1}'
    )
    folder = make_bundle("demo", adapter=adapter)
    notes = [
        (d.severity.value, d.message)
        for d in validate_bundle(folder).diagnostics
        if d.code == "TTB064"
    ]
    assert [severity for severity, _ in notes] == ["warning", "info", "info"]
    assert "declares fabric_config, which this worker does not apply" in notes[0][1]
    assert "'state_slots_are_stateless', a key ttbundles does not know" in notes[1][1]
    assert "'supports_device_seeded_sampling', a key ttbundles" in notes[2][1]


def test_block_output_validates(make_bundle):
    block = make_bundle("demo", adapter=_with_capabilities('{"output_tokens_per_step": 4}'))
    assert not validate_bundle(block).errors


def test_a_block_width_that_is_no_count_is_refused(make_bundle):
    folder = make_bundle("demo", adapter=_with_capabilities('{"output_tokens_per_step": 0}'))
    [error] = validate_bundle(folder).errors
    assert error.code == "TTB275" and "output_tokens_per_step'] is 0" in error.message


def test_known_keys_are_documented_with_what_the_worker_does():
    for key, handling in contract_keys.KNOWN_CAPABILITY_KEYS.items():
        assert handling.split(":")[0] in ("driven", "refused", "irrelevant"), key
    for key in contract.CAPABILITY_KEYS:
        assert key in contract_keys.KNOWN_CAPABILITY_KEYS


def test_list_shows_mllama_as_a_listing_entry_not_a_bundle(run_cli):
    """No vLLM of the tested window serves Mllama, so no bundle ships for it (one would
    never validate); `ttbundle list` still says why TT-Metal's class is not offered."""
    assert not (Path(__file__).parents[1] / "bundles" / "tt-mllama").exists()
    env = {"MESH_DEVICE": "HOST", "TT_VLLM_BUILTIN_MODELS": "1"}
    done = run_cli("list", "--format", "json", env=env)
    [row] = [
        r
        for r in json.loads(done.stdout)["entries"]
        if r["tt_arch"] == "TTMllamaForConditionalGeneration"
    ]
    assert (row["source"], row["status"], row["bundle"]) == ("listing", "unservable", None)
    assert row["reason"].startswith("TTB202 Llama 3.2 Vision (Mllama) is an encoder-decoder")
    assert "pinned vLLM 0.33" not in row["reason"]
    shown = run_cli("list", "--all", env=env).stdout
    [line] = [x for x in shown.splitlines() if x.startswith("TTMllamaForConditionalGeneration")]
    assert "listing" in line and "not servable" in line
