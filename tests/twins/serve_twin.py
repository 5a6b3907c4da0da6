"""Serve the vision contract twin with vLLM's own engine, in this process, and report.

Run as a script by tests/test_contract_twins.py for a spec whose prompts carry images
(the text twins are served by `vllm serve`, `http_twin.py`): `python serve_twin.py
SPEC.json`. vLLM's `LLM` with
`VLLM_ENABLE_V1_MULTIPROCESSING=0` keeps the engine core in this process, so the twin's
`RECORD` of calls is readable here; the platform, scheduler, worker and model runner are
the real ones. Prints one JSON line: the outputs and the calls, or the load error.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main(spec_path: str) -> int:
    spec = json.loads(Path(spec_path).read_text(encoding="utf-8"))
    os.environ.update(
        MESH_DEVICE="HOST",
        HF_HUB_OFFLINE="1",
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        EXTRA_MODELS_DIR=spec["models_dir"],
        TT_VLLM_BUILTIN_MODELS="0",
    )
    from vllm import LLM, SamplingParams

    result: dict = {}
    try:
        llm = LLM(model=spec["checkpoint"], enforce_eager=True, **spec["engine"])
    except Exception as exc:  # the load error is the result for a refused twin
        result["error"] = f"{type(exc).__name__}: {exc}"
        print(json.dumps(result))
        return 0
    greedy = SamplingParams(max_tokens=spec["max_tokens"], temperature=0.0, ignore_eos=True)
    # Text with image files, through vLLM's processor.
    from PIL import Image

    requests = [
        {
            "prompt": p["prompt"],
            **(
                {"multi_modal_data": {"image": [Image.open(f) for f in p["images"]]}}
                if p["images"]
                else {}
            ),
        }
        for p in spec["image_prompts"]
    ]
    outputs = llm.generate(requests, greedy)
    result["prompt_ids"] = [list(o.prompt_token_ids) for o in outputs]
    result["greedy"] = [list(o.outputs[0].token_ids) for o in outputs]
    return _report(result, spec.get("record_module"))


def _report(result: dict, record_module: str | None = None) -> int:
    adapter = (
        sys.modules[record_module]
        if record_module
        else next(
            m for n, m in sys.modules.items() if n.startswith("_ttb_") and n.endswith(".adapter")
        )
    )
    result["calls"] = adapter.RECORD
    print(json.dumps(result, default=str))
    sys.stdout.flush()
    os._exit(0)  # skip vLLM's interpreter-exit cleanup, which expects an accelerator


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
