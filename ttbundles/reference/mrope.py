"""Multimodal RoPE (M-RoPE) of Qwen2-VL / Qwen2.5-VL: where each token is, in three axes.

A text token at sequence index i sits at (p, p, p) for a running position p. An image's
placeholder tokens (its merged patches, `t x h x w / M^2` of them, row by row) sit at
(p + frame, p + row, p + column) with the image starting at p; the text after the image
resumes at p + max(h, w) / M. So an image of many tokens advances the running position
by only its larger side, and a row's positions end lower than its length: the row's
"rope delta" is `max position + 1 - length`, and every later token (decode) sits at
`index + delta` on all three axes. This is transformers' `get_rope_index` for images
(vLLM's `get_mrope_input_positions` computes the same).

The rotary frequencies are split into three sections (`mrope_section`, summing to
head_dim / 2): section 0 rotates by the temporal position, 1 by the row, 2 by the
column; for pure text the three are equal and it is ordinary RoPE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ImageSpan:
    """One image's placeholder tokens in a row: sequence indices start .. start+length-1."""

    start: int
    length: int
    grid: tuple[int, int, int]  # (frames, patch rows, patch columns)

    @property
    def end(self) -> int:
        return self.start + self.length


def image_spans(
    token_ids: torch.Tensor,
    image_token_id: int,
    grids: list[tuple[int, int, int]],
    merge: int,
) -> list[ImageSpan]:
    """Where each image's placeholders are in `token_ids [L]` (the row from index 0 up to
    the end of the chunk computed now). Images are matched to runs of `image_token_id` in
    order; an image whose run starts at or after L lies in a later chunk and is left out.

    Raises ValueError when the placeholders cannot belong to these images: a run shorter
    than its image's token count (inside L). Placeholder ids after the last image are
    text: a model can generate that id, and a resumed or prefix-cached request replays its
    output (transformers' `generate` places generated tokens as text too).
    """
    ids = token_ids.tolist()
    length = len(ids)
    spans: list[ImageSpan] = []
    cursor = 0
    for number, grid in enumerate(grids):
        t, h, w = grid
        count = t * h * w // (merge * merge)
        start = next((i for i in range(cursor, length) if ids[i] == image_token_id), None)
        if start is None:
            break  # this image (and any after it) comes in a later chunk
        present = min(start + count, length)
        bad = next((i for i in range(start, present) if ids[i] != image_token_id), None)
        if bad is not None:
            raise ValueError(
                f"image {number} (grid {t}x{h}x{w}) needs {count} placeholder tokens from "
                f"index {start}, but index {bad} holds token {ids[bad]}: the prompt's image "
                "placeholders do not match the images sent with it"
            )
        spans.append(ImageSpan(start, count, grid))
        cursor = start + count
    return spans


def mrope_positions(length: int, spans: list[ImageSpan], merge: int) -> tuple[torch.Tensor, int]:
    """Positions `[3, length]` (temporal, row, column) of a row's first `length` tokens,
    and the row's rope delta after them (`max + 1 - length`).

    `spans` from `image_spans`; the last one may run past `length` (a chunk that ends
    inside an image): only its first tokens are placed.
    """
    parts = []
    cursor = 0  # sequence index
    position = 0  # running text position
    for span in spans:
        text = span.start - cursor
        parts.append(torch.arange(text).expand(3, -1) + position)
        position += text
        t, h, w = span.grid
        gh, gw = h // merge, w // merge
        frame = torch.arange(t)[:, None, None].expand(t, gh, gw)
        row = torch.arange(gh)[None, :, None].expand(t, gh, gw)
        col = torch.arange(gw)[None, None, :].expand(t, gh, gw)
        parts.append(torch.stack([frame, row, col]).reshape(3, -1) + position)
        position += max(gh, gw)
        cursor = span.end
    if cursor < length:
        parts.append(torch.arange(length - cursor).expand(3, -1) + position)
    positions = torch.cat(parts, dim=1)[:, :length] if parts else torch.zeros(3, 0)
    positions = positions.long()
    delta = int(positions.max()) + 1 - length if length else 0
    return positions, delta


def frequency_axes(sections: list[int], interleaved: bool = False) -> torch.Tensor:
    """Which axis (0 temporal, 1 row, 2 column) each of the D / 2 frequencies rotates by.

    Sectioned (Qwen2-VL, Qwen2.5-VL): the first `sections[0]` frequencies follow the
    temporal position, the next `sections[1]` the row, the last the column. Interleaved
    (Qwen3-VL): frequencies cycle temporal, row, column (j % 3) while each axis has
    frequencies left (row: j < 3 * sections[1], column: j < 3 * sections[2]); the rest
    follow the temporal position."""
    total = sum(sections)
    if not interleaved:
        return torch.repeat_interleave(torch.arange(len(sections)) % 3, torch.tensor(sections))
    j = torch.arange(total)
    axis = torch.zeros(total, dtype=torch.long)
    axis[(j % 3 == 1) & (j < 3 * sections[1])] = 1
    axis[(j % 3 == 2) & (j < 3 * sections[2])] = 2
    return axis


def mrope_cos_sin(
    positions: torch.Tensor,
    inv_freq: torch.Tensor,
    sections: list[int],
    scaling: float = 1.0,
    interleaved: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[T, D]` for positions `[3, T]`: frequency j takes its angle from its
    axis (`frequency_axes`), and the two halves repeat as in `attention.rope_cos_sin`."""
    if sum(sections) != inv_freq.shape[0]:
        raise ValueError(
            f"mrope_section {sections} sums to {sum(sections)}, not head_dim / 2 = "
            f"{inv_freq.shape[0]}"
        )
    axis = frequency_axes(sections, interleaved)
    chosen = positions.float()[axis]  # [D / 2, T]: frequency j's axis, per token
    freqs = chosen.T * inv_freq[None, :]  # [T, D / 2]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos() * scaling, angles.sin() * scaling
