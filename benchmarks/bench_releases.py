"""`bench_engine.py` on every vLLM release of the tested window, interleaved: does the
serving stack cost more per step on one release than on another?

Each round runs `bench_engine.py --rounds 1 --json` once in each release's venv
(`.venv`: 0.34.0, `.venv-vllm-0.33.0`: 0.33.0; set them up with `VLLM_VERSION=...
scripts/setup`), alternating which goes first, so both releases see the same machine load.
Within a run the generator alone is the baseline, measured in the same process as the
engine: a release's figure is its own engine/generator ratio, and the releases are
compared through those ratios (and through our own host work per step), never through
raw times taken at different moments. Reported per batch: the median and spread
(min-max) over the rounds of each release's engine/generator and own host work, and the
ratio of the medians (0.34.0 over 0.33.0).

    .venv/bin/python benchmarks/bench_releases.py [--batches 8 32 64] [--rounds 5]
        [--steps 48] [--lanes 0] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
VENVS = {"0.33.0": ROOT / ".venv-vllm-0.33.0", "0.34.0": ROOT / ".venv"}


def run_once(venv: Path, args: argparse.Namespace) -> list[dict]:
    command = [
        str(venv / "bin" / "python"),
        str(ROOT / "benchmarks" / "bench_engine.py"),
        "--rounds",
        "1",
        "--json",
        "--steps",
        str(args.steps),
        "--lanes",
        str(args.lanes),
        "--batches",
        *map(str, args.batches),
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        sys.stderr.write(done.stderr[-4000:])
        raise SystemExit(f"bench_engine failed in {venv}")
    # vLLM logs to stdout too: the report is the indented JSON array that ends it.
    lines = done.stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line == "[")
    return json.loads("\n".join(lines[start:]))


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="*", default=[8, 32, 64])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--lanes", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    missing = [str(v) for v in VENVS.values() if not (v / "bin" / "python").exists()]
    if missing:
        raise SystemExit(f"set these venvs up first (VLLM_VERSION=... scripts/setup): {missing}")
    samples: dict[str, dict[int, dict[str, list[float]]]] = {r: {} for r in VENVS}
    releases = list(VENVS)
    for round_ in range(args.rounds):
        order = releases if round_ % 2 == 0 else releases[::-1]
        for release in order:
            for row in run_once(VENVS[release], args):
                into = samples[release].setdefault(row["batch"], {"ratio": [], "own": []})
                into["ratio"].append(row["engine_over_generator"]["median"])
                into["own"].append(row["own_steady_ms_per_step"]["median"])
        print(f"round {round_ + 1}/{args.rounds} done ({' then '.join(order)})", file=sys.stderr)
    report = []
    for batch in args.batches:
        row = {"batch": batch}
        for release in releases:
            got = samples[release][batch]
            row[release] = {
                "engine_over_generator": spread(got["ratio"]),
                "own_ms": spread(got["own"]),
            }
        old, new = (row[r]["engine_over_generator"]["median"] for r in releases)
        row["ratio_new_over_old"] = new / old
        old_own, new_own = (row[r]["own_ms"]["median"] for r in releases)
        row["own_new_over_old"] = new_own / old_own
        report.append(row)
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(
        f"demo checkpoint, greedy, device sampling; {args.steps} decode steps a run; median "
        f"(min-max) of {args.rounds} interleaved rounds per release"
    )
    for row in report:
        parts = []
        for release in releases:
            r, o = row[release]["engine_over_generator"], row[release]["own_ms"]
            parts.append(
                f"{release}: engine/generator {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}), "
                f"own {o['median']:.3f} ms/step"
            )
        print(
            f"batch {row['batch']:>4}: " + "; ".join(parts) + f"; 0.34.0/0.33.0 "
            f"{row['ratio_new_over_old']:.2f} (own work {row['own_new_over_old']:.2f})"
        )


if __name__ == "__main__":
    main()
