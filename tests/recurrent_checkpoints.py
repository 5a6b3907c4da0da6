"""Tiny random checkpoints of the recurrent-state and SSM families, made by transformers.

Each is what a new user would try first: the family's own `*ForCausalLM` at toy sizes
(hidden 64, a few layers, the demo's tokenizer), saved with safetensors by
`demo.checkpoint.save_random`. They exist to prove that every such layer kind is
described truly by `ttbundle plan` and refused with a code, never a traceback.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

# Qwen3.5 and Qwen3-Next: three gated-delta-net layers to one full-attention layer, as
# their configs derive `layer_types` from `full_attention_interval` (4).
QWEN_GDN_LAYER_TYPES = (
    ("linear_attention",) * 3
    + ("full_attention",)
    + ("linear_attention",) * 3
    + ("full_attention",)
)


def _tokens(tokenizer: Any) -> dict[str, Any]:
    return {
        "vocab_size": len(tokenizer),
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
    }


def _gdn_sizes() -> dict[str, Any]:
    return {
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": len(QWEN_GDN_LAYER_TYPES),
        "layer_types": list(QWEN_GDN_LAYER_TYPES),
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4,
        "max_position_embeddings": 1024,
    }


def _qwen3_5(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM, Qwen3_5TextConfig(**_gdn_sizes(), **_tokens(tokenizer))


def _qwen3_next(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import Qwen3NextConfig, Qwen3NextForCausalLM

    config = Qwen3NextConfig(
        **_gdn_sizes(),
        **_tokens(tokenizer),
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=32,
    )
    return Qwen3NextForCausalLM, config


def _jamba(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import JambaConfig, JambaForCausalLM

    config = JambaConfig(
        **_tokens(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        attn_layer_period=2,
        attn_layer_offset=1,
        expert_layer_period=2,
        expert_layer_offset=1,
        num_experts=2,
        num_experts_per_tok=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_dt_rank=8,
        use_mamba_kernels=False,
        max_position_embeddings=1024,
    )
    return JambaForCausalLM, config


def _falcon_h1(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import FalconH1Config, FalconH1ForCausalLM

    config = FalconH1Config(
        **_tokens(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        mamba_d_ssm=128,
        mamba_n_heads=8,
        mamba_d_head=16,
        mamba_n_groups=1,
        mamba_d_state=8,
        mamba_d_conv=4,
        mamba_expand=2,
        mamba_chunk_size=16,
        max_position_embeddings=1024,
    )
    return FalconH1ForCausalLM, config


def _mamba(tokenizer: Any) -> tuple[Any, Any]:
    from transformers import MambaConfig, MambaForCausalLM

    config = MambaConfig(
        **_tokens(tokenizer),
        hidden_size=64,
        state_size=8,
        num_hidden_layers=4,
        conv_kernel=4,
        expand=2,
        time_step_rank=8,
        use_mambapy=False,
    )
    return MambaForCausalLM, config


# Each builder: (the model class, its tiny config) from the tokenizer's ids and size.
BUILDERS = {
    "Qwen3_5ForCausalLM": _qwen3_5,
    "Qwen3NextForCausalLM": _qwen3_next,
    "JambaForCausalLM": _jamba,
    "FalconH1ForCausalLM": _falcon_h1,
    "MambaForCausalLM": _mamba,
}


def write_recurrent_checkpoint(architecture: str, out: Path) -> Path:
    """The tiny random checkpoint of `architecture` (a key of `BUILDERS`) in `out`."""
    from ttbundles.demo.checkpoint import build_tokenizer, save_random

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out)
    model_cls, config = BUILDERS[architecture](tokenizer)
    save_random(model_cls(config), architecture, out)
    return out
