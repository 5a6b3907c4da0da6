"""Serve one contract twin with plain `vllm serve` and ask it through the openai client.

The same spec and the same result as `serve_twin.py` (which drives vLLM's engine in its
own process): greedy tokens of every prompt in one batch, a seeded request alone and
beside greedy ones, and the twin's record of calls. Here the server is the one operators
run (its API server, its engine core in a process of its own; forked from the test
session's zygote where it can be, `tests/zygote.py`), so the record comes from
the file the twin appends each call to (`TWIN_RECORD_FILE`), read once the server has
stopped: a stop is a real SIGTERM, so the worker's shutdown hooks are what a stopped
server runs.
"""

from __future__ import annotations

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.zygote import start_server
from ttbundles.demo.server import serve_environment


def cli_options(engine: dict[str, Any]) -> list[str]:
    """The `vllm serve` options for the engine arguments a spec gives `vllm.LLM`."""
    options = ["--enforce-eager"]
    for key, value in engine.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            options.append(flag)
        elif isinstance(value, dict):
            options += [flag, json.dumps(value)]
        else:
            options += [flag, str(value)]
    return options


def serve_over_http(spec: dict[str, Any], workdir: Path) -> dict[str, Any]:
    """`spec` served by `vllm serve`: the result `serve_twin.py` would print (with the
    load error, the server's last lines, when it does not start)."""
    import openai

    record = workdir / "record.jsonl"
    record.unlink(missing_ok=True)
    env = serve_environment(dict(os.environ))
    env.update(
        EXTRA_MODELS_DIR=spec["models_dir"],
        TT_VLLM_BUILTIN_MODELS="0",
        TWIN_RECORD_FILE=str(record),
        PYTHONUNBUFFERED="1",
        **spec.get("env", {}),
    )
    if "python_path" in spec:  # a twin as an environment class (a TT-Metal checkout's)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (spec["python_path"], env.get("PYTHONPATH", "")) if p
        )
    options = ["--served-model-name", "twin", *cli_options(spec["engine"])]
    if spec.get("shutdown"):
        # vLLM's default grace (0) kills the engine core right after its SIGTERM, often
        # before the worker's shutdown has run: the grace an operator gives it.
        options += ["--shutdown-timeout", "30"]
    server = start_server(
        Path(spec["checkpoint"]),
        vllm_args=options,
        env=env,
        log_path=workdir / "serve.log",
    )
    result: dict[str, Any] = {}
    try:
        try:
            server.wait_ready()
        except Exception as exc:  # the load error is the result for a refused twin
            return {"error": str(exc)}
        client = openai.OpenAI(base_url=server.api_url, api_key="none", max_retries=0)

        def complete(prompts: list[list[int]], **params: Any) -> list[list[int]]:
            body = {"return_token_ids": True, "ignore_eos": True, **params.pop("extra", {})}
            done = client.completions.create(
                model="twin", prompt=prompts, max_tokens=spec["max_tokens"], extra_body=body,
                **params,
            )  # fmt: skip
            return [c.token_ids for c in sorted(done.choices, key=lambda c: c.index)]

        prompts = spec["prompts"]
        result["greedy"] = complete(prompts, temperature=0.0)
        # A top-k within the class's max_device_top_k keeps the seeded row on the device.
        cut = {"extra": {"top_k": spec["seeded_top_k"]}} if "seeded_top_k" in spec else {}
        seeded = {"temperature": 0.9, "seed": 3, **cut}
        (result["seeded_alone"],) = complete(prompts[:1], **seeded)
        with ThreadPoolExecutor(2) as pool:  # the seeded row beside greedy ones
            mixed = pool.submit(complete, prompts[:1], **seeded)
            again = pool.submit(complete, prompts[1:], temperature=0.0)
            (result["seeded_in_batch"],) = mixed.result()
            result["greedy_again"] = again.result()
    finally:
        server.stop()
    lines = record.read_text(encoding="utf-8").splitlines() if record.exists() else []
    result["calls"] = [json.loads(line) for line in lines]
    return result
