"""The penalty history a device that applies penalties rebuilds its per-slot state from."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ttbundles.serving.runner.step import Layout


class PenaltyHistory:
    """The prompt and output tokens of each slot's request, -1 padded, for generators
    that apply penalties on the device. Assembled only for a batch where a request asks
    for a penalty; kept between steps and brought up to date per row (a new owner: its
    prompt; then the output tokens it gained, usually one), then copied out whole."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.prompt = np.full((capacity, 1), -1, dtype=np.int64)
        self.output = np.full((capacity, 1), -1, dtype=np.int64)
        self.prompt_len = np.zeros(capacity, dtype=np.int64)
        self.output_len = np.zeros(capacity, dtype=np.int64)
        self.owner: list[Any] = [None] * capacity  # the request state each row holds
        self.builds = 0  # decodes that carried a history (tests read it)

    def _widen(self, table: np.ndarray, width: int) -> np.ndarray:
        if table.shape[1] >= width:
            return table
        wider = np.full((self.capacity, max(width, 2 * table.shape[1])), -1, dtype=np.int64)
        wider[:, : table.shape[1]] = table
        return wider

    def tensors(self, layout: Layout) -> dict[str, torch.Tensor]:
        self.builds += 1
        for state, slot in zip(layout.states, layout.slots.tolist()):
            if self.owner[slot] is not state:
                ids = state.prompt_token_ids or []
                self.prompt = self._widen(self.prompt, len(ids))
                self.prompt[slot] = -1
                self.prompt[slot, : len(ids)] = ids
                self.prompt_len[slot] = len(ids)
                self.output[slot] = -1
                self.output_len[slot] = 0
                self.owner[slot] = state
            out = state.output_token_ids
            have = int(self.output_len[slot])
            if len(out) != have:
                if len(out) < have:  # the scheduler took tokens back: rewrite the row
                    self.output[slot] = -1
                    have = 0
                self.output = self._widen(self.output, len(out))
                self.output[slot, have : len(out)] = out[have:]
                self.output_len[slot] = len(out)
        slots = layout.slots
        prompt_width = max(int(self.prompt_len[slots].max()), 1)
        output_width = max(int(self.output_len[slots].max()), 1)
        prompt = self.prompt[:, :prompt_width].copy()
        output = self.output[:, :output_width].copy()
        prompt[layout.idle] = -1
        output[layout.idle] = -1
        return {
            "prompt_tokens": torch.from_numpy(prompt),
            "output_tokens": torch.from_numpy(output),
        }
