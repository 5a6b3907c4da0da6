"""Value names in help: `--mesh MESH`, `--models-dir DIR`, not `<str>`, `<list[Path]>`.

typer labels an option's value with its Python type (`<bool>` even for a flag, which
takes no value). Here, once, every parameter without an explicit `metavar` gets the name
of what it takes: by its name where one is known, else by its type; a flag gets none.
"""

from __future__ import annotations

from typing import Any

# The value of a parameter, by the parameter's Python name (shared by all commands).
VALUE_NAMES: dict[str, str] = {
    "archive": "ARCHIVE",
    "arch": "ARCH",
    "bundle": "BUNDLE",
    "certificate": "CERT",
    "chain": "CA",
    "checkpoint_dir": "DIR",
    "folder": "DIR",
    "from_hf": "REPO|DIR",
    "golden": "SOURCE",
    "host": "ADDRESS",
    "max_tokens": "N",
    "mesh": "MESH",
    "model": "MODEL",
    "models_dir": "DIR",
    "name": "NAME",
    "output_dir": "DIR",
    "path": "PATH",
    "paths": "PATH",
    "port": "PORT",
    "record": "FILE",
    "ref": "REF",
    "source": "ARCHIVE|DIR",
    "timeout": "SECONDS",
    "write_checkpoint": "DIR",
}


def _by_type(param: Any) -> str:
    descriptor = getattr(param, "type_descriptor", None)
    if descriptor is None:
        return param.name.upper()
    if descriptor.is_choice:
        return "|".join(str(getattr(c, "value", c)) for c in descriptor.choices or ())
    if descriptor.is_path:
        return {"dir": "DIR", "file": "FILE"}.get(descriptor.path_type, "PATH")
    annotation = descriptor.annotation
    if annotation is int:
        return "N"
    if annotation is float:
        return "NUMBER"
    return (param.name or "value").upper()


def apply_value_names(command: Any) -> Any:
    """Give every parameter of `command` and its subcommands a value name (in place),
    and reflow its help so that a paragraph wraps at the terminal's width, not at the
    docstring's line breaks."""
    for sub in getattr(command, "commands", {}).values():
        apply_value_names(sub)
    if command.help:
        command.help = reflow(command.help)
    _no_value_for_help(command)
    for param in command.params:
        if param.param_type_name == "argument":
            # An argument's name column shows its value name already; no type beside it.
            param.display_type_rich = lambda ctx: None
        if param.metavar is not None:
            continue
        if getattr(param, "is_flag", False):
            param.metavar = ""  # a flag takes no value: show none
        elif param.name == "fmt":
            param.metavar = _by_type(param)
        else:
            param.metavar = VALUE_NAMES.get(param.name) or _by_type(param)
    return command


def _no_value_for_help(command: Any) -> None:
    """`-h/--help` is made by click on demand, after the walk above: name it there."""
    make = command.get_help_option

    def get_help_option(ctx: Any) -> Any:
        option = make(ctx)
        if option is not None:
            option.metavar = ""
        return option

    command.get_help_option = get_help_option


def reflow(text: str) -> str:
    """Join the lines of each paragraph (blank-line separated) of a docstring; a line
    that starts with a space or "-" stays on its own (an indented example, a list)."""
    import inspect

    paragraphs = inspect.cleandoc(text).split("\n\n")
    out = []
    for paragraph in paragraphs:
        lines = paragraph.split("\n")
        if any(line.startswith((" ", "-")) for line in lines[1:]):
            out.append(paragraph)
        else:
            out.append(" ".join(line.strip() for line in lines))
    return "\n\n".join(out)
