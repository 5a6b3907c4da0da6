"""What registers: every bundle found, which one serves each TT architecture and why,
requirements against the running environment, the index of checked bundles, and what
can be served on this machine. The rule that selects among bundles and the isolated
loader of bundle code are part of the format (`format.selection`, `format.loader`).

Imports neither vLLM nor torch: `ttbundle list` and vLLM's general plugin share it.
"""
