"""`ttbundle test` on the demo bundle against its two generators run separately.

Writes the demo checkpoint to a temporary folder, then measures, in turns (`--runs` times
each, so that a load change on the machine hits all three alike):

- test: `ttbundle test bundles/demo --model CKPT --golden reference --format json`, the
  console script in a fresh process: vLLM's import, the three engines (host, chunked,
  device) with every path of the demo's tests section, the reference golden (loaded while
  vLLM imports), the comparison;
- served: the same engines and the same requests through plain `vllm.LLM` in a fresh
  process (in-process engine core, no observer, nothing recorded): the bundle's generator
  on its own;
- golden: the reference golden in a fresh process: torch, the checkpoint, and one
  teacher-forced pass per case (the sequences `ttbundle test` compares).

Reported: the median wall time of each, and test / (served + golden), the harness
overhead. Below 1 means that running the golden while vLLM imports more than pays for
recording and comparing.

    .venv/bin/python benchmarks/bench_test.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO = REPO / "bundles" / "demo"
TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")


def spec_for(checkpoint: Path, workdir: Path) -> Path:
    """The harness document `ttbundle test` would write for the demo bundle."""
    from ttbundles.conformance.plan import resolve_plan
    from ttbundles.format.parse import load_metadata

    plan = resolve_plan(DEMO, load_metadata(DEMO).metadata)
    models = workdir / "models"
    models.mkdir(exist_ok=True)
    if not (models / "demo").exists():
        (models / "demo").symlink_to(DEMO, target_is_directory=True)
    spec = plan.harness_spec(models_dir=models, checkpoint=str(checkpoint), out_dir=workdir)
    path = workdir / "spec.json"
    path.write_text(json.dumps(spec))
    return path


def served_alone(spec_path: str) -> None:
    """The demo's test requests through plain vLLM: no observer, nothing kept."""
    spec = json.loads(Path(spec_path).read_text())
    os.environ.update(
        MESH_DEVICE=spec["mesh"],
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        EXTRA_MODELS_DIR=spec["models_dir"],
        TT_VLLM_BUILTIN_MODELS="0",
    )
    from vllm import LLM, SamplingParams

    from ttbundles.serving.harness import close, engine_plan, model_config, tokenize

    ids, perplexity = tokenize(spec)
    spec["perplexity_ids"] = perplexity
    config = model_config(spec["checkpoint"])
    engines = engine_plan(
        spec, {k: len(v) for k, v in ids.items()}, config.get("max_position_embeddings")
    )
    n = spec["max_tokens"]
    prompts = [{"prompt_token_ids": v} for v in ids.values()]

    def greedy(count: int, logprobs: int | None = None) -> SamplingParams:
        return SamplingParams(max_tokens=count, temperature=0.0, ignore_eos=True, logprobs=logprobs)

    for _, kwargs, runs in engines:
        llm = LLM(**kwargs)
        decoded = None
        for run in runs:
            if run == "prefill":
                llm.generate(prompts, greedy(1), use_tqdm=False)
            elif run in ("decode", "chunked_prefill"):
                decoded = llm.generate(prompts, greedy(n), use_tqdm=False)
            elif run == "prefix_cache":
                again = [
                    {"prompt_token_ids": p["prompt_token_ids"] + list(o.outputs[0].token_ids)}
                    for p, o in zip(prompts, decoded)
                ]
                llm.generate(again, greedy(n), use_tqdm=False)
            elif run == "perplexity":
                prefixes = [{"prompt_token_ids": perplexity[:i]} for i in range(1, len(perplexity))]
                llm.generate(prefixes, greedy(1), use_tqdm=False)
            elif run == "device_sampling":
                s = spec["sampling"]
                llm.generate(prompts, greedy(n, 5), use_tqdm=False)
                seeded = [
                    SamplingParams(
                        max_tokens=n,
                        temperature=s["temperature"],
                        top_k=s["top_k"],
                        top_p=s["top_p"],
                        seed=s["seed"] + i,
                        ignore_eos=True,
                    )
                    for i in range(len(prompts))
                ]
                for prompt, params in zip(prompts, seeded):
                    llm.generate([prompt], params, use_tqdm=False)
                llm.generate(prompts, seeded, use_tqdm=False)
        close(llm)
    sys.stdout.flush()
    os._exit(0)  # vLLM's interpreter-exit cleanup expects an accelerator


def golden_alone(spec_path: str) -> None:
    """The reference golden over the sequences `ttbundle test` teacher-forces."""
    spec = json.loads(Path(spec_path).read_text())
    from transformers import AutoTokenizer

    from ttbundles.reference.golden import ReferenceGolden

    tokenizer = AutoTokenizer.from_pretrained(spec["checkpoint"])
    golden = ReferenceGolden(spec["checkpoint"])
    n = spec["max_tokens"]
    ids = [tokenizer.encode(p["text"]) for p in spec["prompts"]]
    # Output tokens per case: prefill, decode, chunked_prefill, device greedy, device
    # seeded (its support check), prefix_cache (the decode sequence plus as many again).
    counts = [1, n, n, n, n, 2 * n]
    for prompt in ids:
        for count in counts:
            golden.sequence_logits(prompt + [0] * (count - 1))
    golden.sequence_logits(tokenizer.encode(spec["perplexity_text"]))


def timed(command: list[str]) -> float:
    start = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, cwd=tempfile.gettempdir())
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{command[:3]} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--served-alone", help=argparse.SUPPRESS)
    parser.add_argument("--golden-alone", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.served_alone:
        return served_alone(args.served_alone)
    if args.golden_alone:
        return golden_alone(args.golden_alone)
    from ttbundles.demo.checkpoint import write_checkpoint

    with tempfile.TemporaryDirectory(prefix="bench-test-") as tmp:
        workdir = Path(tmp)
        checkpoint = write_checkpoint(workdir / "ckpt")
        spec = spec_for(checkpoint, workdir)
        me = [sys.executable, str(Path(__file__).resolve())]
        commands = {
            "test": [
                TTBUNDLE,
                "test",
                str(DEMO),
                "--model",
                str(checkpoint),
                "--golden",
                "reference",
                "--format",
                "json",
            ],
            "served": [*me, "--served-alone", str(spec)],
            "golden": [*me, "--golden-alone", str(spec)],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        timed(commands["served"])  # warm the page cache: every run then imports alike
        for run in range(args.runs):
            for name, command in commands.items():
                times[name].append(timed(command))
            print(
                f"run {run + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in times.items()),
                flush=True,
            )
    med = {name: statistics.median(values) for name, values in times.items()}
    separate = med["served"] + med["golden"]
    print(
        f"ttbundle test {med['test']:.1f} s vs served {med['served']:.1f} s + golden "
        f"{med['golden']:.1f} s = {separate:.1f} s: {med['test'] / separate:.2f}x "
        f"(median of {args.runs})"
    )


if __name__ == "__main__":
    main()
