"""The host references served as pooling models by a real `vllm serve` (the pooling form
`prefill_hidden`: the reference's prefill returns hidden states, vLLM's own pooler
finishes on the host), against transformers on the same float32 weights:

- a Qwen3-Embedding-shaped checkpoint (its `modules.json`: last token, normalised) with a
  bundle from `ttbundle init --reference`, on two data-parallel engines: `/v1/embeddings`
  and Cohere's `/v2/embed` answer transformers' vectors, both engines serving; and asked
  for per-token vectors (`--pooler-config`), `/pooling` answers every position's;
- a `Qwen3ForSequenceClassification` reranker from `init --reference`: `/classify`,
  `/score`, `/rerank` and `/v2/rerank` answer with `AutoModelForSequenceClassification`'s
  logits;
- the real trained SmolLM2-135M-Instruct through the built-in demo bundle, `--runner
  pooling --convert embed`: last-token embeddings equal transformers';
- Gemma 3 from `init --reference` (sliding-window layers), prompts several windows long.

The five servers start together (module-scoped) and stop after the module.
"""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import GEMMA3_WINDOW
from tests.e2e.conftest import READY_TIMEOUT, STOP_TIMEOUT, _environment
from tests.e2e.test_pooling_classify_serving import _logits, _sigmoid
from tests.e2e.test_pooling_serving import http_post_json
from tests.zygote import start_server

pytestmark = pytest.mark.server

TEXTS = ["The quick brown fox", "jumps over the lazy dog again and again", "hi"]
QUERY = "what does the fox do"
DOCUMENTS = ["The quick brown fox jumps", "a lazy dog sleeps all day", "hi"]
COSINE = 0.99999


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    from ttbundles.demo.pooling_checkpoints import write_qwen3_classifier, write_qwen3_embedder

    root = tmp_path_factory.mktemp("pooling-reference")
    embedder = write_qwen3_embedder(root / "qwen3-embedder")
    reranker = write_qwen3_classifier(root / "qwen3-reranker", num_labels=1)
    # vLLM scores a pair as the query's text then the document's (no separator token),
    # as the transformers side below does.
    config = json.loads((reranker / "config.json").read_text())
    config["use_sep_token"] = False
    (reranker / "config.json").write_text(json.dumps(config, indent=2))
    return root, embedder, reranker


@pytest.fixture(scope="module")
def pooling_servers(checkpoints, real_model, gemma3_checkpoint):
    from ttbundles.scaffold.init import init_bundle

    root, embedder, reranker = checkpoints
    models = root / "models"
    for name, checkpoint in (
        ("qwen3-embedder", embedder),
        ("qwen3-reranker", reranker),
        ("gemma3", gemma3_checkpoint),
    ):
        init_bundle(models / name, arch=None, from_hf=str(checkpoint), reference=True)
    env = _environment({"EXTRA_MODELS_DIR": str(models), "TT_VLLM_BUILTIN_MODELS": "0"})
    plans = {
        "embedder": (embedder, ["--runner", "pooling", "--data-parallel-size", "2"], env),
        # vLLM's API serves one pooling task per server: per-token vectors are asked for.
        "tokens": (
            embedder,
            ["--runner", "pooling", "--pooler-config", json.dumps({"task": "token_embed"})],
            env,
        ),
        "reranker": (reranker, [], env),  # vLLM pools a *ForSequenceClassification itself
        "real": (real_model, ["--runner", "pooling", "--convert", "embed"], _environment({})),
        # Sliding-window layers (10 of 12, a 32-token window) and KV groups declared.
        "gemma3": (gemma3_checkpoint, ["--runner", "pooling", "--convert", "embed"], env),
    }
    started = {}
    try:
        for name, (checkpoint, args, environment) in plans.items():
            log = root / f"{name}.log"
            process = start_server(
                checkpoint,
                vllm_args=[*args, "--max-model-len", "256"],
                env=environment,
                log_path=log,
            )
            started[name] = (process, checkpoint, log)
        for process, _checkpoint, _log in started.values():
            process.wait_ready(READY_TIMEOUT)
        yield started
    finally:
        for process, _checkpoint, _log in started.values():
            process.stop(STOP_TIMEOUT)


def _hidden(checkpoint, texts):
    """transformers' final hidden states of each text, `[L, hidden]` each."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModel.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.inference_mode():
        return [
            model(input_ids=tokenizer(t, return_tensors="pt").input_ids).last_hidden_state[0]
            for t in texts
        ]


def _last_token_vectors(checkpoint, texts):
    import torch

    return [torch.nn.functional.normalize(h[-1], dim=0) for h in _hidden(checkpoint, texts)]


def _assert_vectors(got, want) -> None:
    import torch

    assert len(got) == len(want)
    for g, w in zip(got, want):
        g = torch.as_tensor(g, dtype=torch.float32)
        assert g.shape == w.shape
        assert torch.nn.functional.cosine_similarity(g, w, dim=0) >= COSINE


def test_embeddings_equal_transformers_on_two_engines(pooling_servers):
    import openai

    process, checkpoint, log = pooling_servers["embedder"]
    client = openai.OpenAI(base_url=process.api_url, api_key="none")
    want = _last_token_vectors(checkpoint, TEXTS)
    # Enough separate requests that vLLM's API servers hand some to each engine.
    for _ in range(4):
        for text, vector in zip(TEXTS, want):
            response = client.embeddings.create(model=str(checkpoint), input=text)
            _assert_vectors([response.data[0].embedding], [vector])
    # Cohere's embed API, which vLLM serves too: the same vectors.
    cohere = http_post_json(
        process.api_url.removesuffix("/v1") + "/v2/embed",
        {"model": str(checkpoint), "texts": TEXTS, "embedding_types": ["float"]},
    )
    _assert_vectors(cohere["embeddings"]["float"], want)
    text = log.read_text()
    assert "pooling embed+token_embed, form 'prefill_hidden'" in text
    # Each engine pooled requests: vLLM's metrics count them per engine.
    import httpx

    metrics = httpx.get(process.api_url.removesuffix("/v1") + "/metrics", timeout=30).text
    served = {
        m.group(1): float(m.group(2))
        for m in re.finditer(
            r'^vllm:prompt_tokens_total\{[^}]*engine="(\d+)"[^}]*\} ([0-9.e+]+)$',
            metrics,
            re.MULTILINE,
        )
    }
    assert set(served) == {"0", "1"}, metrics[:2000]
    assert all(tokens > 0 for tokens in served.values()), served


def test_pooling_endpoint_gives_per_token_vectors(pooling_servers):
    """`/pooling` with the task token_embed: every position's hidden state, normalised
    (vLLM's token-embedding head), as transformers computes them."""
    import torch

    process, checkpoint, _log = pooling_servers["tokens"]
    body = {"model": str(checkpoint), "input": TEXTS[1], "task": "token_embed"}
    [row] = http_post_json(process.api_url.removesuffix("/v1") + "/pooling", body)["data"]
    want = [torch.nn.functional.normalize(h, dim=0) for h in _hidden(checkpoint, TEXTS[1:2])[0]]
    _assert_vectors(row["data"], want)


def test_classify_score_and_rerank_equal_transformers(pooling_servers):
    process, checkpoint, log = pooling_servers["reranker"]
    root, model = process.api_url.removesuffix("/v1"), str(checkpoint)
    want = _logits(checkpoint, DOCUMENTS)
    raw = http_post_json(
        root + "/classify", {"model": model, "input": DOCUMENTS, "use_activation": False}
    )["data"]
    assert [row["probs"][0] for row in raw] == pytest.approx(want, abs=1e-4)
    probs = http_post_json(root + "/classify", {"model": model, "input": DOCUMENTS})["data"]
    assert [row["probs"][0] for row in probs] == pytest.approx(
        [_sigmoid(x) for x in want], abs=1e-5
    )
    pairs = [_sigmoid(x) for x in _logits(checkpoint, [QUERY + d for d in DOCUMENTS])]
    scores = http_post_json(
        root + "/score", {"model": model, "queries": QUERY, "documents": DOCUMENTS}
    )["data"]
    assert [d["score"] for d in sorted(scores, key=lambda d: d["index"])] == pytest.approx(
        pairs, abs=1e-5
    )
    reranked = http_post_json(
        root + "/rerank", {"model": model, "query": QUERY, "documents": DOCUMENTS}
    )["results"]
    assert [r["index"] for r in reranked] == sorted(range(3), key=lambda i: -pairs[i])
    for path in ("/rerank", "/v2/rerank"):  # vLLM's Jina/Cohere-style and Cohere v2 routes
        reranked = http_post_json(
            root + path, {"model": model, "query": QUERY, "documents": DOCUMENTS, "top_n": 2}
        )["results"]
        assert [r["index"] for r in reranked] == sorted(range(3), key=lambda i: -pairs[i])[:2]
        for r in reranked:
            assert r["relevance_score"] == pytest.approx(pairs[r["index"]], abs=1e-5)
    assert "runner: None -> 'pooling'" in log.read_text()


def test_a_real_model_embeds_as_transformers_does(pooling_servers):
    """SmolLM2-135M-Instruct (30 layers, real weights) through the demo bundle: the last
    token's hidden state, normalised, is what `--convert embed` of a decoder means."""
    import openai

    process, checkpoint, log = pooling_servers["real"]
    client = openai.OpenAI(base_url=process.api_url, api_key="none")
    response = client.embeddings.create(model=str(checkpoint), input=TEXTS)
    _assert_vectors([d.embedding for d in response.data], _last_token_vectors(checkpoint, TEXTS))
    assert "demo@1.0.0 pools (--runner pooling --convert embed)" in log.read_text()


def test_a_sliding_window_model_embeds_prompts_longer_than_its_window(pooling_servers):
    """Gemma 3 from `init --reference` (10 local layers with a 32-token window): prompts
    of several windows embed as transformers' Gemma3TextModel does."""
    import openai
    from transformers import AutoTokenizer

    process, checkpoint, log = pooling_servers["gemma3"]
    texts = [" ".join(TEXTS * 6), " ".join(DOCUMENTS * 5) + " " + QUERY]
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    assert all(len(tokenizer(t).input_ids) > 2 * GEMMA3_WINDOW for t in texts)
    client = openai.OpenAI(base_url=process.api_url, api_key="none")
    response = client.embeddings.create(model=str(checkpoint), input=texts)
    _assert_vectors([d.embedding for d in response.data], _last_token_vectors(checkpoint, texts))
    assert "form 'prefill_hidden'" in log.read_text()
