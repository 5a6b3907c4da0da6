"""The runner's calls into a generator, without a server."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("vllm")

from ttbundles.serving.model_runner import TTModelRunner  # noqa: E402


class Recorder:
    def __init__(self):
        self.calls = []


class WholeCache(Recorder):
    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        self.calls.append(("whole", kv_cache_shape, dtype, num_layers))
        return "whole"


class PerLayerCache(WholeCache):
    def allocate_kv_cache_per_layer(self, per_layer_specs):
        self.calls.append(("per_layer", per_layer_specs))
        return "per-layer"


def runner_with(model) -> TTModelRunner:
    runner = TTModelRunner.__new__(TTModelRunner)  # only what allocation reads
    runner.model = model
    runner.block_size = 16
    return runner


def test_whole_cache_allocation():
    model = WholeCache()
    runner = runner_with(model)
    runner.allocate_kv_cache(10, 2, 8, 3, torch.float32)
    assert runner.kv_cache == "whole"
    assert model.calls == [("whole", (10, 2, 16, 8), torch.float32, 3)]


def test_per_layer_allocation_is_preferred_where_offered():
    model = PerLayerCache()
    runner = runner_with(model)
    runner.allocate_kv_cache(10, 2, 8, 3, torch.bfloat16)
    assert runner.kv_cache == "per-layer"
    shape = (10, 2, 16, 8)
    assert model.calls == [
        (
            "per_layer",
            [(shape, torch.bfloat16, 0), (shape, torch.bfloat16, 1), (shape, torch.bfloat16, 2)],
        )
    ]
