"""The base family's decoders with transformers' sequence-classification head (`score`, a
linear layer over the last token's hidden states). The reference computes their hidden
states with the base's forward pass; the head is applied on the host by vLLM's classifier
pooler (`serving.runner.pooler`), so they are served only as vLLM's pooling runner."""

from __future__ import annotations

from ttbundles.reference.families.base import Family

CLASSIFIERS = Family(
    name="classifiers",
    architectures=(
        "LlamaForSequenceClassification",
        "MistralForSequenceClassification",
        "Qwen2ForSequenceClassification",
        "Qwen3ForSequenceClassification",
    ),
    pooling_only=True,
)
