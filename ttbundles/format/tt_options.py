"""The Tenstorrent device options: `additional_config["tt"]` on the vLLM command line.

Bundles give defaults for them per target (`targets.<mesh>.additional_config`); the user's
`--additional-config.tt.KEY VALUE` wins. Every field is optional here so that a partial
set (a bundle's defaults, the user's overrides) can be told apart from an unset one; the
effective defaults are applied by the configuration plan.
"""

from __future__ import annotations

import ipaddress
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

SampleOnDeviceMode = Literal["all", "decode_only"]

FABRIC_CONFIGS = (
    "DISABLED",
    "FABRIC_1D",
    "FABRIC_1D_RING",
    "FABRIC_2D",
    "FABRIC_2D_TORUS_X",
    "FABRIC_2D_TORUS_Y",
    "FABRIC_2D_TORUS_XY",
)
FABRIC_RELIABILITY_MODES = (
    "STRICT_SYSTEM_HEALTH_SETUP_MODE",
    "RELAXED_SYSTEM_HEALTH_SETUP_MODE",
    "DYNAMIC_RECONFIGURATION_SETUP_MODE",
)

PositiveInt = Annotated[int, Field(gt=0)]
NonNegativeInt = Annotated[int, Field(ge=0)]


class TTOptions(BaseModel):
    """Device options of the Tenstorrent platform (all optional; None means unset)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    sample_on_device_mode: SampleOnDeviceMode | None = Field(
        None,
        description="Sample on the device for every step ('all') or decode steps only "
        "('decode_only'); must be a mode the bundle declares. Unset: sample on the host.",
    )
    always_compat_sampling: bool | None = Field(
        None, description="Always sample on the host with vLLM's sampler."
    )
    trace_mode: Literal["all", "decode_only", "none"] | None = Field(
        None, description="Which steps are captured and replayed as device traces."
    )
    enable_model_warmup: bool | None = Field(
        None, description="Run the generator's warm-up before serving."
    )
    trace_region_size: NonNegativeInt | None = Field(
        None, description="Device memory reserved for traces, in bytes."
    )
    worker_l1_size: NonNegativeInt | None = Field(None, description="Worker L1 size, bytes.")
    l1_small_size: NonNegativeInt | None = Field(None, description="L1 small region, bytes.")
    dispatch_core_axis: Literal["row", "col"] | None = Field(
        None, description="Axis of the dispatch cores."
    )
    fabric_config: Literal[FABRIC_CONFIGS] | None = Field(  # type: ignore[valid-type]
        None, description="Fabric topology between the chips of the mesh."
    )
    fabric_reliability_mode: Literal[FABRIC_RELIABILITY_MODES] | None = Field(  # type: ignore[valid-type]
        None, description="How strictly fabric health is checked at start."
    )
    optimizations: Literal["performance", "accuracy"] | None = Field(
        None, description="Passed to initialize_vllm_model as `optimizations`."
    )
    decode_interleave_enabled: bool | None = Field(
        None,
        description="Interleave decode steps between the chunks of a long prefill.",
    )
    decode_interleave_prefill_steps: PositiveInt | None = Field(
        None, description="Prefill steps taken before decode steps are interleaved."
    )
    decode_interleave_decode_steps: PositiveInt | None = Field(
        None, description="Decode steps interleaved after each run of prefill steps."
    )

    def merged_over(self, defaults: TTOptions) -> TTOptions:
        """These options, with what is unset here taken from `defaults`."""
        values = defaults.model_dump(exclude_none=True)
        values.update(self.model_dump(exclude_none=True))
        return TTOptions(**values)


TT_OPTION_NAMES: tuple[str, ...] = tuple(TTOptions.model_fields)


class ServerOptions(BaseModel):
    """Options of the API server, given with the device options (`additional_config["tt"]`)
    but by the operator only: a bundle's target cannot set them (they are not device
    options, and a bundle must not open the server's network to its clients)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    allow_private_media_urls: bool | list[str] = Field(
        False,
        description="Fetch http(s) image URLs whose host is a loopback, private, link-local, "
        "multicast, unspecified or reserved address: true for all of them, or a list of "
        'networks (CIDR, e.g. ["10.1.2.0/24"]) for those only. Default: refused (TTB220).',
    )

    @field_validator("allow_private_media_urls")
    @classmethod
    def _networks(cls, value: bool | list[str]) -> bool | list[str]:
        if isinstance(value, list):
            for network in value:
                try:
                    ipaddress.ip_network(network, strict=False)
                except ValueError:
                    raise ValueError(
                        f"{network!r} is not a network (write 10.1.2.0/24, fd00::/8 or an address)"
                    ) from None
        return value


SERVER_OPTION_NAMES: tuple[str, ...] = tuple(ServerOptions.model_fields)
