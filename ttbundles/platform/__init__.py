"""The vLLM side of ttbundles: platform, configuration plan, worker. Imports vLLM."""
