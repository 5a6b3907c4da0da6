"""A served checkpoint's files, read on the host without loading the model: its folder
(vLLM's `--model`, a folder or a hub id already downloaded) and which safetensors file
holds a tensor (from the index, else each file's header).

Shared by the planner, which refuses from the headers alone (a classifier without its
head), and the runner's pooler, which loads that one tensor.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ttbundles.errors import ConfigurationError

SCORE_WEIGHT = "score.weight"
"""The classification head's key in transformers' `*ForSequenceClassification`
checkpoints (Llama, Mistral, Qwen2, Qwen3: `nn.Linear(hidden, num_labels, bias=False)`)."""


def checkpoint_folder(model: str) -> Path:
    """The local folder of vLLM's `--model` (a folder, or a hub id already downloaded)."""
    path = Path(model).expanduser()
    if path.is_dir():
        return path
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, local_files_only=True))


def file_holding(folder: Path, key: str) -> Path | None:
    """The safetensors file of the checkpoint that holds `key` (its index says, or each
    file's header), None when none does; no tensor is read."""
    from safetensors import safe_open

    index = folder / "model.safetensors.index.json"
    if index.is_file():
        name = json.loads(index.read_text()).get("weight_map", {}).get(key)
        return folder / name if name else None
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as handle:
            if key in handle.keys():  # noqa: SIM118 - safe_open is not a mapping
                return file
    return None


def headless_classifier(model_config: Any) -> ConfigurationError:
    """TTB273: the checkpoint has no classification head (a `*ForCausalLM` asked for
    `--convert classify`), in the words the planner and the pooler both use."""
    return ConfigurationError.single(
        "TTB273",
        f"{model_config.model} has no {SCORE_WEIGHT}: classification of the pooling form "
        "'prefill_hidden' applies the checkpoint's classification head on the host, and "
        f"this checkpoint ({', '.join(model_config.architectures)}) has none",
        hint="serve a *ForSequenceClassification checkpoint, or ask for embeddings "
        "(--convert embed)",
    )
