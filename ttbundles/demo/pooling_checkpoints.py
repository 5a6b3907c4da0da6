"""Tiny pooling checkpoints, made locally and deterministically, for the host references'
pooling tests and `init --reference` examples.

- `write_qwen3_embedder`: Qwen3-Embedding's shape, a `Qwen3ForCausalLM` with the
  sentence-transformers configuration Qwen3-Embedding ships (`modules.json`: last-token
  pooling, then normalisation), so vLLM's pooler reads the pooling from the checkpoint
  as it does for the real model;
- `write_qwen3_classifier`: a `Qwen3ForSequenceClassification` (the `score` head over the
  last token), with one label (a cross-encoder reranker: `/score`, `/rerank`) or several
  (`/classify`).

Same tokenizer and weight filling as the demo checkpoint (`demo.checkpoint`): the same
arguments always give the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

from ttbundles.demo.checkpoint import build_tokenizer, save_random, tiny_sizes

SEED = 4321

# sentence-transformers' description of Qwen3-Embedding: the transformer, last-token
# pooling, L2 normalisation (what vLLM reads from `modules.json` and `1_Pooling`).
_MODULES = [
    {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
    {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    {
        "idx": 2,
        "name": "2",
        "path": "2_Normalize",
        "type": "sentence_transformers.models.Normalize",
    },
]


def _qwen3_config(tokenizer, **extra):  # noqa: ANN001, ANN202 - transformers types
    from transformers import Qwen3Config

    return Qwen3Config(
        **tiny_sizes(tokenizer), head_dim=32, rms_norm_eps=1e-6, rope_theta=1000000.0, **extra
    )


def write_qwen3_embedder(out_dir: Path) -> Path:
    """A tiny Qwen3-Embedding-shaped checkpoint in `out_dir`; the folder."""
    from transformers import Qwen3ForCausalLM

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = _qwen3_config(tokenizer)
    save_random(Qwen3ForCausalLM(config), "Qwen3ForCausalLM", out_dir, seed=SEED)
    (out_dir / "modules.json").write_text(json.dumps(_MODULES, indent=2) + "\n")
    pooling = out_dir / "1_Pooling"
    pooling.mkdir(exist_ok=True)
    (pooling / "config.json").write_text(
        json.dumps(
            {
                "word_embedding_dimension": config.hidden_size,
                "pooling_mode_cls_token": False,
                "pooling_mode_mean_tokens": False,
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
                "pooling_mode_weightedmean_tokens": False,
                "pooling_mode_lasttoken": True,
                "include_prompt": True,
            },
            indent=2,
        )
        + "\n"
    )
    (out_dir / "2_Normalize").mkdir(exist_ok=True)
    return out_dir


def write_qwen3_classifier(out_dir: Path, num_labels: int = 1) -> Path:
    """A tiny `Qwen3ForSequenceClassification` in `out_dir` (one label: a cross-encoder
    reranker); the folder."""
    from transformers import Qwen3ForSequenceClassification

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer(out_dir)
    config = _qwen3_config(tokenizer, num_labels=num_labels)
    save_random(
        Qwen3ForSequenceClassification(config),
        "Qwen3ForSequenceClassification",
        out_dir,
        seed=SEED,
    )
    return out_dir
