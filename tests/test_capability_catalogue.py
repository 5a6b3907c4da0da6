"""The catalogue of capabilities and pooling tasks (`format.capabilities`): every field of
`Capabilities` has its record with its facts, and every list the library keeps about
them is derived from it. The lists' values before they were derived are pinned here once,
so the derivation is proven to give what the hand-kept lists said."""

from __future__ import annotations

import typing

import pytest

from ttbundles.check import support, tests_section
from ttbundles.codes import CODES
from ttbundles.conformance import pooling as conformance_pooling
from ttbundles.format import capabilities as catalogue
from ttbundles.format import contract, contract_keys, metadata
from ttbundles.format.metadata import (
    SUPPORTED_SCHEMA_VERSIONS,
    TEST_PATHS,
    BundleMetadata,
    Capabilities,
    capability_flags,
)
from ttbundles.scaffold.reference import REFERENCE_CAPABILITIES


def test_every_capability_field_has_its_record_in_the_models_order():
    fields = [name for name in Capabilities.model_fields if name != "extensions_"]
    assert [c.name for c in catalogue.CAPABILITIES] == fields


@pytest.mark.parametrize("entry", catalogue.CAPABILITIES, ids=lambda c: c.name)
def test_each_record_states_facts_that_hold(entry):
    assert entry.added_in in SUPPORTED_SCHEMA_VERSIONS
    if entry.added_in > 1:  # the version's description names what it added
        assert entry.name in SUPPORTED_SCHEMA_VERSIONS[entry.added_in]
    if entry.class_key is not None:
        assert entry.key_from in ("tt_metal", "ttbundles", "plugin")
        assert entry.class_key in contract_keys.KNOWN_CAPABILITY_KEYS
    if entry.refusal is not None:
        assert entry.refusal in CODES
    if entry.test_path is not None:
        assert entry.test_path in TEST_PATHS
    if entry.card is not None:  # a support card row says the code and what the plan does
        assert entry.refusal is not None and entry.plan_note
    if entry.summary in ("values", "tasks") or entry.choices:
        assert entry.card is not None
    if entry.reference is not None:  # the reference declares what the model accepts,
        # beside its other facts (spec_plan needs spec_decode, its master gate)
        Capabilities(**catalogue.REFERENCE)


def test_a_list_capabilitys_choices_are_the_values_its_field_takes():
    for name in ("sample_on_device", "spec_decode"):
        (item,) = typing.get_args(Capabilities.model_fields[name].annotation)
        assert set(catalogue.BY_NAME[name].choices) == set(typing.get_args(item))
    assert catalogue.BY_NAME["pooling"].choices == contract.POOLING_TASKS


def test_the_class_keys_are_the_contracts_named_keys():
    assert catalogue.PLUGIN_KEYS == {
        contract.SPEC_DECODE_KEY: "spec_decode",
        contract.ASYNC_SPEC_DECODE_KEY: "async_spec_decode",
        contract.SPEC_REQUIREMENTS_KEY: "spec_requirements",
        contract.SPEC_HIDDEN_HANDOFF_KEY: "spec_hidden_handoff",
    }


# The hand-kept lists as they were (852a564), each with its order where it had one.


def test_schema_additions_are_derived_as_they_were():
    assert metadata.ADDED_IN == {
        2: (("capabilities", "modalities"), ("tests", "image_prompts")),
        3: (
            ("capabilities", "spec_decode"),
            ("capabilities", "async_spec_decode"),
            ("capabilities", "spec_requirements"),
            ("capabilities", "spec_hidden_handoff"),
            ("capabilities", "spec_plan"),
            ("capabilities", "prompt_logprobs"),
        ),
        4: (("", "serving"),),
        5: (("", "performance"), ("capabilities", "kv_cache_spec"), ("capabilities", "pooling")),
        6: (("capabilities", "recurrent_state"),),
    }


def test_class_keys_paths_and_reference_are_derived_as_they_were():
    assert list(contract.CAPABILITY_KEYS.items()) == [
        ("supports_prefix_caching", "prefix_caching"),
        ("supports_async_decode", "async_decode"),
        ("supports_sample_on_device", "sample_on_device"),
        ("supports_chunked_prefill", "chunked_prefill"),
        ("recurrent_state", "recurrent_state"),  # ttbundles' own key: the owner
    ]
    assert list(contract.SPEC_KEYS.items()) == [
        ("supports_spec_decode", "spec_decode"),
        ("supports_async_spec_decode", "async_spec_decode"),
        ("spec_requirements", "spec_requirements"),
        ("spec_hidden_handoff", "spec_hidden_handoff"),
    ]
    assert contract.SPEC_METHODS == ("ngram", "custom_class")
    assert metadata.PATH_CAPABILITY == {
        "chunked_prefill": "chunked_prefill",
        "prefix_cache": "prefix_caching",
        "device_sampling": "sample_on_device",
    }
    assert REFERENCE_CAPABILITIES == {
        "prefix_caching": True,
        "chunked_prefill": True,
        "async_decode": True,
        "sample_on_device": ["decode_only", "all"],
        "spec_decode": ["ngram"],
        "async_spec_decode": True,
        "spec_plan": True,
        "prompt_logprobs": True,
    }


def test_the_settings_the_plan_turns_off_are_derived_as_they_were():
    # configuration._plan_features: (config, setting, capability), in the plan's order.
    assert catalogue.TURNED_OFF == (
        ("cache_config", "enable_prefix_caching", "prefix_caching"),
        ("scheduler_config", "async_scheduling", "async_decode"),
        ("scheduler_config", "enable_chunked_prefill", "chunked_prefill"),
    )


def test_the_pooling_tables_are_derived_from_one_record_per_task():
    assert contract.POOLING_TASKS == ("embed", "classify", "token_embed")
    paths = {"pooling_embed": "embed", "pooling_classify": "classify"}
    assert list(tests_section.POOLING_PATHS.items()) == list(paths.items())
    assert conformance_pooling.KINDS == {
        "embed": ("embedding", "raw"),
        "classify": ("probs", "logits"),
    }
    assert conformance_pooling.CODES == {"embed": "TTB128", "classify": "TTB129"}
    assert catalogue.CONVERT_TASKS == {"embed": ("embed", "token_embed"), "classify": ("classify",)}
    for task in catalogue.POOLING:
        assert task.name in typing.get_args(metadata.PoolingTask)
        assert task.mismatch is None or task.mismatch in CODES
        assert set(task.vectors) <= set(conformance_pooling.TOLERANCES)


def test_the_harness_and_the_planner_read_the_same_records():
    from ttbundles.serving import harness
    from ttbundles.serving.planning import pooling

    assert harness.POOLING_RUNS is tests_section.POOLING_PATHS
    assert pooling.CONVERT_TASKS is catalogue.CONVERT_TASKS


def _bundle(capabilities: dict) -> BundleMetadata:
    return BundleMetadata.model_validate(
        {
            "schema_version": 5,
            "name": "demo",
            "version": "1.0.0",
            "arch": "LlamaForCausalLM",
            "main_class": "adapter:Generator",
            "capabilities": capabilities,
        }
    )


EVERYTHING = {
    "prefix_caching": True,
    "async_decode": True,
    "sample_on_device": ["decode_only"],
    "chunked_prefill": True,
    "execution": "single",
    "modalities": {"image": 2},
    "spec_decode": ["ngram"],
    "prompt_logprobs": True,
    "pooling": {"tasks": ["embed"], "form": "prefill_hidden"},
}


def test_the_summary_shows_each_capability_in_the_catalogues_order():
    assert capability_flags(EVERYTHING) == [
        "prefix_caching",
        "async_decode",
        "sample_on_device=decode_only",
        "chunked_prefill",
        "single-execute",
        "inputs=text+image:2",
        "spec_decode=ngram",
        "prompt_logprobs",
        "pooling=embed",
    ]
    assert capability_flags({"multimodal": True}) == ["inputs=text+image:1"]


def test_the_support_card_has_a_row_per_capability_and_choice():
    rows = support._features(_bundle(EVERYTHING))
    assert [(feature, admitted, code) for feature, admitted, code, _ in rows] == [
        ("text generation", True, ""),
        ("prefix_caching", True, "TTB203"),
        ("async_decode", True, "TTB203"),
        ("sample_on_device: decode_only", True, "TTB204"),
        ("sample_on_device: all", False, "TTB204"),
        ("chunked_prefill", True, "TTB203"),
        ("lanes", True, "TTB202"),
        ("images", True, "TTB215"),
        ("spec_decode: ngram", True, "TTB235"),
        ("spec_decode: custom_class", False, "TTB235"),
        ("prompt_logprobs", True, "TTB206"),
        ("pooling: embed", True, "TTB270"),
        ("pooling: classify", False, "TTB270"),
        ("pooling: token_embed", False, "TTB270"),
    ]
    assert support._TEST_PATHS == {
        "text generation": ("prefill", "decode"),
        "prefix_caching": ("prefix_cache",),
        "chunked_prefill": ("chunked_prefill",),
        "pooling: embed": ("pooling_embed",),
        "pooling: classify": ("pooling_classify",),
    }
