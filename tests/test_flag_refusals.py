"""What the flags alone refuse: one line (code, what, a fix), from the parse hook that
`vllm serve` and `ttbundle plan` share, and from the planner for configurations built
without a command line; and what the plan says of flags that have no effect.

Through the real vLLM: its own argument parser (`make_arg_parser`, which installs the
TT platform's parse hook, as in `vllm serve`) and `EngineArgs(...).create_engine_config()`
(see tests/test_platform_config.py), with the TT platform active on the host mesh.
"""

from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from tests.test_platform_config import bundle, configure, error_of
from ttbundles.errors import ConfigurationError

EXAMPLE_CONNECTOR = {"kv_connector": "ExampleConnector", "kv_role": "kv_both"}

FLAGS = [
    pytest.param(["--enable-lora"], "TTB202", "LoRA", "drop --enable-lora", id="lora"),
    pytest.param(
        ["--enable-sleep-mode"],
        "TTB202",
        "--enable-sleep-mode: sleep mode",
        "drop --enable-sleep-mode",
        id="sleep-mode",
    ),
    pytest.param(
        ["--kv-transfer-config", json.dumps(EXAMPLE_CONNECTOR)],
        "TTB202",
        "--kv-transfer-config (ExampleConnector): moving KV caches between instances",
        "drop --kv-transfer-config",
        id="kv-transfer",
    ),
    pytest.param(
        ["--tensor-parallel-size", "2"], "TTB201", "--tensor-parallel-size=2", "drop", id="tp"
    ),
]


def parse(arguments: list[str]):
    """`vllm serve`'s parse of `arguments`, through the TT platform's hook."""
    from vllm.entrypoints.common.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    return make_arg_parser(FlexibleArgumentParser()).parse_args(arguments)


@pytest.mark.parametrize("flags,code,what,fix", FLAGS)
def test_a_flag_tenstorrent_does_not_serve_is_refused_as_the_command_line_parses(
    demo_checkpoint, flags, code, what, fix
):
    """Before vLLM builds its configuration (no config, no engine): the parse alone."""
    with pytest.raises(ConfigurationError) as excinfo:
        parse([str(demo_checkpoint), *flags])
    (diagnostic,) = excinfo.value.diagnostics
    assert diagnostic.code == code
    assert what in diagnostic.message
    assert diagnostic.hint.startswith(fix)
    assert "scheduler_cls" not in diagnostic.hint


@pytest.mark.parametrize(
    "option,what",
    [
        ({"enable_sleep_mode": True}, "--enable-sleep-mode"),
        ({"kv_transfer_config": EXAMPLE_CONNECTOR}, "--kv-transfer-config (ExampleConnector)"),
    ],
)
def test_the_planner_refuses_them_in_the_same_line_without_a_command_line(
    models_dir, demo_checkpoint, option, what
):
    """`EngineArgs` built in code (no parse hook): the planner's refusal, not vLLM's
    pydantic error for sleep mode nor a plan that ignores the connector."""
    bundle(models_dir, "plain")
    with pytest.raises(ConfigurationError) as excinfo:
        configure(demo_checkpoint, **option)
    assert error_of(excinfo) == "TTB202"
    assert str(excinfo.value.diagnostics[0].message).startswith(what)


@pytest.fixture(scope="module")
def long_checkpoint(demo_checkpoint, tmp_path_factory):
    """The demo checkpoint claiming 8,192 positions (a real SmolLM2's), as a folder."""
    folder = tmp_path_factory.mktemp("checkpoint") / "tiny-llama-8k"
    shutil.copytree(demo_checkpoint, folder)
    config = json.loads((folder / "config.json").read_text())
    config["max_position_embeddings"] = 8192
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_a_length_beyond_the_checkpoint_names_its_positions_and_the_targets_cap(
    models_dir, long_checkpoint
):
    from ttbundles.serving.planning.flag_refusals import refuse_checkpoint_length

    bundle(models_dir, "capped", targets={"HOST": {"max_model_len": 512}})
    asked = SimpleNamespace(model_tag=str(long_checkpoint), max_model_len=100000)
    with pytest.raises(ConfigurationError) as excinfo:
        refuse_checkpoint_length(asked, "HOST")
    (diagnostic,) = excinfo.value.diagnostics
    assert diagnostic.code == "TTB247"
    assert diagnostic.message == (
        f"--max-model-len 100000: the checkpoint {long_checkpoint} has 8192 positions "
        "(max_position_embeddings in its config.json); capped@1.0.0's target HOST serves "
        "at most 512"
    )
    assert (
        diagnostic.hint
        == "ask for at most 512, or drop --max-model-len (the server then takes 512)"
    )
    # Within the checkpoint's positions: the planner's to lower (TTB246), not refused here.
    refuse_checkpoint_length(
        SimpleNamespace(model_tag=str(long_checkpoint), max_model_len=4096), "HOST"
    )


def test_a_length_vllm_is_told_to_allow_is_left_to_vllm(models_dir, long_checkpoint, monkeypatch):
    from ttbundles.serving.planning.flag_refusals import (
        checkpoint_positions,
        refuse_checkpoint_length,
    )

    monkeypatch.setenv("VLLM_ALLOW_LONG_MAX_MODEL_LEN", "1")
    refuse_checkpoint_length(
        SimpleNamespace(model_tag=str(long_checkpoint), max_model_len=100000), "HOST"
    )
    # A RoPE factor stretches the positions: vLLM computes them, not a key.
    assert checkpoint_positions({"max_position_embeddings": 4096}) == (
        4096,
        "max_position_embeddings",
    )
    scaled = {"max_position_embeddings": 4096, "rope_scaling": {"factor": 8.0}}
    assert checkpoint_positions(scaled) is None
    nested = {"text_config": {"max_position_embeddings": 2048, "seq_length": 1024}}
    assert checkpoint_positions(nested) == (1024, "seq_length")


def test_quantization_is_a_decision_the_host_mesh_does_not_apply(models_dir, demo_checkpoint):
    """vLLM serves `--quantization fp8` on the host mesh without a word; the reference
    loads the checkpoint's weights in float32 all the same, and the plan says so."""
    bundle(models_dir, "plain")
    _, decisions, _ = configure(demo_checkpoint, quantization="fp8")
    quantization = decisions["quantization"]
    assert (quantization["requested"], quantization["effective"]) == (
        "fp8",
        "float32, not quantized",
    )
    assert "--quantization has no effect on HOST" in quantization["reason"]
    _, decisions, _ = configure(demo_checkpoint)
    assert "quantization" not in decisions  # not asked, not in the checkpoint: no row


@pytest.mark.parametrize(
    "arguments,code,text",
    [
        pytest.param(
            ["--enable-sleep-mode"], "TTB202", "--enable-sleep-mode: sleep mode", id="sleep-mode"
        ),
        pytest.param(
            ["--kv-transfer-config", json.dumps(EXAMPLE_CONNECTOR)],
            "TTB202",
            "--kv-transfer-config (ExampleConnector)",
            id="kv-transfer",
        ),
        pytest.param(
            ["--max-model-len", "100000"],
            "TTB247",
            "has 8192 positions (max_position_embeddings in its config.json); demo@",
            id="length",
        ),
    ],
)
def test_plan_refuses_in_one_line_as_the_server_does(
    run_cli, long_checkpoint, arguments, code, text
):
    done = run_cli("plan", str(long_checkpoint), "--mesh", "HOST", *arguments, timeout=300)
    assert done.returncode == 1, done.stdout
    [line, fix] = [x for x in done.stderr.splitlines() if x.strip()]
    assert line.startswith(f"error {code} ") and text in line
    assert fix.strip().startswith("fix: ") and "docs/reference/codes.md" in fix
    assert "Traceback" not in done.stderr


def test_plan_has_a_row_for_quantization(run_cli, demo_checkpoint):
    done = run_cli(
        "plan",
        str(demo_checkpoint),
        "--mesh",
        "HOST",
        "--quantization",
        "fp8",
        "-f",
        "json",
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    decisions = {d["setting"]: d for d in json.loads(done.stdout)["decisions"]}
    assert decisions["quantization"]["effective"] == "float32, not quantized"
