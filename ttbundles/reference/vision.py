"""The Qwen2.5-VL vision tower in plain torch: patches in, one embedding per image token out.

What a Qwen2.5-VL image goes through before the language model sees it (transformers'
`Qwen2_5_VisionTransformerPretrainedModel`, written out step by step):

1. Patch embedding. The processor already cut the image into patches of
   `C x T x P x P` values (3 x 2 x 14 x 14 = 1176 for the real model), one row of
   `pixel_values` each, in "block-major" order: the `M x M` patches that merge into one
   language-model token are consecutive. The checkpoint's Conv3d has kernel = stride = the
   patch, so it is a linear map of each row.
2. 2-D rotary positions. Each patch has a (row, column) in its image; half of every head
   rotates by the row, half by the column (`vision_rope`).
3. Windowed attention. Patches are reordered so that each window of
   `window_size / P / M` merged tokens per side is contiguous (`window_order`); most
   blocks attend within a window, the `fullatt_block_indexes` blocks within the whole
   image. Attention never crosses images.
4. Merger. RMSNorm, then each group of `M x M` patches is concatenated and mapped by a
   two-layer GELU MLP to the language model's hidden size; the window order is undone.

Shapes: `P` patches over all images of a call, `E` the tower's hidden size, `n` images,
`grid_thw [n, 3]` (frames, patch rows, patch columns per image).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.reference.attention import apply_rope, rms_norm
from ttbundles.reference.weights import Linear

VISION_NORM_EPS = 1e-6  # Qwen2.5-VL's vision RMSNorms use a fixed epsilon


@dataclass(frozen=True)
class VisionDims:
    """The vision tower's sizes, read once from the checkpoint's `vision_config`."""

    depth: int
    hidden_size: int  # E
    num_heads: int
    patch_size: int
    temporal_patch_size: int
    in_channels: int
    merge_size: int  # M: M x M patches make one language-model token
    window_size: int  # in pixels
    full_attention_blocks: frozenset[int]
    out_hidden_size: int  # the language model's hidden size
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def window_tokens(self) -> int:
        """Merged tokens per window side (real model: 112 / 14 / 2 = 4)."""
        return self.window_size // self.merge_size // self.patch_size

    @classmethod
    def from_hf_config(cls, vision_config: Any) -> VisionDims:
        act = getattr(vision_config, "hidden_act", "silu")
        if act not in ("silu", "swish"):
            raise NotImplementedError(
                f"vision hidden_act {act!r}: the reference vision MLP is SwiGLU (silu) only"
            )
        rope = getattr(vision_config, "rope_parameters", None) or {}
        return cls(
            depth=vision_config.depth,
            hidden_size=vision_config.hidden_size,
            num_heads=vision_config.num_heads,
            patch_size=vision_config.patch_size,
            temporal_patch_size=vision_config.temporal_patch_size,
            in_channels=getattr(vision_config, "in_channels", 3),
            merge_size=vision_config.spatial_merge_size,
            window_size=vision_config.window_size,
            full_attention_blocks=frozenset(vision_config.fullatt_block_indexes),
            out_hidden_size=vision_config.out_hidden_size,
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )


@dataclass
class VisionBlockWeights:
    norm1: torch.Tensor  # [E]
    qkv: Linear  # [3E, E]
    proj: Linear  # [E, E]
    norm2: torch.Tensor  # [E]
    gate_proj: Linear  # [I, E]
    up_proj: Linear  # [I, E]
    down_proj: Linear  # [E, I]


@dataclass
class VisionWeights:
    """All vision weights, float32, named after their role."""

    patch_embed: torch.Tensor  # [E, C * T * P * P]: the Conv3d kernel, flattened
    blocks: list[VisionBlockWeights]
    merger_norm: torch.Tensor  # [E]
    merger_fc1: Linear  # [E * M^2, E * M^2]
    merger_fc2: Linear  # [out_hidden, E * M^2]

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], dims: VisionDims) -> VisionWeights:
        """Keys without their prefix (`blocks.0.attn.qkv.weight`, `merger.ln_q.weight`,
        `patch_embed.proj.weight`, ...): see `vision_state`."""

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint lacks the vision weight {name}")
            return state[name].float()

        def linear(name: str) -> Linear:
            bias = state.get(f"{name}.bias")
            return Linear(take(f"{name}.weight"), None if bias is None else bias.float())

        blocks = [
            VisionBlockWeights(
                norm1=take(f"blocks.{i}.norm1.weight"),
                qkv=linear(f"blocks.{i}.attn.qkv"),
                proj=linear(f"blocks.{i}.attn.proj"),
                norm2=take(f"blocks.{i}.norm2.weight"),
                gate_proj=linear(f"blocks.{i}.mlp.gate_proj"),
                up_proj=linear(f"blocks.{i}.mlp.up_proj"),
                down_proj=linear(f"blocks.{i}.mlp.down_proj"),
            )
            for i in range(dims.depth)
        ]
        kernel = take("patch_embed.proj.weight")  # [E, C, T, P, P]
        return cls(
            patch_embed=kernel.reshape(kernel.shape[0], -1),
            blocks=blocks,
            merger_norm=take("merger.ln_q.weight"),
            merger_fc1=linear("merger.mlp.0"),
            merger_fc2=linear("merger.mlp.2"),
        )


def vision_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The vision tower's tensors with their prefix removed. Checkpoints spell it
    `visual.` (the hub's Qwen2.5-VL files) or `model.visual.` (transformers 5's layout)."""
    out = {}
    for name, tensor in state.items():
        for prefix in ("model.visual.", "visual."):
            if name.startswith(prefix):
                out[name[len(prefix) :]] = tensor
                break
    return out


def grid_list(grid_thw: torch.Tensor) -> list[tuple[int, int, int]]:
    """`[n, 3]` grids as (frames, patch rows, patch columns) tuples."""
    return [(int(t), int(h), int(w)) for t, h, w in grid_thw.reshape(-1, 3).tolist()]


def patch_positions(grid_thw: torch.Tensor, merge: int) -> torch.Tensor:
    """(row, column) of every patch in its image, `[P, 2]`, in the processor's block-major
    order: the M x M patches of one merged token are consecutive; frames repeat."""
    out = []
    for t, h, w in grid_list(grid_thw):
        rows = torch.arange(h)[:, None].expand(h, w)
        cols = torch.arange(w)[None, :].expand(h, w)
        block = (h // merge, merge, w // merge, merge)
        rows = rows.reshape(block).transpose(1, 2).flatten()
        cols = cols.reshape(block).transpose(1, 2).flatten()
        out.append(torch.stack([rows, cols], dim=-1).repeat(t, 1))
    return torch.cat(out)


def vision_rope(
    positions: torch.Tensor, head_dim: int, theta: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin `[P, head_dim]` of patches at `positions [P, 2]` (row, column).

    head_dim / 4 frequencies; the first quarter of the rotation angles is row x frequency,
    the second column x frequency, and the two halves repeat (the "rotate half" layout of
    `attention.apply_rope`)."""
    half = head_dim // 2
    inv_freq = 1.0 / (theta ** (torch.arange(0, half, 2, dtype=torch.float) / half))
    angles = positions[..., None].float() * inv_freq  # [P, 2, head_dim / 4]
    angles = angles.flatten(1)  # [P, head_dim / 2]: rows' angles, then columns'
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos(), angles.sin()


def window_order(grid_thw: torch.Tensor, dims: VisionDims) -> tuple[torch.Tensor, list[int]]:
    """The order of merged tokens that makes each attention window contiguous, and the
    window lengths in patches.

    Per image and frame, the grid of merged tokens is cut into windows of
    `window_tokens` x `window_tokens` from the top-left (edge windows are smaller);
    windows are listed row by row, tokens in a window row by row. Returns `order [P / M^2]`
    (position i holds merged token order[i]) and the lengths, in patches, of consecutive
    windows in that order (empty windows left out).
    """
    side = dims.window_tokens
    unit = dims.merge_size**2
    order, lengths, offset = [], [], 0
    for t, h, w in grid_list(grid_thw):
        gh, gw = h // dims.merge_size, w // dims.merge_size
        for frame in range(t):
            index = torch.arange(gh * gw).reshape(gh, gw) + offset + frame * gh * gw
            for top in range(0, gh, side):
                for left in range(0, gw, side):
                    window = index[top : top + side, left : left + side].flatten()
                    order.append(window)
                    lengths.append(len(window) * unit)
        offset += t * gh * gw
    return torch.cat(order), lengths


def image_lengths(grid_thw: torch.Tensor) -> list[int]:
    """Patches per frame, frame after frame (full attention spans one frame of one image)."""
    return [h * w for t, h, w in grid_list(grid_thw) for _ in range(t)]


def attend_within(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: list[int], scale: float
) -> torch.Tensor:
    """Bidirectional attention inside consecutive spans of the given lengths; q, k, v and
    the result `[P, heads, head_dim]`. One call per span: spans differ in length."""
    out = []
    offset = 0
    for length in lengths:
        span = slice(offset, offset + length)
        out.append(
            F.scaled_dot_product_attention(
                q[span].transpose(0, 1),
                k[span].transpose(0, 1),
                v[span].transpose(0, 1),
                scale=scale,
            ).transpose(0, 1)
        )
        offset += length
    return torch.cat(out)


class VisionTower:
    """Qwen2.5-VL's vision encoder (see the module docstring)."""

    def __init__(self, weights: VisionWeights, dims: VisionDims):
        self.weights = weights
        self.dims = dims
        self.scale = dims.head_dim**-0.5

    def tokens_per_image(self, grid_thw: torch.Tensor) -> list[int]:
        """Language-model tokens of each image: t * h * w / M^2."""
        return [t * h * w // self.dims.merge_size**2 for t, h, w in grid_list(grid_thw)]

    @torch.no_grad()
    def __call__(self, pixel_values: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        """Embeddings `[sum tokens_per_image, out_hidden]` of the images, image after
        image; pixel_values `[P, C * T * P * P]` (the images' patch rows, concatenated),
        grid_thw `[n, 3]`."""
        dims, weights = self.dims, self.weights
        grid_thw = torch.as_tensor(grid_thw).reshape(-1, 3)
        patches = sum(t * h * w for t, h, w in grid_list(grid_thw))
        if (
            pixel_values.shape[0] != patches
            or pixel_values.shape[-1] != weights.patch_embed.shape[1]
        ):
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)} but the grids "
                f"{grid_list(grid_thw)} need [{patches}, {weights.patch_embed.shape[1]}]"
            )
        unit = dims.merge_size**2
        order, window_lengths = window_order(grid_thw, dims)
        # Patch index of each position in window order (merged tokens keep their M^2 patches).
        patch_order = (order[:, None] * unit + torch.arange(unit)).flatten()
        x = F.linear(pixel_values.float(), weights.patch_embed)[patch_order]  # [P, E]
        cos, sin = vision_rope(
            patch_positions(grid_thw, dims.merge_size)[patch_order], dims.head_dim, dims.rope_theta
        )
        frames = image_lengths(grid_thw)
        for i, block in enumerate(weights.blocks):
            h = rms_norm(x, block.norm1, VISION_NORM_EPS)
            q, k, v = block.qkv(h).view(-1, 3, dims.num_heads, dims.head_dim).unbind(1)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            spans = frames if i in dims.full_attention_blocks else window_lengths
            attended = attend_within(q, k, v, spans, self.scale)
            x = x + block.proj(attended.flatten(1))
            h = rms_norm(x, block.norm2, VISION_NORM_EPS)
            x = x + block.down_proj(F.silu(block.gate_proj(h)) * block.up_proj(h))
        merged = rms_norm(x, weights.merger_norm, VISION_NORM_EPS).view(-1, unit * dims.hidden_size)
        merged = weights.merger_fc2(F.gelu(weights.merger_fc1(merged)))  # [P / M^2, out]
        return merged[torch.argsort(order)]  # undo the window order

    def encode(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The embeddings, and no deepstack features (the Qwen3-VL tower's form)."""
        return self(pixel_values, grid_thw), []

    @classmethod
    def from_state_dict(cls, state: dict[str, torch.Tensor], vision_config: Any) -> VisionTower:
        dims = VisionDims.from_hf_config(vision_config)
        return cls(VisionWeights.from_state_dict(vision_state(state), dims), dims)
