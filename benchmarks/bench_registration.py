"""Registration at vLLM start-up, for 10, 100 and 1,000 bundles, against a floor.

What the general plugin does in every vLLM process: compute the registry (read and
validate every bundle's metadata, check its module file, select per architecture) and
register each selected `TT<arch>` lazily with vLLM's ModelRegistry. Measured in one run
against two baselines over the same files:

- floor: reading and `json.load`-ing every vllm_metadata.json;
- reference loop: what the reference Tenstorrent plugin does (json.load,
  `sys.path.append`, `register_model`, no validation), for scale.

It checks that no adapter module was imported, and reports the plugin's import time
(`python -X importtime -c "import ttbundles.serving.plugin"`). Target: within 2x of the floor.

    .venv/bin/python benchmarks/bench_registration.py [--counts 10 100 1000] [--json]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_validate import make_bundles  # noqa: E402

TARGET = 2.0


def floor(root: Path) -> None:
    for child in sorted(root.iterdir()):
        with open(child / "vllm_metadata.json", encoding="utf-8") as handle:
            json.load(handle)


def reference_loop(root: Path) -> None:
    from vllm.model_executor.models.registry import ModelRegistry

    saved = list(sys.path)
    try:
        for child in sorted(root.iterdir()):
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


def timed(function, root: Path) -> float:
    start = time.perf_counter()
    function(root)
    return time.perf_counter() - start


def import_time() -> dict[str, float]:
    """Cumulative import time of ttbundles.serving.plugin (what vLLM loads in every process),
    with the standard-library modules vLLM has already imported (logging) in place."""
    code = "import logging, importlib.util; import ttbundles.serving.plugin"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--counts", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--repeat", type=int, default=9)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    import vllm.model_executor.models.registry  # noqa: F401 - loaded before timing, as in vLLM

    results = []
    for count in args.counts:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            make_bundles(root, count)
            runs: dict[str, list[float]] = {"floor": [], "reference": [], "ours": []}
            ours(root)  # warm caches (file system, lazy imports) before timing
            for _ in range(args.repeat):  # interleaved: the machine is noisy
                runs["floor"].append(timed(floor, root))
                runs["reference"].append(timed(reference_loop, root))
                runs["ours"].append(timed(ours, root))
            adapters = [m for m in sys.modules if m.startswith("_ttb_")]
            median = {k: statistics.median(v) for k, v in runs.items()}
            results.append(
                {
                    "bundles": count,
                    "floor_ms": median["floor"] * 1e3,
                    "reference_ms": median["reference"] * 1e3,
                    "ours_ms": median["ours"] * 1e3,
                    "reference_ratio": median["reference"] / median["floor"],
                    "ours_ratio": median["ours"] / median["floor"],
                    "adapter_imports": len(adapters),
                }
            )
    imports = import_time()
    if args.json:
        print(json.dumps({"results": results, "import": imports}, indent=2))
        return
    print(
        f"{'bundles':>8} {'floor':>10} {'reference':>10} {'ours':>10} "
        f"{'ref/floor':>10} {'ours/floor':>11} adapter imports"
    )
    for r in results:
        verdict = "ok" if r["ours_ratio"] <= TARGET else f"OVER {TARGET}x"
        print(
            f"{r['bundles']:>8} {r['floor_ms']:>8.2f}ms {r['reference_ms']:>8.2f}ms "
            f"{r['ours_ms']:>8.2f}ms {r['reference_ratio']:>9.2f}x {r['ours_ratio']:>9.2f}x "
            f"  {r['adapter_imports']} ({verdict})"
        )
    print(
        f"import ttbundles.serving.plugin: {imports['plugin_us'] / 1e3:.2f} ms cumulative, "
        f"{imports['modules']} modules loaded by it"
    )


if __name__ == "__main__":
    main()
