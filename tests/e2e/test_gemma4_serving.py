"""A Gemma 4 text checkpoint as a new user meets it: the tiny `Gemma4ForCausalLM` (4 local
layers with `sliding_window=16`, 2 global ones with their own head size and KV heads and a
partial RoPE) made a bundle by `ttbundle init --reference`, validated strictly, and served
by plain `vllm serve` on hybrid KV groups, each group in its own KV shape; its greedy
tokens for prompts several windows long are transformers'. One server start, two
requests."""

from __future__ import annotations

import os
import re

import pytest

from tests.conftest import GEMMA4_WINDOW
from tests.e2e.conftest import Reference
from tests.e2e.test_first_bundle import (
    MAX_TOKENS,
    completion,
    forked_server,
    shell_environment,
    typed,
)
from tests.e2e.test_sliding_window_serving import LONG_PROMPTS


@pytest.mark.server
def test_a_gemma4_checkpoint_from_init_to_vllm_serve(tmp_path, gemma4_checkpoint):
    env = shell_environment(tmp_path)
    os.symlink(gemma4_checkpoint, tmp_path / "ckpt")
    created = typed("ttbundle init my-gemma4 --from-hf ckpt --reference", tmp_path, env)
    assert created.strip() == "my-gemma4"
    assert "valid (0 errors, 0 warnings" in typed(
        "ttbundle validate --strict my-gemma4", tmp_path, env
    )
    (tmp_path / "models").mkdir()
    os.symlink(tmp_path / "my-gemma4", tmp_path / "models" / "my-gemma4")
    reference = Reference(tmp_path / "ckpt")
    with forked_server(tmp_path, env) as (port, log):
        text = log.read_text()
        assert "my-gemma4@0.1.0" in text, "the bundle serves"
        # Two KV groups, each in its layers' own shape: the sliding layers' 2 KV heads
        # of 16 and the global layers' 1 of 32 (one page size: one block size).
        lines = [line for line in text.splitlines() if "KV cache of" in line]
        assert lines, text[-4000:]
        groups = r"\d KV groups: sliding window 16 \(\d\), full attention \(1\)"
        assert re.search(groups, lines[0]), lines[0]
        for prompt in LONG_PROMPTS:
            served, prompt_ids = completion(port, prompt)
            prompt_ids = prompt_ids or reference.tokenizer(prompt)["input_ids"]
            assert len(prompt_ids) >= 3 * GEMMA4_WINDOW, len(prompt_ids)
            assert served == reference.greedy(list(prompt_ids), MAX_TOKENS), prompt
