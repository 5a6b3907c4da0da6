"""The checkpoint's weights, float32, named after their role; and where the checkpoint is."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from ttbundles.reference.config import ModelDims


@dataclass
class Linear:
    """`y = x @ weight.T + bias`; weight `[out, in]`, bias `[out]` or None."""

    weight: torch.Tensor
    bias: torch.Tensor | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass
class LayerWeights:
    """One decoder layer. Optional parts: q/k/v biases (Qwen2), q/k norms (Qwen3,
    Gemma 3), the feed-forward norms (Gemma 3, whose `post_attention_norm` then
    normalises the attention output rather than the MLP input)."""

    input_norm: torch.Tensor  # [hidden]
    q_proj: Linear  # [H * D, hidden]
    k_proj: Linear  # [KV * D, hidden]
    v_proj: Linear  # [KV * D, hidden]
    o_proj: Linear  # [hidden, H * D]
    post_attention_norm: torch.Tensor  # [hidden]
    gate_proj: Linear  # [intermediate, hidden]
    up_proj: Linear  # [intermediate, hidden]
    down_proj: Linear  # [hidden, intermediate]
    q_norm: torch.Tensor | None = None  # [D], applied per head before RoPE
    k_norm: torch.Tensor | None = None  # [D]
    pre_feedforward_norm: torch.Tensor | None = None  # [hidden]
    post_feedforward_norm: torch.Tensor | None = None  # [hidden]


@dataclass
class LlamaWeights:
    """All weights, float32, named after their role rather than the checkpoint keys."""

    embed_tokens: torch.Tensor  # [V, hidden]
    layers: list[LayerWeights]
    final_norm: torch.Tensor  # [hidden]
    lm_head: torch.Tensor  # [V, hidden]; the embedding itself when tied

    @classmethod
    def from_state_dict(
        cls,
        state: dict[str, torch.Tensor],
        dims: ModelDims,
        tie_word_embeddings: bool,
        norm_offset: float = 0.0,
    ) -> LlamaWeights:
        """Map Hugging Face `LlamaForCausalLM`-style keys (also Mistral/Qwen2/Qwen3/Gemma 3).

        `norm_offset`: added to every RMSNorm weight once, here (Gemma's norms scale by
        `1 + weight`, transformers computes `1.0 + weight.float()`), so the forward pass
        has one RMSNorm for every family.
        """
        state = {name: tensor.float() for name, tensor in state.items()}
        if norm_offset:
            state = {
                name: tensor + norm_offset if name.endswith("norm.weight") else tensor
                for name, tensor in state.items()
            }

        def take(name: str) -> torch.Tensor:
            if name not in state:
                raise KeyError(f"checkpoint lacks {name}")
            return state[name]

        def linear(name: str) -> Linear:
            return Linear(take(f"{name}.weight"), state.get(f"{name}.bias"))

        layers = []
        for i in range(dims.num_layers):
            prefix = f"model.layers.{i}"
            layers.append(
                LayerWeights(
                    input_norm=take(f"{prefix}.input_layernorm.weight"),
                    q_proj=linear(f"{prefix}.self_attn.q_proj"),
                    k_proj=linear(f"{prefix}.self_attn.k_proj"),
                    v_proj=linear(f"{prefix}.self_attn.v_proj"),
                    o_proj=linear(f"{prefix}.self_attn.o_proj"),
                    post_attention_norm=take(f"{prefix}.post_attention_layernorm.weight"),
                    gate_proj=linear(f"{prefix}.mlp.gate_proj"),
                    up_proj=linear(f"{prefix}.mlp.up_proj"),
                    down_proj=linear(f"{prefix}.mlp.down_proj"),
                    q_norm=state.get(f"{prefix}.self_attn.q_norm.weight"),
                    k_norm=state.get(f"{prefix}.self_attn.k_norm.weight"),
                    pre_feedforward_norm=state.get(f"{prefix}.pre_feedforward_layernorm.weight"),
                    post_feedforward_norm=state.get(f"{prefix}.post_feedforward_layernorm.weight"),
                )
            )
        embed = take("model.embed_tokens.weight")
        # Tied checkpoints usually omit lm_head.weight; trust the config when both exist.
        lm_head = (
            embed
            if tie_word_embeddings or "lm_head.weight" not in state
            else state["lm_head.weight"]
        )
        return cls(embed, layers, take("model.norm.weight"), lm_head)


def checkpoint_dir(hf_config: Any) -> Path:
    """The local folder of the checkpoint the config was loaded from.

    vLLM passes the config it loaded, whose `_name_or_path` is the model argument: a
    folder, or a hub id that vLLM has already downloaded (found in the local hub cache).
    """
    name = getattr(hf_config, "_name_or_path", None) or getattr(hf_config, "name_or_path", None)
    if not name:
        raise ValueError("hf_config has no _name_or_path: cannot find the checkpoint")
    path = Path(str(name)).expanduser()
    if path.is_dir():
        return path
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(str(name), local_files_only=True))
    except Exception as exc:  # any hub failure means the same thing here
        raise FileNotFoundError(
            f"checkpoint {name!r} is neither a folder nor in the local Hugging Face cache"
        ) from exc


def load_safetensors(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the checkpoint: `model.safetensors`, sharded via its index, or any
    `*.safetensors` files in the folder."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        weight_map = json.loads(index.read_text())["weight_map"]
        files = [folder / name for name in sorted(set(weight_map.values()))]
    elif (folder / "model.safetensors").is_file():
        files = [folder / "model.safetensors"]
    else:
        files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"no safetensors weights in {folder}")
    state: dict[str, torch.Tensor] = {}
    for file in files:
        state.update(load_file(str(file)))
    return state


@dataclass
class GdnWeights:
    """A gated delta net layer's mixer (Qwen3.5's `linear_attn`, `reference.gdn`)."""

    in_proj_qkv: Linear  # [2 * Hk * Dk + Hv * Dv, hidden]: q | k | v before the conv
    in_proj_z: Linear  # [Hv * Dv, hidden]: the output gate
    in_proj_b: Linear  # [Hv, hidden]: beta = sigmoid(b)
    in_proj_a: Linear  # [Hv, hidden]: the decay's input
    conv: torch.Tensor  # [C, K]: the depthwise causal conv's kernel (no bias)
    dt_bias: torch.Tensor  # [Hv]
    A_log: torch.Tensor  # [Hv]  # noqa: N815 (transformers' name)
    norm: torch.Tensor  # [Dv]: the gated RMSNorm's weight (plain, not 1 + w)
    out_proj: Linear  # [hidden, Hv * Dv]


@dataclass
class GatedAttentionWeights:
    """A gated full-attention layer's mixer (Qwen3.5's `self_attn`): `q_proj` emits each
    head's query and its output gate, side by side."""

    q_proj: Linear  # [H * D * 2, hidden]
    k_proj: Linear  # [KV * D, hidden]
    v_proj: Linear  # [KV * D, hidden]
    o_proj: Linear  # [hidden, H * D]
    q_norm: torch.Tensor  # [D], 1 + w folded in
    k_norm: torch.Tensor  # [D]


@dataclass
class HybridLayerWeights:
    """One decoder layer of a hybrid (Qwen3.5): its mixer (GDN or gated attention), then
    the gated MLP; the norms with `1 + w` folded in."""

    input_norm: torch.Tensor  # [hidden]
    mixer: GdnWeights | GatedAttentionWeights
    post_attention_norm: torch.Tensor  # [hidden]
    gate_proj: Linear
    up_proj: Linear
    down_proj: Linear


# The Qwen3.5 norms that scale by `1 + w` (`Qwen3_5RMSNorm`); the GDN's gated norm does not.
_OFFSET_NORMS = ("layernorm.weight", "q_norm.weight", "k_norm.weight", "model.norm.weight")


def hybrid_state_dict(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A Qwen3.5 checkpoint's text weights, float32, under `Qwen3_5ForCausalLM`'s names
    (`Qwen3_5ForConditionalGeneration` keeps them under `model.language_model.`; its
    vision tower and the MTP head are dropped), `1 + w` folded into the norms that use it."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("model.language_model."):
            name = "model." + name[len("model.language_model.") :]
        if name.startswith(("model.visual.", "mtp.")):
            continue
        tensor = tensor.float()
        out[name] = tensor + 1.0 if name.endswith(_OFFSET_NORMS) else tensor
    return out


def hybrid_layers(state: dict[str, torch.Tensor], layer_types: list[str]) -> list:
    """Each layer's `HybridLayerWeights` from `hybrid_state_dict`'s names."""

    def take(name: str) -> torch.Tensor:
        if name not in state:
            raise KeyError(f"checkpoint lacks {name}")
        return state[name]

    def linear(name: str) -> Linear:
        return Linear(take(f"{name}.weight"), state.get(f"{name}.bias"))

    layers = []
    for i, kind in enumerate(layer_types):
        p = f"model.layers.{i}"
        if kind == "linear_attention":
            g = f"{p}.linear_attn"
            mixer: GdnWeights | GatedAttentionWeights = GdnWeights(
                *(linear(f"{g}.in_proj_{part}") for part in ("qkv", "z", "b", "a")),
                conv=take(f"{g}.conv1d.weight")[:, 0],
                dt_bias=take(f"{g}.dt_bias"),
                A_log=take(f"{g}.A_log"),
                norm=take(f"{g}.norm.weight"),
                out_proj=linear(f"{g}.out_proj"),
            )
        else:
            a = f"{p}.self_attn"
            mixer = GatedAttentionWeights(
                *(linear(f"{a}.{part}_proj") for part in ("q", "k", "v", "o")),
                q_norm=take(f"{a}.q_norm.weight"),
                k_norm=take(f"{a}.k_norm.weight"),
            )
        layers.append(
            HybridLayerWeights(
                take(f"{p}.input_layernorm.weight"),
                mixer,
                take(f"{p}.post_attention_layernorm.weight"),
                *(linear(f"{p}.mlp.{part}_proj") for part in ("gate", "up", "down")),
            )
        )
    return layers
