"""The demo checkpoint: a tiny Llama with its tokenizer and chat template, made locally.

No model hub is needed: weights come from a fixed seed, the tokenizer is trained with
`tokenizers` on a fixed text, and the same arguments always give the same files. It is
the embedded default that `ttbundle demo` serves and that the tests run against.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from ttbundles.fsutil import apply_umask
from ttbundles.paths import user_cache_dir

SEED = 1234
VOCAB_SIZE = 384
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|system|>", "<|user|>", "<|assistant|>", "<|end|>"]

_CORPUS = """\
Tenstorrent builds computers for AI. A mesh of chips runs a model written in TT-NN.
vLLM serves language models with continuous batching and a paged KV cache.
The quick brown fox jumps over the lazy dog. Hello world, hello mesh, hello bundle.
A bundle holds metadata and an adapter class. The registry maps architectures to
generators. Prefill reads the prompt; decode writes one token at a time.
Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000. Punctuation: . , ; : ! ? ( ) [ ] { } " '
The capital of France is Paris. The sky is blue. Water is wet. Once upon a time.
"""


def train_bpe(special_tokens: list[str], unk_token: str | None = "<unk>") -> Any:
    """A byte-level BPE `tokenizers.Tokenizer` trained on the fixed corpus; the special
    tokens take the first ids, in order (deterministic: same arguments, same ids)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token=unk_token))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=special_tokens,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_CORPUS.splitlines(), trainer=trainer)
    return tokenizer


def build_tokenizer(out_dir: Path):
    """A byte-level BPE tokenizer with a chat template, saved as tokenizer.json."""
    from transformers import PreTrainedTokenizerFast

    tokenizer = train_bpe(SPECIAL_TOKENS)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="</s>",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out_dir)
    return fast


def write_checkpoint(out_dir: Path, *, architecture: str = "LlamaForCausalLM") -> Path:
    """Write the tiny Llama checkpoint (safetensors) into `out_dir`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = LlamaConfig(**tiny_sizes(tokenizer), rms_norm_eps=1e-5, rope_theta=10000.0)
    save_random(LlamaForCausalLM(config), architecture, out_dir)
    return out_dir


def tiny_sizes(tokenizer: Any) -> dict[str, Any]:
    """The tiny checkpoints' shape (two layers of 64, grouped-query attention 4/2) and
    the tokenizer's ids: what every tiny family made here shares."""
    return {
        "vocab_size": len(tokenizer),
        "hidden_size": 64,
        "intermediate_size": 128,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 512,
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }


def save_random(model: Any, architecture: str, out_dir: Path, *, seed: int = SEED) -> None:
    """Fill `model` from `seed` and save it as a checkpoint of `architecture`: the
    safetensors, a config without the transformers version (the same bytes under any
    transformers), and no generation config (sampling defaults stay vLLM's own)."""
    fill_random(model, seed)
    model.config.architectures = [architecture]
    model.save_pretrained(out_dir, safe_serialization=True)
    generation = out_dir / "generation_config.json"
    if generation.exists():
        generation.unlink()
    _normalise_config(out_dir / "config.json")


def fill_random(model: Any, seed: int) -> None:
    """Overwrite every parameter from a seeded generator, in name order: matrices
    N(0, 0.2), vectors (norm scales, biases) 1 + N(0, 0.1). The same seed and parameter
    names give the same weights on any machine."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() > 1:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.2)
            else:
                param.copy_(1.0 + 0.1 * torch.randn(param.shape, generator=generator))


def _normalise_config(path: Path) -> None:
    data = json.loads(path.read_text())
    data.pop("transformers_version", None)
    for sub in ("text_config", "vision_config"):  # a multimodal model's sub-configs
        if isinstance(data.get(sub), dict):
            data[sub].pop("transformers_version", None)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")


if __name__ == "__main__":
    import sys

    print(write_checkpoint(Path(sys.argv[1])))


# --- the cached copy `ttbundle demo` serves ---------------------------------------------

# What a complete demo checkpoint holds; a folder missing any of them is (re)written.
CHECKPOINT_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")


def default_checkpoint_dir() -> Path:
    return user_cache_dir() / "demo-checkpoint"


def checkpoint_is_complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in CHECKPOINT_FILES)


def write_demo_checkpoint(folder: Path, writer: Callable[[Path], Path] = write_checkpoint) -> Path:
    """Write the demo checkpoint (or what `writer` writes) into `folder`, whole or not
    at all.

    The files are written into a sibling temporary folder first and moved in at the end,
    so an interrupted write never leaves a folder that looks complete.
    """
    from transformers.utils import logging as transformers_logging

    folder = Path(folder).expanduser().absolute()
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}-", dir=folder.parent))
    bars = transformers_logging.is_progress_bar_enabled()
    transformers_logging.disable_progress_bar()  # a bar for one small file is noise
    try:
        writer(staging)
        # mkdtemp made the folder 0700 and save_pretrained writes some files 0600: give
        # them the modes of any new file, so a service account can read the checkpoint.
        apply_umask(staging)
        if not folder.exists():
            staging.rename(folder)
        else:
            for item in staging.iterdir():
                os.replace(item, folder / item.name)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if bars:
            transformers_logging.enable_progress_bar()
    return folder


def ensure_checkpoint(folder: Path | None = None) -> tuple[Path, bool]:
    """The demo checkpoint in `folder` (default: the cache), written only when missing.

    Returns the folder and whether it was written now.
    """
    folder = Path(folder or default_checkpoint_dir()).expanduser().absolute()
    if checkpoint_is_complete(folder):
        return folder, False
    return write_demo_checkpoint(folder), True
