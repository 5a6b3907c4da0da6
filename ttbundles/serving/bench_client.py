"""`python -m ttbundles.serving.bench_client SPEC`: vLLM's own `vllm bench serve`, run for
several workloads in one process.

`ttbundle bench` measures with vLLM's benchmark client (its datasets, its timing, its
figures), not one of ours. Each `vllm bench serve` process spends most of its time
importing vLLM (about 15 s here); this runs each workload's command line through the same
parser and `main` that `vllm bench serve` runs (`vllm.benchmarks.serve`), one after the
other in one process, and writes every result to one JSON file.

SPEC is a JSON file: {"runs": [{"name": ..., "argv": [vllm bench serve options]}],
"out": RESULT FILE}. The result: {"results": [{"name": ..., "result": {...}} or
{"name": ..., "error": "..."}]}; a run that raises is recorded and the next one still runs.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

# Per-request lists dropped from a result: the figures are what is kept.
_PER_REQUEST = (
    "input_lens",
    "output_lens",
    "start_times",
    "ttfts",
    "itls",
    "latencies",
    "queue_times",
    "generated_texts",
    "server_queue_times",
    "server_ttfts",
)


def run(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of `spec`, in order: its result (figures only) or its error."""
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    results: list[dict[str, Any]] = []
    for item in spec["runs"]:
        parser = FlexibleArgumentParser(prog="vllm bench serve")
        add_cli_args(parser)
        try:
            args = parser.parse_args(item["argv"])
            result = main(args)
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - reported to the caller
            results.append({"name": item["name"], "error": f"{type(exc).__name__}: {exc}"})
            continue
        errors = sorted({e for e in result.get("errors") or () if e})
        kept = {k: v for k, v in result.items() if k not in (*_PER_REQUEST, "errors")}
        results.append({"name": item["name"], "result": kept, "request_errors": errors[:5]})
    return results


def _main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    results = run(spec)
    Path(spec["out"]).write_text(json.dumps({"results": results}), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
