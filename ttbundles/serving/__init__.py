"""The vLLM side: entry points, registration, the platform, the configuration plan and
its dry run (`ttbundle plan`), worker, model runner, scheduler, sampling path, stats.

The one package (with `reference/`) that imports vLLM and torch. `plugin` is the
exception that keeps the rule cheap: vLLM loads it in every process, so it imports
nothing heavy until a hook runs. This `__init__` imports nothing.
"""
