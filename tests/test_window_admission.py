"""A checkpoint with a sliding window, at configuration (`serving.planning.window_admission`, the
same code `ttbundle plan` runs): served where the generator masks the window or where
max_model_len does not pass it, refused with TTB250 everywhere else."""

from __future__ import annotations

import pytest
import vllm  # noqa: F401 - required: a missing or broken vllm fails

from tests.bundle_factory import metadata, write_bundle
from tests.conftest import WINDOW
from tests.test_platform_config import configure, error_of
from ttbundles.errors import ConfigurationError

ARCH = "MistralForCausalLM"


def environment_bundle(models_dir, package: str, name: str, body: str):
    """A bundle whose class lives in `package` on sys.path (read from source, never
    imported), with the class body given."""
    folder = models_dir.parent / "lib" / package
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "__init__.py").touch()
    (folder / f"{name}.py").write_text(f"class Generator:\n{body}")
    document = metadata(
        name,
        arch=ARCH,
        main_class=f"{package}.{name}:Generator",
        main_class_source="environment",
    )
    return write_bundle(models_dir / name, document=document)


def test_a_generator_that_does_not_mask_the_window_is_refused(models_dir, window_checkpoint):
    environment_bundle(models_dir, "tt_models", "plain", "    model_capabilities = {}\n")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(window_checkpoint, max_model_len=256)
    assert error_of(excinfo) == "TTB250"
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.message.startswith(
        f"the checkpoint's config.json sets sliding_window={WINDOW} (all 2 layers), shorter "
        "than max_model_len 256, and the generator tt_models.plain:Generator (plain) does "
        "not declare that it masks keys older than the window"
    )
    assert f"--max-model-len {WINDOW}" in diagnostic.hint
    assert "model_capabilities['supports_sliding_window'] = True" in diagnostic.hint


def test_no_longer_than_the_window_every_generator_serves(models_dir, window_checkpoint):
    environment_bundle(models_dir, "tt_models", "plain", "    model_capabilities = {}\n")
    config, decisions, _ = configure(window_checkpoint, max_model_len=WINDOW)
    assert config.model_config.max_model_len == WINDOW
    assert decisions["sliding_window"]["effective"] == WINDOW
    assert "every query sees its whole context" in decisions["sliding_window"]["reason"]


def test_a_generator_that_declares_the_window_serves(models_dir, window_checkpoint):
    environment_bundle(
        models_dir,
        "tt_models",
        "masked",
        "    model_capabilities = {'supports_sliding_window': True}\n",
    )
    _, decisions, _ = configure(window_checkpoint, max_model_len=256)
    assert decisions["sliding_window"]["reason"] == (
        f"sliding_window={WINDOW} (all 2 layers): tt_models.masked:Generator declares "
        "model_capabilities['supports_sliding_window']"
    )


def test_tt_metal_generators_read_the_window_themselves(models_dir, window_checkpoint):
    """TT-Metal's classes (its `models` package) have no flag; they read sliding_window
    from the config, and are served as the reference plugin serves them."""
    environment_bundle(models_dir, "models", "tt_window", "    model_capabilities = {}\n")
    _, decisions, _ = configure(window_checkpoint, max_model_len=256)
    assert "is TT-Metal's" in decisions["sliding_window"]["reason"]


def test_no_window_no_decision(models_dir, demo_checkpoint):
    environment_bundle(models_dir, "tt_models", "llama", "    model_capabilities = {}\n")
    _, decisions, _ = configure(demo_checkpoint, hf_overrides={"architectures": [ARCH]})
    assert "sliding_window" not in decisions
