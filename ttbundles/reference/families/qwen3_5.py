"""Qwen3.5 (text): a gated delta net hybrid. Its forward pass is not the shared one (three
of every four layers keep a recurrent state instead of KV), so the family names its own
generator, `reference.qwen3_5.ReferenceQwen3_5Generator`; its norms scale by `1 + w`,
folded into the weights as they load (`weights.hybrid_state_dict`).

`Qwen3_5ForConditionalGeneration` is read for its text part only (the config's
`text_config`, the weights under `model.language_model.`)."""

from __future__ import annotations

from typing import Any

from ttbundles.reference.config import ModelDims, ModelStyle
from ttbundles.reference.families.base import Family

QWEN3_5_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")


def is_qwen3_5(hf_config: Any) -> bool:
    """A Qwen3.5 config (model_type `qwen3_5` or `qwen3_5_text`), or one naming it."""
    architectures = getattr(hf_config, "architectures", None) or []
    model_type = str(getattr(hf_config, "model_type", "") or "")
    return model_type in ("qwen3_5", "qwen3_5_text") or any(
        a in QWEN3_5_ARCHITECTURES for a in architectures
    )


def qwen3_5_style(hf_config: Any, dims: ModelDims) -> ModelStyle:
    """Refused: the shared forward pass has no GDN layer. Asked only by the generator
    that reads the shared pass (`ReferenceLlamaGenerator`), so a Qwen3.5 checkpoint
    given to it fails here, naming the class that reads it, not on a missing weight."""
    raise NotImplementedError(
        "Qwen3.5 (gated delta net layers) is read by "
        "ttbundles.reference.qwen3_5.ReferenceQwen3_5Generator, not the Llama-family "
        "reference generator"
    )


QWEN3_5 = Family(
    name="qwen3_5",
    architectures=QWEN3_5_ARCHITECTURES,
    style=qwen3_5_style,
    claims=is_qwen3_5,
    generator="ttbundles.reference.qwen3_5:ReferenceQwen3_5Generator",
)
