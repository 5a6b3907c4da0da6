"""Installing `.ttbundle` archives into a models folder, and uninstalling them.

A step above `archive` (which it reads archives with) and `registry` (whose index of
checked bundles it keeps current): neither of those knows installs exist.
"""
