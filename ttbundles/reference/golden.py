"""Goldens for `ttbundle test`: the logits a bundle's generator should produce.

A golden answers one question, `sequence_logits(ids)`: the logits `[n, V]` at every
position of a token sequence (row j predicts token j + 1), computed in one contiguous
float32 forward pass with no paged cache, no batching and no sampling, so it is the plain
definition of the model. Two are live:

- `ReferenceGolden`: this package's torch reference generator (`forward_segments` over one
  sequence, every position), for the architectures it covers (`reference_covers`);
- `TransformersGolden`: the checkpoint's own transformers implementation, for the rest.

`greedy(ids, steps)` is the golden's own greedy continuation with each step's logits, as
`ttbundle test --record` writes it for machines that have neither.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ttbundles.reference.attention import Segment
from ttbundles.reference.config import ModelDims, ModelRope
from ttbundles.reference.families import BASE, SUPPORTED_ARCHITECTURES, family_of, style_of

BLOCK = 16  # block size of the scratch cache a reference pass uses


def load_config(checkpoint: str | Path) -> Any:
    """The checkpoint's Hugging Face config (a folder, or a hub id in the local cache)."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(str(checkpoint))


def reference_covers(config: Any) -> str | None:
    """None when the reference generator computes this checkpoint; else why not."""
    architectures = list(getattr(config, "architectures", None) or [])
    if not any(a in SUPPORTED_ARCHITECTURES for a in architectures):
        return (
            f"architecture {', '.join(architectures) or 'unknown'} is not one the reference "
            f"generator reads ({', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    family = family_of(config)
    try:
        if family.generator != BASE.generator:  # a family with its own forward pass
            family.generator_class().check_config(config)
            return None
        dims = ModelDims.from_hf_config(config)
        ModelRope.from_hf_config(config, dims, style_of(config, dims))
    except (NotImplementedError, AttributeError, KeyError, ValueError) as exc:
        return str(exc)
    return None


class ReferenceGolden:
    """The torch reference generator as a golden."""

    name = "reference"

    def __init__(self, checkpoint: str | Path, config: Any | None = None):
        from ttbundles.format.contract import HostMesh

        config = config if config is not None else load_config(checkpoint)
        reason = reference_covers(config)
        if reason is not None:
            raise NotImplementedError(reason)
        # The family's generator: a recurrent hybrid's is its own (`families.qwen3_5`).
        self.generator = (
            family_of(config)
            .generator_class()
            .initialize_vllm_model(
                hf_config=config,
                mesh_device=HostMesh(),
                max_batch_size=1,
                max_seq_len=getattr(config, "max_position_embeddings", 2048),
            )
        )
        self.vocab_size = self.generator.dims.vocab_size

    def _cache(self, tokens: int) -> tuple[list, torch.Tensor]:
        dims = self.generator.dims
        blocks = max(1, math.ceil(tokens / BLOCK))
        cache = self.generator.allocate_kv_cache(
            (blocks, dims.num_kv_heads, BLOCK, dims.head_dim),
            torch.float32,
            self.generator.kv_layer_count(),
        )
        return cache, torch.arange(blocks, dtype=torch.int64)[None, :]

    def sequence_logits(self, ids: list[int]) -> np.ndarray:
        cache, table = self._cache(len(ids))
        segment = Segment(0, torch.tensor(ids, dtype=torch.int64), 0)
        logits = self.generator.forward_segments([segment], table, cache, all_positions=True)
        return logits.numpy()

    def greedy(self, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
        """The golden's greedy continuation and its logits `[steps, V]`, over one
        growing cache (prefill once, then a token at a time)."""
        cache, table = self._cache(len(ids) + steps)
        forward = self.generator.forward_segments
        logits = forward([Segment(0, torch.tensor(ids), 0)], table, cache)[0]
        tokens, rows = [], []
        for step in range(steps):
            rows.append(logits.numpy().copy())
            token = int(torch.argmax(logits))
            tokens.append(token)
            if step + 1 < steps:
                segment = Segment(0, torch.tensor([token]), len(ids) + step)
                logits = forward([segment], table, cache)[0]
        return tokens, np.stack(rows)


class TransformersGolden:
    """The checkpoint's transformers implementation (float32, eager) as a golden."""

    name = "transformers"

    def __init__(self, checkpoint: str | Path, config: Any | None = None):
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(checkpoint), dtype=torch.float32)
        self.model.eval()
        self.vocab_size = int(self.model.config.vocab_size)

    @torch.no_grad()
    def sequence_logits(self, ids: list[int]) -> np.ndarray:
        out = self.model(torch.tensor([ids], dtype=torch.int64))
        return out.logits[0].float().numpy()

    @torch.no_grad()
    def greedy(self, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
        out = self.model.generate(
            torch.tensor([ids], dtype=torch.int64),
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
            pad_token_id=self.model.config.eos_token_id,
        )
        tokens = out.sequences[0, len(ids) :].tolist()
        return tokens, torch.stack([s[0] for s in out.logits]).float().numpy()


GOLDENS = {"reference": ReferenceGolden, "transformers": TransformersGolden}


def load_golden(kind: str, checkpoint: str | Path, config: Any | None = None) -> Any:
    """`kind` "reference" or "transformers"."""
    return GOLDENS[kind](checkpoint, config)
