"""A prefix cache that is right for recurrent state the generator owns: snapshots.

A gated delta net layer remembers the context as one state per request: a prefix-cache
hit that skips tokens is right only when the state after exactly those tokens was kept.
vLLM's KV manager knows the attention blocks of a prefix, not the state. So, as the
reference plugin's `RecurrentPrefixCache` route does, the generator keeps snapshots of
its state (`model_capabilities["recurrent_prefix_snapshots"] = N`; `save_recurrent_prefix
(slot) -> handle`, `restore_recurrent_prefix(slot, handle)`, `free_recurrent_prefix
(handle)`), and the scheduler:

- caps every hit at the longest prefix whose state a snapshot holds, keyed as vLLM keys
  blocks (the request's block hash of the prefix's last block), so a hit is never
  admitted that cannot be restored;
- sends the runner the snapshot to restore into each hit's slot before its prefill
  (`SNAPSHOT_RESTORE` on the scheduler output) and the snapshots it evicted (`SNAPSHOT_FREE`);
- indexes what the runner saved (`SNAPSHOT_SAVED` on the runner's output: a prompt chunk
  that ended on a block boundary), least recently used first out, N at most.

The scheduler and the runner talk only through these attributes of vLLM's step objects,
so the same works with the engine's worker in another process.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vllm.v1.request import Request

SNAPSHOT_RESTORE = "tt_recurrent_restore"
"""On a `SchedulerOutput`: {req_id: handle}, restore before the request's prefill."""
SNAPSHOT_FREE = "tt_recurrent_free"
"""On a `SchedulerOutput`: [handle], snapshots the index let go."""
SNAPSHOT_SAVED = "tt_recurrent_saved"
"""On a `ModelRunnerOutput`: [(req_id, tokens, handle)], snapshots taken after prefill."""
SNAPSHOTS_KEY = "recurrent_prefix_snapshots"
"""The class's `model_capabilities` key: how many snapshots it keeps (the reference
plugin's name)."""
SNAPSHOT_METHODS = ("save_recurrent_prefix", "restore_recurrent_prefix", "free_recurrent_prefix")


class SnapshotIndex:
    """Snapshot handles by the block hash of the prefix they end, least recently used
    first; `capacity` at most (the class's `recurrent_prefix_snapshots`)."""

    def __init__(self, capacity: int, block_size: int):
        self.capacity = capacity
        self.block_size = block_size
        self._by_hash: OrderedDict[Any, int] = OrderedDict()
        self.to_free: list[int] = []
        self.restores = 0

    def __len__(self) -> int:
        return len(self._by_hash)

    def longest(self, request: Request, limit: int) -> int:
        """The longest prefix of `request`, at most `limit` tokens, whose state a snapshot
        holds (a multiple of the block size), or 0."""
        hashes = request.block_hashes
        for blocks in range(min(limit // self.block_size, len(hashes)), 0, -1):
            if hashes[blocks - 1] in self._by_hash:
                return blocks * self.block_size
        return 0

    def handle(self, request: Request, tokens: int) -> int | None:
        """The snapshot after `tokens` tokens of `request` (touched: used last), or None."""
        if tokens <= 0 or tokens % self.block_size:
            return None
        key = request.block_hashes[tokens // self.block_size - 1]
        handle = self._by_hash.get(key)
        if handle is not None:
            self._by_hash.move_to_end(key)
        return handle

    def add(self, request: Request | None, tokens: int, handle: int) -> None:
        """Index a snapshot the runner took; one that cannot be keyed (the request is
        gone, its hashes are short) or that is already held is freed."""
        blocks = tokens // self.block_size
        hashes = request.block_hashes if request is not None else ()
        if tokens % self.block_size or not 0 < blocks <= len(hashes):
            self.to_free.append(handle)
            return
        key = hashes[blocks - 1]
        if key in self._by_hash:
            self._by_hash.move_to_end(key)
            self.to_free.append(handle)
            return
        self._by_hash[key] = handle
        while len(self._by_hash) > self.capacity:
            self.to_free.append(self._by_hash.popitem(last=False)[1])

    def take_frees(self) -> list[int]:
        frees, self.to_free = self.to_free, []
        return frees


class RecurrentPrefixMixin:
    """Mixed into the phase scheduler before vLLM's: caps hits at a snapshot, names the
    snapshot each hit restores, and indexes what the runner saved. Inert (no wrapper, one
    attribute read a step) unless the plan serves snapshots."""

    kv_cache_manager: Any
    requests: dict[str, Request]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        from ttbundles.serving.planning.plan import served_plan

        plan = served_plan(self.vllm_config)  # type: ignore[attr-defined]
        capacity = plan.recurrent_snapshots if plan is not None else 0
        self.snapshots: SnapshotIndex | None = None
        self._hits: dict[str, int] = {}
        if capacity > 0:
            block = self.vllm_config.cache_config.block_size  # type: ignore[attr-defined]
            self.snapshots = SnapshotIndex(capacity, block)
            self._lookup = self.kv_cache_manager.get_computed_blocks
            self.kv_cache_manager.get_computed_blocks = self._capped_computed_blocks

    def _capped_computed_blocks(self, request: Request, max_cache_hit_length: int | None = None):
        """vLLM's lookup, its hit cut to the longest prefix a snapshot restores."""
        index = self.snapshots
        assert index is not None
        limit = request.num_tokens - 1
        if max_cache_hit_length is not None:
            limit = min(limit, max_cache_hit_length)
        cap = index.longest(request, limit)
        while cap > 0:
            found = self._lookup(request, cap)
            tokens = found[1]
            if tokens == 0:
                return found
            if index.handle(request, tokens) is not None:
                self._hits[request.request_id] = tokens
                return found
            cap = index.longest(request, tokens - 1)  # the attention blocks ran short
        self._hits.pop(request.request_id, None)
        return self.kv_cache_manager.empty_kv_cache_blocks, 0, 0

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.snapshots is None:
            return super().schedule(*args, **kwargs)  # type: ignore[misc]
        self._hits.clear()
        output = super().schedule(*args, **kwargs)  # type: ignore[misc]
        restore = {}
        for req_id, tokens in self._hits.items():
            request = self.requests.get(req_id)
            if request is None or req_id not in output.num_scheduled_tokens:
                continue  # looked up, not scheduled this step: looked up again next time
            handle = self.snapshots.handle(request, tokens)
            if handle is not None:
                restore[req_id] = handle
        self.snapshots.restores += len(restore)
        setattr(output, SNAPSHOT_RESTORE, restore)
        setattr(output, SNAPSHOT_FREE, self.snapshots.take_frees())
        return output

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        if self.snapshots is not None:
            for req_id, tokens, handle in getattr(model_runner_output, SNAPSHOT_SAVED, ()):
                self.snapshots.add(self.requests.get(req_id), tokens, handle)
        return super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
