"""Sampling on the "device": temperature, top-k, top-p and seeds, row by row."""

from __future__ import annotations

import torch

from ttbundles.format.contract import SamplingParamsBatch


def seeded_generator(seed: int, position: int) -> torch.Generator:
    """A generator that depends only on (seed, position): same seed, same token, whatever
    else is in the batch and however the batch is ordered."""
    return torch.Generator().manual_seed((seed * 1000003 + position) % 2**63)


def filtered_probs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """Sampling distribution `[V]` of one row: temperature, then top-k, then top-p.

    top_k 0 or >= V: no cut. top_p >= 1: no cut; otherwise keep the most likely tokens
    until their mass reaches top_p (the token that crosses it is kept, and always at
    least one token).
    """
    scaled = logits / temperature
    vocab = scaled.shape[-1]
    if 0 < top_k < vocab:
        kth_largest = torch.topk(scaled, top_k).values[-1]
        scaled = scaled.masked_fill(scaled < kth_largest, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        mass_before = sorted_probs.cumsum(0) - sorted_probs
        drop_sorted = mass_before >= top_p
        drop_sorted[0] = False
        drop = torch.zeros_like(drop_sorted).scatter(0, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum()
    return probs


def sample_tokens(
    logits: torch.Tensor,
    params: SamplingParamsBatch,
    positions: list[int],
    active: list[bool],
    unseeded: torch.Generator,
) -> torch.Tensor:
    """One token per row `[B]` int64 from logits `[B, V]`.

    `positions[i]` is the position the drawn token will occupy (it keys seeded rows).
    Inactive (padding) rows get token 0. A SamplingParamsBatch of one entry applies to
    every row.
    """
    greedy = torch.argmax(logits, dim=-1).tolist()  # every row's argmax, in one call
    out = [0] * logits.shape[0]
    for i in range(logits.shape[0]):
        if not active[i]:
            continue
        j = 0 if len(params) == 1 else i
        temperature = float(params.temperature[j])
        if temperature <= 0.0:
            out[i] = greedy[i]
            continue
        probs = filtered_probs(logits[i], temperature, int(params.top_k[j]), float(params.top_p[j]))
        seed = params.seed[j] if j < len(params.seed) else None
        generator = unseeded if seed is None else seeded_generator(int(seed), positions[i])
        out[i] = int(torch.multinomial(probs, 1, generator=generator)[0])
    return torch.tensor(out, dtype=torch.int64)
