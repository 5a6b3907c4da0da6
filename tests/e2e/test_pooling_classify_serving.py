"""A classification (cross-encoder) bundle of the pooling `forward` form, served by a real
`vllm serve` on the host mesh: `/classify`, `/score` and `/rerank` answer with
`AutoModelForSequenceClassification`'s logits (through vLLM's sigmoid for one label) on a
tiny `LlamaForSequenceClassification` made here.

One server, started after the embedding module's has stopped (module-scoped fixtures):
at most one `vllm serve` at a time.
"""

from __future__ import annotations

import json
import shutil

import pytest

from tests.e2e.conftest import READY_TIMEOUT, STOP_TIMEOUT, _environment, write_test_bundle
from tests.e2e.test_pooling_serving import http_post_json
from tests.zygote import start_server

pytestmark = pytest.mark.server

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
METADATA = {
    "schema_version": 5,
    "name": "tiny-reranker",
    "version": "1.0.0",
    "arch": "LlamaForSequenceClassification",
    "main_class": "adapter:Classifier",
    "capabilities": {"pooling": {"tasks": ["classify"], "form": "forward"}},
    "targets": {"HOST": {}},
}
QUERY = "what does the fox do"
DOCUMENTS = ["The quick brown fox jumps", "a lazy dog sleeps all day", "hi"]


@pytest.fixture(scope="module")
def classifier_checkpoint(demo_checkpoint, tmp_path_factory):
    """The demo checkpoint's shape as a one-label sequence classifier (a cross-encoder):
    seeded weights, its tokenizer; `use_sep_token: false` so that vLLM scores a pair as
    the query's text followed by the document's (the reference does the same)."""
    from transformers import LlamaConfig, LlamaForSequenceClassification

    from ttbundles.demo.checkpoint import save_random

    folder = tmp_path_factory.mktemp("checkpoint") / "tiny-llama-cls"
    config = LlamaConfig.from_pretrained(demo_checkpoint)
    config.num_labels = 1
    save_random(LlamaForSequenceClassification(config), "LlamaForSequenceClassification", folder)
    for path in demo_checkpoint.iterdir():
        if "token" in path.name:
            shutil.copy(path, folder / path.name)
    data = json.loads((folder / "config.json").read_text())
    data["use_sep_token"] = False
    (folder / "config.json").write_text(json.dumps(data, indent=2))
    return folder


@pytest.fixture(scope="module")
def classify_server(classifier_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("pooling-classify")
    write_test_bundle(root / "models", METADATA, CLASSIFIER)
    env = _environment({"EXTRA_MODELS_DIR": str(root / "models")})
    args = ["--max-model-len", "256"]  # vLLM pools a *ForSequenceClassification by itself
    process = start_server(
        classifier_checkpoint, vllm_args=args, env=env, log_path=root / "server.log"
    )
    try:
        process.wait_ready(READY_TIMEOUT)
        yield process
    finally:
        process.stop(STOP_TIMEOUT)


def _logits(checkpoint, texts):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForSequenceClassification.from_pretrained(
        checkpoint, dtype=torch.float32
    ).eval()
    with torch.inference_mode():
        return [
            float(model(input_ids=tokenizer(t, return_tensors="pt").input_ids).logits[0, 0])
            for t in texts
        ]


def _sigmoid(x: float) -> float:
    import math

    return 1.0 / (1.0 + math.exp(-x))


def test_classify_equals_transformers_logits(classify_server, classifier_checkpoint):
    root = classify_server.api_url.removesuffix("/v1")
    body = {"model": str(classifier_checkpoint), "input": DOCUMENTS}
    data = http_post_json(root + "/classify", body)["data"]
    want = _logits(classifier_checkpoint, DOCUMENTS)
    assert [d["num_classes"] for d in data] == [1, 1, 1]
    for row, logit in zip(data, want):
        assert row["probs"][0] == pytest.approx(_sigmoid(logit), abs=1e-5)
    # The raw logits, as vLLM gives them without its activation.
    raw = http_post_json(root + "/classify", {**body, "use_activation": False})["data"]
    for row, logit in zip(raw, want):
        assert row["probs"][0] == pytest.approx(logit, abs=1e-4)


def test_score_and_rerank_equal_transformers_on_the_pairs(classify_server, classifier_checkpoint):
    root = classify_server.api_url.removesuffix("/v1")
    model = str(classifier_checkpoint)
    want = [_sigmoid(x) for x in _logits(classifier_checkpoint, [QUERY + d for d in DOCUMENTS])]
    scores = http_post_json(
        root + "/score", {"model": model, "queries": QUERY, "documents": DOCUMENTS}
    )
    got = [d["score"] for d in sorted(scores["data"], key=lambda d: d["index"])]
    assert got == pytest.approx(want, abs=1e-5)
    reranked = http_post_json(
        root + "/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS}
    )["results"]
    assert [r["index"] for r in reranked] == sorted(range(3), key=lambda i: -want[i])
    for r in reranked:
        assert r["relevance_score"] == pytest.approx(want[r["index"]], abs=1e-5)
