"""The model runner's contract logic, without a server: binding calls to a class's real
signature, normalising return forms, the decode commands, the tt_data_parallel rules.

What a whole step does end to end is covered by the contract twins
(tests/test_contract_twins.py) and the e2e tests; these point at one function each.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch  # required: a missing or broken torch fails, never skips
import vllm  # noqa: F401 - required: a missing or broken vllm fails

from ttbundles.format import contract
from ttbundles.serving.binding import (
    GeneratorContractError,
    bind,
    decode_offer,
    split_output,
)
from ttbundles.serving.runner import DecodeCommands, tt_data_parallel

# --- binding -----------------------------------------------------------------------------


class Legacy70B:
    """TT-Metal's legacy Llama-2-70B signatures (t3000 @6f2ab0bf)."""

    @classmethod
    def initialize_vllm_model(cls, hf_config, t3k_mesh_device, max_batch_size):
        return ("init", hf_config, t3k_mesh_device, max_batch_size)

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens):
        return ("prefill", tokens, page_table, kv_cache, prompt_lens)


def test_bind_passes_only_what_the_signature_takes_under_its_own_names():
    init = bind(Legacy70B, contract.INITIALIZE, contract.INITIALIZE.passes, class_name="L")
    result = init(
        hf_config="cfg",
        mesh_device="mesh",
        max_batch_size=8,
        max_seq_len=2048,
        tt_data_parallel=1,
        optimizations=None,
    )
    assert result == ("init", "cfg", "mesh", 8)  # mesh_device reached t3k_mesh_device
    prefill = bind(Legacy70B(), contract.PREFILL, contract.PREFILL.passes, class_name="L")
    assert prefill(
        tokens=1,
        page_table=2,
        kv_cache=3,
        prompt_lens=4,
        empty_slots=[0],
        start_pos=[0],
        enable_trace=False,
        sampling_params=None,
    ) == ("prefill", 1, 2, 3, 4)


def test_a_method_with_kwargs_gets_every_keyword_that_has_a_value():
    class Forwarding:
        def decode_forward(self, *args, **kwargs):
            return kwargs

    decode = bind(Forwarding(), contract.DECODE, decode_offer(1), class_name="F")
    got = decode(tokens=1, start_pos=2, sampling_params=None, reload_inputs=True)
    assert got == {"tokens": 1, "start_pos": 2, "reload_inputs": True}


def test_a_required_parameter_the_worker_cannot_supply_fails_at_load_naming_it():
    class NeedsFoo:
        def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, foo):
            raise AssertionError

    with pytest.raises(GeneratorContractError) as info:
        bind(NeedsFoo(), contract.PREFILL, contract.PREFILL.passes, class_name="NeedsFoo")
    diagnostic = info.value.diagnostics[0]
    assert diagnostic.code == "TTB062" and "requires foo" in diagnostic.message


def test_mllama_style_multimodal_inputs_are_refused():
    class Mllama:
        def prefill_forward(
            self, tokens, images, page_table, kv_cache, prompt_lens, cross_page_table
        ):
            raise AssertionError

    with pytest.raises(GeneratorContractError) as info:
        bind(Mllama(), contract.PREFILL, contract.PREFILL.passes, class_name="Mllama")
    diagnostic = info.value.diagnostics[0]
    assert diagnostic.code == "TTB202"
    assert "images, cross_page_table" in diagnostic.message
    assert "pixel_values and image_grid_thw" in diagnostic.message


def test_readback_methods_take_the_device_output_by_position():
    class Reads:
        def read_decode_output(self, tt_out, async_read=False):
            return tt_out, async_read

    read = bind(Reads(), contract.READ_DECODE_OUTPUT, ("async_read",), class_name="R")
    assert read("out", async_read=True) == ("out", True)


def test_decode_keywords_by_contract_version():
    legacy, v1 = decode_offer(0), decode_offer(1)
    assert "reset_batch" in legacy and not set(contract.DECODE_COMMANDS) & set(legacy)
    assert "reset_batch" not in v1 and set(contract.DECODE_COMMANDS) <= set(v1)
    assert "slot_remap" in legacy and "slot_remap" in v1

    class Marked:
        decode_input_update_contract = 1

    assert contract.contract_version(Marked) == 1
    assert contract.contract_version(Legacy70B) == 0


@pytest.mark.parametrize(
    ("out", "expected"),
    [
        ("logits", ("logits", None)),
        (("tokens", "logprobs"), ("tokens", "logprobs")),
        (("logits", "rope_deltas"), ("logits", "rope_deltas")),
        (("tokens",), ("tokens", None)),
    ],
)
def test_split_output_forms(out, expected):
    assert split_output(out) == expected


def test_a_bare_tensor_is_not_split():
    tensor = torch.zeros(2, 1, 5)
    primary, extra = split_output(tensor)
    assert primary is tensor and extra is None


# --- decode commands -----------------------------------------------------------------------

TABLE = torch.tensor([[1, 2], [3, 4]], dtype=torch.int32)


def decide(**overrides):
    values = dict(
        device=True,
        resident=True,
        layout=("a", "b"),
        previous_layout=("a", "b"),
        page_table=TABLE,
        previous_page_table=TABLE.clone(),
    )
    values.update(overrides)
    return DecodeCommands.decide(**values)


def test_a_steady_device_decode_keeps_everything_resident():
    assert decide() == DecodeCommands(False, False, False, False)


def test_new_blocks_in_a_steady_batch_reload_only_the_page_table():
    grown = torch.tensor([[1, 2, 9], [3, 4, 0]], dtype=torch.int32)
    assert decide(page_table=grown) == DecodeCommands(False, True, False, False)


@pytest.mark.parametrize(
    "change",
    [
        {"layout": ("a", None)},  # a request left its slot
        {"layout": ("c", "b")},  # a new request took a slot
        {"previous_layout": None},  # first decode, or after a prefill / host step
    ],
)
def test_a_layout_change_reloads_inputs_and_rebuilds_sampling_state(change):
    assert decide(**change) == DecodeCommands(True, False, True, True)


def test_host_sampling_reloads_inputs_and_touches_no_sampling_state():
    assert decide(device=False) == DecodeCommands(True, False, False, False)


def test_a_generator_without_resident_inputs_reloads_every_step():
    steady = decide(resident=False)
    assert steady.reload_inputs and not steady.reload_page_table
    assert not steady.reset_sampling_state  # not a transition: seeds and history stay


# --- tt_data_parallel -----------------------------------------------------------------------


def family(module: str) -> type:
    return type("Generator", (), {"__module__": module})


def test_tt_data_parallel_per_family():
    mesh = SimpleNamespace(shape=(8, 4), get_num_devices=lambda: 32)
    assert tt_data_parallel(family("models.tt_transformers.tt.generator_vllm"), 2, mesh) == 2
    assert tt_data_parallel(family("models.demos.deepseek_v3.tt.generator_vllm"), 1, mesh) == 32
    assert (
        tt_data_parallel(family("models.demos.llama3_70b_galaxy.tt.generator_vllm"), 4, mesh) == 4
    )
    with pytest.raises(GeneratorContractError) as info:
        tt_data_parallel(family("models.demos.llama3_70b_galaxy.tt.generator_vllm"), 2, mesh)
    assert info.value.diagnostics[0].code == "TTB205"
    assert "multiple of the mesh's 4 columns" in info.value.diagnostics[0].message
