"""The `ttbundle` command: assembles the commands and owns error presentation.

Library errors are typed (`TTBundleError` with diagnostics); here they become clean
messages and exit codes: 0 success, 1 invalid input, 2 usage, 3 internal error (with the
traceback only under TTBUNDLE_DEBUG=1).
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ttbundles import envs
from ttbundles.errors import TTBundleError

from . import archive, conformance, demo, doctor, info, init, plan, validate

app = typer.Typer(
    name="ttbundle",
    help="Validate, pack, verify and install Tenstorrent model bundles for vLLM.",
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
app.command("list")(info.list_bundles)
app.command()(info.inspect)
app.command()(info.schema)
app.command()(init.init)
app.command()(init.migrate)
app.command()(demo.demo)
app.command()(doctor.doctor)
app.command("test")(conformance.test)
app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    options_metavar="MODEL [OPTIONS] [VLLM SERVE OPTIONS]",
)(plan.plan)


def main() -> None:
    from .output import Output
    from .usage import run

    try:
        code = run(app, "ttbundle")
    except TTBundleError as exc:
        Output().diagnostics(exc.diagnostics, stderr=True)
        sys.exit(1)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no tracebacks
        if envs.TTBUNDLE_DEBUG:
            raise
        sys.stderr.write(
            f"ttbundle: internal error: {type(exc).__name__}: {exc}\n"
            "Set TTBUNDLE_DEBUG=1 to see the traceback, and please report it.\n"
        )
        sys.exit(3)
    sys.exit(code)


if __name__ == "__main__":
    main()
