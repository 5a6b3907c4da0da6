"""The classification (cross-encoder) bundle of the pooling `forward` form and its tiny
checkpoint, shared by the served tests (`tests/e2e/test_pooling_classify_serving.py`)
and `ttbundle test`'s (`tests/test_conformance_pooling.py`); the embedding one is
`ttbundles.demo.embedding_bundle` (benchmarks use it too).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

CLASSIFIER = '''"""The pooling form over transformers' Llama classifier: the score head at the last
real token of each right-padded row."""

import torch
from transformers import LlamaForSequenceClassification


class Classifier:
    model_capabilities = {}

    def __init__(self, model):
        self.model = model

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        path = hf_config._name_or_path
        model = LlamaForSequenceClassification.from_pretrained(path, dtype=torch.float32)
        return cls(model.eval())

    def forward(self, input_ids, attention_mask):
        hidden = self.model.model(input_ids=input_ids, attention_mask=attention_mask)
        last = attention_mask.sum(dim=1).long() - 1
        pooled = hidden.last_hidden_state[torch.arange(input_ids.shape[0]), last]
        return self.model.score(pooled)
'''
CLASSIFIER_METADATA = {
    "schema_version": 5,
    "name": "tiny-reranker",
    "version": "1.0.0",
    "arch": "LlamaForSequenceClassification",
    "main_class": "adapter:Classifier",
    "capabilities": {"pooling": {"tasks": ["classify"], "form": "forward"}},
    "targets": {"HOST": {}},
}


def write_classifier_checkpoint(demo_checkpoint: Path, folder: Path) -> Path:
    """The demo checkpoint's shape as a one-label sequence classifier (a cross-encoder):
    seeded weights, its tokenizer; `use_sep_token: false` so that vLLM scores a pair as
    the query's text followed by the document's (the reference does the same)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from ttbundles.demo.checkpoint import save_random

    config = LlamaConfig.from_pretrained(demo_checkpoint)
    config.num_labels = 1
    save_random(LlamaForSequenceClassification(config), "LlamaForSequenceClassification", folder)
    for path in Path(demo_checkpoint).iterdir():
        if "token" in path.name:
            shutil.copy(path, folder / path.name)
    data = json.loads((folder / "config.json").read_text())
    data["use_sep_token"] = False
    (folder / "config.json").write_text(json.dumps(data, indent=2))
    return folder
