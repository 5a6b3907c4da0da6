"""A bundle's serving defaults at a real `vllm serve`: a bundle declaring a tool-call
parser (and the chat template that tells the model its tools) serves `tool_choice:
"auto"` with no flag from the operator; without the bundle's defaults vLLM answers 400.

One server of its own (the session's servers do not declare serving defaults)."""

from __future__ import annotations

import pytest

from tests.chat_bundle import write_chat_bundle
from tests.e2e.conftest import READY_TIMEOUT, STOP_TIMEOUT, _environment
from tests.zygote import start_server

pytestmark = pytest.mark.server

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]


@pytest.fixture(scope="module")
def tools_server(demo_checkpoint, tmp_path_factory):
    root = tmp_path_factory.mktemp("chat-defaults")
    write_chat_bundle(root / "models")
    env = _environment({"EXTRA_MODELS_DIR": str(root / "models")})
    process = start_server(
        demo_checkpoint,
        vllm_args=["--max-model-len", "512", "--max-num-seqs", "4"],
        env=env,
        log_path=root / "server.log",
    )
    try:
        process.wait_ready(READY_TIMEOUT)
        yield process, root / "server.log"
    finally:
        process.stop(STOP_TIMEOUT)


def test_auto_tool_choice_is_served_from_the_bundles_defaults(tools_server, demo_checkpoint):
    import openai

    process, log = tools_server
    client = openai.OpenAI(base_url=process.api_url, api_key="EMPTY", max_retries=0)
    reply = client.chat.completions.create(
        model=str(demo_checkpoint),
        messages=[{"role": "user", "content": "What is the weather in Paris?"}],
        tools=TOOLS,
        tool_choice="auto",
        max_tokens=8,
        temperature=0,
    )
    # Random weights: no particular call, but the request is accepted and answered
    # through the parser (a reply without a call is text, finish_reason not tool_calls).
    choice = reply.choices[0]
    assert choice.finish_reason in ("length", "stop", "tool_calls")
    assert choice.message.content or choice.message.tool_calls
    text = log.read_text()
    assert "tool_call_parser: None -> 'pythonic' (default of bundle demo-tools@1.0.0" in text
    assert "enable_auto_tool_choice: None -> True" in text
    # The start-up report's one line on a mesh the bundle has no evidence for.
    assert "evidence: demo-tools@1.0.0 has no evidence on mesh HOST: served, not tested" in text


def test_the_template_tells_the_model_the_tools_in_the_syntax_the_parser_reads(
    demo_checkpoint,
):
    """The bundle's template renders the tools (the checkpoint's own would drop them),
    and vLLM's pythonic parser turns the call syntax the template asks for into a call."""
    from transformers import AutoTokenizer
    from vllm.tool_parsers import ToolParserManager

    from tests.chat_bundle import TOOL_TEMPLATE

    tokenizer = AutoTokenizer.from_pretrained(demo_checkpoint)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"}],
        tools=TOOLS,
        chat_template=TOOL_TEMPLATE,
        tokenize=False,
        add_generation_prompt=True,
    )
    assert "get_weather(" in prompt and "[name(arg=value)]" in prompt
    assert "get_weather" not in tokenizer.apply_chat_template(
        [{"role": "user", "content": "Weather in Paris?"}], tools=TOOLS, tokenize=False
    )
    parser = ToolParserManager.get_tool_parser("pythonic")(tokenizer)
    found = parser.extract_tool_calls('[get_weather(city="Paris")]', None)
    assert found.tools_called
    assert found.tool_calls[0].function.name == "get_weather"
    assert found.tool_calls[0].function.arguments == '{"city": "Paris"}'
