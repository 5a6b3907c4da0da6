"""The pooling golden of `ttbundle test`: what a pooling bundle should serve, from the
checkpoint's own transformers implementation in float32, one prompt at a time (no
padding, no batch), so it is the plain definition of the model:

- `embedding(ids, pooling)`: `AutoModel`'s last hidden states pooled over the prompt as
  vLLM's pooler resolved it for the served engine (`LAST`, the decoder default of
  `--convert embed`; `MEAN` or `CLS` when the checkpoint's sentence-transformers files
  say so), before normalisation;
- `logits(ids)`: `AutoModelForSequenceClassification`'s logits, before any activation.

What vLLM's heads do after pooling (normalisation, the calibration and activation of a
classifier) is applied by the comparison (`conformance.pooling`), on numbers it can show.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

POOLINGS = ("LAST", "MEAN", "CLS")


class PoolingGolden:
    """transformers' models for the pooling tasks asked for (`embed`, `classify`)."""

    name = "transformers"

    def __init__(self, checkpoint: str | Path, tasks: list[str]):
        from transformers.utils import logging as transformers_logging

        self.checkpoint = str(checkpoint)
        self.encoder: Any = None
        self.classifier: Any = None
        # The base model of a causal LM's checkpoint leaves its lm_head unread, which
        # transformers reports at length; a missing head is refused below instead.
        verbosity = transformers_logging.get_verbosity()
        transformers_logging.set_verbosity_error()
        try:
            self._load(tasks)
        finally:
            transformers_logging.set_verbosity(verbosity)

    def _load(self, tasks: list[str]) -> None:
        from transformers import AutoModel, AutoModelForSequenceClassification

        if "embed" in tasks:
            self.encoder = AutoModel.from_pretrained(self.checkpoint, dtype=torch.float32).eval()
        if "classify" in tasks:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                self.checkpoint, dtype=torch.float32, output_loading_info=True
            )
            # A head transformers had to make up (a checkpoint of a causal LM) would be
            # random weights: a golden that proves nothing.
            head = sorted(info.get("missing_keys", ()))
            if head:
                raise ValueError(
                    f"the checkpoint has no classification head ({', '.join(head)} "
                    "missing): transformers would make one up"
                )
            self.classifier = model.eval()

    @torch.no_grad()
    def embedding(self, ids: list[int], pooling: str) -> np.ndarray:
        """The pooled last hidden state `[hidden]` of one prompt, not normalised."""
        if pooling not in POOLINGS:
            raise ValueError(f"pooling {pooling!r} is not one of {', '.join(POOLINGS)}")
        hidden = self.encoder(input_ids=torch.tensor([ids], dtype=torch.int64))
        states = hidden.last_hidden_state[0].float()
        if pooling == "LAST":
            pooled = states[-1]
        elif pooling == "CLS":
            pooled = states[0]
        else:
            pooled = states.mean(dim=0)
        return pooled.numpy().copy()

    @torch.no_grad()
    def logits(self, ids: list[int]) -> np.ndarray:
        """The classifier's logits `[num_labels]` of one prompt."""
        out = self.classifier(input_ids=torch.tensor([ids], dtype=torch.int64))
        return out.logits[0].float().numpy().copy()
