"""The reference Qwen2.5-VL generator: TT-Metal's vision-language contract in plain torch.

It speaks the contract of TT-Metal's `Qwen2_5_VLForConditionalGeneration`
(`models/demos/qwen25_vl/tt/generator_vllm.py`), computing with the reference text
generator (`reference.generator`, whose Qwen2 text tower is Qwen2.5-VL's) and the
reference vision tower (`reference.vision`):

- `prefill_forward(tokens, page_table, kv_cache, prompt_lens, enable_trace, **kwargs)`
  takes `pixel_values` and `image_grid_thw` as lists aligned with the batch rows, as the
  reference plugin's `_gather_multi_modal_inputs` sends them: `None` for a text-only row,
  else the row's images (a list of one tensor per image, `[patches_i, 1176]` and `[3]`,
  or the row's images concatenated, `[sum patches, 1176]` and `[n, 3]`). It runs the
  vision tower on the images this prefill computes, puts their embeddings at the
  `<|image_pad|>` placeholders, places every token with M-RoPE (`reference.mrope`) and
  returns `(logits [B, 1, V], rope_deltas [B, 1])`.
- `decode_forward(..., rope_deltas_all_users=None, ...)` (decode input-update contract
  v1, as the text reference) places slot s's token at `pos + delta[s]`; the deltas are
  per-slot state, replaced by `rope_deltas_all_users` (slot 0 first, not padded: missing
  slots get 0) and moved by `slot_remap` when no new list comes.

Where it goes beyond TT-Metal's class (which asserts `start_pos == 0`): chunked prefill
and prefix caching. Row i computes positions `start_pos[i] .. prompt_lens[i] - 1`; every
image needs its `image_grid_thw` (positions depend on all earlier images), but only the
images whose placeholders fall in that range need `pixel_values`: vLLM drops the pixels of
images a prefix-cache hit covers and keeps their grids (`strip_covered_mm_data`), and a
`None` entry for such an image is expected. An image cut by a chunk boundary is encoded
whole in each chunk that holds part of it. Lanes (`tt_data_parallel` > 1) work as in the
text reference, each slot with its own delta.

TT-Metal's class ignores `sampling_params` in prefill and returns logits (the worker
samples the first token on the host); so does this one, so the two are interchangeable.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from ttbundles.format.contract import SamplingParams
from ttbundles.reference.attention import Segment
from ttbundles.reference.cache import KVCache
from ttbundles.reference.config import ModelDims, rope_frequencies, rope_parameters
from ttbundles.reference.driver import int_list
from ttbundles.reference.generator import ReferenceLlamaGenerator
from ttbundles.reference.mrope import ImageSpan, image_spans, mrope_cos_sin, mrope_positions
from ttbundles.reference.sampling import MAX_DEVICE_TOP_K
from ttbundles.reference.vision import VisionTower
from ttbundles.reference.vision_qwen3 import Qwen3VisionTower
from ttbundles.reference.weights import LlamaWeights, checkpoint_dir, load_safetensors

# Keywords prefill_forward reads from **kwargs; any other is a TypeError.
PREFILL_KEYWORDS = frozenset(
    {
        "empty_slots",
        "start_pos",
        "sampling_params",
        "pixel_values",
        "image_grid_thw",
        "page_tables_per_layer",
    }
)


@dataclass(frozen=True)
class VisionSegment(Segment):
    """A prefill chunk of a vision-language row: its M-RoPE positions and, for the
    placeholders in the chunk, the image embeddings that replace their token embeddings."""

    rope_positions: torch.Tensor = field(default_factory=lambda: torch.zeros(3, 0))  # [3, L]
    image_index: torch.Tensor = field(default_factory=lambda: torch.zeros(0, dtype=torch.long))
    image_embeds: torch.Tensor | None = None  # [len(image_index), hidden]
    deepstack: tuple[torch.Tensor, ...] = ()  # Qwen3-VL: per layer, [len(image_index), hidden]


@dataclass(frozen=True)
class RowImage:
    """One image of a row, as the worker sent it: its grid, and its patches or None."""

    grid: tuple[int, int, int]
    pixels: torch.Tensor | None  # [t * h * w, C * T * P * P]


def text_state(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The language model's tensors under `LlamaWeights`' names: transformers 5 writes
    `model.language_model.*`, the hub's Qwen2.5-VL files `model.*`; `lm_head` as is."""
    out = {}
    for name, tensor in state.items():
        if name.startswith("model.language_model."):
            out["model." + name[len("model.language_model.") :]] = tensor
        elif name.startswith(("model.", "lm_head.")) and not name.startswith("model.visual."):
            out[name] = tensor
    return out


def _grids(value: Any, row: int) -> list[tuple[int, int, int]]:
    """A row's image grids: a tensor `[n, 3]` / `[3]`, or a list of them per image."""
    if value is None:
        return []
    items = list(value) if isinstance(value, list | tuple) else [value]
    grids = []
    for number, item in enumerate(items):
        if item is None:
            raise ValueError(
                f"row {row}: image {number} has no image_grid_thw (M-RoPE positions need "
                "every image's grid, also for images a prefix-cache hit covers)"
            )
        for t, h, w in torch.as_tensor(item).reshape(-1, 3).tolist():
            grids.append((int(t), int(h), int(w)))
    return grids


def row_images(pixel_values: Any, image_grid_thw: Any, row: int) -> list[RowImage]:
    """Pair a row's `pixel_values` entry with its `image_grid_thw` entry, image by image.

    Pixels come as one tensor per image (None: not sent, e.g. stripped by a prefix-cache
    hit), or as the row's images concatenated (split here by the grids)."""
    grids = _grids(image_grid_thw, row)
    if pixel_values is None:
        return [RowImage(grid, None) for grid in grids]
    if not grids:
        raise ValueError(f"row {row}: pixel_values without image_grid_thw")
    sizes = [t * h * w for t, h, w in grids]
    if isinstance(pixel_values, torch.Tensor):
        if pixel_values.shape[0] != sum(sizes):
            raise ValueError(
                f"row {row}: pixel_values has {pixel_values.shape[0]} patch rows, the "
                f"grids {grids} need {sum(sizes)}"
            )
        pixels: list[torch.Tensor | None] = list(torch.split(pixel_values, sizes))
    else:
        pixels = list(pixel_values)
    if len(pixels) != len(grids):
        raise ValueError(
            f"row {row}: {len(pixels)} pixel_values entries for {len(grids)} image grids"
        )
    for number, (tensor, size) in enumerate(zip(pixels, sizes, strict=True)):
        if tensor is not None and not tensor.is_floating_point():
            raise ValueError(
                f"row {row}: image {number}'s pixel_values are {tensor.dtype}, not "
                "normalised floats: vLLM leaves pixels raw when the registered class "
                "declares supports_mm_device_do_normalize (vLLM's own Qwen2.5-VL does); "
                "a TT class must not (TT-Metal's does not)"
            )
        if tensor is not None and tensor.shape[0] != size:
            raise ValueError(
                f"row {row}: image {number} has {tensor.shape[0]} patch rows, its grid "
                f"{grids[number]} needs {size}"
            )
    return [RowImage(g, p) for g, p in zip(grids, pixels, strict=True)]


def _per_row(value: Any, batch: int, name: str) -> list[Any]:
    if value is None:
        return [None] * batch
    value = list(value)
    if len(value) != batch:
        raise ValueError(
            f"{name} has {len(value)} entries for {batch} rows (one per row: None for a "
            "text-only row)"
        )
    return value


def _delta(value: Any) -> int:
    return int(torch.as_tensor(value).reshape(-1)[0])


class ReferenceQwen2_5_VLGenerator(ReferenceLlamaGenerator):
    """TT-Metal's Qwen2.5-VL generator contract, in torch, on the host (module docstring)."""

    model_capabilities = {
        "supports_prefix_caching": True,
        "supports_async_decode": True,
        "supports_sample_on_device": True,
        "supports_chunked_prefill": True,
        "supports_device_penalties": True,
        "max_device_top_k": MAX_DEVICE_TOP_K,
    }
    decode_input_update_contract = 1
    vision_tower_class: Any = VisionTower

    def __init__(
        self,
        weights: LlamaWeights,
        dims: ModelDims,
        inv_freq: torch.Tensor,
        vision: VisionTower,
        mrope_section: list[int],
        image_token_id: int,
        attention_scaling: float = 1.0,
        max_batch_size: int = 32,
        max_seq_len: int = 2048,
        lanes: int = 1,
        interleaved_mrope: bool = False,
    ):
        super().__init__(
            weights, dims, inv_freq, attention_scaling, max_batch_size, max_seq_len, lanes
        )
        self.interleaved_mrope = interleaved_mrope
        if sum(mrope_section) != inv_freq.shape[0]:
            raise ValueError(
                f"mrope_section {mrope_section} must sum to head_dim / 2 = {inv_freq.shape[0]}"
            )
        if vision.dims.out_hidden_size != dims.hidden_size:
            raise ValueError(
                f"the vision tower outputs {vision.dims.out_hidden_size} values per token, "
                f"the language model's hidden size is {dims.hidden_size}"
            )
        self.vision = vision
        self.mrope_section = list(mrope_section)
        self.image_token_id = image_token_id
        # Per-slot rope deltas "on the device": only the device queue reads or replaces them.
        self._rope_deltas = torch.zeros(max_batch_size, dtype=torch.long)

    # ---- construction ----------------------------------------------------------------

    @classmethod
    def initialize_vllm_model(  # type: ignore[override]
        cls,
        hf_config: Any,
        mesh_device: Any,
        max_batch_size: int,
        max_seq_len: int,
        tt_data_parallel: int = 1,
        optimizations: str | None = None,
    ) -> ReferenceQwen2_5_VLGenerator:
        """Load the Qwen2.5-VL checkpoint named by `hf_config._name_or_path`, float32
        (TT-Metal's signature; `mesh_device` and `optimizations` change nothing here)."""
        text = hf_config.get_text_config() if hasattr(hf_config, "get_text_config") else hf_config
        vision_config = getattr(hf_config, "vision_config", None)
        if vision_config is None:
            raise ValueError("hf_config has no vision_config: not a Qwen2.5-VL checkpoint")
        dims = ModelDims.from_hf_config(text)
        inv_freq, attention_scaling = rope_frequencies(text, dims)
        section = rope_parameters(text).get("mrope_section")
        if not section:
            raise ValueError("the text config's rope parameters lack mrope_section")
        state = load_safetensors(checkpoint_dir(hf_config))
        tied = bool(
            getattr(hf_config, "tie_word_embeddings", False)
            or getattr(text, "tie_word_embeddings", False)
        )
        weights = LlamaWeights.from_state_dict(text_state(state), dims, tied)
        vision = cls.vision_tower_class.from_state_dict(state, vision_config)
        return cls(
            weights,
            dims,
            inv_freq,
            vision,
            list(section),
            int(hf_config.image_token_id),
            attention_scaling,
            max_batch_size,
            max_seq_len,
            lanes=tt_data_parallel,
            interleaved_mrope=bool(rope_parameters(text).get("mrope_interleaved", False)),
        )

    # ---- inputs of the first layer ---------------------------------------------------

    def _delta_of(self, slot: int) -> int:
        deltas = self._rope_deltas
        return int(deltas[slot]) if slot < deltas.shape[0] else 0

    def segment_inputs(
        self, segments: list[Segment], token_ids: torch.Tensor, positions: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Token embeddings with the image embeddings at the placeholders, and M-RoPE:
        prefill chunks carry their positions (`VisionSegment`); a decode token of slot s
        at cache position p sits at `p + delta[s]` on all three axes."""
        x = self.weights.embed_tokens[token_ids]  # [T, hidden], a copy
        rope_rows, offset = [], 0
        for segment in segments:
            length = len(segment.tokens)
            if isinstance(segment, VisionSegment):
                rope_rows.append(segment.rope_positions)
                if segment.image_embeds is not None:
                    x[offset + segment.image_index] = segment.image_embeds
            else:
                shifted = positions[offset : offset + length] + self._delta_of(segment.row)
                rope_rows.append(shifted.expand(3, -1))
            offset += length
        cos, sin = mrope_cos_sin(
            torch.cat(rope_rows, dim=1),
            self.inv_freq,
            self.mrope_section,
            self.attention_scaling,
            self.interleaved_mrope,
        )
        return x, cos, sin

    def residual_additions(
        self, segments: list[Segment]
    ) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
        """Deepstack (Qwen3-VL): image feature k added at the image tokens after layer k."""
        index, values, offset = [], [], 0
        for segment in segments:
            if isinstance(segment, VisionSegment) and segment.deepstack:
                index.append(segment.image_index + offset)
                values.append(segment.deepstack)
            offset += len(segment.tokens)
        if not index:
            return {}
        tokens_at = torch.cat(index)
        return {
            layer: (tokens_at, torch.cat([per_layer[layer] for per_layer in values]))
            for layer in range(len(values[0]))
        }

    # ---- prefill ---------------------------------------------------------------------

    def _plan_row(
        self, row: int, tokens: torch.Tensor, start: int, end: int, images: list[RowImage]
    ) -> tuple[VisionSegment, int, list[tuple[ImageSpan, RowImage]]]:
        """Row `row`'s chunk `start .. end - 1`: its segment (image embeddings still to
        fill), its rope delta, and the images whose placeholders the chunk holds."""
        merge = self.vision.dims.merge_size
        spans = image_spans(
            tokens[:end], self.image_token_id, [image.grid for image in images], merge
        )
        positions, delta = mrope_positions(end, spans, merge)
        needed = []
        for number, span in enumerate(spans):
            if span.start < end and span.end > start:
                if images[number].pixels is None:
                    raise ValueError(
                        f"row {row}: image {number} has placeholders at positions "
                        f"{span.start}..{span.end - 1}, which this prefill computes "
                        f"({start}..{end - 1}), but no pixel_values were sent for it"
                    )
                needed.append((span, images[number]))
        segment = VisionSegment(
            row, tokens[start:end].long(), start, rope_positions=positions[:, start:end]
        )
        return segment, delta, needed

    def _with_images(
        self, segment: VisionSegment, needed: list[tuple[ImageSpan, RowImage]], embeds: list
    ) -> VisionSegment:
        """The segment with the embeddings of its placeholders (`embeds[k]`: image k of
        `needed`, all its tokens, and its deepstack features)."""
        if not needed:
            return segment
        index, rows = [], []
        deepstack: list[list[torch.Tensor]] = []
        for (span, _), (image_embeds, features) in zip(needed, embeds, strict=True):
            lo, hi = max(span.start, segment.start), min(span.end, segment.end)
            index.append(torch.arange(lo, hi) - segment.start)
            rows.append(image_embeds[lo - span.start : hi - span.start])
            for layer, feature in enumerate(features):
                if layer == len(deepstack):
                    deepstack.append([])
                deepstack[layer].append(feature[lo - span.start : hi - span.start])
        return VisionSegment(
            segment.row,
            segment.tokens,
            segment.start,
            rope_positions=segment.rope_positions,
            image_index=torch.cat(index),
            image_embeds=torch.cat(rows),
            deepstack=tuple(torch.cat(parts) for parts in deepstack),
        )

    def prefill_forward(  # type: ignore[override]
        self,
        tokens: torch.Tensor,
        page_table: torch.Tensor,
        kv_cache: KVCache,
        prompt_lens: Any,
        enable_trace: bool,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One chunk per row: `(logits [B, 1, V], rope_deltas [B, 1] int64)`.

        kwargs: `empty_slots` (the slot each row fills: its lane with tt_data_parallel >
        1), `start_pos` (None: 0), `pixel_values`, `image_grid_thw` (see the module
        docstring), `sampling_params` (ignored, as TT-Metal's class does: logits are
        returned), `page_tables_per_layer` (ignored: one KV group). Row i's delta is the
        one after its last computed token (`prompt_lens[i]`): final once the row's
        prompt is complete. Rows with nothing to compute are padding (logits and delta 0).
        """
        unknown = set(kwargs) - PREFILL_KEYWORDS
        if unknown:
            raise TypeError(
                f"prefill_forward got unexpected keywords: {', '.join(sorted(unknown))}"
            )
        batch = tokens.shape[0]
        ends = int_list(prompt_lens, batch, "prompt_lens")
        start_pos = kwargs.get("start_pos")
        starts = [0] * batch if start_pos is None else int_list(start_pos, batch, "start_pos")
        empty_slots = kwargs.get("empty_slots")
        slots = (
            list(range(batch))
            if empty_slots is None
            else int_list(empty_slots, batch, "empty_slots")
        )
        pixel_rows = _per_row(kwargs.get("pixel_values"), batch, "pixel_values")
        grid_rows = _per_row(kwargs.get("image_grid_thw"), batch, "image_grid_thw")

        plans = []
        deltas = torch.zeros(batch, 1, dtype=torch.long)
        for row in range(batch):
            if ends[row] <= starts[row]:
                continue
            if ends[row] > tokens.shape[1]:
                raise ValueError(
                    f"row {row}: chunk of positions {starts[row]}..{ends[row] - 1} needs "
                    f"tokens up to position {ends[row] - 1} but tokens has width "
                    f"{tokens.shape[1]} (tokens hold the row from position 0)"
                )
            images = row_images(pixel_rows[row], grid_rows[row], row)
            segment, delta, needed = self._plan_row(
                row, tokens[row], starts[row], ends[row], images
            )
            plans.append((segment, needed))
            deltas[row, 0] = delta

        def compute() -> torch.Tensor:
            # All images this prefill encodes in one tower call, as TT-Metal does: windows
            # and full attention never cross images, so batching changes nothing.
            wanted = [image for _, needed in plans for _, image in needed]
            embeds: list[tuple[torch.Tensor, list[torch.Tensor]]] = []
            if wanted:
                grids = torch.tensor([image.grid for image in wanted])
                pixels = torch.cat([image.pixels for image in wanted])  # type: ignore[misc]
                merged, features = self.vision.encode(pixels, grids)
                sizes = self.vision.tokens_per_image(grids)
                split = [torch.split(f, sizes) for f in features]
                embeds = [
                    (image, [per_layer[i] for per_layer in split])
                    for i, image in enumerate(torch.split(merged, sizes))
                ]
            segments, used = [], 0
            for segment, needed in plans:
                segments.append(
                    self._with_images(segment, needed, embeds[used : used + len(needed)])
                )
                used += len(needed)
            return self._run(segments, batch, page_table, kv_cache, slots).unsqueeze(1)

        logits = self._device_queue.submit(compute).result()
        return logits, deltas

    # ---- decode ----------------------------------------------------------------------

    def decode_forward(  # type: ignore[override]
        self,
        tokens: torch.Tensor,
        start_pos: Any,
        page_table: torch.Tensor | None = None,
        kv_cache: KVCache | None = None,
        enable_trace: bool = True,
        read_from_device: bool = True,
        sampling_params: SamplingParams | None = None,
        prompt_tokens: torch.Tensor | None = None,
        output_tokens: torch.Tensor | None = None,
        slot_remap: Any = None,
        rope_deltas_all_users: Any = None,
        *,
        reload_inputs: bool = True,
        reload_page_table: bool = False,
        reload_sampling_params: bool = False,
        reset_sampling_state: bool = False,
        **kwargs: Any,
    ) -> Any:
        """The text reference's decode (contract v1) with slot s's token at
        `pos + delta[s]`. `rope_deltas_all_users`: the deltas of slots 0, 1, ... (the
        rest 0), replacing the resident ones; without it, `slot_remap` moves them
        (slot i takes slot remap[i]'s delta) before this step, as it moves the
        sampler's state."""
        deltas = None
        if rope_deltas_all_users is not None:
            deltas = [_delta(v) for v in rope_deltas_all_users]
        remap = None if slot_remap is None else int_list(slot_remap, len(slot_remap), "slot_remap")

        def update_deltas() -> None:
            current = self._rope_deltas
            if deltas is not None:
                fresh = torch.zeros(max(len(deltas), current.shape[0]), dtype=torch.long)
                fresh[: len(deltas)] = torch.tensor(deltas, dtype=torch.long)
                self._rope_deltas = fresh
            elif remap is not None:
                size = max(current.shape[0], len(remap))
                padded = torch.zeros(size, dtype=torch.long)
                padded[: current.shape[0]] = current
                order = list(remap) + list(range(len(remap), size))
                self._rope_deltas = padded[torch.tensor(order)]

        # On the device queue, so a decode still queued reads the deltas of its own step.
        if deltas is not None or remap is not None:
            self._device_queue.submit(update_deltas)
        return super().decode_forward(
            tokens,
            start_pos,
            page_table,
            kv_cache,
            enable_trace,
            read_from_device,
            sampling_params,
            prompt_tokens,
            output_tokens,
            slot_remap,
            reload_inputs=reload_inputs,
            reload_page_table=reload_page_table,
            reload_sampling_params=reload_sampling_params,
            reset_sampling_state=reset_sampling_state,
            **kwargs,
        )


class ReferenceQwen3VLGenerator(ReferenceQwen2_5_VLGenerator):
    """The same contract for Qwen3-VL checkpoints (TT-Metal's
    `models/demos/qwen3_vl/tt/generator_vllm.py` takes the same inputs and returns the
    same forms): the Qwen3 text tower (per-head q/k norms), the Qwen3-VL vision tower
    (`reference.vision_qwen3`), deepstack features added after the first text layers at
    the image tokens, and interleaved M-RoPE."""

    vision_tower_class = Qwen3VisionTower
