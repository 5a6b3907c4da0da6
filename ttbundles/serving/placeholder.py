"""Stand-in vLLM model classes for bare architectures vLLM does not know.

vLLM resolves a checkpoint's `architectures` before any platform hook runs, and refuses
names it has no class for. A bundle may serve a checkpoint whose architecture is custom
(a known `model_type`, a new class name); registering this placeholder under the bare
name lets vLLM's model-config checks pass. It is never run: the TT worker loads the
bundle's `TT<arch>` generator instead. A bundle that only pools gets the pooling one, so
that vLLM picks its pooling runner for the checkpoint by itself, as for its own
`*ForSequenceClassification` classes (with the text-generation one it chose
`--runner generate`, which such a bundle cannot serve).
"""

from __future__ import annotations

import torch
from torch import nn


class _NeverExecuted(nn.Module):
    """What both placeholders share: built by vLLM's loader, never run (the TT worker
    runs the generator)."""

    def __init__(self, *, vllm_config: object = None, prefix: str = "") -> None:
        super().__init__()

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the TT worker serves this architecture's TT generator")

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, **kwargs) -> torch.Tensor:
        raise RuntimeError("the TT worker serves this architecture's TT generator")


class TTPlaceholderForCausalLM(_NeverExecuted):
    """Satisfies vLLM's text-generation model interface; never executed."""

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("the TT worker serves this architecture's TT generator")


class TTPlaceholderForPooling(_NeverExecuted):
    """Satisfies vLLM's pooling model interface (no `compute_logits`); never executed."""

    is_pooling_model = True
    default_seq_pooling_type = "LAST"
    default_tok_pooling_type = "ALL"
