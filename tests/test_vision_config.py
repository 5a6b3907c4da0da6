"""What a vision-language checkpoint's configuration becomes: the bundle's modalities as
vLLM's per-prompt limits, normalised pixels, lanes with a RoPE delta per slot.

Real `VllmConfig`s built in-process on the tiny Qwen2.5-VL checkpoint (vLLM reads its
processor), with the built-in demo-vision bundle or bundles written here.
"""

from __future__ import annotations

import json

import pytest
from vllm.engine.arg_utils import EngineArgs

from tests.bundle_factory import write_bundle
from ttbundles.demo.variants import write_lanes_bundle
from ttbundles.errors import ConfigurationError
from ttbundles.paths import builtin_bundles_dir


@pytest.fixture
def host(monkeypatch, tmp_path):
    monkeypatch.setenv("MESH_DEVICE", "HOST")
    monkeypatch.delenv("EXTRA_MODELS_DIR", raising=False)
    monkeypatch.delenv("TT_VLLM_BUILTIN_MODELS", raising=False)
    return tmp_path


def configure(checkpoint, **kwargs):
    kwargs.setdefault("max_model_len", 1024)
    config = EngineArgs(model=str(checkpoint), **kwargs).create_engine_config()
    plan = config.additional_config["ttbundles"]
    return config, {d["setting"]: d for d in plan["decisions"]}, plan


def limits(config) -> dict[str, int]:
    mm = config.model_config.multimodal_config
    return {m: mm.get_limit_per_prompt(m) for m in ("image", "video", "audio")}


def test_the_bundle_modalities_become_vllm_limits_and_pixels_come_normalised(
    host, vision_checkpoint
):
    config, decisions, plan = configure(vision_checkpoint)
    assert plan["bundle"]["name"] == "demo-vision"
    assert limits(config) == {"image": 2, "video": 0, "audio": 0}
    assert plan["inputs"] == {"image": 2}
    assert decisions["inputs"]["effective"] == "text + 2 image(s) per prompt"
    # vLLM's own Qwen2.5-VL would leave pixels raw for its GPU to normalise.
    assert config.model_config.multimodal_config.mm_device_do_normalize is False
    assert decisions["mm_device_do_normalize"]["effective"] is False


def test_a_user_limit_may_lower_but_not_raise_the_bundle_limit(host, vision_checkpoint):
    config, decisions, _ = configure(vision_checkpoint, limit_mm_per_prompt={"image": 1})
    assert limits(config)["image"] == 1
    assert decisions["inputs"]["requested"] == {"image": 1}
    with pytest.raises(ConfigurationError) as excinfo:
        configure(vision_checkpoint, limit_mm_per_prompt={"image": 3, "video": 1})
    diagnostic = excinfo.value.diagnostics[0]
    assert diagnostic.code == "TTB215"
    assert "image=3, video=1" in diagnostic.message and "text + 2 image(s)" in diagnostic.message


def test_a_text_only_bundle_for_a_vision_architecture_takes_no_images(
    host, vision_checkpoint, monkeypatch
):
    source = builtin_bundles_dir() / "demo-vision"
    document = json.loads((source / "vllm_metadata.json").read_text())
    document.update(schema_version=1, name="vision-text-only")
    del document["capabilities"]["modalities"]
    document.pop("tests", None)  # its image prompts need images (and schema 2)
    write_bundle(
        host / "models" / "vision-text-only",
        document=document,
        files={"adapter.py": (source / "adapter.py").read_text()},
    )
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(host / "models"))
    config, decisions, plan = configure(vision_checkpoint)
    assert plan["bundle"]["name"] == "vision-text-only"
    assert limits(config) == {"image": 0, "video": 0, "audio": 0}
    assert plan["inputs"] == {}
    assert decisions["inputs"]["effective"] == "text only"
    assert not config.model_config.is_multimodal_model or not (
        config.model_config.multimodal_config.get_limit_per_prompt("image")
    )


def test_lanes_serve_request_specific_rope(host, vision_checkpoint, monkeypatch):
    """The reference plugin refuses M-RoPE in lanes; here each slot keeps its delta."""
    write_lanes_bundle(host / "models", "demo-vision")
    monkeypatch.setenv("EXTRA_MODELS_DIR", str(host / "models"))
    config, decisions, plan = configure(vision_checkpoint, data_parallel_size=2, max_num_seqs=2)
    assert config.model_config.uses_mrope
    assert plan["bundle"]["name"] == "demo-vision-lanes"
    assert plan["lanes"] == 2
    assert decisions["max_num_seqs"]["effective"] == 4
    assert limits(config)["image"] == 2
