"""The reference generator's own drafter: early exit from the target's first layers.

A model-owned drafter (vLLM's `custom_class` method, `propose_draft_tokens` in
`format.speculative`) that needs no weights of its own: it runs the target's first
`layers` decoder layers, then the target's final norm and LM head, greedily, K tokens
ahead (self-speculation by early exit, as LayerSkip drafts). Because those layers are the
target's, the K/V the target already wrote into the paged cache for a row's committed
positions are exactly what the drafter's layers would have computed there, so it reads
them (the drafter shares the target's caches: `drafter_state="shared_with_target"`) and
keeps only its own drafted positions in a scratch K/V that is dropped after the call. It
never writes the paged cache: the blocks past a row's committed length may not be
allocated yet.

The verify then checks every draft against the full model, so a poor draft costs only
its rejection; greedy output is the full model's whatever the drafter proposes.
"""

from __future__ import annotations

from typing import Any

import torch

from ttbundles.reference.attention import causal_attention, context_blocks, gather_context


@torch.no_grad()
def early_exit_drafts(
    model: Any,
    layers: int,
    last_tokens: torch.Tensor,
    last_positions: torch.Tensor,
    block_table: torch.Tensor,
    kv_cache: list[list[torch.Tensor]],
    num_drafts: int,
) -> torch.Tensor:
    """Greedy drafts `[n, num_drafts]` int64 for n rows. `model` is the target, a
    `ReferenceLlamaGenerator` (its weights, dims, rope and scale; not imported here: the
    generator imports this module); `kv_cache` its per-layer `[k_cache, v_cache]`.

    Row i's last committed token `last_tokens[i]` sits at `last_positions[i]` (p, not yet
    in the cache); positions 0 .. p - 1 are in the cache through `block_table[i]` (its
    page-table row). Each drafting step feeds one token per row through the first
    `layers` layers at positions p, p + 1, ..., attending over the cached context and
    the tokens drafted so far.
    """
    weights = model.weights
    n = last_tokens.shape[0]
    cache_shape = kv_cache[0][0].shape
    # The cached context: positions 0 .. p - 1 (blocks up to p - 1; later keys masked).
    blocks = context_blocks(block_table, (last_positions - 1).clamp(min=0), cache_shape)
    context_length = blocks.shape[-1] * cache_shape[2]
    in_context = torch.arange(context_length)[None, :] < last_positions[:, None]  # [n, C]
    context = [
        (gather_context(k_cache, blocks), gather_context(v_cache, blocks))
        for k_cache, v_cache in kv_cache[:layers]
    ]  # each [n, KV, C, D]
    own_k: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    own_v: list[list[torch.Tensor]] = [[] for _ in range(layers)]

    tokens, positions = last_tokens.long(), last_positions.long()
    drafts = []
    for step in range(num_drafts):
        x = model.embed(tokens)  # [n, hidden]
        cos, sin = model.rope(positions)
        rotations = model.layer_rope(positions, cos, sin)
        visible = torch.cat([in_context, torch.ones(n, step + 1, dtype=torch.bool)], dim=1)
        window = model.window
        if window is not None:
            # The query at q = p + step sees keys c > q - window: cached positions c, and
            # its own drafted positions p + j (j = 0 .. step).
            key_positions = torch.cat(
                [
                    torch.arange(context_length)[None, :].expand(n, -1),
                    positions[:, None] - step + torch.arange(step + 1)[None, :],
                ],
                dim=1,
            )  # [n, C + step + 1]
            in_window = visible & (key_positions > positions[:, None] - window.size)
        for index, layer in enumerate(weights.layers[:layers]):
            q, k, v = model.attention_inputs(layer, x, *rotations[index])
            own_k[index].append(k)
            own_v[index].append(v)
            keys = torch.cat([context[index][0], torch.stack(own_k[index], dim=2)], dim=2)
            values = torch.cat([context[index][1], torch.stack(own_v[index], dim=2)], dim=2)
            sees = visible
            if window is not None and index in window.layers:
                sees = in_window
            attended = causal_attention(
                q[:, None], keys, values, sees[:, None, :], model.scale
            )  # [n, 1, H, D]
            x = model.layer_output(layer, x, attended)
        tokens = model.lm_logits(x).argmax(dim=-1)
        drafts.append(tokens)
        positions = positions + 1
    return torch.stack(drafts, dim=1)
