"""The image inputs of a prefill (`contract.PREFILL_IMAGE_INPUTS`), from each request's
processed multimodal features (vLLM's processor ran in the API server).

An image whose placeholders lie in the row's computed prefix is sent as vLLM sends it
(pixels dropped on a prefix hit, grid kept); one the prefill computes now gets its
pixels, from the request or, when vLLM dropped them and the prefix is gone again
(preempted, evicted), from the pixel store (`serving.runner.pixel_store`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ttbundles.format import contract
from ttbundles.serving.runner.pixel_store import PixelStore


def prefill_image_inputs(
    req_ids: list[str], computed: list[int], requests: Mapping[str, Any], pixels: PixelStore
) -> dict[str, list[Any]]:
    """One entry per prefill row for each image input (None: the row has no image)."""
    inputs: dict[str, list[Any]] = {name: [] for name in contract.PREFILL_IMAGE_INPUTS}
    for req_id, start in zip(req_ids, computed):
        features = requests[req_id].mm_features
        if not features:
            for rows in inputs.values():
                rows.append(None)
            continue
        row: dict[str, list[Any]] = {name: [] for name in inputs}
        for feature in features:
            if feature.modality != "image":  # the API server refuses these
                raise ValueError(
                    f"request {req_id} carries a {feature.modality} input; "
                    "this bundle serves images only"
                )
            data = feature.data or {}
            for name in inputs:
                element = data.get(name)
                row[name].append(None if element is None else element.data)
            pixel_values = row["pixel_values"][-1]
            position = feature.mm_position
            if pixel_values is not None:
                pixels.put(feature.identifier, pixel_values)
            elif position.offset + position.length > start:  # computed now: needed
                row["pixel_values"][-1] = pixels.get(feature.identifier)
        for name, rows in inputs.items():
            rows.append(row[name])
    return inputs
