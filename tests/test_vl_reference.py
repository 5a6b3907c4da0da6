"""The reference Qwen2.5-VL generator against transformers, driven through its contract.

The golden is transformers' own `Qwen2_5_VLForConditionalGeneration` on the tiny
random-weight checkpoint (`demo.vision_checkpoint`), fed by transformers' processor with
`mm_token_type_ids` (without them transformers 5 falls back to 1-D positions: a wrong
golden). The generator gets what the worker sends: per-row lists of per-image tensors,
a paged cache, `start_pos`, `empty_slots`, `rope_deltas_all_users` on the first decode.
Greedy token ids must be identical; logits agree to ATOL (float32 on both sides; the
differences seen are ~1e-5, from summation order).
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
import transformers  # required: a missing or broken transformers fails, never skips
from PIL import Image

from ttbundles.demo.vision_checkpoint import (
    RECORD,
    ensure_vision_checkpoint,
)
from ttbundles.format.contract import HostMesh, SamplingParams
from ttbundles.reference.mrope import image_spans, mrope_positions
from ttbundles.reference.vision import window_order
from ttbundles.reference.vl_generator import ReferenceQwen2_5_VLGenerator

ATOL = 1e-4
BLOCK = 4  # small blocks: prompts span many, images straddle block boundaries
SEQ_BLOCKS = 40  # blocks per slot (160 positions)
STEPS = 6  # greedy decode steps compared


# ---- inputs -------------------------------------------------------------------------------


def picture(seed: int, height: int, width: int) -> Image.Image:
    """A deterministic noise picture (random weights see no difference from a photo)."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


WIDE = picture(1, 84, 140)  # 6 x 10 patches: 15 tokens, windows of 2 x 2 with ragged edges
SQUARE = picture(2, 112, 112)  # 8 x 8 patches: 16 tokens, four full windows
SMALL = picture(3, 56, 56)  # 4 x 4 patches: 4 tokens, one window


def chat(processor, *parts) -> dict:
    """Processor inputs for one user message: parts are PIL images or strings."""
    content = [
        {"type": "image"} if isinstance(p, Image.Image) else {"type": "text", "text": p}
        for p in parts
    ]
    text = processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    images = [p for p in parts if isinstance(p, Image.Image)] or None
    return processor(text=[text], images=images, return_tensors="pt")


def per_image(inputs) -> tuple[list | None, list | None]:
    """The row's `pixel_values` / `image_grid_thw` entries as the reference plugin sends
    them: one tensor per image (None for a text-only row)."""
    if "pixel_values" not in inputs:
        return None, None
    grids = inputs["image_grid_thw"]
    sizes = grids.prod(-1).tolist()
    return list(torch.split(inputs["pixel_values"], sizes)), list(grids)


# ---- the golden ---------------------------------------------------------------------------


@torch.no_grad()
def hf_greedy(model, inputs, steps: int = STEPS) -> tuple[list[int], torch.Tensor]:
    """transformers' greedy continuation and each step's logits `[steps, V]`."""
    assert "mm_token_type_ids" in inputs  # M-RoPE in transformers 5 needs them
    out = model.generate(
        **inputs,
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
    )
    ids = out.sequences[0, inputs["input_ids"].shape[1] :].tolist()
    return ids, torch.stack([step[0] for step in out.logits])


@torch.no_grad()
def hf_rope_delta(model, inputs) -> int:
    _, delta = model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs.get("image_grid_thw"),
    )
    return int(delta.reshape(-1)[0])


# ---- driving the generator as the worker does ---------------------------------------------


class Worker:
    """Slots, a paged cache and the contract calls; slot s owns SEQ_BLOCKS blocks of its
    lane's cache (block ids lane-local)."""

    def __init__(self, generator: ReferenceQwen2_5_VLGenerator):
        self.gen = generator
        dims = generator.dims
        self.per_lane = generator.per_lane
        self.kv = generator.allocate_kv_cache(
            (self.per_lane * SEQ_BLOCKS, dims.num_kv_heads, BLOCK, dims.head_dim),
            torch.float32,
            dims.num_layers,
        )
        self.tables: dict[int, list[int]] = {}

    def own_blocks(self, slot: int) -> list[int]:
        local = slot % self.per_lane
        return list(range(local * SEQ_BLOCKS, (local + 1) * SEQ_BLOCKS))

    def table(self, slots: list[int]) -> torch.Tensor:
        return torch.tensor(
            [self.tables.get(s, [0] * SEQ_BLOCKS) for s in slots], dtype=torch.int32
        )

    def prefill(self, rows: list[dict], **extra) -> tuple[torch.Tensor, torch.Tensor]:
        """rows: {"slot", "ids" [L], "start" (default 0), "end" (default L), "inputs"
        (processor output: pixels and grids), "pixels" (override: a per-image list)}."""
        width = max(len(r["ids"]) for r in rows)
        tokens = torch.zeros(len(rows), width, dtype=torch.int32)
        for i, r in enumerate(rows):
            tokens[i, : len(r["ids"])] = torch.tensor(r["ids"], dtype=torch.int32)
            self.tables.setdefault(r["slot"], r.get("blocks") or self.own_blocks(r["slot"]))
        sent = [per_image(r["inputs"]) for r in rows]
        pixels = [r.get("pixels", p) for r, (p, _) in zip(rows, sent, strict=True)]
        grids = [r.get("grids", g) for r, (_, g) in zip(rows, sent, strict=True)]
        return self.gen.prefill_forward(
            tokens,
            self.table([r["slot"] for r in rows]),
            self.kv,
            torch.tensor([r.get("end", len(r["ids"])) for r in rows]),
            False,
            start_pos=torch.tensor([r.get("start", 0) for r in rows]),
            empty_slots=[r["slot"] for r in rows],
            pixel_values=pixels,
            image_grid_thw=grids,
            **extra,
        )

    def decode(self, tokens: dict[int, int], positions: dict[int, int], **extra) -> torch.Tensor:
        """One host-sampled decode over every slot (empty ones at -1); logits `[B, V]`."""
        batch = self.gen.max_batch_size
        slots = list(range(batch))
        logits, _ = self.gen.decode_forward(
            torch.tensor([[tokens.get(s, 0)] for s in slots]),
            torch.tensor([positions.get(s, -1) for s in slots]),
            self.table(slots),
            self.kv,
            enable_trace=False,
            **extra,
        )
        return logits[:, 0]


def greedy(worker: Worker, first: torch.Tensor, slots: list[int], lengths: list[int], deltas):
    """Greedy decode of several slots together from their prefill logits `[n, V]`; the
    first decode carries `rope_deltas_all_users`, as the worker sends it after a prefill.
    Returns per slot the tokens and the logits `[STEPS, V]`."""
    tokens = {s: int(first[i].argmax()) for i, s in enumerate(slots)}
    positions = dict(zip(slots, lengths, strict=True))
    ids = {s: [tokens[s]] for s in slots}
    logits = {s: [first[i]] for i, s in enumerate(slots)}
    all_users = [0] * (max(slots) + 1)
    for s, d in zip(slots, deltas, strict=True):
        all_users[s] = int(d)
    for step in range(STEPS - 1):
        extra = {"rope_deltas_all_users": all_users} if step == 0 else {}
        out = worker.decode(tokens, positions, **extra)
        for s in slots:
            tokens[s] = int(out[s].argmax())
            positions[s] += 1
            ids[s].append(tokens[s])
            logits[s].append(out[s])
    return ids, {s: torch.stack(v) for s, v in logits.items()}


def assert_matches(ids, logits, golden_ids, golden_logits):
    assert ids == golden_ids
    torch.testing.assert_close(logits, golden_logits, atol=ATOL, rtol=0)


# ---- fixtures -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def processor(vision_checkpoint):
    return transformers.AutoProcessor.from_pretrained(vision_checkpoint)


@pytest.fixture(scope="module")
def hf_model(vision_checkpoint):
    model = transformers.Qwen2_5_VLForConditionalGeneration.from_pretrained(
        vision_checkpoint, dtype=torch.float32
    )
    return model.eval()


def make_generator(checkpoint, batch: int = 4, lanes: int = 1) -> ReferenceQwen2_5_VLGenerator:
    """As the worker does it: the config vLLM loaded, then initialize_vllm_model."""
    config = transformers.AutoConfig.from_pretrained(checkpoint)
    return ReferenceQwen2_5_VLGenerator.initialize_vllm_model(
        hf_config=config,
        mesh_device=HostMesh(),
        max_batch_size=batch,
        max_seq_len=SEQ_BLOCKS * BLOCK,
        tt_data_parallel=lanes,
    )


@pytest.fixture(scope="module")
def gen(vision_checkpoint):
    return make_generator(vision_checkpoint)


def ids_of(inputs) -> list[int]:
    return inputs["input_ids"][0].tolist()


# ---- parity -------------------------------------------------------------------------------


def test_single_image_prefill_and_greedy_decode_match_transformers(gen, processor, hf_model):
    inputs = chat(processor, WIDE, "What is in this picture?")
    golden_ids, golden_logits = hf_greedy(hf_model, inputs)
    worker = Worker(gen)
    ids = ids_of(inputs)
    logits, deltas = worker.prefill([{"slot": 0, "ids": ids, "inputs": inputs}])
    assert logits.shape == (1, 1, gen.dims.vocab_size) and deltas.shape == (1, 1)
    assert deltas.dtype == torch.int64
    assert int(deltas[0, 0]) == hf_rope_delta(hf_model, inputs) != 0
    out_ids, out_logits = greedy(worker, logits[:, 0], [0], [len(ids)], deltas[:, 0])
    assert_matches(out_ids[0], out_logits[0], golden_ids, golden_logits)

    # The picture reaches the model: another one changes the logits.
    other = chat(processor, SQUARE, "What is in this picture?")
    assert (hf_greedy(hf_model, other, 1)[1][0] - golden_logits[0]).abs().max() > 0.1


def test_two_images_in_one_prompt_match_transformers(gen, processor, hf_model):
    inputs = chat(processor, SMALL, "and", WIDE, "Compare the two.")
    assert inputs["image_grid_thw"].shape[0] == 2
    golden_ids, golden_logits = hf_greedy(hf_model, inputs)
    worker = Worker(gen)
    ids = ids_of(inputs)
    logits, deltas = worker.prefill([{"slot": 1, "ids": ids, "inputs": inputs}])
    assert int(deltas[0, 0]) == hf_rope_delta(hf_model, inputs)
    out_ids, out_logits = greedy(worker, logits[:, 0], [1], [len(ids)], deltas[:, 0])
    assert_matches(out_ids[1], out_logits[1], golden_ids, golden_logits)


def test_row_images_concatenated_give_the_same_result(gen, processor):
    """The row's images as one tensor (`[sum patches, 1176]`, grids `[n, 3]`) give what
    the one-tensor-per-image form gives."""
    inputs = chat(processor, SMALL, "and", WIDE, "Compare the two.")
    ids = ids_of(inputs)
    results = []
    for pixels, grids in (
        per_image(inputs),
        (inputs["pixel_values"], inputs["image_grid_thw"]),
    ):
        row = {"slot": 0, "ids": ids, "inputs": inputs, "pixels": pixels, "grids": grids}
        results.append(Worker(gen).prefill([row]))
    assert torch.equal(results[0][0], results[1][0])
    assert torch.equal(results[0][1], results[1][1])


def test_mixed_batch_with_a_text_only_row_matches_transformers(gen, processor, hf_model):
    rows = [
        chat(processor, WIDE, "Describe it."),
        chat(processor, "Hello mesh, tell me a story."),
        chat(processor, SQUARE, "then", SMALL, "Which is larger?"),
    ]
    goldens = [hf_greedy(hf_model, inputs) for inputs in rows]
    worker = Worker(gen)
    slots = [2, 0, 3]  # rows fill slots out of order, as empty_slots allows
    logits, deltas = worker.prefill(
        [
            {"slot": s, "ids": ids_of(inputs), "inputs": inputs}
            for s, inputs in zip(slots, rows, strict=True)
        ]
    )
    assert int(deltas[1, 0]) == 0  # the text-only row
    assert [int(d) for d in deltas[:, 0]] == [
        hf_rope_delta(hf_model, r) if "image_grid_thw" in r else 0 for r in rows
    ]
    out_ids, out_logits = greedy(
        worker, logits[:, 0], slots, [len(ids_of(r)) for r in rows], deltas[:, 0]
    )
    for slot, (golden_ids, golden_logits) in zip(slots, goldens, strict=True):
        assert_matches(out_ids[slot], out_logits[slot], golden_ids, golden_logits)


def test_prefix_cache_hit_without_pixels_keeps_positions_and_deltas(gen, processor, hf_model):
    """A second request whose first blocks (image included) are shared: vLLM strips the
    covered image's pixel_values and keeps its grid. Positions and delta stay right."""
    inputs = chat(processor, WIDE, "What is in this picture?")
    golden_ids, golden_logits = hf_greedy(hf_model, inputs)
    ids = ids_of(inputs)
    image_end = max(i for i, t in enumerate(ids) if t == gen.image_token_id) + 1
    cached = -(-image_end // BLOCK)  # whole blocks covering the image
    assert cached * BLOCK < len(ids)
    worker = Worker(gen)
    worker.prefill([{"slot": 0, "ids": ids, "inputs": inputs}])
    shared = worker.tables[0][:cached] + worker.own_blocks(1)[cached:]
    logits, deltas = worker.prefill(
        [
            {
                "slot": 1,
                "ids": ids,
                "start": cached * BLOCK,
                "inputs": inputs,
                "pixels": [None],  # strip_covered_mm_data
                "blocks": shared,
            }
        ]
    )
    assert int(deltas[0, 0]) == hf_rope_delta(hf_model, inputs)
    out_ids, out_logits = greedy(worker, logits[:, 0], [1], [len(ids)], deltas[:, 0])
    assert_matches(out_ids[1], out_logits[1], golden_ids, golden_logits)


def test_chunked_prefill_split_inside_an_image_matches_transformers(gen, processor, hf_model):
    inputs = chat(processor, SMALL, "and", WIDE, "Compare the two.")
    golden_ids, golden_logits = hf_greedy(hf_model, inputs)
    ids = ids_of(inputs)
    second = [i for i, t in enumerate(ids) if t == gen.image_token_id][-8]  # inside image 2
    worker = Worker(gen)
    worker.prefill([{"slot": 0, "ids": ids, "end": second, "inputs": inputs}])
    logits, deltas = worker.prefill([{"slot": 0, "ids": ids, "start": second, "inputs": inputs}])
    assert int(deltas[0, 0]) == hf_rope_delta(hf_model, inputs)
    out_ids, out_logits = greedy(worker, logits[:, 0], [0], [len(ids)], deltas[:, 0])
    assert_matches(out_ids[0], out_logits[0], golden_ids, golden_logits)


def test_lanes_keep_a_rope_delta_per_slot(vision_checkpoint, processor, hf_model):
    """Single-execute lanes: two lanes of two slots; requests with different deltas in
    both lanes (and a text-only one) decode together."""
    lanes = make_generator(vision_checkpoint, batch=4, lanes=2)
    rows = [
        chat(processor, WIDE, "Describe it."),
        chat(processor, SMALL, "Describe it."),
        chat(processor, "Hello mesh."),
    ]
    goldens = [hf_greedy(hf_model, inputs) for inputs in rows]
    worker = Worker(lanes)
    slots = [0, 3, 2]  # lane 0, lane 1, lane 1
    logits, deltas = worker.prefill(
        [{"slot": s, "ids": ids_of(r), "inputs": r} for s, r in zip(slots, rows, strict=True)]
    )
    assert len({int(d) for d in deltas[:, 0]}) == 3
    out_ids, out_logits = greedy(
        worker, logits[:, 0], slots, [len(ids_of(r)) for r in rows], deltas[:, 0]
    )
    for slot, (golden_ids, golden_logits) in zip(slots, goldens, strict=True):
        assert_matches(out_ids[slot], out_logits[slot], golden_ids, golden_logits)


def test_slot_remap_moves_the_deltas_with_the_requests(gen, processor, hf_model):
    """After a request leaves, vLLM compacts the batch and sends only `slot_remap`: the
    deltas move with the requests (a stale delta would shift every later position)."""
    rows = [chat(processor, "Hi."), chat(processor, WIDE, "Describe it.")]
    golden_ids, golden_logits = hf_greedy(hf_model, rows[1])
    worker = Worker(gen)
    logits, deltas = worker.prefill(
        [{"slot": s, "ids": ids_of(r), "inputs": r} for s, r in enumerate(rows)]
    )
    length = len(ids_of(rows[1]))
    token = int(logits[1, 0].argmax())
    ids, steps = [token], [logits[1, 0]]
    out = worker.decode(
        {0: 5, 1: token},
        {0: len(ids_of(rows[0])), 1: length},
        rope_deltas_all_users=[int(d) for d in deltas[:, 0]],
    )
    token = int(out[1].argmax())
    ids.append(token)
    steps.append(out[1])
    # Request 0 finished; request 1 moves from slot 1 to slot 0.
    worker.tables[0] = worker.tables.pop(1)
    position = length + 1
    for step in range(STEPS - 2):
        extra = {"slot_remap": [1, 0]} if step == 0 else {}
        out = worker.decode({0: token}, {0: position}, **extra)
        token = int(out[0].argmax())
        ids.append(token)
        steps.append(out[0])
        position += 1
    assert_matches(ids, torch.stack(steps), golden_ids, golden_logits)


def test_device_sampling_with_two_steps_in_flight_keeps_each_slots_delta(gen, processor, hf_model):
    """The serving path with async decode: prefill ignores sampling_params (logits back,
    as TT-Metal's class), then greedy device sampling; after the first decode the inputs
    stay resident (reload_inputs=False, stale host tokens) and two steps are in flight."""
    rows = [chat(processor, WIDE, "Describe it."), chat(processor, "Hello mesh.")]
    goldens = [hf_greedy(hf_model, r)[0] for r in rows]
    worker = Worker(gen)
    batch = gen.max_batch_size
    greedy = SamplingParams(temperature=[0.0] * batch, top_k=[0] * batch, top_p=[1.0] * batch)
    logits, deltas = worker.prefill(
        [{"slot": s, "ids": ids_of(r), "inputs": r} for s, r in enumerate(rows)],
        sampling_params=SamplingParams(temperature=[0.0] * 2, top_k=[0] * 2, top_p=[1.0] * 2),
    )
    assert logits.is_floating_point()
    first = logits[:, 0].argmax(-1).tolist()
    lengths = [len(ids_of(r)) for r in rows]
    slots = list(range(batch))
    handles = []
    for step in range(STEPS - 1):
        start = step == 0
        handle = gen.decode_forward(
            torch.tensor([[first[s] if start and s < 2 else -1] for s in slots]),
            torch.tensor([lengths[s] + step if s < 2 else -1 for s in slots]),
            worker.table(slots),
            worker.kv,
            read_from_device=False,
            sampling_params=greedy,
            rope_deltas_all_users=[int(d) for d in deltas[:, 0]] if start else None,
            reload_inputs=start,
            reload_sampling_params=start,
            reset_sampling_state=start,
        )
        handles.append(gen.read_decode_output(handle, async_read=True))
    produced = [[first[0]], [first[1]]]
    for host, events in handles:
        for event in events:
            event.wait()
        tokens, _ = gen.process_decode_output_host(host, is_tokens=True)
        for s in range(2):
            produced[s].append(int(tokens[s]))
    assert produced == goldens


# ---- the pieces against transformers' own -------------------------------------------------


def test_mrope_positions_equal_get_rope_index(gen, processor, hf_model):
    inputs = chat(processor, SMALL, "and", WIDE, "x", SQUARE, "Compare.")
    ids = inputs["input_ids"][0]
    grids = [tuple(g) for g in inputs["image_grid_thw"].tolist()]
    spans = image_spans(ids, gen.image_token_id, grids, merge=2)
    assert [s.length for s in spans] == [4, 15, 16]
    positions, delta = mrope_positions(len(ids), spans, merge=2)
    golden, golden_delta = hf_model.model.get_rope_index(
        inputs["input_ids"],
        mm_token_type_ids=inputs["mm_token_type_ids"],
        image_grid_thw=inputs["image_grid_thw"],
    )
    assert torch.equal(positions, golden[:, 0])
    assert delta == int(golden_delta)


def test_window_order_equals_transformers_window_index(gen):
    from transformers.vision_utils import get_vision_window_index

    grids = torch.tensor([[1, 6, 10], [1, 8, 8], [2, 4, 6]])
    order, lengths = window_order(grids, gen.vision.dims)
    golden, cu = get_vision_window_index(grids, 2, 56, 14)
    assert torch.equal(order, golden)
    assert torch.equal(torch.tensor([0, *lengths]).cumsum(0).int(), cu)


def test_vision_tower_equals_transformers_visual(gen, processor, hf_model):
    inputs = chat(processor, WIDE, "x", SQUARE, "y")
    with torch.no_grad():
        golden = hf_model.model.visual(
            inputs["pixel_values"], grid_thw=inputs["image_grid_thw"]
        ).pooler_output
    mine = gen.vision(inputs["pixel_values"], inputs["image_grid_thw"])
    torch.testing.assert_close(mine, golden, atol=1e-4, rtol=1e-4)


# ---- what the generator refuses -----------------------------------------------------------


def test_placeholder_count_that_does_not_match_the_image_is_refused(gen, processor):
    inputs = chat(processor, WIDE, "Describe it.")
    ids = ids_of(inputs)
    first = ids.index(gen.image_token_id)
    broken = ids[: first + 3] + ids[first + 5 :]  # two placeholders gone
    with pytest.raises(ValueError, match="placeholders do not match"):
        Worker(gen).prefill([{"slot": 0, "ids": broken, "inputs": inputs}])


def test_placeholder_ids_after_the_last_image_are_text(gen, processor, hf_model):
    """A request replayed with its output (preemption, prefix cache) may hold a generated
    `<|image_pad|>`: after the last image it is text, as in transformers' generate."""
    inputs = chat(processor, WIDE, "Describe it.")
    ids = ids_of(inputs) + [gen.image_token_id, 17]
    logits, deltas = Worker(gen).prefill([{"slot": 0, "ids": ids, "inputs": inputs}])
    with torch.no_grad():  # the prompt, then the two tokens as transformers decodes them
        prompt = hf_model(**inputs, use_cache=True)
        golden = hf_model(
            input_ids=torch.tensor([ids[-2:]]), past_key_values=prompt.past_key_values
        ).logits[0, -1]
    assert int(deltas[0, 0]) == hf_rope_delta(hf_model, inputs)
    torch.testing.assert_close(logits[0, 0], golden, atol=ATOL, rtol=0)


def test_an_image_computed_now_without_pixels_is_refused(gen, processor):
    inputs = chat(processor, WIDE, "Describe it.")
    with pytest.raises(ValueError, match="no pixel_values were sent"):
        Worker(gen).prefill(
            [{"slot": 0, "ids": ids_of(inputs), "inputs": inputs, "pixels": [None]}]
        )


def test_lists_not_aligned_with_the_rows_and_unknown_keywords_are_refused(gen, processor):
    inputs = chat(processor, WIDE, "Describe it.")
    ids = torch.tensor([ids_of(inputs)], dtype=torch.int32)
    worker = Worker(gen)
    worker.tables[0] = worker.own_blocks(0)
    pixels, grids = per_image(inputs)
    with pytest.raises(ValueError, match="one per row"):
        gen.prefill_forward(
            ids,
            worker.table([0]),
            worker.kv,
            [ids.shape[1]],
            False,
            pixel_values=[pixels, None],
            image_grid_thw=[grids, None],
        )
    raw = [(p * 255).to(torch.uint8) for p in pixels]  # vLLM's device-normalise form
    with pytest.raises(ValueError, match="supports_mm_device_do_normalize"):
        gen.prefill_forward(
            ids,
            worker.table([0]),
            worker.kv,
            [ids.shape[1]],
            False,
            pixel_values=[raw],
            image_grid_thw=[grids],
        )
    with pytest.raises(TypeError, match="images"):
        gen.prefill_forward(ids, worker.table([0]), worker.kv, [ids.shape[1]], False, images=[])


# ---- the checkpoint -----------------------------------------------------------------------


def test_vllm_processor_reads_the_checkpoint_as_transformers_does(vision_checkpoint, processor):
    """vLLM's own Qwen2.5-VL processor gives the prompt tokens and tensors the golden uses."""
    from vllm.config import ModelConfig
    from vllm.multimodal import MULTIMODAL_REGISTRY

    # vLLM's own Qwen2.5-VL class normalises pixels in its vision tower
    # (supports_mm_device_do_normalize): its processor then leaves them raw uint8. A TT
    # class does not declare that, so vLLM normalises on the host, as here.
    config = ModelConfig(
        model=str(vision_checkpoint),
        limit_mm_per_prompt={"image": 2},
        mm_device_do_normalize=False,
        dtype="float32",  # the processor casts pixels to the model's dtype
    )
    assert config.uses_mrope
    vllm_processor = MULTIMODAL_REGISTRY.create_processor(config)
    inputs = chat(processor, SMALL, "and", WIDE, "Compare the two.")
    text = processor.apply_chat_template(
        [
            {
                "role": "user",
                "content": [
                    {"type": "image"},
                    {"type": "text", "text": "and"},
                    {"type": "image"},
                    {"type": "text", "text": "Compare the two."},
                ],
            }
        ],
        add_generation_prompt=True,
        tokenize=False,
    )
    out = vllm_processor(text, vllm_processor.info.parse_mm_data({"image": [SMALL, WIDE]}))
    assert out["prompt_token_ids"] == ids_of(inputs)
    items = out["mm_kwargs"]["image"]
    pixels, grids = per_image(inputs)
    for item, pv, grid in zip(items, pixels, grids, strict=True):
        torch.testing.assert_close(item["pixel_values"].data, pv)
        assert torch.equal(item["image_grid_thw"].data, grid)


def test_the_cached_checkpoint_is_reused_and_rewritten_when_stale(vision_checkpoint, tmp_path):
    folder = tmp_path / "vision"
    shutil.copytree(vision_checkpoint, folder)
    assert ensure_vision_checkpoint(folder) == (folder, False)
    (folder / RECORD).write_text(json.dumps({"version": -1}))
    assert ensure_vision_checkpoint(folder) == (folder, True)
    assert json.loads((folder / RECORD).read_text())["version"] != -1
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["Qwen2_5_VLForConditionalGeneration"]
    assert sum(f.stat().st_size for f in folder.iterdir()) < 4_000_000


# ---- the second family: Qwen3-VL ----------------------------------------------------------
# Same inputs and return forms (TT-Metal's Qwen3-VL class takes what the Qwen2.5-VL one
# takes); inside, a Qwen3 text tower, learned position embeddings, full-frame vision
# attention, deepstack features added after the first text layers, interleaved M-RoPE.


@pytest.fixture(scope="module")
def qwen3_checkpoint(tmp_path_factory):
    from ttbundles.demo.vision_checkpoint import write_vision_checkpoint

    return write_vision_checkpoint(tmp_path_factory.mktemp("qwen3-vl"), family="qwen3_vl")


@pytest.fixture(scope="module")
def qwen3(qwen3_checkpoint):
    """(processor, transformers model, reference generator)."""
    from ttbundles.reference.vl_generator import ReferenceQwen3VLGenerator

    config = transformers.AutoConfig.from_pretrained(qwen3_checkpoint)
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(
        qwen3_checkpoint, dtype=torch.float32
    ).eval()
    generator = ReferenceQwen3VLGenerator.initialize_vllm_model(
        hf_config=config,
        mesh_device=HostMesh(),
        max_batch_size=4,
        max_seq_len=SEQ_BLOCKS * BLOCK,
    )
    return transformers.AutoProcessor.from_pretrained(qwen3_checkpoint), model, generator


def test_qwen3_vl_mixed_batch_matches_transformers(qwen3):
    processor, hf, gen = qwen3
    rows = [
        chat(processor, WIDE, "and", SQUARE, "Compare the two."),
        chat(processor, "Hello mesh, tell me a story."),
    ]
    assert rows[0]["pixel_values"].shape[1] == 3 * 2 * 16 * 16  # 16-pixel patches
    goldens = [hf_greedy(hf, inputs) for inputs in rows]
    worker = Worker(gen)
    logits, deltas = worker.prefill(
        [{"slot": s, "ids": ids_of(r), "inputs": r} for s, r in zip((1, 0), rows, strict=True)]
    )
    assert int(deltas[0, 0]) == hf_rope_delta(hf, rows[0]) != 0 and int(deltas[1, 0]) == 0
    out_ids, out_logits = greedy(
        worker, logits[:, 0], [1, 0], [len(ids_of(r)) for r in rows], deltas[:, 0]
    )
    for slot, (golden_ids, golden_logits) in zip((1, 0), goldens, strict=True):
        assert_matches(out_ids[slot], out_logits[slot], golden_ids, golden_logits)


def test_qwen3_vl_chunk_inside_an_image_then_a_prefix_hit_match_transformers(qwen3):
    """Deepstack features are sliced with the chunk like the embeddings; a prefix hit
    without pixels keeps positions."""
    processor, hf, gen = qwen3
    inputs = chat(processor, SMALL, "and", WIDE, "Compare the two.")
    golden_ids, golden_logits = hf_greedy(hf, inputs)
    ids = ids_of(inputs)
    placeholders = [i for i, t in enumerate(ids) if t == gen.image_token_id]
    split = placeholders[-5]  # inside the second image
    worker = Worker(gen)
    worker.prefill([{"slot": 0, "ids": ids, "end": split, "inputs": inputs}])
    logits, deltas = worker.prefill([{"slot": 0, "ids": ids, "start": split, "inputs": inputs}])
    out_ids, out_logits = greedy(worker, logits[:, 0], [0], [len(ids)], deltas[:, 0])
    assert_matches(out_ids[0], out_logits[0], golden_ids, golden_logits)

    cached = (placeholders[-1] + 1) // BLOCK + 1  # whole blocks past both images
    shared = worker.tables[0][:cached] + worker.own_blocks(1)[cached:]
    row = {"slot": 1, "ids": ids, "start": cached * BLOCK, "inputs": inputs}
    logits, deltas = worker.prefill([{**row, "pixels": [None, None], "blocks": shared}])
    assert int(deltas[0, 0]) == hf_rope_delta(hf, inputs)
    torch.testing.assert_close(logits[0, 0], golden_logits[0], atol=ATOL, rtol=0)


def test_qwen3_vl_vision_tower_and_deepstack_equal_transformers(qwen3):
    processor, hf, gen = qwen3
    inputs = chat(processor, WIDE, "x", SQUARE, "y")
    with torch.no_grad():
        golden = hf.model.visual(inputs["pixel_values"], grid_thw=inputs["image_grid_thw"])
    merged, features = gen.vision.encode(inputs["pixel_values"], inputs["image_grid_thw"])
    torch.testing.assert_close(merged, golden.pooler_output, atol=1e-4, rtol=1e-4)
    assert len(features) == len(golden.deepstack_features) == 1
    torch.testing.assert_close(features[0], golden.deepstack_features[0], atol=1e-4, rtol=1e-4)
