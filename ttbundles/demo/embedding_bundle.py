"""A pooling bundle of the `forward` form over the demo checkpoint, for the end-to-end
tests and `benchmarks/bench_pooling.py`.

Its generator is transformers' `LlamaModel` in float32 with last-token pooling (what
vLLM's `--convert embed` does to a decoder), so what it serves can be compared with
transformers directly, and what a benchmark measures beside transformers is the serving
path: vLLM's API server, the scheduler and the pooling runner.
"""

from __future__ import annotations

import json
from pathlib import Path

EMBEDDING_BUNDLE = "tiny-embedder"

ADAPTER = '''"""The reference plugin's pooling form over transformers' Llama: last token."""

import torch
from transformers import LlamaModel


class Embedder:
    model_capabilities = {}

    def __init__(self, model):
        self.model = model

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        path = hf_config._name_or_path
        return cls(LlamaModel.from_pretrained(path, dtype=torch.float32).eval())

    def forward(self, input_ids, attention_mask):
        hidden = self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        last = attention_mask.sum(dim=1).long() - 1
        return hidden[torch.arange(hidden.shape[0]), last]
'''

METADATA = {
    "schema_version": 5,
    "name": EMBEDDING_BUNDLE,
    "version": "1.0.0",
    "description": "Last-token embeddings of a Llama checkpoint through transformers.",
    "arch": "LlamaForCausalLM",
    "main_class": "adapter:Embedder",
    "capabilities": {"pooling": {"tasks": ["embed"], "form": "forward"}},
    "targets": {"HOST": {}},
}


def write_embedding_bundle(models_dir: Path) -> Path:
    """Write the bundle into `models_dir` (a folder for EXTRA_MODELS_DIR); its folder."""
    folder = Path(models_dir) / EMBEDDING_BUNDLE
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vllm_metadata.json").write_text(json.dumps(METADATA, indent=2) + "\n")
    (folder / "adapter.py").write_text(ADAPTER)
    return folder
