"""Usage errors in one or two lines: what was wrong, the likely fix, where help is.

Click's own report is the usage line, a help pointer and a framed box; an unknown option
is better answered like git does: `no such option --fromat; did you mean --format?`.
The root runs click in non-standalone mode and renders its exceptions here.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

import typer

# Typer bundles its own click; its exceptions are the ones raised (not the click package's).
from typer._click import exceptions as click

from ttbundles.suggest import did_you_mean


def no_such_option(command_path: str, word: str, options: Iterable[str], *, also: str = "") -> str:
    """`PROG CMD: error: no such option --x; did you mean --y?` and where the help is (`also`:
    another help to point at)."""
    best = closest_option(word, list(options))
    guess = f"; did you mean {best}?" if best else ""
    helps = f"'{command_path} --help'" + (f" and '{also}'" if also else "")
    return f"{command_path}: error: no such option {word}{guess}\nSee {helps}."


def closest_option(word: str, options: list[str]) -> str | None:
    """The option `word` most likely meant: one it extends or abbreviates (`--mesh-device`
    is `--mesh`, `--max-model-lenn` is `--max-model-len`), else the closest spelling."""
    extended = [o for o in options if len(o) > 3 and word.startswith(o)]
    if extended:
        return max(extended, key=len)
    abbreviated = [o for o in options if len(word) > 3 and o.startswith(word)]
    if len(abbreviated) == 1:
        return abbreviated[0]
    return did_you_mean(word, options)


def report(exc: click.ClickException, prog: str = "ttbundle", commands: Iterable[str] = ()) -> int:
    """Write a click error to stderr in at most two lines; the exit code to use."""
    ctx = getattr(exc, "ctx", None)
    path = ctx.command_path if ctx is not None else prog
    if ctx is None and sys.argv[1:2] and sys.argv[1] in set(commands):
        path = f"{prog} {sys.argv[1]}"  # errors raised before the command's context exists
    if isinstance(exc, click.NoSuchOption) and ctx is not None:
        options = [o for p in ctx.command.params for o in (*p.opts, *p.secondary_opts)]
        options += ["--help"]
        text = no_such_option(path, exc.option_name, options)
    elif isinstance(exc, click.UsageError):
        text = f"{path}: error: {exc.format_message()}\nSee '{path} --help'."
    else:
        text = f"{path}: error: {exc.format_message()}"
    sys.stderr.write(text + "\n")
    return exc.exit_code


def run(command: Any, prog: str, args: list[str]) -> int:
    """Run the click command tree without click's standalone error printing; the exit
    code. Shell completion, --help and --version behave as in standalone mode."""
    try:
        result = command.main(args, prog_name=prog, standalone_mode=False)
    except click.ClickException as exc:
        return report(exc, prog, getattr(command, "commands", {}))
    except typer.Abort:
        sys.stderr.write("Aborted.\n")
        return 1
    # Non-standalone click returns an Exit's code, or the command's return value.
    return result if isinstance(result, int) else 0
