"""What a family is (`Family`), apart from the table so that each family's module can
import it without importing the others."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ttbundles.reference.config import ModelDims, ModelStyle


def base_style(hf_config: Any, dims: ModelDims) -> ModelStyle:
    """Llama's forward pass: every `ModelStyle` default."""
    return ModelStyle()


@dataclass(frozen=True)
class Family:
    """One family of checkpoints the reference reads.

    `architectures`: the Hugging Face architectures it reads (`config.architectures`);
    `pooling_only`: they carry a head vLLM's pooler applies on the host, so they are
    served only by the pooling runner; `claims`: which configs are this family's, None
    for a family that shares the base's forward pass (it claims nothing: what no
    family claims reads as the base); `style`: how its forward pass differs from Llama's,
    refusing (NotImplementedError) a variant the reference does not implement;
    `generator`: the reference generator ("module:Class") that reads it, the shared
    forward pass's unless the family's layers need their own (a recurrent hybrid).
    """

    name: str
    architectures: tuple[str, ...]
    style: Callable[[Any, ModelDims], ModelStyle] = base_style
    claims: Callable[[Any], bool] | None = None
    pooling_only: bool = False
    generator: str = "ttbundles.reference.generator:ReferenceLlamaGenerator"

    def generator_class(self) -> type:
        """The generator class that reads this family's checkpoints (imported here)."""
        import importlib

        module, name = self.generator.split(":")
        return getattr(importlib.import_module(module), name)
