"""The engine's decode rate against the generator's own: what the serving stack costs per step.

In one process, on the demo checkpoint (a tiny Llama, float32, CPU; `--model smollm2`: the
demo's real model, SmolLM2-135M), for each batch size:

- generator: the reference generator driven directly, as a device loop would drive it:
  one prefill of the batch's prompts, then steady decode with device sampling (greedy),
  its inputs resident (decode contract v1, `reload_inputs=False` after the first step)
  and two steps in flight (step N+1 submitted before step N is read back);
- engine: vLLM's engine (`LLMEngine`, stepped as `vllm.LLM.generate` steps it) with the
  same generator behind the platform, the phase scheduler, the worker and the model
  runner (VLLM_ENABLE_V1_MULTIPROCESSING=0: the engine core in this process), greedy,
  device sampling, async scheduling as vLLM defaults, the same prompts, `--steps` tokens
  each.

Both sides alternate in `--rounds` rounds (generator, engine, generator, ...), so both see
the same machine load; the median round and the spread (min-max) are reported. A side's
figure is milliseconds per steady decode step: the generator's is its decode loop's wall
time / steps; the engine's is the time between the first and the last steady decode step
the runner saw (a step of one token per row, no request admitted) / the steps between.
Derived per batch:

- `engine/generator`: the generator's rate over the engine's (1.0: the host costs nothing);
- `whole`: the same over whole rounds, per token a request got (the engine's round from
  the first request added to the last finished: admission, prefill, detokenization and
  finishing in; the generator's from its prefill to its last readback);
- `host cost per step` = engine - generator, and per running request (/ batch);
- `own host work per step`: the CPU time the engine thread spends in the model runner's
  step functions (execute_model, sample_tokens, readback) and in our scheduler (the phase
  scheduler or the lane coordinator), less the time inside the generator's own methods
  and vLLM's `Scheduler` methods: the project's work, not vLLM's and not the model's (CPU
  time, so that other processes on the machine do not inflate it). Given two ways: a
  round's whole own work / its decode steps, and the own work of the steady decode steps
  alone (between the first and the last, as the step time) with the rest per request
  (`once a request`: admission, prefill inputs, finishing, paid once per request, so it
  shrinks per step as requests decode longer);
- `wait per step`: the time the host blocks on a readback (device still computing);
- `device idle per step`: the engine's step less the forward time in it, what the host's
  work did not hide behind the device's;
- `engine thread CPU per step`: all the host work of a step (vLLM's scheduler, output
  processing and detokenizer, and ours), as CPU time of the engine thread, and its share
  of the generator's step. On a card, whose compute takes no host core, the engine keeps
  up with the device while this is below 1; it is the figure least moved by the load of
  other processes. Here the "device" is a thread of this interpreter on the same cores,
  so its forward slows down while the engine thread runs (`forward ... in the engine`),
  and the wall-clock ratio also carries that contention.

vLLM's statistics are off, as `vllm.LLM` sets them (`--log-stats`: on, as `vllm serve`).

`--lanes 4` adds 4 lanes x `--lane-batch` (the demo bundle's single-execute variant,
`--data-parallel-size 4`: one engine, the lane coordinator) against the generator with
`tt_data_parallel=4` at the same total batch.

`--profile` runs one more engine round per configuration under cProfile and prints the top
costs (own CPU time of the engine thread: time blocked on the device or on the interpreter
lock is not counted), and the serving code's own top functions.

    .venv/bin/python benchmarks/bench_engine.py [--batches 8 32 64 128] [--lanes 4]
        [--lane-batch 32] [--steps 64] [--rounds 5] [--repeat 1] [--profile] [--json]
        [--log-stats] [--sync] [--stream-interval N]
        [--switch-interval SECONDS] [--model tiny|smollm2]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import statistics
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

from stopping import unwind_on_sigterm  # benchmarks/, on sys.path as the script folder

INPUT_LEN = 16
SPECIAL_TOKENS = 7  # the demo tokenizer's first ids are its special tokens
BLOCK = 16


# The clock of the engine being measured: vLLM's `Scheduler` methods are patched once per
# process, and charge their time to it.
ACTIVE_CLOCK: list = [None]


class DeviceClock:
    """Wall time the generator's device queue spends in forward passes (`_run`)."""

    def __init__(self, generator) -> None:
        self.seconds = 0.0
        original = generator._run

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        generator._run = timed


def prompts_for(batch: int, vocab: int, seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(SPECIAL_TOKENS, vocab) for _ in range(INPUT_LEN)] for _ in range(batch)]


class GeneratorAlone:
    """The reference generator, driven directly in a steady decode loop."""

    def __init__(self, checkpoint: Path, batch: int, lanes: int, max_len: int):
        import torch
        from transformers import AutoConfig

        from ttbundles.format.contract import HostMesh
        from ttbundles.reference.generator import ReferenceLlamaGenerator

        try:
            from ttbundles.serving.runner.sampling_path import device_params
        except ModuleNotFoundError:  # a tree before serving/ was in wings (bench_commits)
            from ttbundles.serving.sampling_path import device_params

        self.torch = torch
        hf = AutoConfig.from_pretrained(checkpoint)
        self.gen = ReferenceLlamaGenerator.initialize_vllm_model(
            hf, HostMesh(), batch, max_len, tt_data_parallel=lanes
        )
        self.batch, self.lanes = batch, lanes
        per_lane = batch // lanes
        width = -(-max_len // BLOCK)
        head = hf.hidden_size // hf.num_attention_heads
        self.kv = self.gen.allocate_kv_cache(
            (per_lane * width, hf.num_key_value_heads, BLOCK, head),
            torch.float32,
            hf.num_hidden_layers,
        )
        # Slot s (lane-local row r = s % per_lane) owns lane-local blocks r*width ...
        local = torch.arange(batch) % per_lane
        self.table = (local[:, None] * width + torch.arange(width)[None, :]).to(torch.int32)
        self.params = device_params([None] * batch, hf.vocab_size)  # greedy
        self.device = DeviceClock(self.gen)

    def round(self, prompts: list[list[int]], steps: int) -> float:
        """Prefill, then `steps` steady decodes two deep; ms per decode step."""
        torch, gen = self.torch, self.gen
        round_start = time.perf_counter()
        tokens = torch.tensor(prompts, dtype=torch.int64)
        n = len(prompts)
        first, _ = gen.prefill_forward(
            tokens=tokens,
            page_table=self.table,
            kv_cache=self.kv,
            prompt_lens=torch.full((n,), INPUT_LEN),
            empty_slots=list(range(n)),
            sampling_params=self.params,
            start_pos=torch.zeros(n, dtype=torch.int64),
        )

        def submit(step: int):
            out = gen.decode_forward(
                tokens=first.reshape(n, 1) if step == 0 else torch.zeros((n, 1), dtype=torch.int64),
                start_pos=torch.full((n,), INPUT_LEN + step),
                page_table=self.table,
                kv_cache=self.kv,
                read_from_device=False,
                sampling_params=self.params,
                slot_remap=list(range(n)),
                reload_inputs=step == 0,
                reload_sampling_params=step == 0,
                reset_sampling_state=step == 0,
            )
            return gen.read_decode_output(out, async_read=True)

        def finish(pending) -> None:
            host, events = pending
            for event in events:
                event.wait()
            gen.process_decode_output_host(host, is_tokens=True)

        finish(submit(0))  # the first step reloads everything: not steady
        self.device.seconds = 0.0
        start = time.perf_counter()
        pending = submit(1)
        for step in range(2, steps + 1):
            following = submit(step)
            finish(pending)
            pending = following
        finish(pending)
        end = time.perf_counter()
        self.device_ms = self.device.seconds * 1000 / steps
        # The whole round per token a request got (the prefill's, then steps + 1 decodes):
        # what a whole-request run of the engine is compared with.
        self.whole_ms_per_token = (end - round_start) * 1000 / (steps + 2)
        return (end - start) * 1000 / steps


class RunnerClock:
    """Times the model runner's step functions in the engine: when each steady decode step
    started, and the runner's own wall time less its device waits and generator calls."""

    def __init__(self, runner) -> None:
        from ttbundles.serving.runner.readback import TTAsyncOutput

        self.runner = runner
        self.own = 0.0
        self.wait = 0.0
        self.inside = 0.0
        self.decode_starts: list[float] = []
        self.decode_cpu: list[float] = []  # the engine thread's CPU time at those starts
        self.decode_own: list[float] = []  # own work so far at those starts
        self.scheduler_own = 0.0  # the part of own work in our scheduler code
        self.decode_scheduler_own: list[float] = []
        # vLLM's share of the engine thread: its `Scheduler` methods (reached through our
        # schedulers) and the front end's output processing (detokenizer, request outputs).
        self.vllm_scheduler = 0.0
        self.decode_vllm_scheduler: list[float] = []
        self.output_processing = 0.0
        self.decode_output_processing: list[float] = []
        self._depth = 0
        self._wrap_instance("execute_model", self._execute)
        self._wrap_instance("sample_tokens", None)
        self._wrap_instance("synchronize", None, kind="wait")
        # The generator's own methods: the runner's bound contract (`runner.methods`),
        # or its fields before the runner was split by concept (interleaved runs).
        methods = getattr(runner, "methods", None)
        for name in ("decode", "prefill", "read", "process"):
            target, field = (methods, name) if methods is not None else (runner, f"_{name}")
            if getattr(target, field, None) is not None:
                self._wrap_instance(field, None, kind="inside", target=target)
        original = TTAsyncOutput.get_output
        clock = self

        def get_output(output):
            with clock.timed("own"):
                return original(output)

        TTAsyncOutput.get_output = get_output

    def wrap_scheduler(self, scheduler) -> None:
        """Count our scheduler code as own work: the engine's scheduler (the phase
        scheduler, or the lane coordinator over several) is timed, less the time inside
        vLLM's own `Scheduler` methods it calls (patched on vLLM's classes, which our
        schedulers reach through `super()`)."""
        from vllm.v1.core.sched.scheduler import Scheduler

        if not getattr(Scheduler, "_bench_timed", False):
            for name in ("schedule", "update_from_output"):
                original = getattr(Scheduler, name)

                def inside(*args, _original=original, **kwargs):
                    with ACTIVE_CLOCK[0].timed("inside", scheduler=True):
                        return _original(*args, **kwargs)

                setattr(Scheduler, name, inside)
            Scheduler._bench_timed = True
        ACTIVE_CLOCK[0] = self
        # After the patch, so that the bound methods reach the patched base.
        self._wrap_instance("schedule", None, target=scheduler, scheduler=True)
        self._wrap_instance("update_from_output", None, target=scheduler, scheduler=True)

    @contextmanager
    def timed(self, kind: str, scheduler: bool = False):
        """Own and inside are the engine thread's CPU time (what other processes on the
        machine do not inflate), own counted at the outermost level only; wait is wall
        time blocked on a readback."""
        clock = time.perf_counter if kind == "wait" else time.thread_time
        start = clock()
        self._depth += kind == "own"
        try:
            yield
        finally:
            elapsed = clock() - start
            if kind == "own":
                self._depth -= 1
                if self._depth == 0:
                    self.own += elapsed
                    if scheduler:
                        self.scheduler_own += elapsed
            elif kind == "wait":
                self.wait += elapsed
            elif kind == "output":
                self.output_processing += elapsed
            else:
                self.inside += elapsed
                if scheduler:
                    self.scheduler_own -= elapsed
                    self.vllm_scheduler += elapsed

    def _wrap_instance(
        self, name: str, before, kind: str = "own", target=None, scheduler: bool = False
    ) -> None:
        target = self.runner if target is None else target
        original = getattr(target, name)

        def wrapped(*args, **kwargs):
            if before is not None:
                before(*args)
            with self.timed(kind, scheduler):
                return original(*args, **kwargs)

        setattr(target, name, wrapped)

    def _mid_prefill(self) -> set[str]:
        # The runner's own record (its request states'; a field of the runner before the
        # runner was split by concept, kept readable for interleaved runs against it).
        states = getattr(self.runner, "states", None)
        return states.mid_prefill if states is not None else self.runner._mid_prefill

    def _execute(self, scheduler_output) -> None:
        so = scheduler_output
        steady = (
            not so.scheduled_new_reqs
            and so.num_scheduled_tokens
            and all(n == 1 for n in so.num_scheduled_tokens.values())
            and not self._mid_prefill()
        )
        if steady:
            self.decode_starts.append(time.perf_counter())
            self.decode_cpu.append(time.thread_time())
            self.decode_own.append(self.own - self.inside)
            self.decode_scheduler_own.append(self.scheduler_own)
            self.decode_vllm_scheduler.append(self.vllm_scheduler)
            self.decode_output_processing.append(self.output_processing)

    def wrap_output_processor(self, processor) -> None:
        """Time the front end's output processing (in `vllm serve` it runs in the API
        server's process, beside the engine core; in `vllm.LLM`, in this thread)."""
        self._wrap_instance("process_outputs", None, kind="output", target=processor)

    def reset(self) -> None:
        self.own = self.wait = self.inside = self.scheduler_own = 0.0
        self.vllm_scheduler = self.output_processing = 0.0
        self.decode_starts = []
        self.decode_cpu = []
        self.decode_own = []
        self.decode_scheduler_own = []
        self.decode_vllm_scheduler = []
        self.decode_output_processing = []


class Engine:
    """vLLM's `LLMEngine` in this process, stepped as `LLM.generate` steps it (`LLM`
    itself refuses `data_parallel_size` > 1, which the platform folds into lanes)."""

    def __init__(
        self,
        checkpoint: Path,
        batch: int,
        lanes: int,
        max_len: int,
        log_stats: bool = False,
        sync: bool = False,
        stream_interval: int = 1,
    ):
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        per_lane = batch // lanes
        kwargs = dict(
            model=str(checkpoint),
            max_model_len=max_len,
            max_num_seqs=per_lane,
            block_size=BLOCK,
            enable_prefix_caching=False,  # every round's prompts are computed, not reused
            additional_config={"tt": {"sample_on_device_mode": "all"}},
            num_gpu_blocks_override=batch * (-(-max_len // BLOCK)) + lanes,
            # As `vllm.LLM` sets it unless asked (`--log-stats`: as `vllm serve` runs).
            disable_log_stats=not log_stats,
            # `--sync`: vLLM's synchronous scheduling, the host's work never overlapping a
            # forward (a diagnostic: what the host costs without the "device" thread
            # computing on the same cores at the same time).
            async_scheduling=False if sync else None,
            # `--stream-interval N`: the front end makes a request's output every N
            # tokens (vLLM's option; detokenization still runs every step).
            stream_interval=stream_interval,
        )
        if lanes > 1:
            kwargs["data_parallel_size"] = lanes
        self.engine = LLMEngine.from_engine_args(EngineArgs(**kwargs))
        core = self.engine.engine_core.engine_core
        self.runner = core.model_executor.driver_worker.worker.model_runner
        self.requests = 0
        self.clock = RunnerClock(self.runner)
        self.clock.wrap_scheduler(core.scheduler)
        self.clock.wrap_output_processor(self.engine.output_processor)
        self.device = DeviceClock(self.runner.generator)

    def round(self, prompts: list[list[int]], steps: int) -> dict:
        from vllm import SamplingParams

        from ttbundles.serving.stats import STATS

        params = SamplingParams(max_tokens=steps + 1, temperature=0.0, ignore_eos=True)
        self.clock.reset()
        self.device.seconds = 0.0
        before = STATS.snapshot()
        round_start = time.perf_counter()
        for prompt in prompts:
            self.requests += 1
            self.engine.add_request(str(self.requests), {"prompt_token_ids": prompt}, params)
        produced = 0
        while self.engine.has_unfinished_requests():
            for out in self.engine.step():
                if out.finished:
                    produced += len(out.outputs[0].token_ids)
        round_end = time.perf_counter()
        after = STATS.snapshot()
        if produced != len(prompts) * (steps + 1):
            sys.exit(
                f"the engine produced {produced} tokens, expected {len(prompts) * (steps + 1)}"
            )
        starts = self.clock.decode_starts
        intervals = len(starts) - 1
        if intervals < 1:
            sys.exit("the engine ran fewer than two steady decode steps")
        decodes = max(1, after.get("step.decode", 0) - before.get("step.decode", 0))
        host = self.clock.own - self.clock.inside
        own = self.clock.decode_own
        steady = (own[-1] - own[0]) / intervals
        ours = self.clock.decode_scheduler_own
        theirs = self.clock.decode_vllm_scheduler
        processing = self.clock.decode_output_processing

        def per_step(marks: list[float]) -> float:
            return (marks[-1] - marks[0]) * 1000 / intervals

        return {
            "ms_per_step": (starts[-1] - starts[0]) * 1000 / intervals,
            # The whole round (admission, prefill, decode, detokenization, finishing) per
            # token a request got.
            "whole_ms_per_token": (round_end - round_start) * 1000 / (steps + 1),
            "cpu_ms_per_step": (self.clock.decode_cpu[-1] - self.clock.decode_cpu[0])
            * 1000
            / intervals,
            "own_ms_per_step": host * 1000 / decodes,
            "own_steady_ms_per_step": steady * 1000,
            "scheduler_steady_ms_per_step": per_step(ours),
            # The steady steps' engine thread CPU split: vLLM's scheduler, vLLM's output
            # processing, ours (scheduler + runner: own_steady), and the rest (the engine
            # core's loop, the readback's wait bookkeeping, what no clock names).
            "vllm_scheduler_steady_ms_per_step": per_step(theirs),
            "output_processing_steady_ms_per_step": per_step(processing),
            # What the steady steps do not account for (admission, prefill, the last
            # steps' outputs, finishing), per request of the round: paid once a request.
            "own_once_us_per_request": max(host - steady * decodes, 0.0) * 1e6 / len(prompts),
            "wait_ms_per_step": self.clock.wait * 1000 / decodes,
            "device_ms_per_step": self.device.seconds * 1000 / decodes,
            "decode_steps": decodes,
            "overlapped": after.get("decode.overlapped", 0) - before.get("decode.overlapped", 0),
        }

    def close(self) -> None:
        import contextlib
        import gc

        # The engine's last teardown step empties an accelerator cache the host mesh lacks.
        with contextlib.suppress(Exception):
            self.engine.engine_core.shutdown()
        gc.collect()


def spread(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def measure(
    checkpoint: Path, batch: int, lanes: int, args: argparse.Namespace, profile_it: bool
) -> dict:
    """One configuration's rounds: the per-round figures of both sides (see `summary`)."""
    from transformers import AutoConfig

    vocab = AutoConfig.from_pretrained(checkpoint).vocab_size
    max_len = INPUT_LEN + args.steps + 2 * BLOCK
    generator = GeneratorAlone(checkpoint, batch, lanes, max_len)
    engine = Engine(
        checkpoint,
        batch,
        lanes,
        max_len,
        log_stats=args.log_stats,
        sync=args.sync,
        stream_interval=args.stream_interval,
    )
    prompts = prompts_for(batch, vocab, args.seed)
    generator.round(prompts, 4)  # warm-up, both sides
    engine.round(prompts, 4)
    gen_ms, gen_device, gen_whole, eng = [], [], [], []
    for r in range(args.rounds):
        prompts = prompts_for(batch, vocab, args.seed + 1 + r)
        gen_ms.append(generator.round(prompts, args.steps))
        gen_device.append(generator.device_ms)
        gen_whole.append(generator.whole_ms_per_token)
        eng.append(engine.round(prompts, args.steps))
    profile = None
    if profile_it:
        # CPU time of this thread, not wall time: a profile under load (or while the
        # device thread holds the interpreter lock) would otherwise charge waiting to
        # whichever function happened to be running.
        profiler = cProfile.Profile(time.thread_time)
        profiler.enable()
        engine.round(prompts_for(batch, vocab, args.seed), args.steps)
        profiler.disable()
        profile = top_costs(profiler, args.top)
    engine.close()
    del generator
    return {
        "batch": batch,
        "lanes": lanes,
        "gen_ms": gen_ms,
        "gen_device": gen_device,
        "gen_whole": gen_whole,
        "eng": eng,
        "profile": profile,
    }


def summary(raw: dict) -> dict:
    """Median and spread of a configuration's rounds (pooled over `--repeat` sweeps)."""
    batch, lanes, profile = raw["batch"], raw["lanes"], raw["profile"]
    gen_ms, gen_device, eng = raw["gen_ms"], raw["gen_device"], raw["eng"]
    ratios = [g / e["ms_per_step"] for g, e in zip(gen_ms, eng)]
    host = [e["ms_per_step"] - g for g, e in zip(gen_ms, eng)]
    return {
        "batch": batch,
        "lanes": lanes,
        "generator_ms_per_step": spread(gen_ms),
        "engine_ms_per_step": spread([e["ms_per_step"] for e in eng]),
        "engine_over_generator": spread(ratios),
        # Whole rounds, per token a request got: prefill, admission and detokenization in.
        "whole_engine_over_generator": spread(
            [g / e["whole_ms_per_token"] for g, e in zip(raw["gen_whole"], eng)]
        ),
        "host_ms_per_step": spread(host),
        "host_us_per_request": spread([h * 1000 / batch for h in host]),
        "own_host_ms_per_step": spread([e["own_ms_per_step"] for e in eng]),
        "own_steady_ms_per_step": spread([e["own_steady_ms_per_step"] for e in eng]),
        "scheduler_steady_ms_per_step": spread([e["scheduler_steady_ms_per_step"] for e in eng]),
        "runner_steady_ms_per_step": spread(
            [e["own_steady_ms_per_step"] - e["scheduler_steady_ms_per_step"] for e in eng]
        ),
        "vllm_scheduler_steady_ms_per_step": spread(
            [e["vllm_scheduler_steady_ms_per_step"] for e in eng]
        ),
        "output_processing_steady_ms_per_step": spread(
            [e["output_processing_steady_ms_per_step"] for e in eng]
        ),
        "rest_steady_ms_per_step": spread(
            [
                e["cpu_ms_per_step"]
                - e["own_steady_ms_per_step"]
                - e["vllm_scheduler_steady_ms_per_step"]
                - e["output_processing_steady_ms_per_step"]
                for e in eng
            ]
        ),
        # The engine core's share (what `vllm serve` runs in the engine-core process):
        # the whole thread less the front end's output processing.
        "engine_core_cpu_ms_per_step": spread(
            [e["cpu_ms_per_step"] - e["output_processing_steady_ms_per_step"] for e in eng]
        ),
        "own_once_us_per_request": spread([e["own_once_us_per_request"] for e in eng]),
        "engine_cpu_ms_per_step": spread([e["cpu_ms_per_step"] for e in eng]),
        "engine_cpu_over_generator": spread(
            [e["cpu_ms_per_step"] / g for g, e in zip(gen_ms, eng)]
        ),
        "wait_ms_per_step": spread([e["wait_ms_per_step"] for e in eng]),
        "generator_device_ms_per_step": spread(gen_device),
        "engine_device_ms_per_step": spread([e["device_ms_per_step"] for e in eng]),
        # The device's idle time per step in the engine: what the host's work did not hide.
        "device_idle_ms_per_step": spread(
            [max(e["ms_per_step"] - e["device_ms_per_step"], 0.0) for e in eng]
        ),
        "overlapped_steps": [e["overlapped"] for e in eng],
        "decode_steps": [e["decode_steps"] for e in eng],
        "profile": profile,
    }


def top_costs(profiler: cProfile.Profile, top: int) -> dict:
    """The top functions by own time, and those of the project's serving code."""
    stats = pstats.Stats(profiler)
    rows = []
    for (path, line, name), (_, calls, own, cumulative, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((own, cumulative, calls, f"{_short(path)}:{line}({name})"))
    rows.sort(reverse=True)
    ours = [r for r in rows if "ttbundles/serving" in r[3] or "ttbundles/format" in r[3]]
    shape = lambda r: {"own_ms": r[0] * 1000, "cum_ms": r[1] * 1000, "calls": r[2], "fn": r[3]}  # noqa: E731
    return {"top": [shape(r) for r in rows[:top]], "ours": [shape(r) for r in ours[:top]]}


def _short(path: str) -> str:
    for marker in ("site-packages/", "/ttbundles/"):
        if marker in path:
            return (
                path.split(marker, 1)[1]
                if marker == "site-packages/"
                else "ttbundles/" + path.split(marker, 1)[1]
            )
    return path


def main() -> None:
    unwind_on_sigterm()  # a killed run still stops the servers it started
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="*", default=[8, 32, 64, 128])
    parser.add_argument("--lanes", type=int, default=4, help="0: no lanes configuration")
    parser.add_argument("--lane-batch", type=int, default=32, help="rows per lane")
    parser.add_argument("--steps", type=int, default=64, help="decode steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument(
        "--repeat", type=int, default=1, help="sweeps over all configurations, rounds pooled"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--model",
        choices=("tiny", "smollm2"),
        default="tiny",
        help="tiny: the demo's random checkpoint; smollm2: the demo's real model (its forward "
        "is ~100x the tiny one's: use fewer --steps and smaller --batches)",
    )
    parser.add_argument(
        "--log-stats",
        action="store_true",
        help="keep vLLM's statistics on, as `vllm serve` does (vllm.LLM turns them off)",
    )
    parser.add_argument(
        "--sync",
        action="store_true",
        help="synchronous scheduling: no overlap, so the host's work never runs while the "
        "host mesh's forward computes on the same cores (a diagnostic of the own work's "
        "growth; the engine/generator ratio then carries the host's whole cost)",
    )
    parser.add_argument(
        "--stream-interval",
        type=int,
        default=1,
        help="vLLM's --stream-interval: the front end makes each request's output every N "
        "tokens instead of every step (what an operator can set to cut output processing)",
    )
    parser.add_argument(
        "--switch-interval",
        type=float,
        default=None,
        help="the interpreter's thread switch interval in seconds (default: Python's 0.005); "
        "the host mesh's device is a thread of this interpreter, which waits up to this long "
        "for the lock while the engine thread runs Python: a card does not",
    )
    args = parser.parse_args()
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)

    from ttbundles.demo.checkpoint import write_demo_checkpoint
    from ttbundles.demo.server import serve_environment
    from ttbundles.demo.variants import write_lanes_bundle

    with tempfile.TemporaryDirectory(prefix="bench-engine-") as tmp:
        work = Path(tmp)
        if args.model == "smollm2":
            from ttbundles.demo import model

            checkpoint, _ = model.prepare()
        else:
            checkpoint = write_demo_checkpoint(work / "checkpoint")
        # The single-execute variant shadows the built-in demo: with one lane it is the
        # same generator and runner; with --data-parallel-size N it is N lanes.
        bundle = write_lanes_bundle(work / "models")
        # The host target's max_num_seqs (32) is a serving default, not a limit of the
        # reference generator: raised here so that one engine holds the whole batch.
        metadata_path = bundle / "vllm_metadata.json"
        metadata = json.loads(metadata_path.read_text())
        largest = max([*args.batches, args.lanes * args.lane_batch])
        metadata["targets"]["HOST"]["max_num_seqs"] = largest
        metadata_path.write_text(json.dumps(metadata, indent=2) + "\n")
        os.environ.update(serve_environment())
        os.environ.update(
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            EXTRA_MODELS_DIR=str(work / "models"),
        )
        configs = [(b, 1) for b in args.batches]
        if args.lanes > 1:
            configs.append((args.lanes * args.lane_batch, args.lanes))
        # `--repeat` sweeps every configuration again and pools the rounds: a batch's
        # figures then come from several moments of the machine's load, not one.
        pooled: dict[tuple[int, int], dict] = {}
        for sweep in range(args.repeat):
            for batch, lanes in configs:
                last = sweep == args.repeat - 1
                raw = measure(checkpoint, batch, lanes, args, profile_it=args.profile and last)
                into = pooled.setdefault((batch, lanes), raw)
                if into is not raw:
                    for key in ("gen_ms", "gen_device", "gen_whole", "eng"):
                        into[key].extend(raw[key])
                    into["profile"] = raw["profile"]
        results = [summary(pooled[config]) for config in configs]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    model_name = "SmolLM2-135M" if args.model == "smollm2" else "demo"
    print(
        f"{model_name} checkpoint, greedy, device sampling, async scheduling; {INPUT_LEN}-token "
        f"prompts, {args.steps} decode steps a round, median (min-max) of "
        f"{args.rounds * args.repeat} interleaved rounds ({args.repeat} sweep(s))"
    )

    def fmt(s: dict, digits: int = 2) -> str:
        return f"{s['median']:.{digits}f} ({s['min']:.{digits}f}-{s['max']:.{digits}f})"

    for r in results:
        label = f"{r['lanes']}x{r['batch'] // r['lanes']}" if r["lanes"] > 1 else str(r["batch"])
        print(
            f"batch {label:>5}: generator {fmt(r['generator_ms_per_step'])} ms/step, "
            f"engine {fmt(r['engine_ms_per_step'])} ms, engine/generator "
            f"{fmt(r['engine_over_generator'])} (whole rounds "
            f"{fmt(r['whole_engine_over_generator'])}); host {fmt(r['host_ms_per_step'])} ms/step "
            f"({r['host_us_per_request']['median']:.1f} us/request); own "
            f"{fmt(r['own_host_ms_per_step'], 3)} ms/step (steady steps "
            f"{fmt(r['own_steady_ms_per_step'], 3)} ms/step, of which our scheduler "
            f"{r['scheduler_steady_ms_per_step']['median']:.3f}; once a request "
            f"{r['own_once_us_per_request']['median']:.1f} us); "
            f"wait {fmt(r['wait_ms_per_step'])} ms; "
            f"forward {r['generator_device_ms_per_step']['median']:.2f} ms alone, "
            f"{r['engine_device_ms_per_step']['median']:.2f} ms in the engine; device idle "
            f"{fmt(r['device_idle_ms_per_step'])} ms/step; engine thread CPU "
            f"{fmt(r['engine_cpu_ms_per_step'])} ms/step = "
            f"{fmt(r['engine_cpu_over_generator'])} of the generator's step"
        )
        print(
            f"  engine thread CPU per steady decode step, split (ms): vLLM's scheduler "
            f"{fmt(r['vllm_scheduler_steady_ms_per_step'], 3)}, our scheduler "
            f"{fmt(r['scheduler_steady_ms_per_step'], 3)}, the runner "
            f"{fmt(r['runner_steady_ms_per_step'], 3)}, output processing "
            f"{fmt(r['output_processing_steady_ms_per_step'], 3)}, the rest "
            f"{fmt(r['rest_steady_ms_per_step'], 3)}; the engine core's share (no output "
            f"processing) {fmt(r['engine_core_cpu_ms_per_step'], 3)}"
        )
        if r["profile"]:
            print("  top costs (own time over one round):")
            for row in r["profile"]["top"]:
                print(f"    {row['own_ms']:8.1f} ms {row['calls']:7d} calls  {row['fn']}")
            print("  the serving code's own top functions:")
            for row in r["profile"]["ours"]:
                print(f"    {row['own_ms']:8.1f} ms {row['calls']:7d} calls  {row['fn']}")
    single = [r for r in results if r["lanes"] == 1]
    if len(single) > 1:
        low, high = single[0], single[-1]
        for key, what in (
            ("own_host_ms_per_step", "per decode step, a round's whole own work"),
            ("own_steady_ms_per_step", "per steady decode step"),
        ):
            growth = high[key]["median"] / low[key]["median"]
            print(
                f"own host work {what}, batch {high['batch']} over batch {low['batch']}: "
                f"{growth:.2f}x (medians)"
            )


if __name__ == "__main__":
    main()
