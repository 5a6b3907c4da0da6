"""What one decode tells the generator about its inputs (TT-Metal's decode input-update
contract v1, `models/common/decode_contract.py`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ttbundles.serving.stats import STATS


@dataclass(frozen=True)
class DecodeCommands:
    """What one decode tells the generator about its inputs (decode contract v1).

    - `reload_inputs`: host tokens, positions and page table are authoritative: every
      step that is not a steady device-sampling decode of a generator that keeps its
      inputs resident (declares async decode, traces on).
    - `reload_page_table`: a steady step whose page table changed (new KV blocks).
    - `reload_sampling_params` and `reset_sampling_state`: the first device-sampling
      decode of a layout (after a prefill, a host-sampled step, or any change of which
      request holds which slot): parameters and seeds are registered, per-slot history
      rebuilt.
    A legacy class gets `reset_batch` on device-sampling calls in place of all this; a
    class naming `reuse_device_decode_inputs` gets `reuse_inputs` either way.
    """

    reload_inputs: bool
    reload_page_table: bool
    reload_sampling_params: bool
    reset_sampling_state: bool

    @property
    def transition(self) -> bool:
        return self.reset_sampling_state

    @property
    def reuse_inputs(self) -> bool:
        """A steady decode with nothing to restage, not even the page table: what the
        autoports' `reuse_device_decode_inputs=True` lets them skip checking."""
        return not self.reload_inputs and not self.reload_page_table

    @classmethod
    def decide(
        cls,
        *,
        device: bool,
        resident: bool,
        layout: tuple[str | None, ...],
        previous_layout: tuple[str | None, ...] | None,
        page_table: torch.Tensor,
        previous_page_table: torch.Tensor | None,
    ) -> DecodeCommands:
        """The commands for a decode: `device` (it samples on the device), `resident`
        (the generator keeps its inputs resident), the slot layout (request id per slot)
        and page table of this decode and of the last device-sampling decode (None: none
        since the last prefill or host-sampled step)."""
        transition = device and layout != previous_layout
        steady = device and resident and not transition
        table_changed = previous_page_table is not page_table and (
            previous_page_table is None
            or previous_page_table.shape != page_table.shape
            or not torch.equal(previous_page_table, page_table)
        )
        return cls(
            reload_inputs=not steady,
            reload_page_table=steady and table_changed,
            reload_sampling_params=transition,
            reset_sampling_state=transition,
        )

    def count(self) -> None:
        """What this decode tells the generator, in the serving counters."""
        STATS.count("commands.reload_inputs" if self.reload_inputs else "commands.resident")
        if self.reload_page_table:
            STATS.count("commands.reload_page_table")
        if self.reset_sampling_state:
            STATS.count("commands.reset_sampling_state")
