"""The transformers golden for image prompts: what a served vision-language model must say.

Given the token ids the server actually prefilled (vLLM returns them with
`return_token_ids`) and the images sent, it runs the checkpoint's own transformers class
greedily on the same inputs: the pixels from the checkpoint's own image processor (vLLM's
API server runs the same one), and `mm_token_type_ids` marking the image placeholders,
without which transformers 5 places every token on 1-D positions instead of M-RoPE.

Used by the end-to-end tests, the image-serving benchmark and `ttbundle test` (image
prompts, and every prompt of a vision-language checkpoint: `sequence_logits`).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch


class VisionGolden:
    """transformers' Qwen2.5-VL (or any `AutoModelForImageTextToText`) on a checkpoint."""

    name = "transformers"

    def __init__(self, checkpoint: str | Path):
        import transformers

        self.processor = transformers.AutoProcessor.from_pretrained(str(checkpoint))
        self.model = transformers.AutoModelForImageTextToText.from_pretrained(
            str(checkpoint), dtype=torch.float32
        ).eval()
        self.image_token_id = int(self.model.config.image_token_id)

    def inputs(
        self,
        prompt_token_ids: Sequence[int],
        images: Sequence[Any],
        prompt_tokens: int | None = None,
    ) -> dict:
        """The model's inputs for one prompt (batch of one). Image placeholders are marked
        in the first `prompt_tokens` positions only (None: all): a generated token that
        happens to be the placeholder's id is text, as in transformers' generate."""
        ids = torch.tensor([list(prompt_token_ids)], dtype=torch.long)
        marks = (ids == self.image_token_id).long()
        if prompt_tokens is not None:
            marks[:, prompt_tokens:] = 0
        values: dict[str, Any] = {
            "input_ids": ids,
            "attention_mask": torch.ones_like(ids),
            "mm_token_type_ids": marks,
        }
        if images:
            pixels = self.processor.image_processor(images=list(images), return_tensors="pt")
            values["pixel_values"] = pixels["pixel_values"]
            values["image_grid_thw"] = pixels["image_grid_thw"]
        return values

    @torch.no_grad()
    def sequence_logits(
        self,
        ids: Sequence[int],
        images: Sequence[Any] = (),
        prompt_tokens: int | None = None,
    ) -> np.ndarray:
        """Teacher-forced logits `[len(ids), V]` of a sequence (the prompt with its image
        placeholders, then the continuation), float32: what `ttbundle test` compares each
        served step with."""
        out = self.model(**self.inputs(ids, images, prompt_tokens))
        return out.logits[0].float().numpy()

    @torch.no_grad()
    def greedy(
        self, prompt_token_ids: Sequence[int], images: Sequence[Any], max_new_tokens: int
    ) -> list[int]:
        """The greedy continuation's token ids (exactly `max_new_tokens`)."""
        return self.greedy_with_logits(prompt_token_ids, images, max_new_tokens)[0]

    @torch.no_grad()
    def greedy_with_logits(
        self, prompt_token_ids: Sequence[int], images: Sequence[Any], max_new_tokens: int
    ) -> tuple[list[int], torch.Tensor]:
        """The greedy continuation and each step's logits `[max_new_tokens, V]`."""
        inputs = self.inputs(prompt_token_ids, images)
        out = self.model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            min_new_tokens=max_new_tokens,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
        ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
        return ids, torch.stack([step[0] for step in out.logits])

    def disagreement(
        self,
        prompt_token_ids: Sequence[int],
        images: Sequence[Any],
        served: Sequence[int],
        tie: float = 1e-3,
    ) -> str | None:
        """None when `served` is this model's greedy continuation; else where it is not.

        Random weights make near-ties: where the served token differs from transformers'
        but scores within `tie` of the best logit there, both are greedy choices and the
        sequences part honestly; the comparison ends at that step.
        """
        ids, logits = self.greedy_with_logits(prompt_token_ids, images, len(served))
        for step, (got, want) in enumerate(zip(served, ids)):
            if got == want:
                continue
            gap = float(logits[step].max() - logits[step, got])
            if gap <= tie:
                return None
            return f"step {step}: served {got}, transformers {want} (logit gap {gap:.4g})"
        return None

    @torch.no_grad()
    def greedy_batch(
        self, prompts: Sequence[tuple[Sequence[int], Sequence[Any]]], max_new_tokens: int
    ) -> list[list[int]]:
        """`greedy` of each prompt, one at a time (padding would shift M-RoPE positions)."""
        return [self.greedy(ids, images, max_new_tokens) for ids, images in prompts]
