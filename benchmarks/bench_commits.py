"""One benchmark, two versions of the code, alternating: what a change did to its figures.

Runs a benchmark that prints JSON (`bench_engine.py --json`, ...) once per round against
a base commit's code (a git worktree of it, first on PYTHONPATH) and once against the
working tree, which side goes first alternating from round to round, so that both see
the same machine load. The benchmark script is the working tree's on both sides: the same
measurement of two codes. Each numeric figure named by `--metric` is collected per
configuration (the JSON's list items, named by their `batch` and `lanes`, or the whole
document) and printed as the median and spread (min-max) per side and the ratio
head / base of the medians.

    .venv/bin/python benchmarks/bench_commits.py --base 'cf23b54' --rounds 5 \\
        --metric own_steady_ms_per_step --metric engine_over_generator \\
        -- benchmarks/bench_engine.py --batches 32 64 --lanes 0 --steps 64 --rounds 1 --json

A figure that is itself a spread (`{"median": ...}`, as bench_engine reports each round's)
contributes its median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _worktree(base: str) -> Path:
    """A detached worktree of `base` in a temporary folder (removed by `_drop`)."""
    folder = Path(tempfile.mkdtemp(prefix="bench-base-"))
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "-q", "--detach", str(folder), base],
        check=True,
    )
    return folder


def _drop(folder: Path) -> None:
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "remove", "--force", str(folder)], check=False
    )


def _run(command: list[str], tree: Path | None) -> object:
    """The benchmark's JSON, run with `tree`'s code first on the path (None: this tree)."""
    env = dict(os.environ)
    if tree is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tree), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, *command], cwd=REPO, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return _last_json(done.stdout)


def _last_json(text: str) -> object:
    """The JSON document that ends the output (vLLM logs to stdout before it)."""
    lines = text.splitlines()
    for start in range(len(lines) - 1, -1, -1):
        if lines[start][:1] in ("[", "{"):
            try:
                return json.loads("\n".join(lines[start:]))
            except json.JSONDecodeError:
                continue
    raise SystemExit(f"no JSON document at the end of the benchmark's output:\n{text[-2000:]}")


def _figures(document: object, metrics: list[str]) -> dict[tuple[str, str], float]:
    """(configuration, metric) -> value, from one run's JSON."""
    items = document if isinstance(document, list) else [document]
    out: dict[tuple[str, str], float] = {}
    for item in items:
        assert isinstance(item, dict)
        name = " ".join(f"{k} {item[k]}" for k in ("batch", "lanes") if k in item) or "all"
        for metric in metrics:
            value = item.get(metric)
            if isinstance(value, dict):
                value = value.get("median")
            if isinstance(value, (int, float)):
                out[(name, metric)] = float(value)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--base", required=True, help="the commit to compare against")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--metric", action="append", required=True)
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the benchmark to run after --")
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    base_tree = _worktree(args.base)
    runs: dict[str, list[dict[tuple[str, str], float]]] = {"base": [], "head": []}
    try:
        for round_ in range(args.rounds):
            order = ["base", "head"] if round_ % 2 == 0 else ["head", "base"]
            for side in order:
                tree = base_tree if side == "base" else None
                runs[side].append(_figures(_run(command, tree), args.metric))
                print(f"round {round_ + 1}/{args.rounds}: {side} done", file=sys.stderr)
    finally:
        _drop(base_tree)
    keys = sorted({k for side in runs.values() for run in side for k in run})
    table = []
    for key in keys:
        values = {s: [run[key] for run in runs[s] if key in run] for s in runs}
        med = {s: statistics.median(v) for s, v in values.items() if v}
        table.append(
            {
                "configuration": key[0],
                "metric": key[1],
                "base": {"median": med.get("base"), "values": values["base"]},
                "head": {"median": med.get("head"), "values": values["head"]},
                "head_over_base": med["head"] / med["base"] if med.get("base") else None,
            }
        )
    if args.json:
        print(json.dumps({"base": args.base, "head": head, "rows": table}, indent=2))
        return
    print(f"{' '.join(command)}")
    print(f"base {args.base}, head {head} (working tree), {args.rounds} rounds")
    for row in table:
        b, h = row["base"], row["head"]
        print(
            f"  {row['configuration']:>16}  {row['metric']:<28} base {b['median']:.4g} "
            f"({min(b['values']):.4g}-{max(b['values']):.4g})  head {h['median']:.4g} "
            f"({min(h['values']):.4g}-{max(h['values']):.4g})  head/base "
            f"{row['head_over_base']:.3f}"
        )


if __name__ == "__main__":
    main()
