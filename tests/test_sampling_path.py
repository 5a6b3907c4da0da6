"""Which sampler serves a batch: the rules, on vLLM's own SamplingParams."""

from __future__ import annotations

import pytest
import vllm  # noqa: F401 - required: a missing or broken vllm fails
from vllm.sampling_params import SamplingParams, StructuredOutputsParams

from ttbundles.serving.runner.sampling_path import (
    DeviceSupport,
    batch_host_reason,
    device_params,
    device_support,
    host_reason,
)

PLAIN = SamplingParams(temperature=0.7, top_k=20, top_p=0.9, seed=3)


def reason(
    params, *, is_prefill=False, mode="all", always_host=False, custom=False, structured=False
):
    return batch_host_reason(
        params,
        is_prefill=is_prefill,
        mode=mode,
        always_host=always_host,
        custom_logits_processors=custom,
        structured=structured,
    )


@pytest.mark.parametrize(
    "params,expected",
    [
        (SamplingParams(logprobs=2), "logprobs"),
        (SamplingParams(presence_penalty=0.5), "penalties"),
        (SamplingParams(frequency_penalty=0.5), "penalties"),
        (SamplingParams(repetition_penalty=1.2), "penalties"),
        (SamplingParams(temperature=1.0, min_p=0.1), "min_p"),
        (SamplingParams(logit_bias={5: 2.0}), "logit_bias"),
        (SamplingParams(allowed_token_ids=[1, 2]), "allowed_token_ids"),
        (SamplingParams(bad_words=["x"]), "bad_words"),
        (SamplingParams(min_tokens=3), "min_tokens"),
        (
            SamplingParams(structured_outputs=StructuredOutputsParams(choice=["a", "b"])),
            "structured_output",
        ),
        (PLAIN, None),
        (SamplingParams(temperature=0.0), None),
    ],
)
def test_each_host_only_feature_is_named(params, expected):
    assert host_reason(params) == expected


def test_one_request_takes_its_whole_batch_to_the_host():
    assert reason([PLAIN, PLAIN]) is None
    assert reason([PLAIN, SamplingParams(logprobs=1), PLAIN]) == "logprobs"


@pytest.mark.parametrize(
    "kwargs,expected",
    [
        ({"mode": None}, "host_mode"),
        ({"always_host": True}, "always_compat_sampling"),
        ({"mode": "decode_only", "is_prefill": True}, "prefill_in_decode_only_mode"),
        ({"mode": "decode_only", "is_prefill": False}, None),
        ({"mode": "all", "is_prefill": True}, None),
        ({"custom": True}, "custom_logits_processors"),
        ({"structured": True}, "structured_output"),
    ],
)
def test_batch_level_rules(kwargs, expected):
    assert reason([PLAIN], **kwargs) == expected


def test_device_parameters_keep_greedy_seed_and_cuts():
    params = device_params(
        [SamplingParams(temperature=0.0), PLAIN, SamplingParams(temperature=1.0, top_k=10_000)],
        vocab_size=384,
    )
    assert params.temperature == [0.0, 0.7, 1.0]
    assert params.top_k == [0, 20, 0]  # no cut: 0 (off) or >= vocab
    assert params.top_p == [1.0, 0.9, 1.0]
    assert params.seed == [None, 3, None]
    # TT's eight fields, every one a per-row list.
    assert params.presence_penalty == [0.0, 0.0, 0.0]
    assert params.repetition_penalty == [1.0, 1.0, 1.0]
    assert params.enable_log_probs == [False, False, False]


def test_an_empty_decode_slot_is_greedy_and_plain():
    params = device_params([None, SamplingParams(presence_penalty=0.5, logprobs=1)], 384)
    assert params.temperature == [0.0, 1.0] and params.presence_penalty == [0.0, 0.5]
    assert params.enable_log_probs == [False, True]


DEVICE = DeviceSupport(penalties=True, top_logprobs=20)


@pytest.mark.parametrize(
    "params,expected",
    [
        (SamplingParams(presence_penalty=0.5), None),
        (SamplingParams(repetition_penalty=1.2, temperature=0.0), None),
        # Greedy, or a top-k no larger than what the device returns: the sampled token is
        # among the device's top log-probs.
        (SamplingParams(temperature=0.0, logprobs=5), None),
        (SamplingParams(temperature=0.9, top_k=8, logprobs=5), None),
        (SamplingParams(temperature=0.9, top_k=1, logprobs=0), None),
        # Otherwise the host: the sampled token may lie outside them, or more are asked.
        (SamplingParams(temperature=0.9, logprobs=2), "logprobs"),
        (SamplingParams(temperature=0.9, top_k=50, logprobs=2), "logprobs"),
        (SamplingParams(temperature=0.0, logprobs=21), "logprobs"),
        (SamplingParams(min_p=0.1, temperature=1.0), "min_p"),
    ],
)
def test_what_a_generator_declares_keeps_on_the_device(params, expected):
    assert host_reason(params, DEVICE) == expected
    # A generator declaring nothing: penalties and logprobs go to the host.
    if params.logprobs is not None or params.presence_penalty or params.repetition_penalty != 1.0:
        assert host_reason(params) in ("logprobs", "penalties")


# TT's sampler keeps a fixed top-32 candidate set (vllm-tt-plugin docs/MODEL_CAPABILITIES.md:
# a row with temperature > 0 and top_k < 1 or top_k > max_device_top_k samples on the host).
BOUNDED = DeviceSupport(penalties=True, top_k=32)


@pytest.mark.parametrize(
    "params,expected",
    [
        (SamplingParams(temperature=0.8, top_k=1), None),  # greedy by top_k
        (SamplingParams(temperature=0.8, top_k=31), None),
        (SamplingParams(temperature=0.8, top_k=32), None),  # K itself: on the device
        (SamplingParams(temperature=0.8, top_k=33), "top_k"),  # above K
        (SamplingParams(temperature=0.8, top_k=0), "top_k"),  # no cut: the whole vocabulary
        (SamplingParams(temperature=0.8, top_k=-1), "top_k"),
        (SamplingParams(temperature=0.0, top_k=0), None),  # greedy rows are not bounded
        (SamplingParams(temperature=0.0, top_k=500), None),
    ],
)
def test_max_device_top_k_bounds_stochastic_rows(params, expected):
    assert host_reason(params, BOUNDED) == expected
    # Without the key (None) the device takes any top-k.
    assert host_reason(params, DeviceSupport(penalties=True)) is None


def test_one_row_beyond_max_device_top_k_sends_the_batch_to_the_host():
    rows = [SamplingParams(temperature=0.0), SamplingParams(temperature=0.7, top_k=8)]
    common = dict(
        is_prefill=False,
        mode="all",
        always_host=False,
        custom_logits_processors=False,
        structured=False,
        support=BOUNDED,
    )
    assert batch_host_reason(rows, **common) is None
    rows.append(SamplingParams(temperature=0.7, top_k=0))
    assert batch_host_reason(rows, **common) == "top_k"


@pytest.mark.parametrize(
    "capabilities,history,expected",
    [
        # The reference plugin's defaults: penalties on, no top-k bound, no top log-probs.
        ({}, True, DeviceSupport(penalties=True)),
        ({}, False, DeviceSupport(penalties=False)),  # decode takes no history
        ({"supports_device_penalties": False}, True, DeviceSupport(penalties=False)),
        # Qwen3.6-27B autoport: max_device_top_k 32, penalties off.
        (
            {"max_device_top_k": 32, "supports_device_penalties": False},
            True,
            DeviceSupport(penalties=False, top_k=32),
        ),
        # The torch reference generator: 20 top log-probs, any top-k.
        ({"max_device_logprobs": 20}, True, DeviceSupport(penalties=True, top_logprobs=20)),
    ],
)
def test_device_support_reads_the_keys_with_the_plugins_defaults(capabilities, history, expected):
    assert device_support(capabilities, takes_history=history) == expected


GRAMMAR = SamplingParams(
    temperature=0.0, structured_outputs=StructuredOutputsParams(json={"type": "object"})
)


@pytest.mark.parametrize(
    "declared,takes_bitmask,grammar",
    [(True, True, True), (True, False, False), (False, True, False)],
)
def test_device_grammar_needs_the_key_and_the_bitmask_keyword(declared, takes_bitmask, grammar):
    """A declaration the decode call cannot carry (no `grammar_bitmask` keyword) would
    sample structured rows unconstrained: the host samples them then."""
    support = device_support(
        {"supports_device_grammar": declared}, takes_history=True, takes_bitmask=takes_bitmask
    )
    assert support.grammar is grammar


def test_a_class_with_tt_metals_split_sampler_keeps_structured_batches_on_the_host():
    """TT-Metal's shared `Generator` takes the run-time bitmask in `sample_decode_on_device`
    (its `decode_forward` keyword serves the trace warm-up): that route is not driven, so
    the bitmask is never sent to its `decode_forward`."""
    support = device_support(
        {"supports_device_grammar": True},
        takes_history=True,
        takes_bitmask=True,
        split_sampling=True,
    )
    assert support.grammar is False


def test_a_device_grammar_serves_structured_decodes_and_leaves_prefills_to_the_host():
    grammar = DeviceSupport(grammar=True)
    common = dict(mode="all", always_host=False, custom_logits_processors=False, structured=True)
    rows = [GRAMMAR, PLAIN]
    assert batch_host_reason(rows, is_prefill=False, support=grammar, **common) is None
    assert batch_host_reason(rows, is_prefill=True, support=grammar, **common) == (
        "structured_output"
    )
    # Without the capability every structured batch samples on the host.
    assert batch_host_reason(rows, is_prefill=False, **common) == "structured_output"
    # Log-probs of a structured request stay on the host (the plugin's first contract).
    with_logprobs = DeviceSupport(grammar=True, top_logprobs=20)
    asking = SamplingParams(
        temperature=0.0,
        logprobs=2,
        structured_outputs=StructuredOutputsParams(json={"type": "object"}),
    )
    assert host_reason(asking, with_logprobs, decode=True) == "structured_output"
    assert host_reason(GRAMMAR, with_logprobs, decode=True) is None
    assert host_reason(GRAMMAR, with_logprobs) == "structured_output"  # a prefill row


def test_a_greedy_only_device_sampler_sends_sampled_rows_to_the_host():
    """The Gemma 4 31B autoport's `sample_on_device_policy: "greedy_only"` (its device
    sampler raises on a stochastic row) and its spelling of the penalties key."""
    support = device_support(
        {
            "sample_on_device_policy": "greedy_only",
            "supports_device_sampling_penalties": False,
        },
        takes_history=True,
    )
    assert support.greedy_only and not support.penalties
    assert host_reason(PLAIN, support) == "greedy_only"
    assert host_reason(SamplingParams(temperature=0.0), support) is None
    assert host_reason(SamplingParams(temperature=0.8, top_k=1), support) is None
    assert host_reason(PLAIN, device_support({}, takes_history=True)) is None
