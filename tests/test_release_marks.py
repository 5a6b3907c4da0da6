"""The rules that choose what runs on every vLLM release (`tests/release_marks.py`),
held to tests of this suite whose answer is known."""

from __future__ import annotations

import pytest

from tests.release_marks import _commands, _reaches, function_reaches


@pytest.mark.parametrize(
    ("module", "function", "differs"),
    [
        # imports vLLM at module level
        ("tests.test_scheduler", "test_decodes_are_hidden_not_reordered", True),
        # runs `ttbundle plan` (the command's module imports the serving side)
        ("tests.test_output_trust", "test_plan_is_quiet_and_uses_the_servers_defaults", True),
        # hands `python -c` a program that imports the plugin
        ("tests.test_vllm_window", "test_the_plugin_is_silent_about_a_tested_release", True),
        # the same with a program that imports vLLM's modules
        (
            "tests.test_torchvision_compat",
            "test_vllm_vision_modules_import_in_a_process_that_loaded_the_general_plugins",
            True,
        ),
        # reads the installed release
        ("tests.test_vllm_window", "test_the_installed_release_is_in_the_window", True),
        # the format alone
        ("tests.test_metadata", "test_minimal_document_gets_defaults", False),
        # a command named in a parametrized command line (validate reads the installed
        # vLLM's parser tables)
        ("tests.test_cli", "test_usage_errors_exit_2", True),
    ],
)
def test_a_test_differs_between_releases_where_what_it_runs_can(module, function, differs):
    assert function_reaches(module, function) is differs


def test_the_commands_are_read_from_the_app():
    commands = _commands()
    assert commands["list"] == "ttbundles.cli.info"
    assert commands["test"] == "ttbundles.cli.conformance"
    assert _reaches(commands["plan"]) and not _reaches(commands["init"])


def test_every_end_to_end_test_is_in_the_server_tier():
    """A test under tests/e2e without the mark (its module's or its own) would start its
    servers in the fast tier, on every worker that collects it (one did: 20 s of the fast
    tier)."""
    import ast
    from pathlib import Path

    def marked(decorators: list[ast.expr]) -> bool:
        return any("mark.server" in ast.unparse(d) for d in decorators)

    unmarked = []
    for path in sorted((Path(__file__).parent / "e2e").glob("test_*.py")):
        source = path.read_text(encoding="utf-8")
        if "pytestmark = pytest.mark.server" in source:
            continue
        for node in ast.parse(source).body:
            test = isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
            if test and not marked(node.decorator_list):
                unmarked.append(f"{path.name}::{node.name}")
    assert unmarked == []
