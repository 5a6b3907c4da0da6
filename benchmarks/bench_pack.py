"""Benchmark `ttbundles.build.pack` against `tar -c DIR | gzip -1`, and its peak memory.

Builds a bundle of the requested size in a temporary folder (a few large incompressible
"weight" files plus many small ones), then in one run measures:

- the wall time of `tar -c DIR | gzip -1 > out` (the baseline; two processes, so tar's
  reading overlaps gzip's compressing);
- the wall time of our `pack`, run in a child process (interpreter start-up and imports
  included, as a user of `ttbundle pack` would see it);
- the ratio ours / baseline (target: <= 1.25);
- the peak RSS of our pack, for a small tree and for the full tree: equal figures mean
  memory does not grow with the size of the files.

Usage: python benchmarks/bench_pack.py [--size-gib 1.0] [--repeat 1] [--json]
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1 << 20
GIB = 1 << 30

ADAPTER = """class Generator:
    @classmethod
    def initialize_vllm_model(cls, hf_config, mesh_device, max_batch_size, max_seq_len,
                              **kwargs):
        return cls()

    def allocate_kv_cache(self, kv_cache_shape, dtype, num_layers):
        return None

    def prefill_forward(self, tokens, page_table, kv_cache, prompt_lens, **kwargs):
        return None

    def decode_forward(self, tokens, start_pos, page_table, kv_cache, **kwargs):
        return None
"""

# Runs in the child: imports and packs, then reports its own timing on stdout.
PACK_CHILD = """
import json, sys, time
from pathlib import Path
start = time.perf_counter()
from ttbundles.build import pack
out = pack(Path(sys.argv[1]), Path(sys.argv[2]))
print(json.dumps({"archive": str(out), "seconds": time.perf_counter() - start}))
"""


def build_tree(root: Path, total: int, *, large_files: int, small_files: int) -> Path:
    """A valid bundle of about `total` bytes; data from a seeded PRNG (incompressible)."""
    rng = random.Random(20240501)
    bundle = root / "bench-bundle"
    (bundle / "weights").mkdir(parents=True)
    (bundle / "vllm_metadata.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "name": "bench-bundle",
                "version": "1.0.0",
                "arch": "BenchForCausalLM",
                "main_class": "adapter:Generator",
            }
        ),
        encoding="utf-8",
    )
    (bundle / "adapter.py").write_text(ADAPTER, encoding="utf-8")
    small_total = min(total // 50, small_files * 16 * 1024)
    for index in range(small_files):
        size = small_total // small_files
        folder = bundle / "assets" / f"group{index % 20:02d}"
        folder.mkdir(parents=True, exist_ok=True)
        # Half text-like (compressible), half random: like configs, vocabularies, tables.
        if index % 2:
            data = rng.randbytes(size)
        else:
            words = b"token weight layer head scale bias norm embed " * (size // 48 + 1)
            data = words[:size]
        (folder / f"file{index:05d}.bin").write_bytes(data)
    per_file = (total - small_total) // large_files
    for index in range(large_files):
        with open(bundle / "weights" / f"shard-{index:02d}.bin", "wb") as handle:
            left = per_file
            while left:
                chunk = min(left, 8 * MIB)
                handle.write(rng.randbytes(chunk))
                left -= chunk
    return bundle


def build_trees(root: Path, args: argparse.Namespace) -> None:
    build_tree(
        root / "small",
        int(args.small_size_mib * MIB),
        large_files=args.large_files,
        small_files=args.small_files // 10,
    )
    build_tree(
        root / "large",
        int(args.size_gib * GIB),
        large_files=args.large_files,
        small_files=args.small_files,
    )


def tree_size(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def run_baseline(bundle: Path, out: Path) -> float:
    command = (
        f"set -o pipefail; tar -c -C {shlex_quote(bundle.parent)} {shlex_quote(bundle.name)}"
        f" | gzip -1 > {shlex_quote(out)}"
    )
    start = time.perf_counter()
    subprocess.run(["bash", "-c", command], check=True)
    return time.perf_counter() - start


def shlex_quote(path: Path | str) -> str:
    return shlex.quote(str(path))


def run_ours(bundle: Path, out_dir: Path) -> dict:
    """Pack in a child; wall time, the child's own timing, and its peak RSS.

    The peak RSS is the child's own ru_maxrss, as `getrusage(RUSAGE_CHILDREN)` reports
    it; read through `os.wait4`, which gives the figure of that one child, because
    RUSAGE_CHILDREN is a running maximum over every child waited for so far.
    """
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    env.pop("SOURCE_DATE_EPOCH", None)
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-c", PACK_CHILD, str(bundle), str(out_dir)],
        stdout=subprocess.PIPE,
        env=env,
    )
    assert child.stdout is not None
    output = child.stdout.read()
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"pack failed with exit code {child.returncode}")
    report = json.loads(output)
    # ru_maxrss is in KiB on Linux, bytes on macOS.
    scale = 1 if sys.platform == "darwin" else 1024
    return {
        "seconds": wall,
        "pack_seconds": report["seconds"],
        "peak_rss": usage.ru_maxrss * scale,
        "archive": report["archive"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gib", type=float, default=1.0, help="bundle size (GiB)")
    parser.add_argument(
        "--small-size-mib",
        type=float,
        default=64.0,
        help="size of the tree used to show memory stays flat (MiB)",
    )
    parser.add_argument("--large-files", type=int, default=4, help="number of weight files")
    parser.add_argument("--small-files", type=int, default=2000, help="number of small files")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each; best is kept")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="where to build the trees (default: a temporary folder)",
    )
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = parser.parse_args(argv)

    if shutil.which("tar") is None or shutil.which("gzip") is None:
        raise SystemExit("tar and gzip are needed for the baseline")
    root = Path(tempfile.mkdtemp(prefix="ttbundle-bench-", dir=args.workdir))
    try:
        # Built in a child so this process stays small: on Linux a child's peak RSS
        # includes its parent's at the time it was started.
        small, large = root / "small" / "bench-bundle", root / "large" / "bench-bundle"
        builder = multiprocessing.get_context("fork").Process(
            target=build_trees,
            args=(root, args),
        )
        builder.start()
        builder.join()
        if builder.exitcode != 0:
            raise SystemExit("building the trees failed")
        out = root / "out"
        out.mkdir()
        ours_small = run_ours(small, out / "small")
        baseline = min(run_baseline(large, out / "baseline.tar.gz") for _ in range(args.repeat))
        runs = [run_ours(large, out / f"large{i}") for i in range(args.repeat)]
        ours = min(runs, key=lambda r: r["seconds"])
        result = {
            "tree_bytes": tree_size(large),
            "files": sum(1 for p in large.rglob("*") if p.is_file()),
            "baseline_seconds": baseline,
            "baseline_archive_bytes": (out / "baseline.tar.gz").stat().st_size,
            "ours_seconds": ours["seconds"],
            "ours_pack_seconds": ours["pack_seconds"],
            "ours_archive_bytes": Path(ours["archive"]).stat().st_size,
            "ratio": ours["seconds"] / baseline,
            "target_ratio": 1.25,
            "peak_rss_bytes": ours["peak_rss"],
            "small_tree_bytes": tree_size(small),
            "small_peak_rss_bytes": ours_small["peak_rss"],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)

    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    size = result["tree_bytes"]
    rows = [
        ("tar -c | gzip -1", result["baseline_seconds"], None, result["baseline_archive_bytes"]),
        (
            "ttbundle pack",
            result["ours_seconds"],
            result["peak_rss_bytes"],
            result["ours_archive_bytes"],
        ),
    ]
    print(f"tree: {size / MIB:,.0f} MiB in {result['files']} files")
    print(f"{'':18} {'wall s':>8} {'MiB/s':>8} {'peak RSS MiB':>13} {'archive MiB':>12}")
    for label, seconds, rss, archive in rows:
        rss_text = f"{rss / MIB:13.1f}" if rss is not None else f"{'-':>13}"
        print(
            f"{label:18} {seconds:8.2f} {size / MIB / seconds:8.1f} {rss_text} "
            f"{archive / MIB:12.1f}"
        )
    print(
        f"ratio ours/baseline: {result['ratio']:.3f} (target <= {result['target_ratio']})"
        f"; pack alone (no start-up): {result['ours_pack_seconds']:.2f} s"
    )
    print(
        f"peak RSS: {result['small_peak_rss_bytes'] / MIB:.1f} MiB packing "
        f"{result['small_tree_bytes'] / MIB:,.0f} MiB, {result['peak_rss_bytes'] / MIB:.1f} MiB "
        f"packing {size / MIB:,.0f} MiB"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
