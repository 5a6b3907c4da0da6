"""`ttbundle bench`: a bundle's serving speed under vLLM's own benchmark workloads, and
the bundle's declared targets (`performance` in the metadata) checked against it."""
