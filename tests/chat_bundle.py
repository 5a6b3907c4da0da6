"""A bundle declaring serving defaults (schema 4) for the demo checkpoint: the demo
adapter, vLLM's `pythonic` tool-call parser and a chat template that tells the model the
tools and the call syntax that parser reads (`[name(arg=value)]`); the demo checkpoint's
own template ignores tools."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from ttbundles.paths import builtin_bundles_dir

TOOL_TEMPLATE = (
    "{% if tools %}<|system|>You may call these tools, answering with a Python list of "
    "calls such as [name(arg=value)]:\n"
    "{% for tool in tools %}{{ tool.function.name }}({{ tool.function.parameters | tojson }})"
    "\n{% endfor %}<|end|>{% endif %}"
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>{{ message['content'] or '' }}<|end|>"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>{% endif %}"
)


def write_chat_bundle(models_dir: Path, *, name: str = "demo-tools", **serving: object) -> Path:
    """The demo bundle as `name` in `models_dir`, with `serving` (default: the pythonic
    parser and tools.jinja)."""
    folder = models_dir / name
    folder.mkdir(parents=True)
    demo = builtin_bundles_dir() / "demo"
    shutil.copy(demo / "adapter.py", folder / "adapter.py")
    document = json.loads((demo / "vllm_metadata.json").read_text(encoding="utf-8"))
    document.update(schema_version=max(4, document["schema_version"]), name=name)
    document["serving"] = serving or {
        "tool_call_parser": "pythonic",
        "chat_template": "tools.jinja",
    }
    (folder / "vllm_metadata.json").write_text(json.dumps(document, indent=2) + "\n")
    (folder / "tools.jinja").write_text(TOOL_TEMPLATE, encoding="utf-8")
    return folder
