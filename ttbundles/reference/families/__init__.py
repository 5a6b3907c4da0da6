"""The checkpoint families the reference generator reads: one module each, one table.

A family is what its checkpoints need of the reference: the Hugging Face architectures it
reads, which configs it claims, and how its forward pass differs from Llama's (a
`config.ModelStyle`). The forward pass itself is one for every family
(`reference.model`), so a new family that fits it is one new module here and one entry
in `FAMILIES`; the architecture lists the rest of ttbundles reads (`ttbundle init
--reference`, the reference's admission, the golden) are derived from the table.

Which family a config is (`family_of`): the first whose `claims` accepts it; a config no
family claims reads as the base (Llama), unless it names a Gemma the reference does not
implement, which is refused rather than read as Llama and be wrong without an error.
"""

from __future__ import annotations

from typing import Any

from ttbundles.reference.config import ModelDims, ModelStyle
from ttbundles.reference.families.base import Family
from ttbundles.reference.families.classifiers import CLASSIFIERS
from ttbundles.reference.families.gemma3 import GEMMA3, refuse_other_gemma
from ttbundles.reference.families.gemma4 import GEMMA4
from ttbundles.reference.families.llama import LLAMA
from ttbundles.reference.families.qwen3_5 import QWEN3_5

FAMILIES: tuple[Family, ...] = (LLAMA, GEMMA3, GEMMA4, QWEN3_5, CLASSIFIERS)
"""Every family, in the order their architectures are listed."""

BASE = LLAMA
"""What a config no family claims reads as."""

CAUSAL_ARCHITECTURES = tuple(a for f in FAMILIES if not f.pooling_only for a in f.architectures)
"""The Hugging Face architectures whose checkpoints the reference generator reads."""

CLASSIFICATION_ARCHITECTURES = tuple(a for f in FAMILIES if f.pooling_only for a in f.architectures)
"""The same decoders with transformers' sequence-classification head: served only as
vLLM's pooling runner (`families.classifiers`)."""

SUPPORTED_ARCHITECTURES = CAUSAL_ARCHITECTURES + CLASSIFICATION_ARCHITECTURES


def family_of(hf_config: Any) -> Family:
    """The family that reads this config (see the module docstring); NotImplementedError
    for a Gemma other than Gemma 3 and 4."""
    for family in FAMILIES:
        if family.claims is not None and family.claims(hf_config):
            return family
    refuse_other_gemma(hf_config)
    return BASE


def style_of(hf_config: Any, dims: ModelDims) -> ModelStyle:
    """How the config's forward pass differs from Llama's: the defaults, or its family's;
    a variant the reference does not implement is refused (NotImplementedError, the
    message says which key)."""
    return family_of(hf_config).style(hf_config, dims)


__all__ = [
    "BASE",
    "CAUSAL_ARCHITECTURES",
    "CLASSIFICATION_ARCHITECTURES",
    "FAMILIES",
    "SUPPORTED_ARCHITECTURES",
    "Family",
    "family_of",
    "style_of",
]
