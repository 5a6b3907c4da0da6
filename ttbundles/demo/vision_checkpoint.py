"""The tiny vision-language checkpoint: a Qwen2.5-VL with random weights, made locally.

No package here ships a small trained vision-language model, so the vision path is tested
the honest way: a random-weight `Qwen2_5_VLForConditionalGeneration` small enough to run
in a second, with everything a real Qwen2.5-VL checkpoint folder has for serving:
`config.json`, `model.safetensors`, a tokenizer carrying Qwen's special tokens
(`<|im_start|>`, `<|im_end|>`, `<|endoftext|>`, `<|vision_start|>`, `<|image_pad|>`,
`<|vision_end|>`, `<|video_pad|>`), a Qwen-style chat template that puts
`<|vision_start|><|image_pad|><|vision_end|>` where a message has an image, and the
processor files (`preprocessor_config.json` for `Qwen2VLImageProcessor`, the video
processor, the processor's chat template). transformers' `AutoProcessor` and vLLM's
Qwen2.5-VL processor read it as they read `Qwen/Qwen2.5-VL-3B-Instruct`.

The shapes keep the real model's structure at toy sizes: 14-pixel patches, 2-frame
temporal patches, 2x2 spatial merge, windowed attention (a 56-pixel window: 2x2 merged
tokens, so images larger than 56 pixels on a side really use several windows) with one
full-attention block, and 3-section M-RoPE on a head size of 16. Images are resized to
between 56x56 and 224x224 pixels, 4 to 64 image tokens each. Same arguments, same
files: weights come from a fixed seed, the tokenizer from a fixed corpus. About 1 MB.
"""

from __future__ import annotations

import json
from pathlib import Path

from ttbundles.demo.checkpoint import (
    save_random,
    train_bpe,
    write_demo_checkpoint,
)
from ttbundles.paths import user_cache_dir

SEED = 2501
RECORD = "ttbundles-vision-checkpoint.json"
# Bump when the files this module writes change: a cached folder with another version is
# rewritten, so a cache never serves an older checkpoint than the tests expect.
VERSION = 1

# Qwen's special tokens, first ids in this order (Qwen puts them after the BPE vocabulary;
# their ids differ here, and the config names them, as a real checkpoint's does).
SPECIAL_TOKENS = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|image_pad|>",
    "<|video_pad|>",
]
IMAGE_TOKEN = "<|image_pad|>"

# Qwen2-VL's template, without the default system prompt: string content as is; list
# content item by item, an image (or image_url) item as the vision placeholder.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>"
    "{% elif content['type'] == 'video' or 'video' in content %}"
    "<|vision_start|><|video_pad|><|vision_end|>"
    "{% elif 'text' in content %}{{ content['text'] }}"
    "{% endif %}{% endfor %}{% endif %}"
    "<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

PATCH_SIZE = 14
MERGE_SIZE = 2
TEMPORAL_PATCH_SIZE = 2

TEXT_CONFIG = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-6,
    # Head size 16: 8 rotary frequencies, split temporal / height / width.
    "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    "use_sliding_window": False,
}
VISION_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": PATCH_SIZE,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    "window_size": 56,
    "fullatt_block_indexes": [1],
    "tokens_per_second": 2,
}


# Qwen3-VL at toy sizes: 16-pixel patches, a 4 x 4 learned position grid, one deepstack
# feature (from vision block 0, added after text layer 0), interleaved M-RoPE, Qwen3's
# per-head q/k norms. Images 64..256 pixels a side: 4 to 64 image tokens each.
QWEN3_PATCH_SIZE = 16
QWEN3_TEXT_CONFIG = {
    **{k: v for k, v in TEXT_CONFIG.items() if k != "use_sliding_window"},
    "head_dim": 16,
    "rope_parameters": {
        "rope_type": "default",
        "rope_theta": 10000.0,
        "mrope_section": [2, 3, 3],
        "mrope_interleaved": True,
    },
}
QWEN3_VISION_CONFIG = {
    "depth": 2,
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_heads": 2,
    "out_hidden_size": 64,
    "patch_size": QWEN3_PATCH_SIZE,
    "spatial_merge_size": MERGE_SIZE,
    "temporal_patch_size": TEMPORAL_PATCH_SIZE,
    "num_position_embeddings": 16,
    "deepstack_visual_indexes": [0],
    "hidden_act": "gelu_pytorch_tanh",
}


def build_processor(out_dir: Path, family: str = "qwen2_5_vl"):
    """The tokenizer and the family's processor (image and video processors, chat
    template), saved into `out_dir`; returns the processor. `family`: "qwen2_5_vl" or
    "qwen3_vl" (16-pixel patches)."""
    from ttbundles import torchvision_compat

    torchvision_compat.install()  # transformers' Qwen2-VL processors import torchvision
    import transformers
    from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor

    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=train_bpe(SPECIAL_TOKENS, unk_token=None),
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        extra_special_tokens={"image_token": IMAGE_TOKEN, "video_token": "<|video_pad|>"},
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    patch = PATCH_SIZE if family == "qwen2_5_vl" else QWEN3_PATCH_SIZE
    side = patch * MERGE_SIZE
    sizes = {
        "patch_size": patch,
        "merge_size": MERGE_SIZE,
        "temporal_patch_size": TEMPORAL_PATCH_SIZE,
        "min_pixels": (2 * side) ** 2,
        "max_pixels": (8 * side) ** 2,
    }
    if family == "qwen2_5_vl":
        processor_cls = transformers.Qwen2_5_VLProcessor
        video_cls = transformers.Qwen2VLVideoProcessor
    else:
        processor_cls = transformers.Qwen3VLProcessor
        video_cls = transformers.Qwen3VLVideoProcessor
    processor = processor_cls(
        image_processor=Qwen2VLImageProcessor(**sizes),
        tokenizer=tokenizer,
        video_processor=video_cls(**sizes),
        chat_template=CHAT_TEMPLATE,
    )
    processor.save_pretrained(out_dir)
    # transformers 5 keeps the image processor inside processor_config.json; older readers
    # (and tools that load the image processor alone) look for preprocessor_config.json.
    processor.image_processor.save_pretrained(out_dir)
    return processor


def write_vision_checkpoint(out_dir: Path, family: str = "qwen2_5_vl") -> Path:
    """Write the tiny checkpoint of `family` ("qwen2_5_vl", the default, or "qwen3_vl")
    and its processor into `out_dir`."""
    import transformers

    if family not in ("qwen2_5_vl", "qwen3_vl"):
        raise ValueError(f"family {family!r}: qwen2_5_vl or qwen3_vl")
    qwen3 = family == "qwen3_vl"
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    processor = build_processor(out_dir, family)
    tokenizer = processor.tokenizer
    ids = {token: tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS}
    config_cls = transformers.Qwen3VLConfig if qwen3 else transformers.Qwen2_5_VLConfig
    config = config_cls(
        text_config={
            **(QWEN3_TEXT_CONFIG if qwen3 else TEXT_CONFIG),
            "vocab_size": len(tokenizer),
            "eos_token_id": ids["<|im_end|>"],
            "pad_token_id": ids["<|endoftext|>"],
            "bos_token_id": None,
        },
        vision_config=QWEN3_VISION_CONFIG if qwen3 else VISION_CONFIG,
        image_token_id=ids[IMAGE_TOKEN],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    architecture = (
        "Qwen3VLForConditionalGeneration" if qwen3 else "Qwen2_5_VLForConditionalGeneration"
    )
    save_random(getattr(transformers, architecture)(config), architecture, out_dir, seed=SEED)
    (out_dir / RECORD).write_text(json.dumps({"version": VERSION}) + "\n")
    return out_dir


# --- the cached copy ----------------------------------------------------------------------

CHECKPOINT_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "preprocessor_config.json",
    RECORD,
)


def default_vision_checkpoint_dir() -> Path:
    return user_cache_dir() / "demo-vision-checkpoint"


def vision_checkpoint_is_complete(folder: Path) -> bool:
    """Every file present and written by this version of the module."""
    if not all((folder / name).is_file() for name in CHECKPOINT_FILES):
        return False
    try:
        return json.loads((folder / RECORD).read_text()).get("version") == VERSION
    except (OSError, ValueError, AttributeError):
        return False


def ensure_vision_checkpoint(folder: Path | None = None) -> tuple[Path, bool]:
    """The tiny vision checkpoint in `folder` (default: the cache), written only when
    missing or stale; whole or not at all (see `write_demo_checkpoint`).

    Returns the folder and whether it was written now.
    """
    folder = Path(folder or default_vision_checkpoint_dir()).expanduser().absolute()
    if vision_checkpoint_is_complete(folder):
        return folder, False
    return write_demo_checkpoint(folder, writer=write_vision_checkpoint), True


if __name__ == "__main__":
    import sys

    print(write_vision_checkpoint(Path(sys.argv[1])))
