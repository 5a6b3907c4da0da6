"""The `custom_class` speculative method on vLLM releases that take custom methods
through `register_speculative_method` (0.34.0; `compat.register_model_owned_drafter`
registers this config by name, so it is imported only where a launch uses it).

`custom_class` is the generator's own drafter (`propose_draft_tokens`): no draft
checkpoint, the target's model config, no prompt lookup; `model` is the reference
plugin's marker (`format.contract.MODEL_OWNED_DRAFTER`) and defaults to it. Its
`speculator_class` names that marker too: vLLM's GPU runner would import it, the TT
runner never does (it calls the loaded generator).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from vllm.v1.worker.gpu.spec_decode.speculator_config import SpeculatorConfig

from ttbundles.format.contract import MODEL_OWNED_DRAFTER

if TYPE_CHECKING:
    from vllm.config import SpeculativeConfig


class ModelOwnedDrafterConfig(SpeculatorConfig):
    """vLLM's view of a generator that drafts for itself (checked on 0.34.0)."""

    speculator_class: ClassVar[str | None] = MODEL_OWNED_DRAFTER

    @classmethod
    def default_model(cls, spec: SpeculativeConfig) -> str | None:
        return MODEL_OWNED_DRAFTER
