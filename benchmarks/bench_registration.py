"""Registration at vLLM start-up, for 10, 100 and 1,000 bundles, against a floor.

What the general plugin does in every vLLM process: compute the registry (read and
validate every bundle's metadata, check its adapter statically: parse, module, class;
select per architecture) and register each selected `TT<arch>` lazily with vLLM's
ModelRegistry. Three states of the index of checked bundles (`ttbundles.registry.index`):

- cold: no index anywhere; every bundle is checked, adapter included, and the user
  cache written (the first process after a change);
- warm index: the folder's `.ttbundles-index.json`, as `ttbundle install` writes it;
- warm user cache: the user cache a cold start wrote, for a folder nobody installs into.

Each against baselines over the same files, in the same run, interleaved:

- floor: reading and `json.load`-ing every vllm_metadata.json;
- parse bound: the floor plus reading and `ast.parse`-ing every adapter, the least any
  start that parses each adapter can cost (what bounds the cold start from below);
- reference loop: what the reference Tenstorrent plugin does (json.load,
  `sys.path.append`, `register_model`, no validation), for scale.

It checks that no adapter module was imported, and reports the plugin's import time
(`python -X importtime -c "import ttbundles.serving.plugin"`). Goals: cold within 2x of
the parse bound, warm below 1x the floor, each as a ratio within each interleaved
round (median and spread over the rounds).

    .venv/bin/python benchmarks/bench_registration.py [--counts 10 100 1000] [--json]

`--against REV` compares this checkout with the package as it was at git revision REV
(e.g. the commit before a refactoring): what vLLM runs in a fresh process, the plugin's
import plus `register_models()` with vLLM's logging at INFO, over the same bundles, each
side in its own interpreter, in interleaved rounds (each side prepares its own index
first: warm as `ttbundle install` leaves it, cold with none). Reports the ratio
this/REV, median and spread.

    .venv/bin/python benchmarks/bench_registration.py --against 5c810f9^ --counts 1000 \
        [--states warm] [--best-of 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_validate import make_bundles  # noqa: E402

TARGETS = {"cold": 2.0, "warm_index": 1.0, "warm_user": 1.0}
# What each goal is measured against (issue 34): a cold start against the parse bound,
# a warm one against the floor.
GOALS = {"cold": "parse_bound", "warm_index": "floor", "warm_user": "floor"}


def bundles(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if not p.name.startswith("."))


def floor(root: Path) -> None:
    for child in bundles(root):
        with open(child / "vllm_metadata.json", encoding="utf-8") as handle:
            json.load(handle)


def parse_bound(root: Path) -> None:
    import ast

    for child in bundles(root):
        with open(child / "vllm_metadata.json", encoding="utf-8") as handle:
            json.load(handle)
        with open(child / "adapter.py", encoding="utf-8") as handle:
            ast.parse(handle.read())


def reference_loop(root: Path) -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    saved = list(sys.path)
    try:
        for child in bundles(root):
            with open(child / "vllm_metadata.json", encoding="utf-8") as handle:
                data = json.load(handle)
            sys.path.append(str(child))
            arch = data["arch"]
            ModelRegistry.register_model(
                arch if arch.startswith("TT") else f"TT{arch}", data["main_class"]
            )
    finally:
        sys.path[:] = saved


def ours(root: Path) -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    from ttbundles.registry.registry import compute

    registry = compute({"TT_VLLM_BUILTIN_MODELS": "0", "BENCH_VARIANT": "0"}, models_dirs=[root])
    for arch, entry in registry.registered.items():
        ModelRegistry.register_model(arch, entry.class_ref())


def _forget(root: Path) -> None:
    from ttbundles.paths import user_cache_dir
    from ttbundles.registry.index import INDEX_FILE

    (root / INDEX_FILE).unlink(missing_ok=True)
    shutil.rmtree(user_cache_dir(), ignore_errors=True)


def cold(root: Path) -> None:
    ours(root)


def warm_index(root: Path) -> None:
    ours(root)


def warm_user(root: Path) -> None:
    ours(root)


def prepare(name: str, root: Path) -> None:
    """Put the index in the state `name` measures (outside the timing)."""
    from ttbundles.registry.index import write_folder_index

    _forget(root)
    if name == "warm_index":
        write_folder_index(root)
    elif name == "warm_user":
        ours(root)


def timed(function, root: Path) -> float:
    if function in (cold, warm_index, warm_user):
        prepare(function.__name__, root)
    start = time.perf_counter()
    function(root)
    return time.perf_counter() - start


def import_time() -> dict[str, float]:
    """Cumulative import time of ttbundles.serving.plugin (what vLLM loads in every process),
    with the standard-library modules vLLM has already imported when it loads plugins
    (logging, typing, pathlib) in place."""
    code = "import logging, typing, pathlib, importlib.util; import ttbundles.serving.plugin"
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code], capture_output=True, text=True, check=True
    )
    cumulative = {}
    for line in done.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|\s+(\S.*)$", line)
        if match:
            cumulative[match.group(3).strip()] = int(match.group(2))
    after = done.stderr.split("importlib.util")[-1]
    ours = [line for line in after.splitlines() if "import time:" in line]
    return {"plugin_us": cumulative.get("ttbundles.serving.plugin", 0), "modules": len(ours)}


# One fresh process as vLLM has it when it loads the general plugins: its registry module
# and logging configured (INFO, as vLLM's default), then the plugin imported and run.
PLUGIN_START = """
import json, logging, os, sys, time
import vllm.model_executor.models.registry
logging.basicConfig(level=logging.INFO, stream=open(os.devnull, "w"))
start = time.perf_counter()
from ttbundles.serving.plugin import register_models
register_models()
spent = time.perf_counter() - start
import ttbundles
print(json.dumps([spent, ttbundles.__file__]))
"""

PREPARE = """
import shutil, sys
from pathlib import Path
from ttbundles.registry.index import INDEX_FILE, write_folder_index
root = Path(sys.argv[1])
(root / INDEX_FILE).unlink(missing_ok=True)
shutil.rmtree(sys.argv[2], ignore_errors=True)
if sys.argv[3] == "warm":
    write_folder_index(root)
"""


def source_at(revision: str, into: Path) -> Path:
    """The package as it was at `revision` (read from git, nothing checked out)."""
    top = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(top), "archive", revision, "ttbundles", "cli", "bundles", "schemas"],
        capture_output=True,
        check=True,
    ).stdout
    into.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into


def plugin_start(root: Path, state: str, pythonpath: str | None, cache: Path) -> float:
    """Seconds from importing the plugin to the end of `register_models()` in a fresh
    interpreter, the bundles' index put in `state` first by the same side's code."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(
        EXTRA_MODELS_DIR=str(root),
        TT_VLLM_BUILTIN_MODELS="0",
        BENCH_VARIANT="0",
        XDG_CACHE_HOME=str(cache),
    )
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    run = [sys.executable, "-c"]
    subprocess.run(run + [PREPARE, str(root), str(cache), state], env=env, check=True)
    done = subprocess.run(run + [PLUGIN_START], env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"plugin start failed ({pythonpath or 'this checkout'}):\n{done.stderr}")
    spent, package = json.loads(done.stdout.strip().splitlines()[-1])
    if not package.startswith(pythonpath or sysconfig.get_paths()["purelib"]):
        # Each side must run its own code: REV's from its extracted tree, ours installed.
        raise SystemExit(f"ran the package at {package}, not {pythonpath or 'the installed one'}")
    return spent


def against(
    revision: str, counts: list[int], rounds: int, as_json: bool, states: list[str], best_of: int
) -> None:
    """This checkout vs `revision`, the plugin start in fresh processes, interleaved."""
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        old = str(source_at(revision, Path(tmp) / "old"))
        for count in counts:
            root = Path(tmp) / f"bundles{count}"
            root.mkdir()
            make_bundles(root, count)
            for state in states:
                times: dict[str, list[float]] = {"this": [], "then": []}
                for number in range(rounds + 1):
                    order = [("this", None), ("then", old)]
                    for side, path in order if number % 2 else reversed(order):
                        # The best of `best_of` fresh starts: a start is a few hundred ms,
                        # and a load spike on a shared machine is longer than that.
                        spent = min(
                            plugin_start(root, state, path, Path(tmp) / f"cache-{side}")
                            for _ in range(best_of)
                        )
                        if number:  # round 0 warms the file system and the import caches
                            times[side].append(spent)
                ratios = [a / b for a, b in zip(times["this"], times["then"])]
                results.append(
                    {
                        "bundles": count,
                        "state": state,
                        "this_ms": statistics.median(times["this"]) * 1e3,
                        "then_ms": statistics.median(times["then"]) * 1e3,
                        "ratio": statistics.median(times["this"])
                        / statistics.median(times["then"]),
                        "ratio_min": min(ratios),
                        "ratio_max": max(ratios),
                    }
                )
    if as_json:
        document = {"against": revision, "rounds": rounds, "best_of": best_of, "results": results}
        print(json.dumps(document, indent=2))
        return
    print(f"plugin import + register_models() in a fresh process: this checkout vs {revision}")
    for r in results:
        print(
            f"{r['bundles']:>6} bundles, {r['state']:<4}: {r['this_ms']:8.1f} ms vs "
            f"{r['then_ms']:8.1f} ms = {r['ratio']:.2f}x (per round {r['ratio_min']:.2f}-"
            f"{r['ratio_max']:.2f}, {rounds} rounds, best of {best_of} starts each)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--against", metavar="REV", help="compare with the package at REV")
    parser.add_argument("--states", nargs="+", choices=["warm", "cold"], default=["warm", "cold"])
    parser.add_argument("--best-of", type=int, default=1, help="with --against: starts per side")
    args = parser.parse_args()
    if args.against:
        against(args.against, args.counts, args.repeat, args.json, args.states, args.best_of)
        return
    import vllm.model_executor.models.registry  # noqa: F401 - loaded before timing, as in vLLM

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="bench-registration-cache-")
    kinds = {"floor": floor, "parse_bound": parse_bound, "reference": reference_loop}
    kinds["cold"] = cold
    kinds.update(warm_index=warm_index, warm_user=warm_user)
    results = []
    for count in args.counts:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_bundles(root, count)
            runs: dict[str, list[float]] = {k: [] for k in kinds}
            for function in kinds.values():  # warm caches (file system, lazy imports)
                timed(function, root)
            for _ in range(args.repeat):  # interleaved: the machine is noisy
                for name, function in kinds.items():
                    runs[name].append(timed(function, root))
            adapters = [m for m in sys.modules if m.startswith("_ttb_")]
            median = {k: statistics.median(v) for k, v in runs.items()}
            row = {"bundles": count, "adapter_imports": len(adapters)}
            for name in kinds:
                row[f"{name}_ms"] = median[name] * 1e3
                if name != "floor":
                    row[f"{name}_ratio"] = median[name] / median["floor"]
            row["cold_vs_parse_bound"] = median["cold"] / median["parse_bound"]
            # The goals as ratios within each round (its baseline measured beside it, so
            # a load spike on a shared machine moves both): median and spread.
            for name, base in GOALS.items():
                ratios = [a / b for a, b in zip(runs[name], runs[base])]
                row[f"{name}_vs_{base}"] = {
                    "median": statistics.median(ratios),
                    "min": min(ratios),
                    "max": max(ratios),
                    "goal": TARGETS[name],
                }
            results.append(row)
    imports = import_time()
    if args.json:
        print(json.dumps({"results": results, "import": imports}, indent=2))
        return
    print(
        f"{'bundles':>8} {'floor':>9} {'parse bound':>12} {'reference':>10} {'cold':>15} "
        f"{'warm index':>15} {'warm user':>15}  adapter imports"
    )
    for r in results:
        cells = []
        for name in ("cold", "warm_index", "warm_user"):
            ok = "" if r[f"{name}_ratio"] <= TARGETS[name] else "!"
            cells.append(f"{r[name + '_ms']:>6.1f}ms {r[name + '_ratio']:>5.2f}x{ok or ' '}")
        print(
            f"{r['bundles']:>8} {r['floor_ms']:>7.2f}ms {r['parse_bound_ratio']:>11.2f}x "
            f"{r['reference_ratio']:>9.2f}x "
            + " ".join(f"{c:>15}" for c in cells)
            + f"  {r['adapter_imports']}"
        )
    print("per-round ratios against each goal's baseline (median, min-max over rounds):")
    for r in results:
        for name, base in GOALS.items():
            g = r[f"{name}_vs_{base}"]
            verdict = "ok" if g["median"] <= g["goal"] else "over"
            print(
                f"  {r['bundles']:>6} bundles, {name} / {base}: {g['median']:.2f}x "
                f"({g['min']:.2f}-{g['max']:.2f}; goal <= {g['goal']:.1f}x: {verdict})"
            )
    print(
        "ratios vs the floor; ! = over its goal (cold 2x, warm 1x); "
        f"import ttbundles.serving.plugin: {imports['plugin_us'] / 1e3:.2f} ms cumulative, "
        f"{imports['modules']} modules loaded by it"
    )


if __name__ == "__main__":
    main()
