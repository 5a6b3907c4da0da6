"""`python -m ttbundles`: the `ttbundle` command."""

import sys
from pathlib import Path

try:
    from ttbundles.cli.app import main
except ModuleNotFoundError as exc:
    if exc.name != "ttbundles.cli":
        raise
    # The CLI is part of the package only as installed (the wheel maps the top-level cli/
    # to ttbundles.cli); a source tree on sys.path, e.g. from the current folder, has none.
    source = Path(__file__).resolve().parent
    sys.exit(
        f"error: {source} is the source tree of ttbundles, without its CLI; run the "
        "installed `ttbundle` command, or `python -m ttbundles` from another folder "
        "(install with scripts/setup)"
    )

main()
