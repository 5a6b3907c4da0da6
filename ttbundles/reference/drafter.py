"""The reference generator's own drafter: early exit from the target's first layers.

A model-owned drafter (vLLM's `custom_class` method, `propose_draft_tokens` in
`format.speculative`) that needs no weights of its own: it runs the target's first
`layers` decoder layers, then the target's final norm and LM head, greedily, K tokens
ahead (self-speculation by early exit, as LayerSkip drafts). Because those layers are the
target's, the K/V the target already wrote into the paged cache for a row's committed
positions are exactly what the drafter's layers would have computed there, so it reads
them (the drafter shares the target's caches: `drafter_state="shared_with_target"`) and
keeps only its own drafted positions in a scratch K/V that is dropped after the call. It
never writes the paged cache: the blocks past a row's committed length may not be
allocated yet.

The verify then checks every draft against the full model, so a poor draft costs only
its rejection; greedy output is the full model's whatever the drafter proposes.

`Speculation` is the generator's speculative half of the contract (`propose_draft_tokens`,
the verify a `decode_forward` with `spec_mode` runs), here beside the drafter it drives:
what a speculative step needs (each slot's page-table row, the cache a forward wrote) is
kept by it, apart from the plain decode's driver (`reference.driver`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from ttbundles.format import speculative as spec
from ttbundles.reference.attention import (
    Segment,
    causal_attention,
    context_blocks,
    gather_context,
)
from ttbundles.reference.cache import KVCache, PageTables, as_tables, host_tables
from ttbundles.reference.config import ModelDims
from ttbundles.reference.driver import int_list
from ttbundles.reference.readback import DeviceOutput


@torch.no_grad()
def early_exit_drafts(
    model: Any,
    layers: int,
    last_tokens: torch.Tensor,
    last_positions: torch.Tensor,
    block_table: torch.Tensor,
    kv_cache: list[list[torch.Tensor]],
    num_drafts: int,
) -> torch.Tensor:
    """Greedy drafts `[n, num_drafts]` int64 for n rows. `model` is the target, a
    `ReferenceLlamaGenerator` (its weights, dims, rope and scale; not imported here: the
    generator is built on this module's `Speculation`); `kv_cache` its per-layer
    `[k_cache, v_cache]`.

    Row i's last committed token `last_tokens[i]` sits at `last_positions[i]` (p, not yet
    in the cache); positions 0 .. p - 1 are in the cache through `block_table[i]` (its
    page-table row). Each drafting step feeds one token per row through the first
    `layers` layers at positions p, p + 1, ..., attending over the cached context and
    the tokens drafted so far.
    """
    weights = model.weights
    n = last_tokens.shape[0]
    cache_shape = kv_cache[0][0].shape
    # The cached context: positions 0 .. p - 1 (blocks up to p - 1; later keys masked).
    blocks = context_blocks(block_table, (last_positions - 1).clamp(min=0), cache_shape)
    context_length = blocks.shape[-1] * cache_shape[2]
    in_context = torch.arange(context_length)[None, :] < last_positions[:, None]  # [n, C]
    context = [
        (gather_context(k_cache, blocks), gather_context(v_cache, blocks))
        for k_cache, v_cache in kv_cache[:layers]
    ]  # each [n, KV, C, D]
    own_k: list[list[torch.Tensor]] = [[] for _ in range(layers)]
    own_v: list[list[torch.Tensor]] = [[] for _ in range(layers)]

    tokens, positions = last_tokens.long(), last_positions.long()
    drafts = []
    for step in range(num_drafts):
        x = model.embed(tokens)  # [n, hidden]
        cos, sin = model.rope(positions)
        rotations = model.layer_rope(positions, cos, sin)
        visible = torch.cat([in_context, torch.ones(n, step + 1, dtype=torch.bool)], dim=1)
        window = model.window
        if window is not None:
            # The query at q = p + step sees keys c > q - window: cached positions c, and
            # its own drafted positions p + j (j = 0 .. step).
            key_positions = torch.cat(
                [
                    torch.arange(context_length)[None, :].expand(n, -1),
                    positions[:, None] - step + torch.arange(step + 1)[None, :],
                ],
                dim=1,
            )  # [n, C + step + 1]
            in_window = visible & (key_positions > positions[:, None] - window.size)
        for index, layer in enumerate(weights.layers[:layers]):
            q, k, v = model.attention_inputs(layer, x, *rotations[index])
            own_k[index].append(k)
            own_v[index].append(v)
            keys = torch.cat([context[index][0], torch.stack(own_k[index], dim=2)], dim=2)
            values = torch.cat([context[index][1], torch.stack(own_v[index], dim=2)], dim=2)
            sees = visible
            if window is not None and index in window.layers:
                sees = in_window
            attended = causal_attention(
                q[:, None], keys, values, sees[:, None, :], model.scale
            )  # [n, 1, H, D]
            x = model.layer_output(layer, x, attended)
        tokens = model.lm_logits(x).argmax(dim=-1)
        drafts.append(tokens)
        positions = positions + 1
    return torch.stack(drafts, dim=1)


class Speculation:
    """Speculative decoding's half of the contract, mixed into the generator
    (`reference.generator`): the verify, and the early-exit drafter it offers as vLLM's
    `custom_class` method. The generator provides the model, the lanes and the queue."""

    dims: ModelDims
    lanes: int
    per_lane: int
    MAX_SPEC_K: int
    DRAFT_LAYERS_FRACTION: float
    _device_queue: ThreadPoolExecutor
    _resident: Any
    # Each slot's page-table row as the last forward over it had it, and the cache it
    # wrote (device queue only): what the drafter reads.
    _slot_pages: dict[int, torch.Tensor]
    _drafter_cache: Any
    # The model's forward pass (`reference.model`) and the driver's lanes
    # (`reference.driver`), called through the generator so that overrides run.
    forward_segments: Callable[..., torch.Tensor]
    _lane_groups: Callable[..., list[tuple[list[Segment], Any]]]

    @classmethod
    def spec_plan(
        cls, vllm_config: Any, max_num_seqs: int, requested_k: int
    ) -> spec.SpecPlan | spec.SpecReject:
        """Speculative decoding (`format.speculative`): any draft length up to
        `MAX_SPEC_K`; the verify returns argmax ids (greedy) or logits (sampled); the
        generator keeps no drafter state, and serves its ordinary decode too."""
        if requested_k > cls.MAX_SPEC_K:
            return spec.SpecReject(
                f"the reference verifies at most {cls.MAX_SPEC_K} drafts per step",
                supported_k=tuple(range(1, cls.MAX_SPEC_K + 1)),
            )
        return spec.SpecPlan(
            effective_k=requested_k,
            lanes_per_request=1,
            extra_bytes_per_seq=0,
            extra_bytes_per_token=0,
            accept_modes=(spec.ACCEPT_MODE_ARGMAX_IDS, spec.ACCEPT_MODE_LOGITS),
            drafter_state="internal",
            supports_narrow_decode=True,
        )

    def verify(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        num_valid_drafts: Any,
        spec_mode: str,
    ) -> spec.VerifyOutput:
        """The speculative verify (`format.speculative`): row i is slot i, its tokens
        `tokens[i, : 1 + num_valid_drafts[i]]` at positions `start_pos[i, ...]` (a row at
        position -1 is padding). One forward over every real column, K/V written for
        each; the logits at every column: column j predicts the token after column j, the
        one draft j must match (column `num_valid_drafts[i]`: the bonus). Returns
        argmax ids `[B, 1+K]` (-1 past a row's real columns) or logits `[B, 1+K, V]`."""
        tokens = torch.as_tensor(tokens).long()
        positions = torch.as_tensor(start_pos).long()
        batch, width = tokens.shape
        valid = int_list(num_valid_drafts, batch, "num_valid_drafts")
        segments = [
            Segment(row, tokens[row, : 1 + valid[row]], int(positions[row, 0]))
            for row in range(batch)
            if int(positions[row, 0]) >= 0
        ]
        logits = torch.zeros(batch, width, self.dims.vocab_size, dtype=torch.float32)
        table = as_tables(page_table)
        for group, cache in self._lane_groups(segments, kv_cache):
            flat = self.forward_segments(group, table, cache, all_positions=True)
            offset = 0
            for segment in group:
                count = len(segment.tokens)
                logits[segment.row, :count] = flat[offset : offset + count]
                offset += count
        if spec_mode == spec.ACCEPT_MODE_LOGITS:
            return spec.VerifyOutput(spec_mode, logits=logits)
        ids = logits.argmax(dim=-1)
        for row in range(batch):
            ids[row, 1 + valid[row] :] = spec.PLACEHOLDER_TOKEN_ID
        return spec.VerifyOutput(spec_mode, argmax_ids=ids)

    def _verify_forward(
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: Any,
        kv_cache: KVCache | None,
        speculative: tuple[Any, Any, str | None],
        *,
        reload_inputs: bool,
        read_from_device: bool,
        page_tables_per_layer: Any,
    ) -> spec.VerifyOutput:
        """`decode_forward` as a verify (`speculative`: num_valid_drafts, accepted_counts,
        spec_mode): the host's inputs, read now; read later with `read_from_device=False`
        (asynchronous scheduling, `supports_async_spec_decode`)."""
        num_valid_drafts, _, spec_mode = speculative
        if any(v is None for v in speculative):
            raise ValueError("num_valid_drafts, accepted_counts and spec_mode come together")
        if not reload_inputs:
            raise ValueError("a verify reads the host's inputs: send reload_inputs=True")
        if page_table is None:
            raise ValueError("the reference generator needs a page_table (paged KV cache only)")
        tables = host_tables(page_table, page_tables_per_layer)

        def run_verify() -> spec.VerifyOutput:
            self._resident = None  # the host knows the committed tokens
            live = [r for r in range(len(start_pos)) if int(start_pos[r][0]) >= 0]
            self._remember_pages(live, tables, live, kv_cache)
            return self.verify(tokens, start_pos, tables, kv_cache, num_valid_drafts, spec_mode)

        if read_from_device:
            return self._device_queue.submit(run_verify).result()
        # Deferred: the block stays "on the device" for read_decode_output; the host
        # decides later how much of it commits.
        pending = self._device_queue.submit(run_verify)
        argmax = spec_mode == spec.ACCEPT_MODE_ARGMAX_IDS

        def block() -> tuple[torch.Tensor, None]:
            done = pending.result()
            return (done.argmax_ids if argmax else done.logits), None

        held = DeviceOutput(self._device_queue.submit(block), is_tokens=argmax)
        if argmax:
            return spec.VerifyOutput(spec_mode, argmax_ids=held)
        return spec.VerifyOutput(spec_mode, logits=held)

    # ---- the drafter (custom_class) --------------------------------------------------

    def _remember_pages(
        self, slots: list[int], page_table: PageTables | None, rows: list[int], kv_cache: Any
    ) -> None:
        """Keep `page_table[rows[i]]` as slot `slots[i]`'s page-table row, and the cache
        (device queue only): the drafter reads the context a forward just extended."""
        if page_table is None or not slots:
            return
        if isinstance(page_table, list):
            if any(t is not page_table[0] for t in page_table):
                # Layers on several KV groups: the early-exit drafter reads one table,
                # so it offers no drafts rather than read another group's blocks.
                self._slot_pages.clear()
                return
            page_table = page_table[0]
        table = torch.as_tensor(page_table).long()
        for slot, row in zip(slots, rows):
            self._slot_pages[slot] = table[row].clone()
        self._drafter_cache = kv_cache

    @property
    def draft_layers(self) -> int:
        return max(1, int(self.dims.num_layers * self.DRAFT_LAYERS_FRACTION))

    def propose_draft_tokens(
        self,
        num_drafts: int,
        committed_tokens: Any,
        committed_positions: Any,
        accepted_counts: Any,
        hidden: Any = None,
    ) -> spec.DraftOutput:
        """The model's own drafter (`format.speculative`, vLLM's `custom_class`): after
        every commit, up to `num_drafts` greedy drafts per row from an early exit of the
        target (`early_exit_drafts`). Row i is slot i; its last committed token is
        `committed_tokens[i, accepted_counts[i] - 1]` at that column's position (-1: no
        request, nothing offered). `hidden` is not needed: the drafter reads the target's
        cache. Returns `DraftOutput([B, K] int32, num_valid [B] int32)`."""
        tokens = torch.as_tensor(committed_tokens).long()
        positions = torch.as_tensor(committed_positions).long()
        batch = tokens.shape[0]
        counts = int_list(accepted_counts, batch, "accepted_counts")
        k = int(num_drafts)

        def compute() -> spec.DraftOutput:
            ids = torch.full((batch, k), spec.PLACEHOLDER_TOKEN_ID, dtype=torch.int32)
            valid = torch.zeros(batch, dtype=torch.int32)
            rows = [
                r
                for r in range(batch)
                if counts[r] >= 1 and int(positions[r, counts[r] - 1]) > 0 and r in self._slot_pages
            ]
            if not rows or k == 0:
                return spec.DraftOutput(ids, valid)
            by_lane: dict[int, list[int]] = {}
            for r in rows:
                by_lane.setdefault(r // self.per_lane if self.lanes > 1 else 0, []).append(r)
            for lane, lane_rows in by_lane.items():
                index = torch.tensor(lane_rows)
                last = index.new_tensor([counts[r] - 1 for r in lane_rows])
                drafts = self._lane_drafts(
                    lane, lane_rows, tokens[index, last], positions[index, last], k
                )
                ids[index] = drafts.to(torch.int32)
                valid[index] = k
            return spec.DraftOutput(ids, valid)

        return self._device_queue.submit(compute).result()

    def _lane_drafts(
        self,
        lane: int,
        rows: list[int],
        last_tokens: torch.Tensor,
        last_positions: torch.Tensor,
        num_drafts: int,
    ) -> torch.Tensor:
        """One lane's rows' drafts `[n, num_drafts]`, over that lane's cache and the rows'
        remembered page-table rows (zero-padded to the widest)."""
        cache = self._drafter_cache if self.lanes == 1 else self._drafter_cache[lane]
        width = max(len(self._slot_pages[r]) for r in rows)
        table = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            table[i, : len(self._slot_pages[r])] = self._slot_pages[r]
        return early_exit_drafts(
            self, self.draft_layers, last_tokens, last_positions, table, cache, num_drafts
        )
