"""The data-parallel topology of a serve: lanes, ranks, hosts, device groups and the
executor backend, each adjustment a `Decision` on the plan.

`configuration.plan_config` calls `plan_lanes` for every bundle (a single-execute
generator folds `--data-parallel-size N` into N in-process lanes of one engine; anything
else is vLLM's own data parallelism, one engine per rank) and, with several engines on
a card, `plan_device_groups` (each rank's chips). The per-lane `max_num_seqs`
arithmetic is here once (`_lanes_total`, `_lane_seqs`). Never imports vLLM.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ttbundles.errors import ConfigurationError, Diagnostic, Severity
from ttbundles.serving.planning import command_line
from ttbundles.serving.planning.plan import Plan

if TYPE_CHECKING:  # vLLM's config imports the platform: import it only for type hints
    from vllm.config import VllmConfig


def _error(code: str, message: str, hint: str | None = None) -> ConfigurationError:
    return ConfigurationError(Diagnostic(code, Severity.ERROR, message, hint=hint))


def plan_lanes(vllm_config: VllmConfig, plan: Plan, execution: str, target: Any) -> None:
    """The data-parallel topology, decided for every bundle and said with its numbers.

    A single-execute generator (one program over the whole mesh, one KV cache per DP
    submesh) folds `--data-parallel-size N` into N in-process lanes of one engine:
    `--max-num-seqs` is per lane, the total N times that (capped by the target). Anything
    else is vLLM's own data parallelism, one engine per rank.
    """
    parallel = vllm_config.parallel_config
    sched = vllm_config.scheduler_config
    dp = parallel.data_parallel_size
    cap = target.max_num_seqs if target is not None else None
    if dp > 1 and execution == "single" and plan.pooling is not None:
        # The pooling runner batches whole prompts on one generator with one cache of its
        # own; lanes (a cache per lane, rows placed by lane) are the generation runner's.
        raise _error(
            "TTB202",
            f"--data-parallel-size={dp} with pooling of a single-execute bundle "
            f"({plan.bundle.name} declares execution 'single'): in-process lanes do not "
            "pool yet",
            "drop --data-parallel-size (one engine pools the whole batch), or serve a "
            "bundle of execution 'submesh', whose engines pool side by side",
        )
    if dp > 1 and execution == "single" and parallel.data_parallel_size_local != dp:
        _plan_lanes_on_hosts(vllm_config, plan, cap)
        return
    if dp > 1 and execution == "single":
        # Request-specific RoPE (M-RoPE, vision models) needs nothing of the lanes: the
        # runner keeps a delta per slot and sends rope_deltas_all_users over every row.
        requested = sched.max_num_seqs
        total = _lanes_total(requested, dp, cap)
        plan.lanes = dp
        # One engine: vLLM must launch, and its front ends expect, a single engine core.
        parallel.data_parallel_size = 1
        parallel.data_parallel_size_local = 1
        parallel.data_parallel_rank = 0
        parallel.data_parallel_rank_local = 0
        # vLLM chose its multiprocess executor for the DP size it was given; one engine
        # with one worker runs the worker in the engine process, as without lanes.
        _one_worker_in_the_engine(plan, parallel, "the lanes' one worker")
        plan.decide(
            "data_parallel_size",
            dp,
            1,
            f"single-execute model ({plan.bundle.name} declares execution 'single'): "
            f"{dp} in-process lanes in one engine, one KV cache per lane, instead of {dp} "
            "engines",
        )
        sched.max_num_seqs = _lane_seqs(plan, requested, total, dp, cap, "")
        return
    if dp > 1 and vllm_config.model_config.is_moe:
        raise _error(
            "TTB207",
            f"--data-parallel-size={dp}: mixture-of-experts models on Tenstorrent "
            "do not run as multiple engines",
            "drop --data-parallel-size; the mesh provides the parallelism",
        )
    if dp == 1:  # more ranks: decided with their device groups (_plan_device_groups)
        plan.decide(
            "data_parallel_size",
            dp,
            dp,
            "one engine"
            + (
                "; --data-parallel-size N would run N in-process lanes"
                if execution == "single"
                else ""
            ),
        )
    if cap is not None and sched.max_num_seqs > cap:
        if "max_num_seqs" in command_line.COMMAND_LINE:
            sched.max_num_seqs = plan.lowered(
                "max_num_seqs", sched.max_num_seqs, cap, "max_num_seqs"
            )
        else:
            sched.max_num_seqs = plan.decide(
                "max_num_seqs",
                sched.max_num_seqs,
                cap,
                f"the bundle's target {plan.mesh} supports at most {cap}",
            )
    else:
        plan.decide(
            "max_num_seqs",
            sched.max_num_seqs,
            sched.max_num_seqs,
            f"within the target {plan.mesh}'s limit of {cap}"
            if cap is not None
            else "unchanged: the bundle's target sets no limit",
        )


def _plan_lanes_on_hosts(vllm_config: VllmConfig, plan: Plan, cap: int | None) -> None:
    """A single-execute bundle on several hosts: one engine per host, lanes inside each.

    The generator is one program over a host's whole mesh, so a host is one engine and
    `--data-parallel-size-local L` becomes its L lanes, as on one host. vLLM's multi-node
    data parallelism then counts engines: `--data-parallel-size N` over hosts of L lanes
    each is N / L engines, this host's being engine `--data-parallel-start-rank` / L.
    Every host decides this from its own flags, so the hosts must all run L lanes and
    start at multiples of L (refused otherwise: the head would wait for engines that
    never come).
    """
    import socket

    parallel = vllm_config.parallel_config
    sched = vllm_config.scheduler_config
    dp = parallel.data_parallel_size
    local = parallel.data_parallel_size_local
    start = parallel.data_parallel_rank
    host = socket.gethostname()
    bundle = plan.bundle.name
    if local < 1 or dp % local or start % local or parallel.data_parallel_external_lb:
        raise _error(
            "TTB202",
            f"host {host}: --data-parallel-size={dp} --data-parallel-size-local={local} "
            f"--data-parallel-start-rank={start}: {bundle} declares execution 'single' "
            "(one engine per host, its lanes inside it), so every host must run the same "
            "number of lanes L >= 1, L must divide --data-parallel-size and each host's "
            "start rank must be a multiple of L",
            "give every host --data-parallel-size-local L and start ranks 0, L, 2L, ...",
        )
    engines = dp // local
    engine = start // local
    requested = sched.max_num_seqs
    total = _lanes_total(requested, local, cap)
    plan.lanes = local
    plan.dp_size = engines
    plan.dp_start_rank = engine
    plan.dp_local = 1
    plan.host = host
    plan.dp_address = parallel.data_parallel_master_ip
    plan.dp_rpc_port = parallel.data_parallel_rpc_port
    parallel.data_parallel_size = engines
    parallel.data_parallel_size_local = 1
    parallel.data_parallel_rank = engine
    # data_parallel_rank_local stays unset: vLLM reads a set one as offline mode (no DP
    # coordinator, no load balancing stats); each engine process gets its own.
    _one_worker_in_the_engine(plan, parallel, "this host's lanes' one worker")
    others = _ranks_elsewhere(engine, 1, engines)
    plan.decide(
        "data_parallel_size",
        dp,
        engines,
        f"single-execute model ({bundle} declares execution 'single') on several hosts "
        f"(vLLM multi-node data parallelism, handshake at {parallel.data_parallel_master_ip}:"
        f"{parallel.data_parallel_rpc_port}): one engine per host, {local} in-process lanes "
        f"in each over the host's whole mesh; {dp} lanes = {engines} engines; this host "
        f"({host}) runs engine {engine} (lanes {start}-{start + local - 1}), the other "
        f"hosts run {others.replace('DP rank', 'engine')}",
    )
    sched.max_num_seqs = _lane_seqs(plan, requested, total, local, cap, " on this host's engine")


def _lanes_total(requested: int, lanes: int, cap: int | None) -> int:
    """The engine's max_num_seqs for `lanes` lanes of `requested` each, capped by the
    target; TTB205 when the lanes cannot share it evenly."""
    total = requested * lanes if cap is None else min(requested * lanes, cap)
    if total % lanes:
        raise _error(
            "TTB205",
            f"{lanes} data-parallel lanes cannot share max_num_seqs={total} evenly",
            f"use a max_num_seqs that is a multiple of {lanes}",
        )
    return total


def _lane_seqs(
    plan: Plan, requested: int, total: int, lanes: int, cap: int | None, where: str
) -> int:
    """max_num_seqs over `lanes` lanes: `requested` per lane, capped by the target. A
    cap below what the command line asked for is a TTB246 warning ("16 x 4 lanes")."""
    why = f"{total // lanes} per lane x {lanes} lanes{where}"
    if cap is None or requested * lanes <= cap:
        return plan.decide("max_num_seqs", requested, total, why)
    if "max_num_seqs" in command_line.COMMAND_LINE:
        bundle = plan.bundle.label
        reason = f"bundle {bundle}'s target {plan.mesh} serves at most {cap} in all"
        plan.decide("max_num_seqs", requested, total, f"{why} ({reason})")
        plan.lowered_settings.append("max_num_seqs")
        plan.warnings.append(
            Diagnostic(
                "TTB246",
                Severity.WARNING,
                f"max_num_seqs {requested} x {lanes} lanes lowered to {total // lanes} per "
                f"lane ({total} in all): {reason} (targets.{plan.mesh}.max_num_seqs in its "
                "vllm_metadata.json)",
                hint=f"ask for at most {cap // lanes} per lane (--max-num-seqs "
                f"{cap // lanes}), or serve on a mesh whose target allows more",
            )
        )
        return total
    return plan.decide(
        "max_num_seqs",
        requested,
        total,
        f"{why} (the target {plan.mesh} serves at most {cap} in all)",
    )


def plan_device_groups(vllm_config: VllmConfig, plan: Plan) -> None:
    """Multi-process data parallelism: one engine core per rank, each on its own submesh.

    Runs after the lanes decision (single-execute bundles are one engine per host by
    then). The mesh is split here, once per host: with vLLM's multi-node data parallelism
    (`--data-parallel-size-local` < `--data-parallel-size`) every host, the head and each
    `--headless` one, builds its own configuration, so each splits its own mesh into its
    local ranks; its engines bind their group by local rank. The groups travel in the
    plan to every engine's worker on that host.
    """
    import os
    import socket

    from ttbundles.serving.planning import device_groups

    parallel = vllm_config.parallel_config
    ranks = parallel.data_parallel_size
    if ranks <= 1:
        return
    local = parallel.data_parallel_size_local
    start = parallel.data_parallel_rank
    several_hosts = local != ranks
    if several_hosts and parallel.data_parallel_external_lb:
        raise _error(
            "TTB202",
            f"--data-parallel-size={ranks} with one server per rank behind an external "
            "load balancer is not supported on Tenstorrent",
            "start the head with --data-parallel-size-local and the other hosts with "
            "--headless --data-parallel-start-rank (see docs/operators/several-hosts.md)",
        )
    if several_hosts and not 0 <= start <= start + local <= ranks:
        raise _error(
            "TTB212",
            f"--data-parallel-start-rank={start} with --data-parallel-size-local={local} "
            f"runs DP ranks beyond --data-parallel-size={ranks}",
            f"give this host ranks within 0..{ranks - 1}",
        )
    host = socket.gethostname()
    plan.dp_size = ranks
    plan.dp_start_rank = start
    plan.dp_local = local
    plan.host = host
    if several_hosts:
        plan.dp_address = parallel.data_parallel_master_ip
        plan.dp_rpc_port = parallel.data_parallel_rpc_port
    seqs = vllm_config.scheduler_config.max_num_seqs
    totals = f"max_num_seqs={seqs} per rank, {seqs * ranks} in total; KV cache sized per rank"
    here = f"{_ranks_text(start, local)} of {ranks}"
    elsewhere = _ranks_elsewhere(start, local, ranks)
    handshake = f"{parallel.data_parallel_master_ip}:{parallel.data_parallel_rpc_port}"
    if local == 0:  # a head that only runs the API server and the DP coordinator
        plan.decide(
            "data_parallel_size",
            ranks,
            ranks,
            f"{ranks} engine cores over several hosts (vLLM multi-node data parallelism, "
            f"handshake at {handshake}); none on this host ({host}); {elsewhere} on hosts "
            f"started with --headless, each host splitting its own mesh; {totals}",
        )
        return
    device_groups.check_no_user_binding(os.environ, parallel.assigned_physical_gpu_ids, local)
    groups = device_groups.plan_groups(
        plan.mesh,
        local,
        flag="--data-parallel-size-local" if several_hosts else "--data-parallel-size",
        where=f"host {host} ({here}): " if several_hosts else "",
    )
    plan.device_groups = [list(g) for g in groups.groups]
    plan.submesh_shape = list(groups.submesh_shape)
    rows, columns = groups.submesh_shape
    source = {
        "host": "the host mesh: a host submesh per rank",
        "discovered": "chip ids from TT-Metal",
        "logical": "logical chip ids of the grid; TT-Metal is not installed here to "
        "discover the physical ones",
    }[groups.source]
    layout = f"({groups.describe(start)}; {source})"
    if several_hosts:
        reason = (
            f"{ranks} engine cores over several hosts (vLLM multi-node data parallelism, "
            f"handshake at {handshake}): this host ({host}) runs {here}, one per "
            f"{rows}x{columns} submesh of its mesh {groups.mesh} {layout}; {elsewhere} "
            f"on other hosts, each host splitting its own mesh; {totals}"
        )
    else:
        reason = (
            f"{ranks} engine cores, one per {rows}x{columns} submesh of {groups.mesh} "
            f"{layout}; {totals}"
        )
    plan.decide("data_parallel_size", ranks, ranks, reason)
    # vLLM defaults data parallelism to the multiprocessing executor: a worker process
    # behind every engine core. A rank here is one worker (world size 1).
    _one_worker_in_the_engine(plan, parallel, "each rank's one worker")


def _one_worker_in_the_engine(plan: Plan, parallel: Any, whose: str) -> None:
    """vLLM's multiprocessing executor (its choice for data parallelism) replaced by the
    in-process one where an engine has a single worker: a decision like any other."""
    backend = parallel.distributed_executor_backend
    if backend in (None, "mp"):
        parallel.distributed_executor_backend = plan.decide(
            "distributed_executor_backend",
            backend,
            "uni",
            f"{whose} runs inside its engine-core process",
        )


def _ranks_text(start: int, count: int) -> str:
    """`DP ranks 2-3`, `DP rank 2`, or `no DP rank` for `count` global ranks from `start`."""
    if count <= 0:
        return "no DP rank"
    return f"DP rank {start}" if count == 1 else f"DP ranks {start}-{start + count - 1}"


def _ranks_elsewhere(start: int, local: int, ranks: int) -> str:
    """The global DP ranks not on this host: `DP ranks 2-3`, or `DP ranks 0-1 and 4-7`."""
    parts = [
        _ranks_text(first, count)
        for first, count in ((0, start), (start + local, ranks - start - local))
        if count > 0
    ]
    return (
        " and ".join(parts).replace(" and DP ranks ", " and ").replace(" and DP rank ", " and ")
        or "no DP rank"
    )
