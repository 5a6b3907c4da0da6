"""The `ttbundle` command: assembles the commands and owns error presentation.

Library errors are typed (`TTBundleError` with diagnostics); here they become clean
messages and exit codes: 0 success, 1 invalid input, 2 usage, 3 internal error (with the
traceback only under TT_BUNDLES_DEBUG=1).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Annotated, Any

import typer

from ttbundles import envs
from ttbundles.errors import Diagnostic, Severity, TTBundleError

from . import (
    archive,
    bench,
    card,
    compat,
    conformance,
    demo,
    distribution,
    doctor,
    info,
    init,
    plan,
    validate,
)

app = typer.Typer(
    name="ttbundle",
    help="Validate, pack, verify and install Tenstorrent model bundles for vLLM.\n\n"
    "Example: ttbundle validate ./my-bundle && ttbundle pack ./my-bundle -o dist/\n\n"
    "Example: ttbundle demo --query\n\n"
    "Docs (Markdown in the source tree, readable offline): docs/index.md; every command and "
    "option: docs/reference/cli.md; what a TTB code means and what to do: "
    "docs/reference/codes.md.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # typer's --install-completion / --show-completion
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import version

        typer.echo(f"ttbundle {version('ttbundles')}")
        raise typer.Exit()


@app.callback()
def _root(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = False,
) -> None:
    """Validate, pack, verify and install Tenstorrent model bundles for vLLM."""


app.command()(validate.validate)
app.command()(archive.pack)
app.command()(archive.verify)
app.command()(archive.install)
app.command()(archive.uninstall)
app.command()(distribution.push)
app.command()(distribution.pull)
app.command()(distribution.sign)
app.command("list")(info.list_bundles)
app.command()(info.inspect)
app.command()(card.card)
app.command()(info.schema)
app.command()(init.init)
app.command()(init.migrate)
app.command()(demo.demo)
app.command()(doctor.doctor)
app.command()(compat.compat)
app.command("test")(conformance.test)
app.command()(bench.bench)
app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="MODEL [OPTIONS] [VLLM SERVE OPTIONS]",
)(plan.plan)


def command() -> Any:
    """The click command tree, with value names in its help (`names`)."""
    from .names import apply_value_names

    root = apply_value_names(typer.main.get_command(app))
    for name, sub in root.commands.items():  # each command's -h names its docs page
        sub.epilog = sub.epilog or f"Docs: docs/reference/cli.md#ttbundle-{name}"
    return root


def main(argv: list[str] | None = None) -> None:
    """Run `ttbundle` (`answer`); a failed run ends without waiting for background threads.

    A command interrupted or failing while a daemon thread still works (`ttbundle test`'s
    golden loader importing torch when Ctrl-C comes) must not finalize the interpreter
    under it: that can hang for good (seen: the thread's import, cut by the shutdown,
    then no exit). Such a run flushes its output and ends at once; its own cleanup (the
    serving process stopped, the temporary folder removed) has run by then.
    """
    try:
        answer(argv)
    except SystemExit as exc:
        code = exc.code
        if code in (0, None) or not any(t.daemon and t.is_alive() for t in threading.enumerate()):
            raise
        if not isinstance(code, int):
            sys.stderr.write(f"{code}\n")
            code = 1
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def answer(argv: list[str] | None = None) -> None:
    """Run `ttbundle`, answering every error in the format asked for.

    With `--format json`, whatever happens prints one JSON object on stdout (the shape of
    `output.envelope`): the command's answer, a library error (exit 1), a usage error
    (TTB004, exit 2) or an internal error (exit 3). Otherwise errors go to stderr as text.
    """
    from .output import Format, Output, requested_format
    from .usage import run

    args = sys.argv[1:] if argv is None else list(argv)
    out = Output(requested_format(args))
    try:
        if out.format is Format.json:
            # Not standalone: usage errors reach us instead of click's text on stderr.
            code = command().main(args, prog_name="ttbundle", standalone_mode=False)
            sys.exit(code if isinstance(code, int) else 0)
        # Usage errors in one or two lines, with a did-you-mean (`usage`).
        code = run(command(), "ttbundle", args)
    except TTBundleError as exc:
        out.error(exc.diagnostics)
        sys.exit(1)
    except typer.TyperException as exc:  # only in JSON mode: otherwise click has shown it
        out.error([Diagnostic("TTB004", Severity.ERROR, exc.format_message(), hint=_usage(exc))])
        sys.exit(exc.exit_code)
    except (KeyboardInterrupt, typer.Abort):
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no tracebacks
        if envs.TT_BUNDLES_DEBUG:
            raise
        message = f"internal error: {type(exc).__name__}: {exc}"
        hint = "set TT_BUNDLES_DEBUG=1 to see the traceback, and please report it"
        if out.is_json:
            out.result(False, [Diagnostic("TTB005", Severity.ERROR, message, hint=hint)])
        else:
            sys.stderr.write(f"ttbundle: {message}\n{hint[0].upper()}{hint[1:]}.\n")
        sys.exit(3)
    sys.exit(code)


def _usage(exc: Exception) -> str:
    ctx = getattr(exc, "ctx", None)
    if ctx is None:
        return "see ttbundle --help"
    return f"see {ctx.command_path} --help"


if __name__ == "__main__":
    main()
