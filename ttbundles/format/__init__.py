"""The bundle format: metadata (schema v1), the catalogue of capabilities and pooling
tasks (`capabilities`), device options, mesh names, the generator
contract (and its seed rule), parsing with JSON positions, the generated JSON Schema,
the rule that selects among bundles (`selection`), the isolated loader of bundle code
(`loader`), and the files a bundle's `tests` section names (`prompts`, `golden_file`).

Pure Python over pydantic: nothing here imports vLLM or torch.
"""
