"""What registers: every bundle found, which one serves each TT architecture and why,
requirements against the running environment, and the isolated loader of bundle code.

Imports neither vLLM nor torch: `ttbundle list` and vLLM's general plugin share it.
"""
