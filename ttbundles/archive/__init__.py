"""`.ttbundle` archives: which files a bundle is, the manifest of their digests, the
deterministic writer, and the reader with verified extraction. Installing an archive
into a models folder is `ttbundles.installer`, a step above.

The reader never calls the writer or the validator; packing a bundle with validation
first is `ttbundles.build`, a step above.
"""
