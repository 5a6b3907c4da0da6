"""How validation and registration scale with the number of bundles, against a floor.

Generates N valid bundles (metadata plus a small adapter each) in a temporary folder and
measures, in one run:

- floor: reading and `json.load`-ing every vllm_metadata.json, nothing else;
- validate: `validate_path(folder)`: metadata, semantic checks, the static adapter check
  (ast) and the cross-bundle checks, i.e. `ttbundle validate FOLDER`;
- register: `registry.compute(...)` over the folder, what the vLLM plugin runs in every
  process.

Each is repeated and the median taken. Targets: validate within 5x the floor, register
within 2x.

    .venv/bin/python benchmarks/bench_validate.py --count 1000 [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from ttbundles.check.validate import validate_path
from ttbundles.registry.registry import Status, compute

TARGETS = {"validate": 5.0, "register": 2.0}
# Bundles per architecture: variants told apart by `when`, as the built-in Llama family
# is, so the cross-bundle check has same-arch pairs to compare.
VARIANTS = 4

ADAPTER = '''"""Generator {i}."""

class Generator{i}:
    model_capabilities = {{
        "supports_prefix_caching": True,
        "supports_async_decode": False,
        "supports_sample_on_device": True,
    }}

    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        return cls()

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return None

    def decode_forward(self, tokens, start_pos, page_table, kv_cache, sampling_params=None,
                       **kwargs):
        return None
'''


def make_bundles(root: Path, count: int) -> None:
    for i in range(count):
        folder = root / f"bundle-{i:05d}"
        folder.mkdir()
        metadata = {
            "schema_version": 1,
            "name": f"bundle-{i:05d}",
            "version": "1.0.0",
            "description": f"Benchmark bundle {i}",
            "arch": f"Bench{i // VARIANTS}ForCausalLM",
            "main_class": f"adapter:Generator{i}",
            "models": [{"repo": f"org/model-{i}", "revision": "0123456789abcdef"}],
            "capabilities": {"prefix_caching": True, "sample_on_device": ["decode_only"]},
            "targets": {
                "N150": {"max_model_len": 8192, "max_num_seqs": 32},
                "T3K": {
                    "max_model_len": 131072,
                    "max_num_seqs": 64,
                    "additional_config": {
                        "sample_on_device_mode": "decode_only",
                        "trace_mode": "all",
                    },
                },
            },
            "when": {"env": {"BENCH_VARIANT": str(i % VARIANTS)}},
            "x-benchmark": True,
        }
        (folder / "vllm_metadata.json").write_text(json.dumps(metadata, indent=2) + "\n")
        (folder / "adapter.py").write_text(ADAPTER.format(i=i))


def floor(root: Path) -> int:
    loaded = 0
    for child in sorted(root.iterdir()):
        with open(child / "vllm_metadata.json", encoding="utf-8") as handle:
            json.load(handle)
        loaded += 1
    return loaded


def validate(root: Path) -> int:
    result = validate_path(root)
    if result.report.diagnostics:
        raise SystemExit(f"benchmark bundles are not clean: {result.report.diagnostics[:3]}")
    return len(result.bundles)


def register(root: Path) -> int:
    registry = compute(
        models_dirs=[root], environ={"TT_VLLM_BUILTIN_MODELS": "0", "BENCH_VARIANT": "0"}
    )
    if registry.problems:
        raise SystemExit(f"registration reported problems: {registry.problems[:3]}")
    return sum(e.status is Status.REGISTERED for e in registry.entries)


def measure(
    functions: dict[str, Callable[[Path], int]], root: Path, repeat: int
) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds of each function, and median ratio of each to the floor.

    Rounds interleave the functions, and each ratio is taken within a round, so a change
    in machine load during the run shifts all of them alike.
    """
    times: dict[str, list[float]] = {name: [] for name in functions}
    for _ in range(repeat):
        for name, function in functions.items():
            start = time.perf_counter()
            function(root)
            times[name].append(time.perf_counter() - start)
    seconds = {name: statistics.median(values) for name, values in times.items()}
    ratios = {
        name: statistics.median(t / f for t, f in zip(times[name], times["floor"], strict=True))
        for name in functions
        if name != "floor"
    }
    return seconds, ratios


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000, help="bundles to generate")
    parser.add_argument("--repeat", type=int, default=7, help="runs per measurement")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="ttbundle-bench-") as tmp:
        root = Path(tmp)
        make_bundles(root, args.count)
        assert floor(root) == validate(root) == args.count
        assert register(root) == args.count // VARIANTS + (args.count % VARIANTS > 0)
        seconds, ratios = measure(
            {"floor": floor, "validate": validate, "register": register}, root, args.repeat
        )

    within = {name: ratios[name] <= TARGETS[name] for name in TARGETS}
    if args.json:
        print(
            json.dumps(
                {
                    "count": args.count,
                    "repeat": args.repeat,
                    "seconds": seconds,
                    "ratios": ratios,
                    "targets": TARGETS,
                    "within": within,
                },
                indent=2,
            )
        )
    else:
        per_bundle = {name: value / args.count * 1e6 for name, value in seconds.items()}
        print(f"{args.count} bundles, median of {args.repeat} interleaved runs")
        print(
            f"  floor     {seconds['floor'] * 1e3:8.1f} ms {per_bundle['floor']:7.1f} us/bundle"
            "   read + json.load"
        )
        for name in TARGETS:
            verdict = "ok" if within[name] else "OVER"
            print(
                f"  {name:9} {seconds[name] * 1e3:8.1f} ms {per_bundle[name]:7.1f} us/bundle"
                f"   {ratios[name]:5.1f}x floor (target {TARGETS[name]:g}x: {verdict})"
            )
    return 0 if all(within.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
