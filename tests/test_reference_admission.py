"""A bundle built on the torch reference generator, at configuration
(`serving.planning.reference_admission`, the same code `ttbundle plan` runs): an architecture the
reference does not read is refused there (TTB041), saying what it lacks for Gemma 4,
rather than by the generator at load."""

from __future__ import annotations

import json

import pytest
import vllm  # noqa: F401 - required: a missing or broken vllm fails

from tests.test_platform_config import configure, error_of
from ttbundles.errors import ConfigurationError
from ttbundles.scaffold.init import init_bundle


@pytest.fixture(scope="module")
def gemma4_checkpoint(tmp_path_factory):
    """A Gemma 4 text config with the demo's tokenizer: no weights (configuration reads
    none)."""
    from transformers import Gemma4TextConfig

    from ttbundles.demo.checkpoint import build_tokenizer

    out = tmp_path_factory.mktemp("checkpoint") / "tiny-gemma4"
    out.mkdir()
    tokenizer = build_tokenizer(out)
    config = Gemma4TextConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        sliding_window=32,
        max_position_embeddings=512,
    )
    config.architectures = ["Gemma4ForCausalLM"]
    config.save_pretrained(out)
    return out


def test_a_gemma4_bundle_on_the_reference_is_refused_saying_what_is_missing(
    models_dir, gemma4_checkpoint
):
    """The Gemma 3 reference adapter relabelled Gemma 4 (what `init --reference` refuses
    to write, TTB033): `validate` says TTB041; serving it says the same at configuration."""
    folder = models_dir / "g4"
    init_bundle(folder, arch="Gemma3ForCausalLM", reference=True)
    meta = folder / "vllm_metadata.json"
    meta.write_text(json.dumps({**json.loads(meta.read_text()), "arch": "Gemma4ForCausalLM"}))
    with pytest.raises(ConfigurationError) as excinfo:
        configure(gemma4_checkpoint)
    assert error_of(excinfo) == "TTB041"
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.message.startswith(
        "g4@0.1.0 serves Gemma4ForCausalLM with adapter:TTGemma3ForCausalLMGenerator, which "
        "builds on the torch reference generator "
        "ttbundles.reference.generator.ReferenceLlamaGenerator; it reads LlamaForCausalLM, "
    )
    assert "global_head_dim, num_global_key_value_heads" in diagnostic.message
    assert "ttbundle init --arch Gemma4ForCausalLM" in diagnostic.hint


def test_an_architecture_the_reference_reads_is_planned(models_dir, demo_checkpoint):
    init_bundle(models_dir / "llama", arch="LlamaForCausalLM", reference=True)
    _, decisions, _ = configure(demo_checkpoint)
    assert "llama@0.1.0" in decisions["architecture"]["reason"]


def test_a_reference_bundle_serves_what_the_demo_does_on_the_same_reference(
    models_dir, demo_checkpoint
):
    """`init --reference` declares what the reference serves: n-gram speculation is
    admitted by spec_plan (not TTB235) and prompt logprobs are served (not TTB206), as
    with the demo bundle; the declaration is the demo's, less what only the demo's own
    name or pooling choice adds."""
    from ttbundles.paths import builtin_bundles_dir

    init_bundle(models_dir / "llama", arch="LlamaForCausalLM", reference=True)
    written = json.loads((models_dir / "llama" / "vllm_metadata.json").read_text())
    demo = json.loads((builtin_bundles_dir() / "demo" / "vllm_metadata.json").read_text())
    assert written["capabilities"] == demo["capabilities"]
    ngram = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}
    _, decisions, plan = configure(
        demo_checkpoint, speculative_config=ngram, async_scheduling=False
    )
    assert plan["bundle"]["name"] == "llama"
    assert decisions["speculative"]["effective"] == "ngram, k=3", decisions["speculative"]
    assert plan["prompt_logprobs"] is True
