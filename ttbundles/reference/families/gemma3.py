"""Gemma 3 text: how its forward pass differs from Llama's, as transformers'
`modeling_gemma3` computes it (see `config.ModelStyle` for each field), and the Gemmas the
reference does not implement (1, 2, 3n), refused by name; Gemma 4 is `families.gemma4`.

Its per-layer-type RoPE (the sliding layers' own base) is read by `config.ModelRope` when
the style asks for `local_rope`; its sliding layers by `format.attention_window`.
"""

from __future__ import annotations

from typing import Any

import torch

from ttbundles.reference.config import ModelDims, ModelStyle
from ttbundles.reference.families.base import Family

GEMMA3_ARCHITECTURE = "Gemma3ForCausalLM"


def is_gemma3(hf_config: Any) -> bool:
    """A Gemma 3 text config (`Gemma3TextConfig`, model_type `gemma3_text`)."""
    architectures = getattr(hf_config, "architectures", None) or []
    model_type = str(getattr(hf_config, "model_type", "") or "")
    return model_type == "gemma3_text" or GEMMA3_ARCHITECTURE in architectures


def gemma3_style(hf_config: Any, dims: ModelDims) -> ModelStyle:
    """Gemma 3's differences; EmbeddingGemma (bidirectional) is refused."""
    if getattr(hf_config, "use_bidirectional_attention", False):
        raise NotImplementedError(
            "use_bidirectional_attention (EmbeddingGemma) is not a causal language "
            "model: the reference generator serves causal Gemma 3 only"
        )
    scalar = getattr(hf_config, "query_pre_attn_scalar", None) or dims.head_dim
    return ModelStyle(
        norm_offset=1.0,
        # transformers keeps the scale as a tensor of the weights' dtype (float32 here).
        embed_scale=float(torch.tensor(dims.hidden_size**0.5, dtype=torch.float32)),
        query_scale=float(scalar) ** -0.5,
        sandwich_norms=True,
        local_rope=True,
        final_softcap=getattr(hf_config, "final_logit_softcapping", None),
    )


def refuse_other_gemma(hf_config: Any) -> None:
    """Gemma 1/2 (and Gemma 3n) read as Llama would be wrong without an error: say so.
    Gemma 4 is its own family (`families.gemma4`), claimed before this is asked."""
    model_type = str(getattr(hf_config, "model_type", "") or "")
    if model_type.startswith("gemma"):
        raise NotImplementedError(
            f"model_type {model_type!r}: of the Gemma family the reference generator "
            "implements Gemma 3 text (gemma3_text) and Gemma 4 text (gemma4_text, "
            "gemma4) only"
        )


GEMMA3 = Family(
    name="gemma3",
    architectures=(GEMMA3_ARCHITECTURE,),
    style=gemma3_style,
    claims=is_gemma3,
)
