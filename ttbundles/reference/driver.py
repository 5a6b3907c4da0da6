"""The reference's driver: a prefill or a decode cut into its input, run and output.

What the contract's `prefill_forward` and `decode_forward` (`reference.generator`) do
between the host's arguments and the model (`reference.model`), each step a function:

- input: the host's arguments read and checked on the caller's thread, before anything
  is queued (`PrefillBatch.read`, `check_decode_commands`, `DecodeStep.read`), so a bad
  call fails where it was made;
- run: on the device queue, the resident inputs staged (`_stage_resident`) and the
  model run per lane over the rows that compute (`_run`, `_every_position`);
- output: the device sampler and the token feedback that make the next decode's
  resident inputs (`_prefill_sample`, `_decode_output`).

A card's generator has the same three steps (host tensors, trace, readback); keeping them
apart here is what lets a bundle author compare one of them at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import torch

from ttbundles.format.contract import LEGACY_RESET_KEYWORD, SamplingParams
from ttbundles.reference.attention import Segment
from ttbundles.reference.cache import PageTables, as_tables, host_tables, rows_of
from ttbundles.reference.config import ModelDims
from ttbundles.reference.readback import DeviceOutput, HostOutput, ReadEvent
from ttbundles.reference.sampling import DeviceSampler


def int_list(values: Any, count: int, name: str) -> list[int]:
    """A list/tensor of `count` ints (positions, lengths) as Python ints."""
    if isinstance(values, torch.Tensor):
        values = values.reshape(-1).tolist()
    values = [int(v) for v in values]
    if len(values) < count:
        raise ValueError(f"{name} has {len(values)} entries for {count} rows")
    return values[:count]


@dataclass(frozen=True)
class ResidentInputs:
    """The decode inputs kept "on the device" between steps, per slot (on a card: the
    decode trace's input tensors): tokens `[B]`, positions, page table `[B, W]`."""

    tokens: torch.Tensor
    positions: list[int]
    page_table: PageTables | None

    def remapped(self, remap: list[int]) -> ResidentInputs:
        """Slot i takes slot remap[i]'s inputs (slots past the remap stay)."""
        order = list(remap) + list(range(len(remap), len(self.positions)))
        index = torch.tensor(order)
        table = None if self.page_table is None else rows_of(self.page_table, index)
        return ResidentInputs(self.tokens[index], [self.positions[j] for j in order], table)


@dataclass(frozen=True)
class PrefillBatch:
    """A prefill's host inputs, read and checked: the rows that compute (`segments`),
    each row's slot and end, the sampler's rows (`live`: -1 for padding) and the token
    history a penalty reads (`[B, S]`, -1 past each row's end)."""

    batch: int
    segments: list[Segment]
    slots: list[int]
    ends: list[int]
    live: list[int]
    history: torch.Tensor
    tables: PageTables | None

    @classmethod
    def read(
        cls,
        tokens: torch.Tensor,
        prompt_lens: Any,
        start_pos: Any,
        empty_slots: Any,
        page_table: Any,
        page_tables_per_layer: Any,
    ) -> PrefillBatch:
        """Row i computes `tokens[i, start_pos[i]:prompt_lens[i]]` (see `prefill_forward`)."""
        batch = tokens.shape[0]
        ends = int_list(prompt_lens, batch, "prompt_lens")
        starts = [0] * batch if start_pos is None else int_list(start_pos, batch, "start_pos")
        slots = (
            list(range(batch))
            if empty_slots is None
            else int_list(empty_slots, batch, "empty_slots")
        )
        segments = []
        for row in range(batch):
            if ends[row] - starts[row] <= 0:
                continue
            if ends[row] > tokens.shape[1]:
                raise ValueError(
                    f"row {row}: chunk of positions {starts[row]}..{ends[row] - 1} needs "
                    f"tokens up to position {ends[row] - 1} but tokens has width "
                    f"{tokens.shape[1]} (tokens hold the row from position 0)"
                )
            segments.append(
                Segment(row, tokens[row, starts[row] : ends[row]].long(), starts[row], slots[row])
            )
        live = [slot if ends[row] > starts[row] else -1 for row, slot in enumerate(slots)]
        history = tokens.long().clone()
        for row, end in enumerate(ends):
            history[row, end:] = -1
        tables = host_tables(page_table, page_tables_per_layer)
        return cls(batch, segments, slots, ends, live, history, tables)


def check_decode_commands(
    enable_trace: bool,
    reload_inputs: bool,
    reload_page_table: bool,
    reset_sampling_state: bool,
    unknown: dict[str, Any],
) -> None:
    """Refuse what decode input-update contract v1 does not allow (`decode_forward`)."""
    if LEGACY_RESET_KEYWORD in unknown:
        raise ValueError(
            f"{LEGACY_RESET_KEYWORD} is not part of the decode input-update contract; "
            "the worker driving this generator predates it (send reload_inputs / "
            "reload_page_table / reload_sampling_params / reset_sampling_state)"
        )
    if unknown:
        raise TypeError(f"decode_forward got unexpected keywords: {', '.join(sorted(unknown))}")
    if reload_inputs and reload_page_table:
        raise ValueError("reload_page_table is meaningless with reload_inputs=True")
    if not reload_inputs and not enable_trace:
        raise ValueError(
            "Non-traced decode rebuilds its inputs every step: send reload_inputs=True"
        )
    if reset_sampling_state and not reload_inputs:
        raise ValueError(
            "reset_sampling_state needs reload_inputs=True (positions must be authoritative)"
        )


@dataclass(frozen=True)
class DecodeStep:
    """One decode's host inputs and commands, read on the caller's thread: the tokens,
    positions and tables the host sent (read only if `reload_inputs`/
    `reload_page_table` say so), the slot remap, and the sampling commands."""

    batch: int
    tokens: torch.Tensor  # [B]
    positions: list[int]
    tables: PageTables | None
    remap: list[int] | None
    reload_inputs: bool
    reload_page_table: bool
    sampling_params: SamplingParams | None = None
    reload_sampling_params: bool = False
    reset_sampling_state: bool = False
    prompt_tokens: torch.Tensor | None = None
    output_tokens: torch.Tensor | None = None
    grammar_bitmask: torch.Tensor | None = None  # [B, W] packed, per slot

    @classmethod
    def read(
        cls,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: Any,
        page_tables_per_layer: Any,
        slot_remap: Any,
        **commands: Any,
    ) -> DecodeStep:
        """`commands`: the remaining fields (reload_inputs, reload_page_table, sampling)."""
        batch = tokens.shape[0]
        host_tokens = tokens.reshape(batch, -1)[:, 0].long().clone()
        positions = int_list(start_pos, batch, "start_pos")
        tables = host_tables(page_table, page_tables_per_layer)
        remap = None if slot_remap is None else int_list(slot_remap, len(slot_remap), "slot_remap")
        if commands["reload_inputs"] and bool(
            (host_tokens[torch.tensor(positions) >= 0] < 0).any()
        ):
            raise ValueError(
                "reload_inputs=True but tokens has unknown (-1) entries for live slots"
            )
        return cls(batch, host_tokens, positions, tables, remap, **commands)


class Driver:
    """Prefill and decode between the contract and the model, mixed into the generator
    (`reference.generator`), which provides the model (`forward_segments`), the sampler,
    the device queue and the lanes."""

    dims: ModelDims
    lanes: int
    per_lane: int
    sampler: DeviceSampler
    _device_queue: ThreadPoolExecutor
    _resident: ResidentInputs | None
    # The model's forward pass (`reference.model`) and the drafter's bookkeeping
    # (`reference.drafter`): the driver calls them through the generator, so that a
    # subclass's override is the one that runs.
    forward_segments: Callable[..., torch.Tensor]
    _remember_pages: Callable[..., None]

    # ---- run: the model over a batch's rows, per lane --------------------------------

    def _run(
        self,
        segments: list[Segment],
        batch: int,
        page_table: Any,
        kv_cache: Any,
        slots: list[int] | None = None,
    ) -> torch.Tensor:
        """Logits `[B, V]` for a batch where only `segments`' rows are real (others 0).

        `slots[row]`: the batch slot of each row (prefill: `empty_slots`; decode: rows are
        slots). With lanes, each lane's rows run against its own cache."""
        if page_table is None:
            raise ValueError("the reference generator needs a page_table (paged KV cache only)")
        logits = torch.zeros(batch, self.dims.vocab_size, dtype=torch.float32)
        if not segments:
            return logits
        table = as_tables(page_table)
        for group, cache in self._lane_groups(segments, kv_cache, slots):
            rows = torch.tensor([s.row for s in group])
            logits[rows] = self.forward_segments(group, table, cache)
        return logits

    def _every_position(
        self,
        segments: list[Segment],
        batch: int,
        page_table: Any,
        kv_cache: Any,
        slots: list[int] | None,
        width: int,
        *,
        hidden: bool = False,
    ) -> torch.Tensor:
        """`[B, width, V]` logits (prompt logprobs), or `[B, width, hidden]` final hidden
        states (pooling), of every new token of each row (width: the longest chunk),
        zero past a row's chunk and in padding rows."""
        size = self.dims.hidden_size if hidden else self.dims.vocab_size
        out = torch.zeros(batch, width, size, dtype=torch.float32)
        if not segments:
            return out
        table = as_tables(page_table)
        for group, cache in self._lane_groups(segments, kv_cache, slots):
            every = self.forward_segments(group, table, cache, all_positions=True, hidden=hidden)
            for segment, rows in zip(group, every.split([len(s.tokens) for s in group])):
                out[segment.row, : len(rows)] = rows
        return out

    def _lane_groups(
        self, segments: list[Segment], kv_cache: Any, slots: list[int] | None = None
    ) -> list[tuple[list[Segment], Any]]:
        """The segments by lane, each with its lane's cache (one group without lanes); a
        row's lane is its slot's (`slots[row]`; None: rows are slots, as in decode)."""
        if self.lanes == 1:
            return [(segments, kv_cache)]
        if len(kv_cache) != self.lanes:
            raise ValueError(
                f"kv_cache has {len(kv_cache)} entries; with tt_data_parallel="
                f"{self.lanes} it must hold one cache per lane (allocate_kv_cache)"
            )
        by_lane: dict[int, list[Segment]] = {}
        for segment in segments:
            slot = segment.row if slots is None else slots[segment.row]
            by_lane.setdefault(slot // self.per_lane, []).append(segment)
        return [(group, kv_cache[lane]) for lane, group in sorted(by_lane.items())]

    # ---- prefill: run and output -----------------------------------------------------

    def _prefill_run(
        self,
        inputs: PrefillBatch,
        kv_cache: Any,
        sampling_params: SamplingParams | None,
        *,
        every_position: bool,
        hidden: bool,
    ) -> Any:
        """On the device queue: the forward over the chunks, then the output the caller
        asked for (`prefill_forward`'s forms)."""
        segments, slots = inputs.segments, inputs.slots
        self._remember_pages(
            [slots[s.row] for s in segments], inputs.tables, [s.row for s in segments], kv_cache
        )
        if every_position:
            width = max((len(s.tokens) for s in segments), default=1)
            return self._every_position(
                segments, inputs.batch, inputs.tables, kv_cache, slots, width, hidden=hidden
            )
        logits = self._run(segments, inputs.batch, inputs.tables, kv_cache, slots)
        if sampling_params is None:
            return logits.unsqueeze(1)
        return self._prefill_sample(inputs, logits, sampling_params)

    def _prefill_sample(
        self, inputs: PrefillBatch, logits: torch.Tensor, sampling_params: SamplingParams
    ) -> tuple[torch.Tensor, Any]:
        """Register each row's sampling state in its slot, then draw the token at its
        `prompt_lens` position: `(tokens [B, 1], log_probs)`."""
        self.sampler.ensure_capacity(max(inputs.slots) + 1)
        self.sampler.reload_params(inputs.live, sampling_params, inputs.ends)
        self.sampler.reset_state(inputs.live, sampling_params, inputs.ends, inputs.history, None)
        sampled, logprobs = self.sampler.sample(logits, inputs.live)
        return sampled.view(inputs.batch, 1), logprobs

    # ---- decode: run and output ----------------------------------------------------

    def _submit_decode(self, step: DecodeStep, kv_cache: Any, read_from_device: bool) -> Any:
        """Queue the decode; its host copy now (`read_from_device`), else the DeviceOutput
        for `read_decode_output`."""
        is_tokens = step.sampling_params is not None
        out = DeviceOutput(self._device_queue.submit(self._decode_step, step, kv_cache), is_tokens)
        if read_from_device:
            return self.process_decode_output_host(self.read_decode_output(out), is_tokens)
        return out

    def _stage_resident(self, step: DecodeStep) -> ResidentInputs:
        """On the device queue: the inputs this decode reads, from the last decode's
        resident ones (moved by the remap) or restaged from the host, as commanded."""
        resident = self._resident
        if step.remap is not None:
            self.sampler.ensure_capacity(len(step.remap))
            self.sampler.remap(step.remap)
            if resident is not None:
                resident = resident.remapped(step.remap)
        if step.reload_inputs:
            resident = ResidentInputs(step.tokens, step.positions, step.tables)
        elif resident is None:
            raise ValueError("no resident decode inputs: the first decode must reload_inputs")
        elif step.reload_page_table:
            resident = ResidentInputs(resident.tokens, resident.positions, step.tables)
        if resident.page_table is None:
            raise ValueError("the reference generator needs a page_table (paged KV cache only)")
        return resident

    def _decode_step(self, step: DecodeStep, kv_cache: Any) -> tuple[torch.Tensor, Any]:
        """On the device queue: one decode, input staged, run, output."""
        resident = self._stage_resident(step)
        positions = resident.positions
        segments = [
            Segment(row, resident.tokens[row : row + 1], positions[row])
            for row in range(step.batch)
            if positions[row] >= 0
        ]
        live = [s.row for s in segments]
        self._remember_pages(live, resident.page_table, live, kv_cache)
        logits = self._run(segments, step.batch, resident.page_table, kv_cache)
        return self._decode_output(step, resident, logits)

    def _decode_output(
        self, step: DecodeStep, resident: ResidentInputs, logits: torch.Tensor
    ) -> tuple[torch.Tensor, Any]:
        """Logits for host sampling, else the device sampler's tokens, which with their
        positions advanced become the next decode's resident inputs (token feedback)."""
        params = step.sampling_params
        if params is None:
            # Host sampling: the host knows the next tokens; it reloads every step.
            self._resident = None
            return logits.unsqueeze(1), None
        positions = resident.positions
        slots = [row if positions[row] >= 0 else -1 for row in range(step.batch)]
        following = [p + 1 for p in positions]
        self.sampler.ensure_capacity(step.batch)
        if step.reload_sampling_params:
            self.sampler.reload_params(slots, params, following)
        if step.reset_sampling_state:
            self.sampler.reset_state(
                slots, params, following, step.prompt_tokens, step.output_tokens
            )
        sampled, logprobs = self.sampler.sample(logits, slots, step.grammar_bitmask)
        # Token feedback: this step's tokens and positions are the next step's inputs.
        advanced = [p + 1 if p >= 0 else p for p in positions]
        self._resident = ResidentInputs(sampled, advanced, resident.page_table)
        return sampled, logprobs

    # ---- readback: a decode's output to the host (the contract's two calls) ---------

    def read_decode_output(self, out: DeviceOutput, async_read: bool = False) -> Any:
        """Copy a decode result to the host.

        `async_read=False`: the host copy. `async_read=True`: `(host_out, events)`; the
        copy runs on the device queue, and host_out is valid once every event was waited
        on (on a card: `ttnn.event_synchronize`; here `event.wait()`).
        """
        if not async_read:
            return HostOutput.copy_of(out)
        host = HostOutput()
        future = self._device_queue.submit(lambda: host.fill(out))
        return host, [ReadEvent(future)]

    def process_decode_output_host(self, host_out: HostOutput, is_tokens: bool = False) -> Any:
        """`(tokens [B] int64, log_probs)` when `is_tokens`, else `(logits [B, 1, V], None)`;
        a verify block keeps its shape (`argmax_ids` `[B, 1+K]`, `logits` `[B, 1+K, V]`).
        Call it only after the read's events were waited on."""
        if not isinstance(host_out, HostOutput) or host_out.value is None:
            raise ValueError("process_decode_output_host needs a completed read_decode_output")
        primary, logprobs = host_out.value
        if is_tokens != (not primary.is_floating_point()):
            kind = "sampled tokens" if is_tokens else "logits"
            raise ValueError(f"is_tokens={is_tokens} but the decode output is not {kind}")
        if is_tokens:
            if primary.dim() == 2:  # a verify's argmax ids, [B, 1+K]
                return primary.long(), logprobs
            return primary.reshape(-1).long(), logprobs
        if primary.dim() == 3:  # a verify's logits, [B, 1+K, V]
            return primary, logprobs
        return primary.reshape(primary.shape[0], 1, -1), logprobs
