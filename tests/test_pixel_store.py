"""Image inputs as the runner hands them to the generator, and the pixel store behind
them: a prefix hit keeps vLLM's layout (pixels dropped, grid kept); an image the prefill
computes again after its prefix was lost gets its last pixels back by hash.

Built from vLLM's own multimodal feature classes, fed to the runner's real function
(`runner.images.prefill_image_inputs`).
"""

from __future__ import annotations

import torch
from vllm.multimodal.inputs import (
    MultiModalFeatureSpec,
    MultiModalFieldElem,
    MultiModalKwargsItem,
    MultiModalSharedField,
    PlaceholderRange,
)

from ttbundles.serving.runner.images import prefill_image_inputs
from ttbundles.serving.runner.pixel_store import PixelStore


def feature(
    key: str, offset: int, length: int, pixels: torch.Tensor | None
) -> MultiModalFeatureSpec:
    field = MultiModalSharedField(batch_size=1)
    values = {"image_grid_thw": MultiModalFieldElem(data=torch.tensor([1, 4, 4]), field=field)}
    if pixels is not None:
        values["pixel_values"] = MultiModalFieldElem(data=pixels, field=field)
    return MultiModalFeatureSpec(
        data=MultiModalKwargsItem(values),
        modality="image",
        identifier=key,
        mm_position=PlaceholderRange(offset=offset, length=length),
    )


class Runner:
    """What the runner hands `prefill_image_inputs`: its request table and pixel store."""

    def __init__(self, **features):
        self.requests = {
            rid: type("State", (), {"mm_features": f})() for rid, f in features.items()
        }
        self.pixels = PixelStore()

    def image_inputs(self, req_ids: list[str], computed: list[int]) -> dict:
        return prefill_image_inputs(req_ids, computed, self.requests, self.pixels)


def runner(**features) -> Runner:
    return Runner(**features)


def test_the_store_evicts_the_least_recently_used_past_its_budget():
    store = PixelStore(budget_bytes=3 * 400)
    for key in "abc":
        store.put(key, torch.zeros(100))  # 400 bytes each
    assert store.get("a") is not None  # a is now the most recent
    store.put("d", torch.zeros(100))
    assert store.get("b") is None and len(store) == 3
    assert store.size_bytes == 1200
    store.put("huge", torch.zeros(1000))  # over the whole budget: not kept
    assert store.get("huge") is None and len(store) == 3


def test_rows_follow_the_reference_plugin_layout():
    pixels = torch.ones(16, 1176)
    run = runner(text=[], image=[feature("h1", 3, 4, pixels)])
    got = run.image_inputs(["text", "image"], [0, 0])
    assert got["pixel_values"][0] is None and got["image_grid_thw"][0] is None
    assert got["pixel_values"][1][0] is pixels
    assert got["image_grid_thw"][1][0].tolist() == [1, 4, 4]


def test_a_prefix_hit_keeps_vllms_layout_and_a_lost_prefix_gets_the_pixels_back():
    pixels = torch.ones(16, 1176)
    first = runner(first=[feature("h1", 3, 4, pixels)])
    first.image_inputs(["first"], [0])  # the image passes through: stored by hash
    hit = runner(second=[feature("h1", 3, 4, None)])
    hit.pixels = first.pixels
    covered = hit.image_inputs(["second"], [16])  # the prefix covers the image
    assert covered["pixel_values"][0] == [None]
    assert covered["image_grid_thw"][0][0].tolist() == [1, 4, 4]
    again = hit.image_inputs(["second"], [0])  # preempted, blocks evicted: recompute
    assert again["pixel_values"][0][0] is pixels
    unknown = runner(third=[feature("h2", 3, 4, None)])
    assert unknown.image_inputs(["third"], [0])["pixel_values"][0] == [None]
