"""A steady decode row's KV slots, answered without vLLM's allocation path.

vLLM's scheduler calls `KVCacheManager.allocate_slots` for every running row on every
step. For a decode row whose blocks already hold the step's token (and its lookahead),
the answer is always the same: no new blocks, nothing freed, nothing to cache. vLLM still
walks its whole path to find that out (skipped-block removal, the blocks-to-allocate
count, an empty allocation, the caching check: about ten calls a row), and on a Galaxy's
4 x 32 rows that walk is a large part of the host's work per step (issue 58's profile).

`install` puts a check in front of the manager's `allocate_slots` that answers that case
with vLLM's own empty result, and sends every other call to vLLM's method unchanged. It is
installed only where the shortcut is provably what vLLM would do, decided once from the
manager's structure, never from a release number:

- one KV cache group, managed by vLLM's plain `FullAttentionManager` (no sliding window,
  no Mamba, no sink or hierarchical variants: their paths free or relocate blocks per
  step), under the no-prefix-cache or the single-group coordinator;
- with prefix caching, hash blocks as large as the cache blocks (no partial tail block
  to cache) and no re-prefillable tokens (multi-module MTP);
- `allocate_slots` with exactly the parameters this check was written against: a
  release that adds one is served by vLLM's method alone.

A call takes the shortcut only with no argument but the request, its new tokens and the
lookahead (the running loop's call), for a running request with no pending copy-on-write
block, whose blocks cover `num_computed_tokens + num_new_tokens + lookahead` (capped at
the model length, as vLLM caps it) and, with prefix caching, whose full blocks are all
cached already. vLLM's path then: removes no block (full attention skips no token),
counts zero blocks to allocate (so the free-block check cannot fail: no watermark for a
running request), allocates none, caches none, and returns `empty_kv_cache_blocks`.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

logger = logging.getLogger("vllm.ttbundles.steady_slots")

# `KVCacheManager.allocate_slots`'s parameters in the releases this was checked against
# (0.33.0 and 0.34.0 have the same).
KNOWN_PARAMETERS = (
    "request",
    "num_new_tokens",
    "num_new_computed_tokens",
    "new_computed_blocks",
    "num_lookahead_tokens",
    "num_external_computed_tokens",
    "delay_cache_blocks",
    "num_encoder_tokens",
    "full_sequence_must_fit",
    "reserved_blocks",
    "has_scheduled_reqs",
    "skip_zeroing_group_ids",
)

# Where `install` keeps the manager's `SteadyRows` (its mark of being installed).
ATTRIBUTE = "_ttbundles_steady_rows"


def why_not(manager: Any) -> str | None:
    """Why the shortcut would not be vLLM's answer for this manager, or None if it is."""
    from vllm.v1.core.kv_cache_coordinator import (
        KVCacheCoordinatorNoPrefixCache,
        UnitaryKVCacheCoordinator,
    )
    from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager

    coordinator = getattr(manager, "coordinator", None)
    if type(coordinator) not in (KVCacheCoordinatorNoPrefixCache, UnitaryKVCacheCoordinator):
        return f"coordinator {type(coordinator).__name__}"
    groups = coordinator.single_type_managers
    if len(groups) != 1 or type(groups[0]) is not FullAttentionManager:
        return "not one full-attention group: " + ", ".join(type(g).__name__ for g in groups)
    group = groups[0]
    if getattr(coordinator, "num_reprefillable_tokens", None) != 0:
        return "re-prefillable tokens (multi-module MTP)"
    if group.enable_caching and group.block_pool.hash_block_size != group.block_size:
        return "hash blocks smaller than cache blocks (a partial tail block is cached)"
    # The class's method (the instance's may be this module's check already).
    params = tuple(inspect.signature(type(manager).allocate_slots).parameters)[1:]
    if params != KNOWN_PARAMETERS:
        return f"allocate_slots takes {params}"
    for name in ("req_to_blocks", "num_cached_block", "_partial_hit_reqs"):
        if not hasattr(group, name):
            return f"the group has no {name}"
    return None


class SteadyRows:
    """What vLLM's allocation reads of a running row in this manager's one group, and the
    one test of when its answer is empty (used by `install`'s check and by
    `steady_decode`, which counts the other rows' blocks itself)."""

    def __init__(self, manager: Any):
        group = manager.coordinator.single_type_managers[0]
        self.req_to_blocks = group.req_to_blocks
        self.num_cached_block = group.num_cached_block
        self.partial_hits = group._partial_hit_reqs
        self.block_size = group.block_size
        self.max_model_len = manager.max_model_len
        self.caching = bool(group.enable_caching and group.kv_cache_spec.prefix_cacheable)
        self.hash_block_size = group.block_pool.hash_block_size
        self.empty = manager.empty_kv_cache_blocks

    def answers_empty(self, request: Any, total: int, lookahead: int) -> bool:
        """vLLM's `allocate_slots` for a running request with `total` tokens computed
        after the step (capped at the model length before the step's, as vLLM caps it)
        would allocate nothing and cache nothing: its blocks hold `total + lookahead`
        tokens, no copy-on-write block is pending, and with prefix caching every block
        the step fills is cached already."""
        request_id = request.request_id
        blocks = self.req_to_blocks.get(request_id)
        block_size = self.block_size
        return not (
            blocks is None
            or len(blocks) * block_size < min(total + lookahead, self.max_model_len)
            or request_id in self.partial_hits
            or (
                self.caching
                and self.num_cached_block.get(request_id, 0)
                < min(total, request.num_tokens, len(request.block_hashes) * self.hash_block_size)
                // block_size
            )
        )


def installed(manager: Any) -> SteadyRows | None:
    """The manager's steady rows where `install` put its check in front, else None."""
    return getattr(manager, ATTRIBUTE, None)


def install(manager: Any) -> bool:
    """Put the steady-row check in front of `manager.allocate_slots` where it is vLLM's
    own answer (see the module docstring). Returns whether it was installed."""
    if installed(manager) is not None:
        return True
    reason = why_not(manager)
    if reason is not None:
        logger.debug("ttbundles: vLLM's allocate_slots for every row (%s)", reason)
        return False

    from vllm.v1.request import RequestStatus

    base = manager.allocate_slots
    rows = SteadyRows(manager)
    answers_empty, empty, max_model_len = rows.answers_empty, rows.empty, rows.max_model_len
    running = RequestStatus.RUNNING

    def allocate_slots(
        request: Any,
        num_new_tokens: int,
        *args: Any,
        num_lookahead_tokens: int = 0,
        **kwargs: Any,
    ) -> Any:
        if args or kwargs or num_new_tokens <= 0 or request.status != running:
            return base(
                request, num_new_tokens, *args, num_lookahead_tokens=num_lookahead_tokens, **kwargs
            )
        total = min(request.num_computed_tokens, max_model_len) + num_new_tokens
        if answers_empty(request, total, num_lookahead_tokens):
            return empty
        return base(request, num_new_tokens, num_lookahead_tokens=num_lookahead_tokens)

    manager.allocate_slots = allocate_slots
    setattr(manager, ATTRIBUTE, rows)
    return True
