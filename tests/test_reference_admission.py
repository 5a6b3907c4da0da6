"""A bundle built on the torch reference generator, at configuration
(`serving.planning.reference_admission`, the same code `ttbundle plan` runs): an architecture the
reference does not read is refused there (TTB041), saying which reference reads it,
rather than by the generator at load; Gemma 4 on its own reference is planned."""

from __future__ import annotations

import json

import pytest
import vllm  # noqa: F401 - required: a missing or broken vllm fails

from tests.test_platform_config import configure, error_of
from ttbundles.errors import ConfigurationError
from ttbundles.scaffold.init import init_bundle


@pytest.fixture(scope="module")
def gemma4_checkpoint(tmp_path_factory):
    """The tiny Gemma 4 text checkpoint (`write_gemma4_checkpoint`)."""
    from tests.conftest import write_gemma4_checkpoint

    return write_gemma4_checkpoint(tmp_path_factory.mktemp("checkpoint") / "tiny-gemma4")


def test_a_gemma4_bundle_on_the_llama_reference_is_refused_naming_its_reference(
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
    assert "read by ttbundles.reference.gemma4.ReferenceGemma4Generator" in diagnostic.message
    assert "ttbundle init --arch Gemma4ForCausalLM" in diagnostic.hint


def test_a_gemma4_reference_bundle_is_planned_with_a_kv_shape_per_group(
    models_dir, gemma4_checkpoint
):
    """`init --reference` for Gemma 4 is admitted, and its KV groups keep their own
    shapes: a full-attention group of the global layers' 1 KV head of size 32 beside
    the sliding group's 2 of 16."""
    init_bundle(models_dir / "g4", arch="Gemma4ForCausalLM", reference=True)
    _, decisions, plan = configure(gemma4_checkpoint)
    assert plan["bundle"]["name"] == "g4"
    assert "g4@0.1.0" in decisions["architecture"]["reason"]


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
