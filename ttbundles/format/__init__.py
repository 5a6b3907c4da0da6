"""The bundle format: metadata (schema v1), device options, mesh names, the generator
contract, parsing with JSON positions, and the generated JSON Schema.

Pure Python over pydantic: nothing here imports vLLM or torch.
"""
