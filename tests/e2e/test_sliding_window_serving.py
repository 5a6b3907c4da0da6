"""A sliding-window checkpoint as a new user meets it: a tiny `MistralForCausalLM` with
`sliding_window=8`, and a tiny `Gemma3ForCausalLM` (10 local layers with
`sliding_window=32`, 2 global ones), each a bundle from `ttbundle init --reference`,
`ttbundle test` with its defaults (against transformers, since the generator is the
reference), and plain `vllm serve`, whose greedy tokens for prompts several windows long
must be transformers' (once cold, once through a prefix-cache hit). And `ttbundle test`
with its defaults fails a reference that ignores the window, with a fix line that names
it."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import GEMMA3_WINDOW, WINDOW
from tests.e2e.conftest import Reference
from tests.e2e.test_first_bundle import (
    MAX_TOKENS,
    completion,
    forked_server,
    shell_environment,
    typed,
)

# Several windows of tokens each (the demo tokenizer splits words into a few tokens).
PROMPTS = [
    "Once upon a time, there was a little girl who lived in a village near the forest. "
    "Whenever she went out, the little girl wore a red riding cloak",
    "The capital of France is Paris, the capital of Italy is Rome, the capital of Spain is",
]
# Gemma 3's window is 32 tokens: prompts of more than three windows.
LONG_PROMPTS = [
    PROMPTS[0] + " and carried a basket of bread and butter through the dark wood to her "
    "grandmother, who lived alone in a small house at the other end of the forest path, and",
    "One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, thirteen, "
    "fourteen, fifteen, sixteen, seventeen, eighteen, nineteen, twenty, twenty-one, twenty-two",
]
# family: (architecture, checkpoint fixture, window, prompts)
FAMILIES = {
    "mistral": ("MistralForCausalLM", "window_checkpoint", WINDOW, PROMPTS),
    "gemma3": ("Gemma3ForCausalLM", "gemma3_checkpoint", GEMMA3_WINDOW, LONG_PROMPTS),
}

IGNORES_THE_WINDOW = '''

class IgnoresTheWindow(TTMistralForCausalLMGenerator):
    """The reference with its window taken away: attends over the whole context."""

    @classmethod
    def initialize_vllm_model(cls, *args, **kwargs):
        generator = super().initialize_vllm_model(*args, **kwargs)
        generator.window = None
        return generator
'''


def served_tokens(
    tmp_path: Path,
    env: dict[str, str],
    reference: Reference,
    bundle: str = "my-mistral",
    window: int = WINDOW,
    prompts: list[str] = PROMPTS,
    vllm_args: str = "",
) -> str:
    """Plain `vllm serve` of the installed bundle: each prompt's greedy tokens, twice
    (the second time its full blocks come from the prefix cache), equal transformers';
    Gemma 3's served on hybrid KV groups. Returns the server's log."""
    with forked_server(tmp_path, env, vllm_args) as (port, log):
        text = log.read_text()
        assert f"{bundle}@0.1.0" in text, "the installed bundle serves"
        # Gemma 3's bundle declares its KV groups (init --reference, a hybrid family):
        # its sliding layers keep their window and the tokens in flight, on vLLM's hybrid
        # manager, at a step budget the host mesh chose for them to pay; the KV line says
        # the pool's bytes and the requests it holds with the groups and without.
        lean = "-> 'hybrid groups'" in text
        assert lean is (bundle == "my-gemma3"), text[-4000:]
        if lean:
            assert "hybrid KV groups on HOST" in text, text[-4000:]
            # One line per engine (two with --data-parallel-size 2).
            lines = [line for line in text.splitlines() if "KV cache of" in line]
            assert lines, text[-4000:]
            for kv in lines:
                assert re.search(r"KV cache of \d+ blocks x \d+ tokens \([\d.,]+ [KMG]iB\)", kv)
                held = re.search(r"([\d.]+)x concurrency \(([\d.]+)x without KV groups\)", kv)
                assert held and float(held[1]) > float(held[2]), kv
        assert "results past the window differ" not in text
        for prompt in prompts:
            for _ in range(2):
                served, prompt_ids = completion(port, prompt)
                prompt_ids = prompt_ids or reference.tokenizer(prompt)["input_ids"]
                assert len(prompt_ids) >= 3 * window, len(prompt_ids)
                assert served == reference.greedy(list(prompt_ids), MAX_TOKENS), prompt
        return log.read_text()


@pytest.mark.server
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_sliding_window_checkpoint_from_init_to_vllm_serve(tmp_path, request, family):
    arch, fixture, window, prompts = FAMILIES[family]
    bundle = f"my-{family}"
    env = shell_environment(tmp_path)
    os.symlink(request.getfixturevalue(fixture), tmp_path / "ckpt")
    created = typed(f"ttbundle init {bundle} --arch {arch} --reference", tmp_path, env)
    assert created.strip() == bundle
    assert "valid (0 errors, 0 warnings" in typed(
        f"ttbundle validate --strict {bundle}", tmp_path, env
    )
    # Defaults: the generator is the reference, so the golden is transformers.
    tested = typed(f"ttbundle test {bundle} --model ckpt", tmp_path, env, timeout=900)
    assert "PASSED" in tested and "FAIL" not in tested, tested
    assert "vs transformers" in tested and "vs reference" not in tested, tested
    typed(f"ttbundle pack {bundle} -o dist", tmp_path, env)
    typed(f"ttbundle install dist/{bundle}-0.1.0.ttbundle --models-dir models", tmp_path, env)
    served_tokens(tmp_path, env, Reference(tmp_path / "ckpt"), bundle, window, prompts)


@pytest.mark.server
def test_ttbundle_test_fails_a_reference_that_ignores_the_window(tmp_path, window_checkpoint):
    env = shell_environment(tmp_path)
    os.symlink(window_checkpoint, tmp_path / "ckpt")
    typed("ttbundle init my-mistral --arch MistralForCausalLM --reference", tmp_path, env)
    adapter = tmp_path / "my-mistral" / "adapter.py"
    adapter.write_text(adapter.read_text() + IGNORES_THE_WINDOW)
    meta = tmp_path / "my-mistral" / "vllm_metadata.json"
    meta.write_text(
        meta.read_text().replace(
            '"adapter:TTMistralForCausalLMGenerator"', '"adapter:IgnoresTheWindow"'
        )
    )
    done = subprocess.run(
        ["bash", "-c", "ttbundle test my-mistral --model ckpt"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 1, out[-4000:]
    assert "Traceback" not in done.stderr, done.stderr
    assert "TTB120" in out and "(golden: transformers)" in out, out[-4000:]
    assert f"the checkpoint's sliding_window={WINDOW} (all 2 layers)" in out, out[-4000:]


@pytest.mark.server
def test_hybrid_groups_serve_with_two_data_parallel_engines(tmp_path, gemma3_checkpoint):
    """`--data-parallel-size 2`: each engine sizes and serves its own hybrid KV groups,
    and both give transformers' tokens (a request lands on either engine)."""
    env = shell_environment(tmp_path)
    os.symlink(gemma3_checkpoint, tmp_path / "ckpt")
    (tmp_path / "models").mkdir()
    typed("ttbundle init models/my-gemma3 --arch Gemma3ForCausalLM --reference", tmp_path, env)
    log = served_tokens(
        tmp_path,
        env,
        Reference(tmp_path / "ckpt"),
        "my-gemma3",
        GEMMA3_WINDOW,
        LONG_PROMPTS,
        vllm_args="--data-parallel-size 2",
    )
    engines = [line for line in log.splitlines() if "6 KV groups" in line and "KV cache of" in line]
    assert len(engines) == 2, "\n".join(engines) or log[-4000:]
