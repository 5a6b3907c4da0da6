"""The layer kinds of recurrent-state and SSM checkpoints, read from their configs as
transformers derives them (`format.layer_kinds`), and the state a request holds."""

from __future__ import annotations

import pytest

from tests.recurrent_checkpoints import QWEN_GDN_LAYER_TYPES
from ttbundles.format.layer_kinds import (
    ATTENTION,
    GDN,
    MAMBA,
    PARALLEL_HYBRID,
    SHORT_CONV,
    layer_kinds,
    recurrent_kind_of_architecture,
)

GDN_SIZES = {
    "linear_num_key_heads": 2,
    "linear_num_value_heads": 4,
    "linear_key_head_dim": 8,
    "linear_value_head_dim": 8,
    "linear_conv_kernel_dim": 4,
}


def test_qwen3_5_layer_types_name_the_gated_delta_net_layers():
    kinds = layer_kinds(
        {
            "model_type": "qwen3_5_text",
            "num_hidden_layers": 8,
            "layer_types": list(QWEN_GDN_LAYER_TYPES),
            **GDN_SIZES,
        }
    )
    assert kinds.recurrent_layers == (0, 1, 2, 4, 5, 6)
    assert kinds.attention_layers == (3, 7)
    assert kinds.describe() == (
        "6 linear-attention (gated delta net) layers with recurrent state, 2 full-attention layers"
    )
    # conv (K-1) x (2 Hk Dk + Hv Dv) = 3 x 64, recurrent Hv Dk Dv = 256, per GDN layer.
    assert kinds.state.conv_elements == 192 and kinds.state.ssm_elements == 256
    assert kinds.state_bytes_per_request(2) == 6 * (192 + 256) * 2
    assert kinds.state_bytes_per_request(2, 4) == 6 * (192 * 2 + 256 * 4)


def test_qwen_without_layer_types_derives_them_from_the_interval():
    """Qwen3_5TextConfig: every `full_attention_interval`-th layer (default 4) is full."""
    config = {"model_type": "qwen3_next", "num_hidden_layers": 8, **GDN_SIZES}
    assert layer_kinds(config).kinds == (GDN, GDN, GDN, ATTENTION) * 2
    config["full_attention_interval"] = 2
    assert layer_kinds(config).attention_layers == (1, 3, 5, 7)


def test_a_multimodal_qwen3_5_is_read_through_its_text_config():
    text = {"model_type": "qwen3_5_text", "num_hidden_layers": 4, **GDN_SIZES}
    assert layer_kinds({"model_type": "qwen3_5", "text_config": text}).recurrent_layers == (0, 1, 2)


def test_jamba_counts_attention_by_period_and_offset():
    config = {
        "model_type": "jamba",
        "num_hidden_layers": 8,
        "attn_layer_period": 4,
        "attn_layer_offset": 2,
        "hidden_size": 64,
        "mamba_expand": 2,
        "mamba_d_conv": 4,
        "mamba_d_state": 8,
    }
    kinds = layer_kinds(config)
    assert kinds.attention_layers == (2, 6)
    assert set(kinds.kinds) == {ATTENTION, MAMBA}
    assert kinds.describe() == "6 Mamba layers with recurrent state, 2 full-attention layers"
    assert kinds.state.conv_elements == 3 * 128 and kinds.state.ssm_elements == 128 * 8


def test_mamba_has_no_attention_layer_at_all():
    kinds = layer_kinds({"model_type": "mamba", "num_hidden_layers": 2, "hidden_size": 64})
    assert kinds.attention_layers == ()
    assert kinds.describe() == "2 Mamba layers with recurrent state"


def test_falcon_h1_layers_keep_a_kv_cache_and_a_state_each():
    kinds = layer_kinds(
        {
            "model_type": "falcon_h1",
            "num_hidden_layers": 4,
            "mamba_n_heads": 8,
            "mamba_d_head": 16,
            "mamba_d_state": 8,
            "mamba_d_conv": 4,
        }
    )
    assert kinds.kinds == (PARALLEL_HYBRID,) * 4
    assert kinds.recurrent_layers == kinds.attention_layers == (0, 1, 2, 3)
    assert "(a KV cache and recurrent state each)" in kinds.describe()


def test_nemotron_h_and_lfm2_patterns():
    nemotron = layer_kinds(
        {"model_type": "nemotron_h", "num_hidden_layers": 4, "hybrid_override_pattern": "M-M*"}
    )
    assert nemotron.recurrent_layers == (0, 2) and nemotron.attention_layers == (3,)
    lfm2 = layer_kinds(
        {
            "model_type": "lfm2",
            "num_hidden_layers": 3,
            "layer_types": ["conv", "conv", "full_attention"],
        }
    )
    assert lfm2.kinds == (SHORT_CONV, SHORT_CONV, ATTENTION)
    assert lfm2.state is None and lfm2.state_bytes_per_request(2) is None


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "llama", "num_hidden_layers": 4},
        {
            "model_type": "gemma3_text",
            "num_hidden_layers": 2,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ],
)
def test_attention_only_checkpoints_keep_no_state(config):
    kinds = layer_kinds(config)
    assert not kinds.recurrent and kinds.state is None
    assert kinds.attention_layers == tuple(range(config["num_hidden_layers"]))


def test_architectures_with_recurrent_state_are_known_by_name():
    assert recurrent_kind_of_architecture("Qwen3_5ForCausalLM") == GDN
    assert recurrent_kind_of_architecture("TTQwen3_5ForConditionalGeneration") == GDN
    assert recurrent_kind_of_architecture("MambaForCausalLM") == MAMBA
    assert recurrent_kind_of_architecture("LlamaForCausalLM") is None


@pytest.mark.parametrize(
    ("architecture", "recurrent", "attention"),
    [
        ("Qwen3_5ForCausalLM", (0, 1, 2, 4, 5, 6), (3, 7)),
        ("Qwen3NextForCausalLM", (0, 1, 2, 4, 5, 6), (3, 7)),
        ("JambaForCausalLM", (0, 2), (1, 3)),
        ("FalconH1ForCausalLM", (0, 1, 2, 3), (0, 1, 2, 3)),
        ("MambaForCausalLM", (0, 1, 2, 3), ()),
    ],
)
def test_the_tiny_checkpoints_configs_as_transformers_writes_them(
    architecture, recurrent, attention
):
    """transformers' own config objects (no weights), read as the planner reads them."""
    from tests.recurrent_checkpoints import BUILDERS

    class Tokenizer:  # what the builders read of the demo tokenizer
        bos_token_id, eos_token_id, pad_token_id = 1, 2, 2

        def __len__(self):
            return 384

    _, config = BUILDERS[architecture](Tokenizer())
    kinds = layer_kinds(config)
    assert kinds.recurrent_layers == recurrent
    assert kinds.attention_layers == attention
    assert kinds.state is not None
