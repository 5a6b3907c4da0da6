"""`.ttbundle` archives: which files a bundle is, the manifest of their digests, the
deterministic writer, the reader with verified extraction, and installs.

The reader never calls the writer or the validator; packing a bundle with validation
first is `ttbundles.build`, a step above.
"""
