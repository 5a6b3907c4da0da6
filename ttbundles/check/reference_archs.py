"""Which Hugging Face architectures each torch reference generator reads, statically.

A bundle whose class builds on a reference generator (`init --reference` writes one)
serves only the architectures that generator reads; any other `arch` is refused at load
(TTB063), tens of seconds into `vllm serve`. `validate` and `init --reference` say it
before (TTB041) from this table, read without importing torch (a test checks it against
`ttbundles.reference.families.SUPPORTED_ARCHITECTURES`).
"""

from __future__ import annotations

from ttbundles.format.layer_kinds import kind_name, recurrent_kind_of_architecture

# The text generator's families (`reference.families.SUPPORTED_ARCHITECTURES`).
TEXT_ARCHITECTURES: tuple[str, ...] = (
    "LlamaForCausalLM",
    "MistralForCausalLM",
    "Qwen2ForCausalLM",
    "Qwen3ForCausalLM",
    "Gemma3ForCausalLM",
    # Their sequence-classification checkpoints (a `score` head): pooling only.
    "LlamaForSequenceClassification",
    "MistralForSequenceClassification",
    "Qwen2ForSequenceClassification",
    "Qwen3ForSequenceClassification",
)

# The Qwen3.5 generator's (`reference.families.qwen3_5`): gated delta net hybrids, whose
# recurrent state the generator keeps per slot.
QWEN3_5_ARCHITECTURES: tuple[str, ...] = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")

# The Gemma 4 generator's (`reference.families.gemma4`): a KV shape per layer (the global
# layers' own head size and KV heads), partial RoPE on the global layers.
GEMMA4_ARCHITECTURES: tuple[str, ...] = ("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration")

# Families the reference does not cover yet, with what it lacks: `init --reference` and
# the configuration of a bundle built on the reference say this rather than only listing
# the families it does cover.
_ENCODER = (
    "an encoder (bidirectional attention, learned absolute positions, LayerNorm, token "
    "types): the reference implements decoders (Llama, Mistral, Qwen2, Qwen3, Gemma 3, "
    "Gemma 4, Qwen3.5); "
    "serve an encoder's embeddings or scores with a bundle of the pooling form 'forward' "
    "over your own generator, or a decoder embedding model (Qwen3-Embedding's shape)"
)
REFERENCE_MISSING: dict[str, str] = {
    **{
        arch: _ENCODER
        for arch in (
            "BertModel",
            "BertForSequenceClassification",
            "RobertaModel",
            "RobertaForSequenceClassification",
            "XLMRobertaModel",
            "XLMRobertaForSequenceClassification",
        )
    },
    "Qwen3NextForCausalLM": (
        "Qwen3-Next is Qwen3.5's gated delta net hybrid with a mixture-of-experts MLP "
        "(routed and shared experts) and GDN projections packed per key head "
        "(in_proj_qkvz, in_proj_ba); the reference implements Qwen3.5's dense MLP and "
        "its separate in_proj_qkv/z/b/a only"
    ),
}

# "module:Class" of each reference generator -> the architectures it reads. A class is
# judged by its nearest ancestor listed here (the VL generators derive from the text one).
REFERENCE_GENERATORS: dict[str, tuple[str, ...]] = {
    "ttbundles.reference.generator:ReferenceLlamaGenerator": TEXT_ARCHITECTURES,
    "ttbundles.reference.generator:ReferenceLlamaGeneratorLegacy": TEXT_ARCHITECTURES,
    "ttbundles.reference.qwen3_5:ReferenceQwen3_5Generator": QWEN3_5_ARCHITECTURES,
    "ttbundles.reference.gemma4:ReferenceGemma4Generator": GEMMA4_ARCHITECTURES,
    "ttbundles.reference.vl_generator:ReferenceQwen2_5_VLGenerator": (
        "Qwen2_5_VLForConditionalGeneration",
    ),
    "ttbundles.reference.vl_generator:ReferenceQwen3VLGenerator": (
        "Qwen3VLForConditionalGeneration",
    ),
}


def reference_of(ancestors: list[str] | tuple[str, ...]) -> tuple[str, tuple[str, ...]] | None:
    """The nearest reference generator among a class's ancestors ("module:Class", the
    class first) and the architectures it reads; None when it builds on none."""
    for name in ancestors:
        if name in REFERENCE_GENERATORS:
            return name, REFERENCE_GENERATORS[name]
    return None


def covers(architectures: tuple[str, ...], arch: str) -> bool:
    """Whether `arch` is one of them (a `TT` prefix, as TT-Metal names its classes, aside)."""
    return arch in architectures or (arch.startswith("TT") and arch[2:] in architectures)


def missing_reason(arch: str) -> str | None:
    """Why the reference does not read `arch`, when it is known: `REFERENCE_MISSING`,
    another reference generator that reads it (a class built on the wrong one), or the
    recurrent layers a state-space or linear-attention family keeps, which no
    reference family computes (a state per request, not a KV cache)."""
    if arch in REFERENCE_MISSING:
        return REFERENCE_MISSING[arch]
    readers = [name for name, archs in REFERENCE_GENERATORS.items() if covers(archs, arch)]
    if readers:
        return f"{arch} is read by {readers[0].replace(':', '.')}: build on that class"
    kind = recurrent_kind_of_architecture(arch)
    if kind is None:
        return None
    return (
        f"its {kind_name(kind)} layers keep recurrent state (a fixed-size state per "
        "request, not a KV cache), which the reference does not compute: it implements "
        "attention decoders"
    )
