"""The generator contract's data types, shared by the worker and generators.

Pure Python (no torch, no vLLM): generators written in TT-NN import these without
pulling in the serving stack.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class HostMesh:
    """The mesh handed to a generator on the host mesh (MESH_DEVICE=HOST): no device.

    A generator that branches on `mesh_device.is_host` can run its torch reference path.
    """

    shape: tuple[int, int] = (1, 1)
    is_host: bool = True

    def get_num_devices(self) -> int:
        return self.shape[0] * self.shape[1]


@dataclass(frozen=True)
class SamplingParamsBatch:
    """Per-request sampling parameters for sampling on the device, one entry per row.

    temperature 0 means greedy. top_k 0 (or >= vocab) means no top-k cut; top_p 1.0 no
    nucleus cut. A seed makes a row reproducible: the token drawn at a position depends
    only on (seed, position), whatever else is in the batch.
    """

    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    seed: list[int | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.temperature)
