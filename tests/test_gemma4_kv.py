"""Gemma 4's KV groups in the runner's KV package (`serving.runner.kv`): each layer's spec
in its own shape, whether the groups are served or not, so that the bytes vLLM and the
plan count are the layers' own; a group whose block size vLLM grew is refused (TTB265)."""

from __future__ import annotations

import pytest
import torch  # required: a missing or broken torch fails, never skips
import vllm  # noqa: F401 - required: a missing or broken vllm fails
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

from tests.conftest import GEMMA4_WINDOW
from tests.vllm_config import vllm_config
from ttbundles.reference.gemma4 import ReferenceGemma4Generator
from ttbundles.serving.binding import GeneratorContractError
from ttbundles.serving.runner.kv.cache import Allocator, allocate_cache
from ttbundles.serving.runner.kv.groups import layer_specs
from ttbundles.serving.runner.kv.sizing import pool_bytes

BLOCK = 16
GLOBAL = {2, 5}


@pytest.fixture(scope="module")
def config(gemma4_checkpoint):
    return vllm_config(
        gemma4_checkpoint,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        max_model_len=256,
        block_size=BLOCK,
    )


def default(config) -> FullAttentionSpec:
    return FullAttentionSpec(
        block_size=BLOCK, num_kv_heads=2, head_size=16, dtype=config.model_config.dtype
    )


def test_each_layer_keeps_its_own_shape_with_groups_and_without(config):
    served = layer_specs(ReferenceGemma4Generator, config, 6, default(config))
    whole = layer_specs(ReferenceGemma4Generator, config, 6, default(config), ask=False)
    for i, (name, spec) in enumerate(served.items()):
        shape = (1, 32) if i in GLOBAL else (2, 16)
        assert (spec.num_kv_heads, spec.head_size) == shape, name
        assert isinstance(spec, SlidingWindowSpec) is (i not in GLOBAL)
        if i not in GLOBAL:
            assert spec.sliding_window == GEMMA4_WINDOW
        # Not served as groups: full attention, still in the layer's own shape.
        kept = whole[name]
        assert type(kept) is FullAttentionSpec
        assert (kept.num_kv_heads, kept.head_size) == shape


def test_the_bytes_are_the_layers_own(config, gemma4_checkpoint):
    """Without groups every layer keeps the whole context in its own shape: a pool of
    `tokens` holds that many tokens of every layer's page, whatever the layers' shapes
    (here a global layer's page is a sliding one's; with a wider global head it is not,
    and the bytes follow)."""
    tokens = 256
    blocks = -(-tokens // BLOCK) + 1
    whole = layer_specs(ReferenceGemma4Generator, config, 6, default(config), ask=False)
    assert pool_bytes(config, whole, tokens, 1) == blocks * sum(
        s.page_size_bytes for s in whole.values()
    )
    wider = {
        name: FullAttentionSpec(
            block_size=BLOCK,
            num_kv_heads=s.num_kv_heads,
            head_size=s.head_size * (2 if s.num_kv_heads == 1 else 1),
            dtype=s.dtype,
        )
        for name, s in whole.items()
    }
    page = default(config).page_size_bytes
    assert pool_bytes(config, wider, tokens, 1) == blocks * page * (4 + 2 * 2)


def test_a_group_with_grown_blocks_is_refused(gemma4_checkpoint):
    """vLLM unifies pages of different sizes by growing a group's block size: the host
    runner's tables have one block size, so such a layout is refused, saying what to do."""

    class Whole:
        def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
            return []

    allocator = Allocator.bind(Whole(), "Whole")
    shapes = [(8, 2, BLOCK, 16)] * 2 + [(8, 1, 2 * BLOCK, 64)]
    with pytest.raises(GeneratorContractError) as excinfo:
        allocate_cache(allocator, "Whole", None, (8, 2, BLOCK, 16), torch.float32, 3, shapes)
    assert excinfo.value.diagnostics[0].code == "TTB265"
    assert "--disable-hybrid-kv-cache-manager" in excinfo.value.diagnostics[0].hint


def test_the_plan_sizes_each_layer_kind_in_its_own_shape(tmp_path):
    """What a request holds with groups and without (the plan's TTB264 and step budget
    choice) counts a global layer's page in its own shape: here twice a sliding one's."""
    from tests.conftest import write_gemma4_checkpoint
    from ttbundles.serving.planning.kv_capacity import request_blocks

    folder = write_gemma4_checkpoint(tmp_path / "wide", global_head_dim=64)
    config = vllm_config(
        folder, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256, block_size=BLOCK
    )
    held = request_blocks(config, GEMMA4_WINDOW, 4, 64)
    assert held.full_page == 2 * held.page
    assert held.page == 2 * BLOCK * 2 * 16 * 4  # K and V, 2 heads of 16, float32
    assert held.without_groups == held.full * (2 * held.full_page + 4 * held.page)
