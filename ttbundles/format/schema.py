"""The JSON Schema of `vllm_metadata.json`, generated from the pydantic model.

`python -m ttbundles.format.schema > schemas/vllm_metadata.schema.json` regenerates the
checked-in file; a test fails when the two drift.
"""

from __future__ import annotations

import json
from typing import Any

from ttbundles.format.metadata import SCHEMA_ID, BundleMetadata


def generate_schema() -> dict[str, Any]:
    schema = BundleMetadata.model_json_schema(by_alias=True, mode="validation")
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": SCHEMA_ID,
        **schema,
    }


def render_schema() -> str:
    return json.dumps(generate_schema(), indent=2, sort_keys=False) + "\n"


if __name__ == "__main__":
    import sys

    sys.stdout.write(render_schema())
