"""Llama, Mistral, Qwen2 and Qwen3: the base family, whose forward pass is the reference's
own (`reference.model` with the `ModelStyle` defaults). Their differences are in the
weights (Qwen2's q/k/v biases, Qwen3's per-head q/k norms: `weights.LayerWeights` reads
what the checkpoint has) and the config (head size, RoPE, sliding windows), not here."""

from __future__ import annotations

from ttbundles.reference.families.base import Family

LLAMA = Family(
    name="llama",
    architectures=(
        "LlamaForCausalLM",
        "MistralForCausalLM",
        "Qwen2ForCausalLM",
        "Qwen3ForCausalLM",
    ),
)
