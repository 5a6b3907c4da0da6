"""Prompt log-probs on a recurrent-state hybrid (the tiny Qwen3.5), in-process: a prompt
over three prefill chunks, each chunk's every position scored on the state the earlier
chunks left, in both ownership forms, equal to transformers' log-softmax of the whole
prompt (within float32), and the request's tokens still transformers'."""

from __future__ import annotations

import pytest
import torch
import transformers
from vllm.v1.outputs import AsyncModelRunnerOutput

from tests.test_recurrent_serving import CHUNK, build, build_vllm_owned, prompt, qwen  # noqa: F401
from tests.test_runner_steps import request

TOP = 3


def served(scheduler, runner, requests) -> tuple[dict, dict]:
    """The engine core's loop (as `test_runner_steps.run`), keeping each request's prompt
    log-probs chunk by chunk: (tokens, {request: (ids [L-1, 1+TOP], values)})."""
    for r in requests:
        scheduler.add_request(r)
    scored: dict[str, list] = {}
    for _ in range(200):
        if not scheduler.has_requests():
            break
        output = scheduler.schedule()
        runner.execute_model(output)
        result = runner.sample_tokens(scheduler.get_grammar_bitmask(output))
        if isinstance(result, AsyncModelRunnerOutput):
            result = result.get_output()
        for req_id, tensors in (result.prompt_logprobs_dict or {}).items():
            if tensors is not None:
                scored.setdefault(req_id, []).append(tensors)
        scheduler.update_from_output(output, result)
    joined = {
        req_id: (
            torch.cat([torch.as_tensor(t.logprob_token_ids) for t in parts]),
            torch.cat([torch.as_tensor(t.logprobs) for t in parts]),
        )
        for req_id, parts in scored.items()
    }
    return {r.request_id: list(r.output_token_ids) for r in requests}, joined


@pytest.mark.parametrize("form", ["generator", "vllm"])
def test_prompt_logprobs_over_chunks_equal_transformers(qwen, form):  # noqa: F811
    checkpoint, greedy = qwen
    scheduler, runner, *_ = (build if form == "generator" else build_vllm_owned)(
        checkpoint, prompt_logprobs=True
    )
    ids = prompt(7, 60)
    assert len(ids) > 2 * CHUNK
    tokens, scored = served(
        scheduler, runner, [request("p", ids, 4, temperature=0.0, prompt_logprobs=TOP)]
    )
    assert tokens["p"] == greedy(ids, 4)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([ids])).logits[0, :-1].float(), -1)
    got_ids, got = scored["p"]
    assert got_ids.shape == (len(ids) - 1, 1 + TOP)
    # Column 0: each next prompt token's log-prob; then the top TOP, best first.
    assert got_ids[:, 0].tolist() == ids[1:]
    want = expected.gather(1, torch.tensor(ids[1:]).unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(got[:, 0].float(), want, atol=1e-4, rtol=1e-4)
    assert got_ids[:, 1:].tolist() == expected.topk(TOP, -1).indices.tolist()
