"""Block-output decode on the reference generator: several tokens per row from one call.

TT-Metal's block-output classes (Kolibri 1, Muse-Glimmer, DiffusionGemma) declare
`output_tokens_per_step` = k > 1 and answer one device-sampling `decode_forward` with k
tokens per row, their KV written for every position the block passed through. This
generator is the host stand-in that makes the serving path testable without a card: one
call runs k one-token decodes of the same model internally, each fed the token the one
before sampled, so its tokens are exactly what one-at-a-time decode gives (greedy, and
seeded sampling too: the sampler seeds by position), and the paged cache ends as one
token decode per position would leave it.

The return form is the plugin's: `(tokens [B, k], log_probs)`, log_probs None or
`(top_logprobs [B, k, K], top_ids [B, k, K])`. A decode without `sampling_params` (the
host samples: a request asked for what the device does not do) is one token, as the
one-token generator answers it: the host cannot draw a block from one step's logits.
"""

from __future__ import annotations

from typing import Any

import torch

from ttbundles.format.contract import SamplingParams
from ttbundles.reference.cache import KVCache
from ttbundles.reference.generator import ReferenceLlamaGenerator

BLOCK_TOKENS = 4
"""The block the reference emits per decode call (its `output_tokens_per_step`)."""


def _block_size(kv_cache: Any) -> int:
    """Tokens per KV block, read off the cache (`[N, KV, Bs, D]`, per layer, per lane)."""
    tensor = kv_cache
    while isinstance(tensor, (list, tuple)):
        tensor = tensor[0]
    return int(tensor.shape[2])


class ReferenceBlockGenerator(ReferenceLlamaGenerator):
    """The reference generator emitting `BLOCK_TOKENS` tokens per row per device decode.

    Synchronous only (no async decode: the block is read back in the call) and no
    speculation (a block is its own multi-token step), as the reference plugin serves its
    block classes."""

    OUTPUT_TOKENS_PER_STEP = BLOCK_TOKENS
    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": False,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_logprobs": ReferenceLlamaGenerator.model_capabilities["max_device_logprobs"],
        # Literal, as the plan reads it from source (`planning.block_output`).
        "output_tokens_per_step": 4,
    }

    def decode_forward(  # type: ignore[override]
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: SamplingParams | None = None,
        prompt_tokens: torch.Tensor | None = None,
        output_tokens: torch.Tensor | None = None,
        slot_remap: Any = None,
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        page_tables_per_layer: Any = None,
        **kwargs: Any,
    ) -> Any:
        """k tokens per slot (device sampling), else one (host sampling); see the module.

        Positions past the page table (the block's tail beyond max_model_len, where vLLM
        stops the request anyway) are not decoded: those rows repeat their last token
        there, and nothing is written to the cache."""
        if sampling_params is None:
            return super().decode_forward(
                tokens,
                start_pos,
                page_table,
                kv_cache,
                enable_trace,
                read_from_device,
                None,
                prompt_tokens,
                output_tokens,
                slot_remap,
                reload_inputs=reload_inputs,
                reload_page_table=reload_page_table,
                page_tables_per_layer=page_tables_per_layer,
                **kwargs,
            )
        if not read_from_device:
            raise ValueError("block-output decode reads its block in the call (no async decode)")
        table = page_tables_per_layer[0] if page_tables_per_layer is not None else page_table
        assert table is not None and kv_cache is not None
        limit = int(torch.as_tensor(table).shape[-1]) * _block_size(kv_cache)
        positions = [int(p) for p in torch.as_tensor(start_pos).reshape(-1).tolist()]

        def one(j: int, feed: torch.Tensor) -> tuple[torch.Tensor, Any]:
            """Token j of the block: a one-token decode at each row's position + j."""
            at = [p + j if p >= 0 and p + j < limit else -1 for p in positions]
            return super(ReferenceBlockGenerator, self).decode_forward(
                feed,
                torch.tensor(at),
                page_table,
                kv_cache,
                enable_trace,
                True,
                sampling_params,
                prompt_tokens,
                output_tokens,
                slot_remap if j == 0 else None,
                # The first call is the host's, as commanded; the rest are this block's
                # own token feedback, restaged from what the call before sampled.
                reload_inputs=reload_inputs or j > 0,
                reload_page_table=reload_page_table,
                reload_sampling_params=reload_sampling_params and j == 0,
                reset_sampling_state=reset_sampling_state and j == 0,
                page_tables_per_layer=page_tables_per_layer,
                **kwargs,
            )

        return self._block(one, tokens.reshape(len(positions), -1)[:, :1], positions, limit)

    def _block(
        self, one: Any, feed: torch.Tensor, positions: list[int], limit: int
    ) -> tuple[torch.Tensor, Any]:
        """The k one-token decodes, each fed the tokens the one before sampled; a row past
        `limit` repeats its last token. Returns `(tokens [B, k], log_probs)`."""
        block: list[torch.Tensor] = []
        top: list[Any] = []
        for j in range(self.OUTPUT_TOKENS_PER_STEP):
            sampled, logprobs = one(j, feed)
            sampled = sampled.reshape(-1)
            if j:
                live = torch.tensor([p >= 0 and p + j < limit for p in positions])
                sampled = torch.where(live, sampled, block[-1])
            block.append(sampled)
            top.append(logprobs)
            feed = sampled.reshape(-1, 1)
        out = torch.stack(block, dim=1)
        if any(t is None for t in top):
            return out, None
        values = torch.stack([torch.as_tensor(t[0]) for t in top], dim=1)
        ids = torch.stack([torch.as_tensor(t[1]) for t in top], dim=1)
        return out, (values, ids)
