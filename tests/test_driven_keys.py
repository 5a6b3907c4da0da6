"""The newest keys of the contract, driven or refused at load (fast tier; the twins in
`tests/test_contract_twins.py` serve them end to end: the Kolibri autoport's prefill
output masks, sampling origins and release, the Llama 3 executor's warm-up)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from ttbundles.serving.binding import GeneratorContractError
from ttbundles.serving.runner.commands import DecodeCommands
from ttbundles.serving.runner.contract_binding import bind_instance, declared_prefill_keywords
from ttbundles.serving.runner.lifecycle import Lifecycle

TABLE = torch.tensor([[1, 2]])


def decide(**changes: Any) -> DecodeCommands:
    values: dict[str, Any] = dict(
        device=True,
        resident=True,
        layout=("a", None),
        previous_layout=("a", None),
        page_table=TABLE,
        previous_page_table=TABLE,
    )
    values.update(changes)
    return DecodeCommands.decide(**values)


def test_decode_inputs_are_reused_only_on_a_steady_decode_with_the_same_page_table():
    assert decide().reuse_inputs
    assert not decide(page_table=torch.tensor([[1, 3]])).reuse_inputs  # a new KV block
    assert not decide(previous_layout=("b", None)).reuse_inputs  # another request
    assert not decide(previous_layout=None).reuse_inputs  # after a prefill
    assert not decide(resident=False).reuse_inputs  # inputs not kept resident
    assert not decide(device=False).reuse_inputs  # host sampling


class _Generator:
    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, start_pos=None):
        return None

    def decode_forward(
        self, tokens, start_pos, page_table, kv_cache, reuse_device_decode_inputs=False
    ):
        return None


def _bind(generator: Any, capabilities: dict[str, Any]):
    return bind_instance(
        generator,
        "Gen",
        0,
        image_inputs=False,
        prompt_logits=False,
        speculation_method=None,
        async_decode=False,
        capabilities=capabilities,
    )


def test_a_class_declaring_output_masks_without_taking_them_is_refused_at_load():
    for key, keyword in [
        ("supports_intermediate_prefill_output_mask", "prefill_output_mask"),
        ("supports_prefill_sampling_origins", "original_prompt_lens"),
    ]:
        with pytest.raises(GeneratorContractError) as info:
            _bind(_Generator(), {key: True})
        (diagnostic,) = info.value.diagnostics
        assert diagnostic.code == "TTB062"
        assert keyword in diagnostic.message and key in diagnostic.message


def test_the_prefill_keywords_go_only_to_a_class_that_asks_for_them():
    assert declared_prefill_keywords({}) == ()
    assert declared_prefill_keywords({"supports_prefill_sampling_origins": False}) == ()
    both = {
        "supports_intermediate_prefill_output_mask": True,
        "supports_prefill_sampling_origins": True,
    }
    assert declared_prefill_keywords(both) == ("prefill_output_mask", "original_prompt_lens")

    class Takes(_Generator):
        def prefill_forward(
            self, tokens, page_table, kv_cache, prompt_lens, prefill_output_mask=None, **kw
        ):
            if kw:
                raise TypeError(kw)

    methods = _bind(Takes(), both)  # original_prompt_lens through **kw: accepted
    assert methods.prefill.accepts("prefill_output_mask")
    assert "reuse_device_decode_inputs" in methods.decode.names


class _Warmed:
    requires_prefill_trace_warmup = True

    def __init__(self):
        self.calls: list[tuple[bool, bool]] = []
        self.already_warmed_up_prefill = False
        self.released = 0

    def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device):
        if self.already_warmed_up_prefill:
            return
        self.already_warmed_up_prefill = True
        self.calls.append((enable_trace, can_sample_on_device))

    def release_persistent_capture(self):
        self.released += 1


def test_the_prefill_warmup_compiles_then_captures_and_release_runs_once():
    generator = _Warmed()
    lifecycle = Lifecycle.bind(generator, _Warmed, "Warmed")
    assert lifecycle.warm_up("cache", trace=True, sample_on_device=True) == 2
    assert generator.calls == [(False, True), (True, True)]
    assert lifecycle.release_capture() and not lifecycle.release_capture()
    assert generator.released == 1

    untraced = _Warmed()
    assert (
        Lifecycle.bind(untraced, _Warmed, "Warmed").warm_up(
            "c", trace=False, sample_on_device=False
        )
        == 1
    )
    assert untraced.calls == [(False, False)]


def test_no_warmup_unless_the_class_asks_and_a_class_asking_without_the_method_is_refused():
    class Plain:
        pass

    assert (
        Lifecycle.bind(Plain(), Plain, "Plain").warm_up("c", trace=True, sample_on_device=True) == 0
    )

    class Asks:
        requires_prefill_trace_warmup = True

    with pytest.raises(GeneratorContractError) as info:
        Lifecycle.bind(Asks(), Asks, "Asks")
    (diagnostic,) = info.value.diagnostics
    assert diagnostic.code == "TTB053" and "warmup_model_prefill" in diagnostic.message


def test_validate_import_reports_what_the_worker_refuses_at_load():
    """`validate --import` reads the same refusals off the imported class."""
    from ttbundles.check.imports import newest_key_problems

    class Asks(_Generator):
        requires_prefill_trace_warmup = True
        model_capabilities = {"supports_intermediate_prefill_output_mask": True}

    problems = newest_key_problems(Asks, "Asks")
    assert [p["code"] for p in problems] == ["TTB053", "TTB062"]
    assert "warmup_model_prefill" in problems[0]["message"]
    assert "prefill_output_mask" in problems[1]["message"]

    class Fine(Asks):
        def warmup_model_prefill(self, kv_cache, enable_trace, can_sample_on_device):
            pass

        def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
            return kwargs["prefill_output_mask"]  # read: it takes every keyword

    assert newest_key_problems(Fine, "Fine") == []
