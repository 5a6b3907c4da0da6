"""What a TT-Metal generator family needs passed that the contract does not say."""

from __future__ import annotations

from typing import Any

from ttbundles.serving.binding import GeneratorContractError


def tt_data_parallel(generator_cls: type, lanes: int, mesh_device: Any) -> int:
    """The `tt_data_parallel` a TT-Metal generator family needs.

    DeepSeek-V3 (`models/demos/deepseek_v3`) runs one replica per chip: it requires the
    chip count. Galaxy generators (`llama3_70b_galaxy`, `qwen3_32b_galaxy`, ...) split the
    mesh by columns and assert `tt_data_parallel % mesh.shape[1] == 0`: refused here with
    the numbers. Everything else gets the plan's lanes.
    """
    module = generator_cls.__module__
    num_devices = int(getattr(mesh_device, "get_num_devices", lambda: 1)())
    if "deepseek_v3" in module:
        return num_devices
    if "galaxy" in module:
        shape = tuple(getattr(mesh_device, "shape", (1, 1)))
        columns = int(shape[1]) if len(shape) > 1 else 1
        if lanes % columns:
            raise GeneratorContractError.single(
                "TTB205",
                f"{generator_cls.__qualname__} needs tt_data_parallel to be a multiple of the "
                f"mesh's {columns} columns; --data-parallel-size {lanes} is not",
                hint=f"use --data-parallel-size {columns} (or a multiple of it)",
            )
    return lanes
