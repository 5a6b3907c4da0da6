"""The runner's prompt logprobs from a prefill's every-position logits: chunks joined into
one prompt, the prompt token first with its rank, then the top k, handed over once."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from vllm import SamplingParams

from ttbundles.serving.binding import GeneratorContractError
from ttbundles.serving.runner.prompt_logprobs import PromptLogprobs

VOCAB = 11


def _request(prompt: list[int], k: int | None = 3):
    return SimpleNamespace(
        prompt_token_ids=prompt, sampling_params=SamplingParams(prompt_logprobs=k)
    )


def _chunk(full: torch.Tensor, start: int, end: int, width: int) -> torch.Tensor:
    """A row's [width, V] chunk logits: positions start .. end - 1 of `full`, zero after."""
    out = torch.zeros(width, VOCAB)
    out[: end - start] = full[start:end]
    return out


def test_two_chunks_make_the_whole_prompt_as_one_log_softmax():
    torch.manual_seed(0)
    prompt = [1, 4, 2, 8, 5, 7, 3]
    full = torch.randn(len(prompt), VOCAB)
    requests = {"a": _request(prompt), "b": _request([6, 9], k=None)}  # b: no prompt logprobs
    scores = PromptLogprobs()
    # First chunk: positions 0..3 of a, and b whole (it asks nothing).
    assert scores.rows(["a", "b"], requests, [0, 0]) == [0]
    every = torch.stack([_chunk(full, 0, 4, 4), torch.zeros(4, VOCAB)])
    assert scores.score("G", [0], every, [0, 0], [4, 2], ["a", "b"], requests) == {}
    # Last chunk: positions 4..6; position 6 predicts the first output token, not scored.
    assert scores.rows(["a"], requests, [4]) == [0]
    done = scores.score("G", [0], _chunk(full, 4, 7, 3)[None], [4], [7], ["a"], requests)
    tensors = done["a"]
    expected = torch.log_softmax(full[:-1], dim=-1)
    targets = torch.tensor(prompt[1:])
    assert tensors.logprob_token_ids.shape == (6, 4)
    assert torch.equal(tensors.logprob_token_ids[:, 0], targets)
    assert torch.allclose(tensors.logprobs[:, 0], expected.gather(1, targets[:, None])[:, 0])
    top_values, top_ids = expected.topk(3, dim=-1)
    assert torch.equal(tensors.logprob_token_ids[:, 1:], top_ids)
    assert torch.allclose(tensors.logprobs[:, 1:], top_values)
    ranks = (expected >= expected.gather(1, targets[:, None])).sum(-1)
    assert torch.equal(tensors.selected_token_ranks, ranks)
    # Handed over once: recomputing the prompt (a preemption) scores nothing again.
    assert scores.rows(["a"], requests, [0]) == []
    scores.forget("a")
    assert scores.rows(["a"], requests, [0]) == [0]


def test_minus_one_reports_every_token_and_a_one_token_prompt_reports_none():
    full = torch.randn(3, VOCAB)
    requests = {"a": _request([1, 2, 3], k=-1), "b": _request([5])}
    scores = PromptLogprobs()
    assert scores.rows(["a", "b"], requests, [0, 0]) == [0, 1]
    every = torch.stack([_chunk(full, 0, 3, 3), torch.zeros(3, VOCAB)])
    done = scores.score("G", [0, 1], every, [0, 0], [3, 1], ["a", "b"], requests)
    assert set(done) == {"a"}  # nothing predicts a one-token prompt's only token
    assert done["a"].logprob_token_ids.shape == (2, VOCAB + 1)


def test_a_prompt_recomputed_mid_way_starts_its_scores_again():
    full = torch.randn(6, VOCAB)
    requests = {"a": _request([1, 2, 3, 4, 5, 6])}
    scores = PromptLogprobs()
    scores.rows(["a"], requests, [0])
    scores.score("G", [0], _chunk(full, 0, 3, 3)[None], [0], [3], ["a"], requests)
    # Preempted after the first chunk: it prefills from 0 again.
    assert scores.rows(["a"], requests, [0]) == [0]
    done = scores.score("G", [0], _chunk(full, 0, 6, 6)[None], [0], [6], ["a"], requests)
    assert done["a"].logprobs.shape[0] == 5


def test_logits_of_one_position_instead_of_every_one_are_ttb241():
    requests = {"a": _request([1, 2, 3, 4])}
    scores = PromptLogprobs()
    scores.rows(["a"], requests, [0])
    with pytest.raises(GeneratorContractError) as raised:
        scores.score("Gen", [0], torch.zeros(1, 1, VOCAB), [0], [4], ["a"], requests)
    assert raised.value.diagnostics[0].code == "TTB241"
    assert "return_prompt_logits=True" in raised.value.diagnostics[0].message
