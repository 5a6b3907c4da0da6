"""The bundle's serving defaults (`serving`, schema 4): the format, validate's check
against the parsers the installed vLLM has, and the plan's decisions (the operator's
flags win). Serving them is tests/e2e/test_chat_defaults_serving.py."""

from __future__ import annotations

import json

import pytest

from tests.chat_bundle import write_chat_bundle
from ttbundles.check.validate import validate_bundle
from ttbundles.format.metadata import BundleMetadata
from ttbundles.vllm_parsers import known_names, registered

DOC = {"schema_version": 4, "name": "d", "version": "1", "arch": "A", "main_class": "m:C"}


def test_serving_needs_schema_version_4():
    with pytest.raises(Exception, match="serving needs schema_version 4") as info:
        BundleMetadata.model_validate(
            {**DOC, "schema_version": 3, "serving": {"tool_call_parser": "hermes"}}
        )
    assert "TTB020" in str(info.value)
    meta = BundleMetadata.model_validate({**DOC, "serving": {"tool_call_parser": "hermes"}})
    assert meta.serving.auto_tool_choice  # on with a parser unless said off


def test_auto_tool_choice_needs_a_parser():
    with pytest.raises(Exception, match="needs serving.tool_call_parser"):
        BundleMetadata.model_validate({**DOC, "serving": {"enable_auto_tool_choice": True}})


def test_parser_names_read_without_vllm_are_vllms_own():
    """The static read of vLLM's tables (cheap) lists what its managers list."""
    for kind in ("tool_call", "reasoning"):
        assert known_names(kind) == registered(kind)
    assert "pythonic" in known_names("tool_call")


def test_validate_accepts_the_chat_bundle(tmp_path):
    report = validate_bundle(write_chat_bundle(tmp_path))
    assert report.ok(strict=True), [str(d) for d in report.diagnostics]


def test_validate_refuses_a_parser_vllm_lacks_and_a_missing_template(tmp_path):
    folder = write_chat_bundle(
        tmp_path,
        tool_call_parser="pythnic",
        reasoning_parser="no-such",
        chat_template="missing.jinja",
    )
    report = validate_bundle(folder)
    found = {(d.code, d.pointer): d for d in report.diagnostics}
    tool = found[("TTB112", "/serving/tool_call_parser")]
    assert tool.is_error and "'pythnic' is not a tool-call parser" in tool.message
    assert "did you mean 'pythonic'?" in tool.hint
    assert found[("TTB112", "/serving/reasoning_parser")].is_error
    template = found[("TTB113", "/serving/chat_template")]
    assert template.is_error and "does not exist" in template.message
    assert not report.ok()


def _decisions(done) -> dict[str, dict]:
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    return {d["setting"]: d for d in plan["decisions"]}, plan


def test_plan_applies_the_bundles_defaults_and_the_operators_flags_win(
    run_cli, demo_checkpoint, tmp_path
):
    folder = write_chat_bundle(tmp_path / "models")
    common = ("plan", str(demo_checkpoint), "--mesh", "HOST", "--models-dir")
    done = run_cli(*common, str(tmp_path / "models"), "-f", "json", timeout=300)
    decisions, plan = _decisions(done)
    assert decisions["tool_call_parser"]["effective"] == "pythonic"
    assert decisions["tool_call_parser"]["requested"] is None
    assert "default of bundle demo-tools@1.0.0" in decisions["tool_call_parser"]["reason"]
    assert decisions["enable_auto_tool_choice"]["effective"] is True
    assert decisions["chat_template"]["effective"] == str(folder / "tools.jinja")
    assert plan["chat"] == {
        "tool_call_parser": "pythonic",
        "enable_auto_tool_choice": True,
        "chat_template": str(folder / "tools.jinja"),
    }
    done = run_cli(
        *common,
        str(tmp_path / "models"),
        "--tool-call-parser",
        "hermes",
        "-f",
        "json",
        timeout=300,
    )
    decisions, plan = _decisions(done)
    assert decisions["tool_call_parser"]["effective"] == "hermes"
    assert "set by the user (--tool-call-parser)" in decisions["tool_call_parser"]["reason"]
    assert "tool_call_parser" not in plan["chat"]
    assert plan["chat"]["enable_auto_tool_choice"] is True  # not passed: the bundle's


def test_plan_refuses_a_parser_vllm_lacks(run_cli, demo_checkpoint, tmp_path):
    write_chat_bundle(tmp_path / "models", tool_call_parser="pythnic")
    done = run_cli(
        "plan",
        str(demo_checkpoint),
        "--mesh",
        "HOST",
        "--models-dir",
        str(tmp_path / "models"),
        timeout=300,
    )
    assert done.returncode == 1, done.stderr
    assert "TTB112" in done.stderr and "did you mean 'pythonic'?" in done.stderr
    assert "Traceback" not in done.stderr


def test_plan_applies_the_bundles_reasoning_parser(run_cli, demo_checkpoint, tmp_path):
    write_chat_bundle(tmp_path / "models", reasoning_parser="deepseek_r1")
    done = run_cli(
        "plan",
        str(demo_checkpoint),
        "--mesh",
        "HOST",
        "--models-dir",
        str(tmp_path / "models"),
        "-f",
        "json",
        timeout=300,
    )
    decisions, plan = _decisions(done)
    assert decisions["reasoning_parser"]["effective"] == "deepseek_r1"
    assert plan["chat"] == {"reasoning_parser": "deepseek_r1"}
    assert "tool_call_parser" not in decisions  # the bundle declares none
