"""`ttbundle demo`: the demo checkpoint, a `vllm serve` launcher (shared by the tests and
benchmarks), the OpenAI query, and the flow that ties them together."""
