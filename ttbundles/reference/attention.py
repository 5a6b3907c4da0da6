"""RMSNorm, RoPE and causal attention over the paged KV cache, batched per attention group.

Sliding-window layers attend through the same cache with a narrower mask: every position's
K/V stays in the paged cache (a full-attention cache for every layer: correct, not lean),
and a query at position p sees only the keys at `p - window < c <= p`
(`format.attention_window`, as transformers masks them).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension (as transformers: normalise, then scale)."""
    variance = x.pow(2).mean(-1, keepdim=True)
    return weight * (x * torch.rsqrt(variance + eps))


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, scaling: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[T, D]` for absolute positions `[T]` (the two halves repeat)."""
    freqs = positions[:, None].float() * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * scaling, angles.sin() * scaling


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate `x [T, heads, D]` by its positions' angles (the "rotate half" layout HF uses)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


def context_blocks(
    block_table: torch.Tensor, last_positions: torch.Tensor, cache_shape: torch.Size
) -> torch.Tensor:
    """Where n sequences' contexts live in a paged cache, for `gather_context`.

    The cache `[N, KV, Bs, D]` is viewed as `[N * KV, Bs * D]`: entry `block * KV + head`
    holds one head's K (or V) for the Bs positions of one block. Returns those entries
    `[n, KV, nb]` for the blocks holding positions 0 .. nb * Bs - 1, where nb blocks
    cover the longest context (the largest last position).

    block_table `[n, >= nb]`: the rows' page-table rows (position p of row i is in block
    `block_table[i, p // Bs]`, slot `p % Bs`); last_positions `[n]`: each row's last
    context position. A row with fewer blocks repeats its last block up to nb, so only
    blocks the row owns are read (a padded page table may hold anything past them);
    attention masks every position past the row's last out.
    """
    _, kv_heads, block_size, _ = cache_shape
    last_block = last_positions // block_size  # [n]
    num_blocks = int(last_block.max()) + 1
    block_index = torch.arange(num_blocks)[None, :].minimum(last_block[:, None])  # [n, nb]
    blocks = block_table.gather(1, block_index)  # [n, nb]
    heads = torch.arange(kv_heads)[None, :, None]  # [1, KV, 1]
    return blocks[:, None, :] * kv_heads + heads  # [n, KV, nb]


def gather_context(cache: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """K or V of n sequences' contexts, `[n, KV, C, D]` with C = nb * Bs (key c at
    position c), read from a paged cache `[N, KV, Bs, D]` in one index_select of the
    `[n, KV, nb]` entries from `context_blocks`."""
    _, _, block_size, head_dim = cache.shape
    n, kv_heads, num_blocks = blocks.shape
    picked = cache.view(-1, block_size * head_dim).index_select(0, blocks.reshape(-1))
    return picked.view(n, kv_heads, num_blocks * block_size, head_dim)


def causal_mask(
    query_positions: torch.Tensor, length: int, window: int | None = None
) -> torch.Tensor:
    """Which keys each query sees, `[n, L, C]` bool with C = length: the key at position c
    is visible to a query at position p iff c <= p, and with a sliding `window` also
    c > p - window (transformers' `kv_idx > q_idx - sliding_window`). query_positions
    `[n, L]` (absolute)."""
    key_positions = torch.arange(length)[None, None, :]  # [1, 1, C]
    queries = query_positions[:, :, None]  # [n, L, 1]
    visible = key_positions <= queries
    if window is not None:
        visible &= key_positions > queries - window
    return visible


def causal_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, scale: float
) -> torch.Tensor:
    """Attention of n sequences' new tokens over their contexts, in one call.

    q `[n, L, H, D]`; k, v `[n, KV, C, D]`, key c at position c; visible `[n, L, C]` from
    `causal_mask`. Per row and head: `softmax(q @ k.T * scale, masked to visible) @ v`.
    Grouped-query attention: KV head j serves query heads j*H/KV .. (j+1)*H/KV - 1
    (`enable_gqa` repeats K/V heads exactly like `repeat_interleave(H // KV, dim=1)`).
    Returns `[n, L, H, D]`.
    """
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k, v, attn_mask=visible[:, None], scale=scale, enable_gqa=True
    )  # [n, H, L, D]
    return out.transpose(1, 2)


@dataclass(frozen=True)
class Segment:
    """One row's consecutive new tokens: positions start .. start + len(tokens) - 1."""

    row: int
    tokens: torch.Tensor  # [L] int64
    start: int
    # The batch slot whose recurrent state the row continues (a GDN hybrid's,
    # `reference.gdn`): prefill's `empty_slots[row]`; None: the row is its slot (decode).
    slot: int | None = None

    @property
    def end(self) -> int:
        return self.start + len(self.tokens)


@dataclass(frozen=True)
class AttentionGroup:
    """Rows whose new tokens attend in one batched call: n rows of L tokens each, stored
    row after row as `span` of the flattened `[T]` tokens. Built once per forward pass
    (the page table and positions do not change between layers), used by every layer."""

    span: slice  # the group's n * L tokens in the flattened batch
    blocks: torch.Tensor  # [n, KV, nb] where the contexts are (`context_blocks`)
    visible: torch.Tensor  # [n, L, C] bool; C = nb * Bs covers the longest context
    # The same for sliding-window layers (keys older than the window masked too); None
    # when the model has no window.
    visible_in_window: torch.Tensor | None = None

    @classmethod
    def build(
        cls,
        span: slice,
        query_positions: torch.Tensor,
        block_table: torch.Tensor,
        cache_shape: torch.Size,
        window: int | None = None,
    ) -> AttentionGroup:
        """query_positions `[n, L]` (ascending per row, the last one ends the row's
        context); block_table `[n, max_blocks]`, the rows' page-table rows; `window`: the
        model's sliding window, for the layers that have one."""
        blocks = context_blocks(block_table, query_positions[:, -1], cache_shape)
        length = blocks.shape[-1] * cache_shape[2]  # C = nb * Bs
        windowed = None if window is None else causal_mask(query_positions, length, window)
        return cls(span, blocks, causal_mask(query_positions, length), windowed)

    def attend(
        self,
        q: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        scale: float,
        sliding: bool = False,
    ) -> torch.Tensor:
        """The group's attention output `[n * L, H, D]`; q `[T, H, D]` is the whole
        batch's, the caches `[N, KV, Bs, D]` already hold this layer's new K/V.
        `sliding`: the layer has the model's window (the group was built with it)."""
        visible = self.visible
        if sliding:
            if self.visible_in_window is None:
                raise ValueError("a sliding-window layer in a group built without the window")
            visible = self.visible_in_window
        n, length, _ = visible.shape
        out = causal_attention(
            q[self.span].unflatten(0, (n, length)),  # [n, L, H, D]
            gather_context(k_cache, self.blocks),  # [n, KV, C, D]
            gather_context(v_cache, self.blocks),
            visible,
            scale,
        )
        return out.flatten(0, 1)


def attention_groups(
    segments: list[Segment],
    positions: torch.Tensor,
    page_table: torch.Tensor,
    cache_shape: torch.Size,
    window: int | None = None,
) -> list[AttentionGroup]:
    """How the segments' attention is batched; the groups' spans tile the flattened tokens.

    Decode (every segment one token): all rows in one group, one attention call for the
    batch, contexts padded to the longest. Prefill: one group per row, a per-row loop on
    purpose: chunks differ in length (1 .. thousands of tokens), and a padded batch would
    make every row pay for the longest chunk and the longest context, with scores of
    `[n, H, L_max, C_max]`; one row at a time they stay `[H, L, C]` of that row.
    positions `[T]` are the flattened tokens' positions; `window`: the model's sliding
    window (each group then also holds the windowed mask).
    """
    if all(len(s.tokens) == 1 for s in segments):
        span = slice(0, len(segments))
        rows = [s.row for s in segments]
        return [
            AttentionGroup.build(span, positions[span, None], page_table[rows], cache_shape, window)
        ]
    groups, offset = [], 0
    for segment in segments:
        span = slice(offset, offset + len(segment.tokens))
        groups.append(
            AttentionGroup.build(
                span, positions[None, span], page_table[segment.row][None], cache_shape, window
            )
        )
        offset = span.stop
    return groups
