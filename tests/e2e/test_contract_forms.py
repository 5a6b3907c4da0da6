"""Both decode forms of the generator contract, served: decode input-update contract v1
(the demo bundle) and the legacy `reset_batch` form (a bundle of the reference generator's
legacy variant, which takes no `**kwargs`: a v1 command sent to it would fail the step).

The two forms run the same model and the same sampler, so every output must agree,
greedy or seeded, alone or in a batch that changes while it decodes.
"""

from __future__ import annotations

import pytest

from tests.e2e.test_sampling_async import (
    GREEDY,
    Background,
    complete,
    concurrently,
    output_ids,
    random_ids,
)

pytestmark = pytest.mark.server


def test_each_server_logs_the_contract_form_it_drives(demo_server, legacy_server):
    assert "decode contract v1" in demo_server.log_since(0)
    assert "decode contract legacy (reset_batch)" in legacy_server.log_since(0)


def test_legacy_form_serves_greedy_and_async_like_v1(demo_server, legacy_server, reference):
    prompt = random_ids(900, 10, reference.vocab_size)
    before = legacy_server.settled_stats()
    tokens = output_ids(complete(legacy_server, prompt, max_tokens=16, **GREEDY))
    delta = legacy_server.stats_delta(before)
    assert tokens == reference.greedy(prompt, 16)
    assert tokens == output_ids(complete(demo_server, prompt, max_tokens=16, **GREEDY))
    assert delta["sampling.device"] == 16 and delta["decode.async"] == 15


def test_mixed_seeded_batches_agree_across_forms(demo_server, legacy_server, reference):
    """Seeded and greedy requests sent together, with a long request decoding: a batch
    whose layout changes several times. Seeds hold across the changes on both forms."""
    vocab = reference.vocab_size
    prompts = [random_ids(910 + i, 6 + 2 * i, vocab) for i in range(4)]
    options = [
        {"temperature": 0.9, "seed": 5},
        {"temperature": 1.3, "top_k": 20, "seed": 6},
        {"temperature": 0.0},
        {"temperature": 0.7, "top_p": 0.8, "seed": 7},
    ]

    def run(server):
        background = Background(server, random_ids(930, 10, vocab), max_tokens=120)
        background.wait_for(3)
        outputs = []
        for prompt, option in zip(prompts, options):
            outputs.append(concurrently(server, [prompt, prompt[::-1]], max_tokens=12, **option))
        return outputs, background.result()

    v1, v1_long = run(demo_server)
    legacy, legacy_long = run(legacy_server)
    assert v1 == legacy
    assert v1_long == legacy_long == reference.greedy(random_ids(930, 10, vocab), 120)
    # Seeded requests are reproducible whatever else is in the batch: alone, the same.
    alone = output_ids(complete(demo_server, prompts[0], max_tokens=12, **options[0]))
    assert alone == v1[0][0]
