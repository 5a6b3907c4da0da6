"""A pooling bundle of the `forward` form served by a real `vllm serve --runner pooling
--convert embed` on the host mesh: `/v1/embeddings` and `/pooling` answer with
transformers' pooled vectors (last token, normalised), through vLLM's API unchanged.

One server (each costs ~20 s of CI): started here, not with the session's servers.
"""

from __future__ import annotations

import pytest

from tests.e2e.conftest import READY_TIMEOUT, STOP_TIMEOUT, _environment
from tests.zygote import start_server
from ttbundles.demo.embedding_bundle import write_embedding_bundle

pytestmark = pytest.mark.server

TEXTS = ["The quick brown fox", "jumps over the lazy dog again and again", "hi"]


@pytest.fixture(scope="module")
def embed_server(demo_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("pooling")
    write_embedding_bundle(root / "models")
    env = _environment({"EXTRA_MODELS_DIR": str(root / "models")})
    args = ["--runner", "pooling", "--convert", "embed", "--max-model-len", "256"]
    process = start_server(demo_checkpoint, vllm_args=args, env=env, log_path=root / "server.log")
    try:
        process.wait_ready(READY_TIMEOUT)
        yield process, root / "server.log"
    finally:
        process.stop(STOP_TIMEOUT)


def http_post_json(url: str, body: dict) -> dict:
    import httpx

    response = httpx.post(url, json=body, timeout=60)
    assert response.status_code == 200, response.text
    return response.json()


def _transformers_vectors(checkpoint, texts):
    import torch
    from transformers import AutoTokenizer, LlamaModel

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = LlamaModel.from_pretrained(checkpoint, dtype=torch.float32).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            ids = tokenizer(text, return_tensors="pt").input_ids
            hidden = model(input_ids=ids).last_hidden_state[0, -1]
            out.append(torch.nn.functional.normalize(hidden, dim=0))
    return out


def test_embeddings_equal_transformers_pooled_vectors(embed_server, demo_checkpoint):
    import openai
    import torch

    process, log = embed_server
    client = openai.OpenAI(base_url=process.api_url, api_key="none")
    response = client.embeddings.create(model=str(demo_checkpoint), input=TEXTS)
    got = [torch.tensor(d.embedding) for d in response.data]
    want = _transformers_vectors(demo_checkpoint, TEXTS)
    for g, w in zip(got, want):
        assert g.shape == w.shape
        assert torch.nn.functional.cosine_similarity(g, w, dim=0) >= 0.99999
        assert torch.allclose(g.norm(), torch.tensor(1.0), atol=1e-5)
    text = log.read_text()
    assert "runner: None -> 'pooling'" not in text  # requested as a flag, said as asked
    assert "tiny-embedder@1.0.0 pools (--runner pooling --convert embed)" in text
    assert "no KV cache" in text


def test_pooling_endpoint_and_an_unnormalised_request(embed_server, demo_checkpoint):
    """`/pooling` answers the same vectors; a request with use_activation false (vLLM's
    per-request normalisation switch) gets the raw pooled vector, as vLLM's head gives."""
    import torch

    process, _log = embed_server
    model = str(demo_checkpoint)
    pooled = http_post_json(
        process.api_url.removesuffix("/v1") + "/pooling",
        {"model": model, "input": TEXTS[0], "task": "embed"},
    )
    [row] = pooled["data"]
    want = _transformers_vectors(demo_checkpoint, TEXTS[:1])[0]
    got = torch.tensor(row["data"])
    assert torch.nn.functional.cosine_similarity(got, want, dim=0) >= 0.99999
    raw = http_post_json(
        process.api_url + "/embeddings",
        {"model": model, "input": TEXTS[0], "use_activation": False},
    )
    vector = torch.tensor(raw["data"][0]["embedding"])
    assert vector.norm() > 1.01 or vector.norm() < 0.99  # not normalised
    assert torch.nn.functional.cosine_similarity(vector, want, dim=0) >= 0.99999
