"""vLLM's own pooler over the hidden states a generator returns (the pooling form
`prefill_hidden`).

The generator computes the transformer on its device and hands back the final hidden
states of every prompt position; what vLLM's pooling model does after its transformer
(the checkpoint's pooling, a sentence-transformers projector, normalisation, the
classifier head and its activation, per-request `dimensions` and `use_activation`) is
vLLM's own code here, built as vLLM builds it (`DispatchPooler.for_embedding` /
`for_seq_cls`, the adapters `--convert embed|classify` applies). So `--pooler-config`,
a checkpoint's `modules.json` and `--convert` mean on Tenstorrent what they mean in vLLM.

The classifier is the checkpoint's `score` layer (a `*ForSequenceClassification`
checkpoint's head over the pooled hidden state), read from its safetensors on the host:
a `[num_labels, hidden]` matrix, as vLLM's `as_seq_cls_model` loads it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ttbundles.serving.checkpoint_files import (
    SCORE_WEIGHT,
    checkpoint_folder,
    file_holding,
    headless_classifier,
)

if TYPE_CHECKING:  # vLLM's types, for annotations only
    from vllm.config import VllmConfig


def load_classifier(vllm_config: VllmConfig) -> torch.nn.Module:
    """The checkpoint's classification head as a float32 linear layer; TTB273 when the
    checkpoint has none (a `*ForCausalLM` asked for `--convert classify`)."""
    from safetensors import safe_open

    model_config = vllm_config.model_config
    file = file_holding(checkpoint_folder(model_config.model), SCORE_WEIGHT)
    if file is None:
        raise headless_classifier(model_config)
    with safe_open(str(file), framework="pt") as handle:
        weight = handle.get_tensor(SCORE_WEIGHT)
    head = torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False)
    head.weight.data = weight.to(torch.float32)
    return head.eval()


def build_pooler(vllm_config: VllmConfig, tasks: tuple[str, ...]) -> Any:
    """vLLM's `DispatchPooler` for the served tasks, built in vLLM's configuration context
    (its poolers read the current config: the head's dtype, the projector)."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.pooler import DispatchPooler

    pooler_config = vllm_config.model_config.pooler_config
    poolers: dict[str, Any] = {}
    with set_current_vllm_config(vllm_config):
        if {"embed", "token_embed"} & set(tasks):
            embedding = DispatchPooler.for_embedding(pooler_config).poolers_by_task
            poolers.update({t: embedding[t] for t in tasks if t in embedding})
        if "classify" in tasks:
            classifier = load_classifier(vllm_config)
            seq_cls = DispatchPooler.for_seq_cls(pooler_config, classifier=classifier)
            poolers["classify"] = seq_cls.poolers_by_task["classify"]
    return DispatchPooler(poolers)


def pooling_metadata(prompts: list[list[int]], pooling_params: list[Any], pooler: Any) -> Any:
    """vLLM's `PoolingMetadata` for whole prompts, one per request, with its cursor over
    the flattened hidden states (request after request, each its prompt's length), as
    vLLM's pooling runner builds it; each request's parameters updated by the pooler first
    (what it needs, such as the prompt's token ids)."""
    from vllm.v1.pool.metadata import PoolingMetadata, PoolingStates

    for params in pooling_params:
        pooler.get_pooling_updates(params.task).apply(params)
    lengths = torch.tensor([len(p) for p in prompts], dtype=torch.int64)
    token_ids = None
    if any(getattr(p, "requires_token_ids", False) for p in pooling_params):
        token_ids = torch.zeros((len(prompts), int(lengths.max())), dtype=torch.int64)
        for i, prompt in enumerate(prompts):
            token_ids[i, : len(prompt)] = torch.tensor(prompt, dtype=torch.int64)
    metadata = PoolingMetadata(
        prompt_lens=lengths,
        prompt_token_ids=token_ids,
        prompt_token_ids_cpu=token_ids,
        pooling_params=list(pooling_params),
        pooling_states=[PoolingStates() for _ in prompts],
    )
    metadata.build_pooling_cursor(lengths.numpy(), lengths, torch.device("cpu"))
    return metadata
