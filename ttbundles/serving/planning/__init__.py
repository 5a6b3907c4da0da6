"""Configuration time: what a server will do, decided before any engine starts.

The planner (`configuration.plan_config`) is called from the platform's configuration
hook, in `vllm serve` and in `ttbundle plan` alike (one code path, so the plan shows what a
server does). It reads the bundle's declarations and vLLM's configuration and makes the
typed `plan.Plan`, every adjustment a decision and every impossibility a refusal with a
code: the runner (`runner`, `pooling`), the topology (lanes, data-parallel engines, device
groups, hosts), the admissions (speculation, KV groups, windows, references), the device
and server options (`options`), the chat defaults.

The engine side reads only the plan (`plan.served_plan`); nothing here imports the
runner, the API server's installs or vLLM's engine (`tests/test_architecture.py`).
"""
