"""Checking bundles: the whole-bundle check, the static adapter check, the import check
in a subprocess, and the checks across bundles of one folder.

Bundle code never runs here except in `imports`' subprocess; nothing imports vLLM or
torch.
"""
