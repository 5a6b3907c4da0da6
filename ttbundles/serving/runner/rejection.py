"""Accepting drafts against the target's verify output, with vLLM's semantics
(`vllm/v1/sample/rejection_sampler.py`, 0.33.0; 0.34.0's Triton kernels in
`vllm/v1/worker/gpu/spec_decode/rejection_sampler.py` compute the same thing), in torch
on the host.

For a row with drafts d_0 .. d_{n-1} and the target's logits at candidate positions
0 .. n (position j predicts the token draft j proposes; position n the bonus):

- greedy (temperature below vLLM's epsilon): emit the target's argmax at each position
  while it equals the draft; at the first mismatch emit the argmax (the correction) and
  stop; when every draft matched, also emit the argmax at n (the bonus);
- sampled: p_j is the target's distribution at j after temperature, top-k and top-p (the
  parameters vLLM's rejection sampler applies). The n-gram proposer has no draft
  distribution (draft probability 1, as vLLM treats it), so draft j is accepted when
  `p_j(d_j) >= u_j`, u_j uniform on [0, 1); at the first rejection the recovered token is
  drawn from p_j with d_j removed, renormalised (vLLM's `max(p - q, 0)` with q one-hot
  on the draft), and the row stops; when every draft was accepted the bonus is drawn from
  p_n. Each emitted token is then distributed exactly as the target's own sample: accept
  with probability p(d), else draw x != d with probability p(x) / (1 - p(d)).

Draws use the exponential race (`argmax(p / e)`, e ~ Exp(1)), as vLLM's samplers do. A
seeded request draws from a generator seeded for (seed, the position of its first token
this step) (`format.contract.seed_for_position`): the same step gives the same tokens
whatever the batch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ttbundles.format.contract import seed_for_position

GREEDY_EPSILON = 1e-5
"""vLLM's: a temperature below it samples greedily."""


def is_greedy(params: Any) -> bool:
    return params is None or params.temperature < GREEDY_EPSILON


def target_probs(logits: torch.Tensor, params: Any) -> torch.Tensor:
    """`[P, V]` probabilities of one row's candidate positions: the softmax of
    `target_logits`."""
    return target_logits(logits, params).softmax(dim=-1)


def target_logits(logits: torch.Tensor, params: Any) -> torch.Tensor:
    """`[P, V]` float32 logits of one sampled row's candidate positions as vLLM's
    rejection sampler processes them before its draws (and reports them in a
    `processed_*` logprobs mode): over temperature, then vLLM's top-k (keep the k
    largest, ties kept) and top-p (drop the tokens whose cumulative probability,
    smallest first, stays within 1 - p; the largest always stays) as -inf. A greedy row's
    are its raw logits (vLLM applies no temperature to it)."""
    if is_greedy(params):
        return logits.float()
    scaled = logits.float() / float(params.temperature)
    vocab = scaled.shape[-1]
    top_k = int(params.top_k or 0)
    if 0 < top_k < vocab:
        kth = scaled.topk(top_k, dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    top_p = float(params.top_p if params.top_p is not None else 1.0)
    if top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=False)
        cumulative = ordered.softmax(dim=-1).cumsum(dim=-1)
        drop = cumulative <= 1 - top_p
        drop[:, -1] = False
        scaled = scaled.masked_fill(drop.scatter(-1, order, drop), float("-inf"))
    return scaled


def _race(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One draw from `probs` `[V]`: the exponential race."""
    noise = torch.empty_like(probs).exponential_(generator=generator)
    return int((probs / noise).argmax())


def accept_row(
    drafts: Sequence[int],
    logits: torch.Tensor,
    params: Any,
    *,
    position: int,
) -> list[int]:
    """The tokens one row commits: `drafts` (n of them) verified against `logits`
    `[n + 1, V]` (row j: the target's logits at candidate position j), `params` the
    request's sampling parameters, `position` where the row's first committed token goes
    (for a seeded request's generator). Between 1 and n + 1 tokens."""
    n = len(drafts)
    if is_greedy(params):
        chosen = logits[: n + 1].argmax(dim=-1).tolist()
        out: list[int] = []
        for j, token in enumerate(chosen):
            out.append(int(token))
            if j == n or token != drafts[j]:
                break
        return out
    generator = None
    if params.seed is not None:
        generator = torch.Generator().manual_seed(seed_for_position(int(params.seed), position))
    probs = target_probs(logits[: n + 1], params)
    uniform = torch.rand(n, generator=generator) if n else torch.empty(0)
    out = []
    for j, draft in enumerate(drafts):
        if float(probs[j, draft]) >= float(uniform[j]):
            out.append(int(draft))
            continue
        residual = probs[j].clone()
        residual[draft] = 0.0
        out.append(_race(residual, generator))
        return out
    out.append(_race(probs[n], generator))
    return out
