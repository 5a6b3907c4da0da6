"""Device groups for multi-process data parallelism: one submesh per engine rank.

With `--data-parallel-size N` on a bundle that does not declare `execution: "single"`,
vLLM starts N engine cores, each with its own worker. On Tenstorrent each engine must open
only its own part of the mesh: the platform splits the mesh once into N equal submeshes
(in the process that plans the configuration), the plan carries the groups to every
process, and each worker sets `TT_VISIBLE_DEVICES` to its rank's group before anything
imports TT-Metal (TT-Metal reads the variable when it opens a mesh).

- On a TT mesh the physical chip ids of a submesh are TT-Metal's to say, so they are
  discovered in a spawned subprocess that opens the parent mesh, creates the N
  submeshes, prints their device ids and closes the mesh again (with a timeout: a
  mesh that does not open must not hang the server). A subprocess, because a mesh
  opened in the planning process would hold the chips the engines are about to open.
  The result is handed to child processes in `TT_BUNDLES_DEVICE_GROUPS`, so the API
  server processes that plan again do not open the mesh again.
- Without TT-Metal (`ttbundle plan` for a mesh not attached here) the groups are the
  logical chip ids of the preset's grid, row-major, and the plan says so.
- The host mesh has no chips to share: each rank gets a host submesh of its own
  (1x1, device id = its rank), so the multi-process path runs end to end on the host.
- Several hosts (vLLM's multi-node data parallelism): each host plans its own
  configuration (`vllm serve --headless` builds one too), so each host splits only its own
  mesh, into its `--data-parallel-size-local` ranks; group i belongs to local rank i,
  whatever its global rank. A refusal names the host, its ranks and the flag.

Nothing here imports vLLM, torch or ttnn at module level.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass

from ttbundles import envs
from ttbundles.errors import ConfigurationError
from ttbundles.format.meshes import is_host, mesh_shape

VISIBLE_DEVICES = "TT_VISIBLE_DEVICES"
CACHE_VARIABLE = "TT_BUNDLES_DEVICE_GROUPS"
DISCOVERY_TIMEOUT = 180.0  # seconds for the subprocess to open, split and close the mesh
DEFAULT_MESH = "N150"  # what the worker opens when MESH_DEVICE is unset


@dataclass(frozen=True)
class DeviceGroups:
    """The mesh split for N ranks: the submesh shape and each rank's chip ids."""

    mesh: str
    submesh_shape: tuple[int, int]
    groups: tuple[tuple[int, ...], ...]
    source: str  # "host", "discovered" (TT-Metal said) or "logical" (from the shape)

    def describe(self, first_rank: int = 0) -> str:
        """`rank 0 -> [0, 1], rank 1 -> [2, 3]` for the plan's decision line; global DP
        ranks from `first_rank` (a host other than the first runs ranks from its start)."""
        return ", ".join(f"rank {first_rank + r} -> {list(g)}" for r, g in enumerate(self.groups))


def _error(message: str, hint: str | None = None, code: str = "TTB212") -> ConfigurationError:
    return ConfigurationError.single(code, message, hint=hint)


def submesh_shape(
    shape: tuple[int, int],
    ranks: int,
    mesh: str = "the mesh",
    flag: str = "--data-parallel-size",
    where: str = "",
) -> tuple[int, int]:
    """The shape of each of `ranks` equal submeshes of a (rows, columns) mesh.

    Columns are split first (a Galaxy's 8x4 into 8x2 or 8x1, as TT-Metal's demos split
    it), then rows; a mesh that splits neither way evenly is refused with the sizes that
    would work. `flag` is the option that set the rank count and `where` a prefix naming
    the host (on several hosts each host's own `--data-parallel-size-local`).
    """
    rows, columns = shape
    chips = rows * columns
    if ranks < 1:
        raise _error(f"{where}{flag}={ranks} must be at least 1")
    if columns % ranks == 0:
        return rows, columns // ranks
    if rows % ranks == 0:
        return rows // ranks, columns
    sizes = sorted({n for n in range(1, chips + 1) if columns % n == 0 or rows % n == 0} - {1}) or [
        1
    ]
    raise _error(
        f"{where}{flag}={ranks}: mesh {mesh} ({rows}x{columns}, {chips} chips) does "
        f"not split into {ranks} equal submeshes",
        f"use {flag} {' or '.join(map(str, sizes))}, or another MESH_DEVICE",
    )


def split_logical(shape: tuple[int, int], ranks: int, mesh: str = "the mesh") -> DeviceGroups:
    """Equal submeshes of a grid, each as the row-major logical ids of its chips."""
    rows, columns = shape
    sub_rows, sub_columns = submesh_shape(shape, ranks, mesh)
    groups = []
    for top in range(0, rows, sub_rows):
        for left in range(0, columns, sub_columns):
            groups.append(
                tuple(
                    r * columns + c
                    for r in range(top, top + sub_rows)
                    for c in range(left, left + sub_columns)
                )
            )
    return DeviceGroups(mesh, (sub_rows, sub_columns), tuple(groups), "logical")


def host_groups(ranks: int) -> DeviceGroups:
    """One 1x1 host submesh per rank, device id = rank."""
    if ranks < 1:
        raise _error(f"--data-parallel-size={ranks} must be at least 1")
    return DeviceGroups("HOST", (1, 1), tuple((r,) for r in range(ranks)), "host")


def plan_groups(
    mesh: str | None,
    ranks: int,
    *,
    environ: MutableMapping[str, str] | None = None,
    flag: str = "--data-parallel-size",
    where: str = "",
) -> DeviceGroups:
    """The device groups for `ranks` engines on `mesh` (MESH_DEVICE; None: N150).

    Decided once: a result handed down by the parent process is reused; otherwise the
    host mesh is split directly, a TT mesh is discovered through TT-Metal when it is
    installed (and the result handed down), else split logically from its shape.
    """
    environ = os.environ if environ is None else environ
    if is_host(mesh):
        return host_groups(ranks)
    name = mesh or DEFAULT_MESH
    shape = mesh_shape(name)  # an unknown mesh is the one parse's error (TTB106)
    cached = _cached(environ, name, ranks)
    if cached is not None:
        return cached
    sub = submesh_shape(shape, ranks, name, flag, where)  # refuse an uneven split first
    import importlib.util

    if importlib.util.find_spec("ttnn") is None:
        return split_logical(shape, ranks, name)
    groups = DeviceGroups(name, sub, discover_submeshes(name, shape, sub), "discovered")
    if len(groups.groups) != ranks:
        raise _error(
            f"{where}TT-Metal split mesh {name} into {len(groups.groups)} submeshes of "
            f"{sub[0]}x{sub[1]}, not the {ranks} data-parallel ranks asked for",
            code="TTB213",
        )
    environ[CACHE_VARIABLE] = json.dumps(
        {"mesh": name, "ranks": ranks, "submesh_shape": list(sub), "groups": groups.groups}
    )
    return groups


def _cached(environ: MutableMapping[str, str], mesh: str, ranks: int) -> DeviceGroups | None:
    raw = envs.read(CACHE_VARIABLE, environ)
    if not raw:
        return None
    try:
        data = json.loads(raw)
        if data["mesh"] != mesh or data["ranks"] != ranks:
            return None
        return DeviceGroups(
            mesh,
            tuple(data["submesh_shape"]),
            tuple(tuple(int(i) for i in g) for g in data["groups"]),
            "discovered",
        )
    except (ValueError, KeyError, TypeError):
        return None  # not ours to trust: discover again


# Run in a fresh interpreter: open the parent mesh, split it, print the ids, close it.
_DISCOVER = """
import json, sys
import ttnn
rows, columns, sub_rows, sub_columns = map(int, sys.argv[1:5])
mesh = ttnn.open_mesh_device(ttnn.MeshShape(rows, columns))
try:
    submeshes = mesh.create_submeshes(ttnn.MeshShape(sub_rows, sub_columns))
    print("TTBUNDLES_GROUPS " + json.dumps([[int(i) for i in s.get_device_ids()]
                                            for s in submeshes]))
finally:
    ttnn.close_mesh_device(mesh)
"""


def discover_submeshes(
    mesh: str,
    shape: tuple[int, int],
    sub: tuple[int, int],
    *,
    timeout: float = DISCOVERY_TIMEOUT,
) -> tuple[tuple[int, ...], ...]:
    """The physical chip ids of each submesh, as TT-Metal assigns them.

    UNTESTED HERE: this path needs TT-Metal (`ttnn`) and Tenstorrent hardware, which this
    project's machines do not have. It runs TT-Metal in a subprocess, never in-process.
    """
    env = {k: v for k, v in os.environ.items() if k != VISIBLE_DEVICES}  # the whole mesh
    command = [sys.executable, "-c", _DISCOVER, *map(str, (*shape, *sub))]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        raise _error(
            f"opening mesh {mesh} to split it into {sub[0]}x{sub[1]} submeshes did not "
            f"finish within {timeout:.0f} s",
            "check the devices with tt-smi (another process may hold them)",
            code="TTB213",
        ) from None
    for line in done.stdout.splitlines():
        if line.startswith("TTBUNDLES_GROUPS "):
            return tuple(tuple(g) for g in json.loads(line.split(" ", 1)[1]))
    tail = (done.stderr or done.stdout).strip().splitlines()[-5:]
    raise _error(
        f"opening mesh {mesh} to split it into {sub[0]}x{sub[1]} submeshes failed "
        f"(exit {done.returncode}): {' | '.join(tail) or 'no output'}",
        "check MESH_DEVICE against the attached system (tt-smi)",
        code="TTB213",
    )


def check_no_user_binding(environ: MutableMapping[str, str], device_ids: object, ranks: int):
    """Refuse a device choice the user made for the whole server when each rank gets
    its own: it would either be overwritten or give every rank the same chips."""
    user = envs.read(VISIBLE_DEVICES, environ)
    if user:
        raise _error(
            f"{VISIBLE_DEVICES}={user} is set for the whole server, but with "
            f"--data-parallel-size={ranks} the platform gives each rank its own device "
            f"group through {VISIBLE_DEVICES}",
            f"unset {VISIBLE_DEVICES}, and choose the chips to split with MESH_DEVICE",
        )
    if device_ids is not None:
        raise _error(
            f"--device-ids {device_ids} conflicts with the platform's device groups "
            f"for --data-parallel-size={ranks} (each rank opens its own submesh)",
            "drop --device-ids; the platform splits MESH_DEVICE into one submesh per rank",
        )


def bind_rank(
    groups: list[list[int]],
    local_rank: int | None,
    environ: MutableMapping[str, str] | None = None,
) -> str:
    """Set `TT_VISIBLE_DEVICES` to this rank's group; the value set.

    Refused, before anything opens a device: a rank without a group, a different value
    already in the environment, or TT-Metal already imported (it would not see it).
    """
    environ = os.environ if environ is None else environ
    if local_rank is None or not 0 <= local_rank < len(groups):
        raise _error(
            f"data-parallel rank {local_rank} has no device group in the plan "
            f"({len(groups)} groups: {groups})",
            "start the ranks from one `vllm serve --data-parallel-size N`, which plans "
            "every rank's group",
        )
    value = ",".join(str(i) for i in groups[local_rank])
    current = envs.read(VISIBLE_DEVICES, environ)
    if current and current != value:
        raise _error(
            f"{VISIBLE_DEVICES}={current} in data-parallel rank {local_rank}'s environment "
            f"conflicts with its device group {value}",
            f"unset {VISIBLE_DEVICES}; the platform sets it per rank",
        )
    if "ttnn" in sys.modules and current != value:
        raise _error(
            f"TT-Metal was imported before data-parallel rank {local_rank} could bind "
            f"{VISIBLE_DEVICES}={value}: the rank would open every chip",
            "do not import ttnn at module level in the bundle's registration path",
        )
    environ[VISIBLE_DEVICES] = value
    return value
