"""A block-output class (4 tokens per row per decode: the twin `BlockOutputForCausalLM` on
the reference generator's block mode) served by plain `vllm serve`, asked through the
openai client: the greedy tokens are transformers', and a request ends exactly at
`max_tokens` and at a stop string inside a block, log-probs one per token; the start-up
report says the block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.conftest import Reference
from tests.e2e.test_first_bundle import forked_server, shell_environment, typed

pytestmark = pytest.mark.server

FAMILIES = Path(__file__).parent.parent / "twins" / "families.py"
PROMPT = "Once upon a time, there was a"


def _bundle(models: Path) -> None:
    bundle = models / "twin-block"
    bundle.mkdir(parents=True)
    (bundle / "adapter.py").write_text(FAMILIES.read_text())
    document = {
        "schema_version": 1,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": "LlamaForCausalLM",
        "main_class": "adapter:BlockOutputForCausalLM",
        "capabilities": {"sample_on_device": ["decode_only", "all"], "chunked_prefill": True},
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(document))


def test_block_output_serves_transformers_tokens_and_stops_exactly(tmp_path):
    from openai import OpenAI

    env = shell_environment(tmp_path)
    env["TT_VLLM_BUILTIN_MODELS"] = "0"  # the twin serves the checkpoint, not the demo
    typed("ttbundle demo --write-checkpoint ckpt", tmp_path, env, timeout=300)
    _bundle(tmp_path / "models")
    with forked_server(tmp_path, env, "--max-model-len 256 --max-num-seqs 4") as (port, log):
        report = log.read_text()
        assert "output_tokens_per_step: None -> 4 (block output" in report, report[-4000:]
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none")
        reference = Reference(tmp_path / "ckpt")
        prompt_ids = reference.tokenizer(PROMPT)["input_ids"]
        expected = reference.greedy(list(prompt_ids), 14)

        def complete(**params):
            body = {"return_token_ids": True, "ignore_eos": True}
            return client.completions.create(
                model="ckpt", prompt=PROMPT, temperature=0, extra_body=body, **params
            ).choices[0]

        # 14 tokens: the prefill's one, then blocks of 4, the last cut after one.
        whole = complete(max_tokens=14, logprobs=1)
        assert whole.token_ids == expected and whole.finish_reason == "length"
        assert len(whole.logprobs.token_logprobs) == 14
        # max_tokens inside a block: cut there.
        cut = complete(max_tokens=7)
        assert cut.token_ids == expected[:7] and cut.finish_reason == "length"
        # A stop string that the 7th token completes (inside the second block): the text
        # ends before it, the request stops there.
        text = whole.text
        stop = reference.tokenizer.decode(expected[5:7]).strip()
        assert stop and stop in text
        stopped = complete(max_tokens=14, stop=[stop])
        assert stopped.finish_reason == "stop"
        assert stopped.text == text[: text.index(stop)]
