"""A user's tool: lm-evaluation-harness against `vllm serve` on the host mesh.

lm_eval's `local-completions` model scores a loglikelihood task (40 local multiple-choice
facts, tests/e2e/lm_eval/, no hub dataset) through the real SmolLM2 server's completions
API (echo with logprobs: the prompt logprobs the demo bundle declares), and lm_eval's own
transformers backend (`hf`) scores the same task on the same checkpoint in this process.
Both must give the same scores, and each choice the same log-likelihood within float32
rounding over the continuation's tokens.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.server

TASK_DIR = Path(__file__).parent / "lm_eval"
TOLERANCE = 5e-3  # a continuation is 1-3 tokens, each within the file's 2e-3
SCORES = ("acc,none", "acc_norm,none")


def _task() -> dict:
    """The task YAML as a config, its data file an absolute path (datasets reads
    relative data_files from the working folder, not the YAML's)."""
    config = yaml.safe_load((TASK_DIR / "ttb_facts.yaml").read_text(encoding="utf-8"))
    config["dataset_kwargs"]["data_files"] = {"test": str(TASK_DIR / "ttb_facts.jsonl")}
    return config


def _evaluate(model: str, model_args: dict) -> tuple[dict, dict[int, list[float]]]:
    import lm_eval

    out = lm_eval.simple_evaluate(
        model=model,
        model_args=model_args,
        tasks=[_task()],
        log_samples=True,
        bootstrap_iters=0,
        random_seed=0,
    )
    assert out is not None
    scores = out["results"]["ttb_facts"]
    per_doc = {
        sample["doc_id"]: [float(resp[0][0]) for resp in sample["resps"]]
        for sample in out["samples"]["ttb_facts"]
    }
    return scores, per_doc


def test_lm_eval_scores_through_vllm_serve_equal_its_transformers_backend(real_server, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")
    served, served_docs = _evaluate(
        "local-completions",
        {
            "model": real_server.model,
            "base_url": f"{real_server.api_url}/completions",
            "tokenizer": real_server.model,
            "tokenizer_backend": "huggingface",
            "num_concurrent": 2,
            "max_retries": 1,
        },
    )
    reference, reference_docs = _evaluate(
        "hf",
        {"pretrained": real_server.model, "dtype": "float32", "device": "cpu", "batch_size": 8},
    )
    assert len(served_docs) == len(reference_docs) == 40
    for doc_id, expected in reference_docs.items():
        got = served_docs[doc_id]
        assert len(got) == len(expected) == 4
        for choice, (a, b) in enumerate(zip(got, expected)):
            assert abs(a - b) < TOLERANCE, (doc_id, choice, a, b)
    for score in SCORES:
        assert served[score] == reference[score], score
    assert served["acc,none"] > 0.5  # the model knows most of these: a real signal
