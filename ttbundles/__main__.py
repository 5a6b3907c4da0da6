"""`python -m ttbundles`: the `ttbundle` command."""

from ttbundles.cli.app import main

main()
