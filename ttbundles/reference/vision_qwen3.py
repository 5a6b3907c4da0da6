"""The Qwen3-VL vision tower in plain torch: patches in, image tokens and deepstack features out.

How it differs from Qwen2.5-VL's (`reference.vision`), step by step (transformers'
`Qwen3VLVisionModel`):

1. Patch embedding with a bias (16-pixel patches in the real model: rows of
   3 x 2 x 16 x 16 = 1536 values), plus a learned position embedding: a square table of
   `num_position_embeddings` entries, resized bilinearly (corners aligned) to each image's
   patch grid.
2. The same 2-D rotary positions (`vision.vision_rope`).
3. Every block attends over the whole frame: no windows, no reordering. Blocks are
   LayerNorm / attention / LayerNorm / GELU(tanh) MLP.
4. The merger as in Qwen2.5-VL but with LayerNorm; and "deepstack": after each block in
   `deepstack_visual_indexes`, a second merger (normalising after the M x M concatenation)
   turns the block's output into one more set of image-token features. The language
   model adds feature k to its hidden states at the image tokens after its layer k.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.reference.attention import apply_rope
from ttbundles.reference.vision import (
    attend_within,
    grid_list,
    image_lengths,
    patch_positions,
    vision_rope,
)
from ttbundles.reference.weights import Linear

NORM_EPS = 1e-6  # Qwen3-VL's vision LayerNorms use a fixed epsilon
ACTIVATIONS = {"gelu_pytorch_tanh": "tanh", "gelu": "none"}


@dataclass(frozen=True)
class Qwen3VisionDims:
    depth: int
    hidden_size: int  # E
    num_heads: int
    merge_size: int  # M
    out_hidden_size: int
    position_side: int  # the learned position table is position_side x position_side
    deepstack_blocks: tuple[int, ...]
    approximate: str  # F.gelu's `approximate` for the block MLPs
    rope_theta: float

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @classmethod
    def from_hf_config(cls, vision_config: Any) -> Qwen3VisionDims:
        act = getattr(vision_config, "hidden_act", "gelu_pytorch_tanh")
        if act not in ACTIVATIONS:
            raise NotImplementedError(f"vision hidden_act {act!r}: not one of {list(ACTIVATIONS)}")
        side = int(vision_config.num_position_embeddings**0.5)
        if side * side != vision_config.num_position_embeddings:
            raise ValueError("num_position_embeddings must be a square")
        rope = getattr(vision_config, "rope_parameters", None) or {}
        return cls(
            depth=vision_config.depth,
            hidden_size=vision_config.hidden_size,
            num_heads=vision_config.num_heads,
            merge_size=vision_config.spatial_merge_size,
            out_hidden_size=vision_config.out_hidden_size,
            position_side=side,
            deepstack_blocks=tuple(vision_config.deepstack_visual_indexes),
            approximate=ACTIVATIONS[act],
            rope_theta=float(rope.get("rope_theta", 10000.0)),
        )


@dataclass
class LayerNorm:
    weight: torch.Tensor
    bias: torch.Tensor

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, NORM_EPS)


@dataclass
class Qwen3BlockWeights:
    norm1: LayerNorm
    qkv: Linear
    proj: Linear
    norm2: LayerNorm
    fc1: Linear
    fc2: Linear


@dataclass
class Merger:
    """LayerNorm, then M x M patches concatenated, fc1, GELU, fc2. `after_concat`: the
    norm runs over the concatenation (deepstack mergers) rather than each patch."""

    norm: LayerNorm
    fc1: Linear
    fc2: Linear
    after_concat: bool

    def __call__(self, x: torch.Tensor, unit: int) -> torch.Tensor:
        if self.after_concat:
            x = self.norm(x.reshape(-1, unit * x.shape[-1]))
        else:
            x = self.norm(x).reshape(-1, unit * x.shape[-1])
        return self.fc2(F.gelu(self.fc1(x)))


def _state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    out = {}
    for name, tensor in state.items():
        for prefix in ("model.visual.", "visual."):
            if name.startswith(prefix):
                out[name[len(prefix) :]] = tensor.float()
                break
    return out


class Qwen3VisionTower:
    """Qwen3-VL's vision encoder (see the module docstring)."""

    def __init__(self, state: dict[str, torch.Tensor], dims: Qwen3VisionDims):
        vision = _state(state)

        def take(name: str) -> torch.Tensor:
            if name not in vision:
                raise KeyError(f"checkpoint lacks the vision weight {name}")
            return vision[name]

        def linear(name: str) -> Linear:
            return Linear(take(f"{name}.weight"), take(f"{name}.bias"))

        def norm(name: str) -> LayerNorm:
            return LayerNorm(take(f"{name}.weight"), take(f"{name}.bias"))

        def merger(name: str, after_concat: bool) -> Merger:
            return Merger(
                norm(f"{name}.norm"),
                linear(f"{name}.linear_fc1"),
                linear(f"{name}.linear_fc2"),
                after_concat,
            )

        self.dims = dims
        kernel = take("patch_embed.proj.weight")
        self.patch_embed = Linear(
            kernel.reshape(kernel.shape[0], -1), take("patch_embed.proj.bias")
        )
        self.position_table = take("pos_embed.weight")  # [side * side, E]
        self.blocks = [
            Qwen3BlockWeights(
                norm(f"blocks.{i}.norm1"),
                linear(f"blocks.{i}.attn.qkv"),
                linear(f"blocks.{i}.attn.proj"),
                norm(f"blocks.{i}.norm2"),
                linear(f"blocks.{i}.mlp.linear_fc1"),
                linear(f"blocks.{i}.mlp.linear_fc2"),
            )
            for i in range(dims.depth)
        ]
        self.merger = merger("merger", after_concat=False)
        self.deepstack = [
            merger(f"deepstack_merger_list.{k}", after_concat=True)
            for k in range(len(dims.deepstack_blocks))
        ]
        self.scale = dims.head_dim**-0.5

    def tokens_per_image(self, grid_thw: torch.Tensor) -> list[int]:
        return [t * h * w // self.dims.merge_size**2 for t, h, w in grid_list(grid_thw)]

    def position_embeddings(self, grid_thw: torch.Tensor) -> torch.Tensor:
        """The learned table resized to each image's patch grid (bilinear, corners
        aligned), `[P, E]` in the processor's block-major patch order."""
        side, merge = self.dims.position_side, self.dims.merge_size
        table = self.position_table.T.reshape(1, -1, side, side)  # [1, E, side, side]
        out = []
        for t, h, w in grid_list(grid_thw):
            grid = F.interpolate(table, size=(h, w), mode="bilinear", align_corners=True)[0]
            positions = patch_positions(torch.tensor([[t, h, w]]), merge)
            out.append(grid[:, positions[:, 0], positions[:, 1]].T)
        return torch.cat(out)

    @torch.no_grad()
    def encode(
        self, pixel_values: torch.Tensor, grid_thw: torch.Tensor
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Image-token embeddings `[tokens, out]` and the deepstack features (one
        `[tokens, out]` per deepstack block), image after image."""
        dims = self.dims
        grid_thw = torch.as_tensor(grid_thw).reshape(-1, 3)
        patches = sum(t * h * w for t, h, w in grid_list(grid_thw))
        width = self.patch_embed.weight.shape[1]
        if pixel_values.shape[0] != patches or pixel_values.shape[-1] != width:
            raise ValueError(
                f"pixel_values has shape {tuple(pixel_values.shape)} but the grids "
                f"{grid_list(grid_thw)} need [{patches}, {width}]"
            )
        unit = dims.merge_size**2
        x = self.patch_embed(pixel_values.float()) + self.position_embeddings(grid_thw)
        cos, sin = vision_rope(
            patch_positions(grid_thw, dims.merge_size), dims.head_dim, dims.rope_theta
        )
        frames = image_lengths(grid_thw)
        features = []
        for i, block in enumerate(self.blocks):
            h = block.norm1(x)
            q, k, v = block.qkv(h).view(-1, 3, dims.num_heads, dims.head_dim).unbind(1)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            x = x + block.proj(attend_within(q, k, v, frames, self.scale).flatten(1))
            h = block.norm2(x)
            x = x + block.fc2(F.gelu(block.fc1(h), approximate=dims.approximate))
            if i in dims.deepstack_blocks:
                features.append(self.deepstack[dims.deepstack_blocks.index(i)](x, unit))
        return self.merger(x, unit), features

    @classmethod
    def from_state_dict(
        cls, state: dict[str, torch.Tensor], vision_config: Any
    ) -> Qwen3VisionTower:
        return cls(state, Qwen3VisionDims.from_hf_config(vision_config))
