"""A classification (cross-encoder) bundle of the pooling `forward` form, served by a real
`vllm serve` on the host mesh: `/classify`, `/score` and `/rerank` answer with
`AutoModelForSequenceClassification`'s logits (through vLLM's sigmoid for one label) on a
tiny `LlamaForSequenceClassification` (`tests.pooling_bundles`, shared with `ttbundle test`'s
tests).

One server, started after the embedding module's has stopped (module-scoped fixtures):
at most one `vllm serve` at a time.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import READY_TIMEOUT, STOP_TIMEOUT, _environment, write_test_bundle
from tests.e2e.test_pooling_serving import http_post_json
from tests.pooling_bundles import CLASSIFIER, CLASSIFIER_METADATA
from tests.zygote import start_server

pytestmark = pytest.mark.server

QUERY = "what does the fox do"
DOCUMENTS = ["The quick brown fox jumps", "a lazy dog sleeps all day", "hi"]


@pytest.fixture(scope="module")
def classify_server(classifier_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("pooling-classify")
    write_test_bundle(root / "models", CLASSIFIER_METADATA, CLASSIFIER)
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
