"""Every TT-Metal generator family the built-ins name, served through the real worker.

Each contract twin (`tests/twins/families.py`) has its family's signatures and return
forms and computes with the reference generator; it is served on the host mesh by plain
`vllm serve` (forked from the session's zygote where it can be) and asked through the
openai client (`tests/twins/http_twin.py`); the vision twin, whose prompts carry images,
by vLLM's own engine in a process of its own (`tests/twins/serve_twin.py`). A twin's outputs must
equal transformers' greedy continuation, seeded sampling must not depend on the batch,
and its record of calls shows what the worker sent: the keywords its signature accepts,
the decode form it declares. A family that cannot be served yet is refused at load with
a clear "not supported yet". docs/authors/tt-metal-families.md lists the same families.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.twins.http_twin import serve_over_http

pytestmark = pytest.mark.server

FAMILIES = Path(__file__).parent / "twins" / "families.py"
SERVE = Path(__file__).parent / "twins" / "serve_twin.py"
PROMPTS = [[11, 12, 13, 14, 15], [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50], [99, 98, 97]]
MAX_TOKENS = 6
ALL = ["decode_only", "all"]

# twin class -> (capabilities the bundle declares, device options, engine options)
TWINS: dict[str, tuple[dict, dict, dict]] = {
    "TTTransformersLlamaForCausalLM": (
        {
            "prefix_caching": True,
            "async_decode": True,
            "chunked_prefill": True,
            "sample_on_device": ALL,
        },
        {"sample_on_device_mode": "all"},
        {"enable_prefix_caching": True},
    ),
    "TTTransformersLlamaV1": (
        {
            "prefix_caching": True,
            "async_decode": True,
            "chunked_prefill": True,
            "sample_on_device": ALL,
        },
        {"sample_on_device_mode": "all"},
        {"enable_prefix_caching": True},
    ),
    "HybridGptOssForCausalLM": (
        {"async_decode": True, "sample_on_device": ALL},
        {"sample_on_device_mode": "all"},
        {},
    ),
    "Qwen2_5_VLForConditionalGeneration": (
        {"async_decode": True, "sample_on_device": ["decode_only"]},
        {"sample_on_device_mode": "decode_only"},
        {},
    ),
    "GalaxyLlamaForCausalLM": ({}, {}, {}),
    "DeepseekV3ForCausalLM": ({"sample_on_device": ALL}, {"sample_on_device_mode": "all"}, {}),
    "T3000LlamaLegacy": ({}, {}, {}),
    "T3000LlamaV1": ({}, {}, {}),
    "MllamaForConditionalGeneration": ({"async_decode": True}, {}, {}),
    "ExecutorLlama3Generator": (
        {"prefix_caching": True, "async_decode": True, "sample_on_device": ALL},
        {"sample_on_device_mode": "all"},
        {"enable_prefix_caching": True, "block_size": 32},  # its required_block_size
    ),
    # Chunks of at most 8 tokens: the 11-token prompt ends in its second chunk, so one
    # prefill row ends no prompt (prefill_output_mask False for it).
    "KolibriForCausalLM": (
        {"async_decode": True, "chunked_prefill": True, "sample_on_device": ALL},
        {"sample_on_device_mode": "all"},
        {"enable_chunked_prefill": True, "max_num_batched_tokens": 8},
    ),
}
SPEC_EXTRAS: dict[str, dict] = {
    # Every row samples on the device (top-k within its max_device_top_k of 32): the class
    # raises on host sampling unless KOLIBRI_VLLM_HOST_COMPAT=1. And the engine is shut
    # down before the report, so that its release_persistent_capture is seen.
    "KolibriForCausalLM": {"seeded_top_k": 20, "shutdown": True},
    # Host sampling (a call without sampling_params) raises in the Gemma 4 31B autoport
    # unless the environment allows it.
    "Gemma4AutoportForCausalLM": {"env": {"GEMMA4_31B_VLLM_HOST_SAMPLING_COMPAT": "1"}},
}


def serve_twin(
    tmp_path: Path, checkpoint: Path, name: str, twin: tuple | None = None, arch: str = ""
) -> dict:
    capabilities, tt, engine = twin or TWINS[name]
    # "galaxy" in the bundle's name puts it in the module path, as TT-Metal's Galaxy
    # classes have it (the worker's tt_data_parallel rule keys on it).
    bundle = tmp_path / "models" / f"twin-{name.lower().replace('_', '-')}"
    bundle.mkdir(parents=True)
    (bundle / "adapter.py").write_text(FAMILIES.read_text())
    metadata = {
        "schema_version": 6 if arch else 1,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": arch or "LlamaForCausalLM",
        "main_class": f"adapter:{name}",
        "capabilities": capabilities,
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(metadata))
    spec = {
        "checkpoint": str(checkpoint),
        "models_dir": str(bundle.parent),
        "prompts": engine.pop("prompts", PROMPTS),
        "max_tokens": MAX_TOKENS,
        **SPEC_EXTRAS.get(name, {}),
        "engine": {
            "max_model_len": 256,
            "max_num_seqs": 4,
            "block_size": engine.pop("block_size", 16),
            "additional_config": {"tt": tt},
            **engine,
        },
    }
    return run_spec(tmp_path, spec, name)


def run_spec(tmp_path: Path, spec: dict, name: str) -> dict:
    """`spec` served: its outputs and the twin's calls (or the load error). By `vllm
    serve` (`http_twin.py`); a spec with image prompts by `serve_twin.py` (its one JSON
    line, the same result)."""
    if "image_prompts" not in spec:
        return serve_over_http(spec, tmp_path)
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(SERVE), str(spec_file)], capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result from {name}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return json.loads(lines[-1])


@pytest.fixture(scope="module")
def greedy_reference(demo_checkpoint) -> list[list[int]]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(demo_checkpoint, dtype=torch.float32)
    out = []
    for ids in PROMPTS:
        ids_t = torch.tensor([ids])
        generated = model.generate(
            ids_t, max_new_tokens=MAX_TOKENS, do_sample=False, min_new_tokens=MAX_TOKENS
        )
        out.append(generated[0, len(ids) :].tolist())
    return out


def calls(result: dict, method: str) -> list[dict]:
    return [values for name, values in result["calls"] if name == method]


SERVED = [name for name in TWINS if name != "MllamaForConditionalGeneration"]


@pytest.mark.parametrize("name", SERVED)
def test_twin_serves_greedy_and_seeded_like_the_reference(
    tmp_path, demo_checkpoint, greedy_reference, name
):
    result = serve_twin(tmp_path, demo_checkpoint, name)
    assert "error" not in result, result.get("error")
    assert result["greedy"] == greedy_reference
    assert result["greedy_again"] == greedy_reference[1:]
    assert result["seeded_alone"] == result["seeded_in_batch"]
    check = CHECKS.get(name)
    if check is not None:
        check(result)


def _check_legacy_tt_transformers(result: dict) -> None:
    (init,) = calls(result, "initialize_vllm_model")
    # optimizations unset: the class's own default, not None passed over it.
    assert init["optimizations"] == "performance" and init["max_seq_len"] == 256
    budget = calls(result, "get_max_tokens_all_users")
    assert budget and "tiny-llama" in budget[0]["model_name"] and budget[0]["num_devices"] == 1
    assert budget[0]["max_num_seqs"] == 4 and budget[0]["max_model_len"] == 256
    decodes = calls(result, "decode_forward")
    assert decodes and all("reload_inputs" not in d for d in decodes)  # legacy: no commands
    assert any(d["reset_batch"] for d in decodes) and not all(d["reset_batch"] for d in decodes)
    assert any(not d["read_from_device"] for d in decodes)  # async decode ran
    prefills = calls(result, "prefill_forward")
    assert prefills and all(p["empty_slots"] is not None for p in prefills)


def _check_v1_tt_transformers(result: dict) -> None:
    decodes = calls(result, "decode_forward")
    assert decodes and all("reset_batch" not in d for d in decodes)
    first = decodes[0]
    assert first["reload_inputs"] and first["reset_sampling_state"]
    assert first["reload_sampling_params"] and not first["reload_page_table"]
    steady = [d for d in decodes if not d["reload_inputs"]]
    assert steady and not any(d["reset_sampling_state"] for d in steady)
    assert all(d["slot_remap"] == [0, 1, 2, 3] for d in decodes)


def _check_hybrid(result: dict) -> None:
    (allocated,) = calls(result, "allocate_kv_cache_per_layer")
    assert not calls(result, "allocate_kv_cache")
    per_layer = calls(result, "page_tables_per_layer")
    assert {p["step"] for p in per_layer} == {"prefill", "decode"}
    assert all(p["layers"] == allocated["layers"] and p["same"] for p in per_layer)


def _check_qwen_vl(result: dict) -> None:
    decodes = calls(result, "decode_forward")
    assert decodes and all(d["rope_deltas_ok"] for d in decodes)


def _check_deepseek(result: dict) -> None:
    (init,) = calls(result, "initialize_vllm_model")
    assert init["tt_data_parallel"] == 1  # the host mesh's one chip
    (budget,) = calls(result, "get_max_tokens_all_users")
    assert (budget["max_model_len"], budget["max_num_seqs"]) == (256, 4)
    assert any(d["sampled"] for d in calls(result, "decode_forward"))


def _check_t3000(result: dict) -> None:
    (init,) = calls(result, "initialize_vllm_model")
    assert init["mesh"] == "HostMesh"


def _check_executor(result: dict) -> None:
    (init,) = calls(result, "initialize_vllm_model")
    assert init["optimizations"] == "performance"  # its own default: not passed unset
    decodes = calls(result, "decode_forward")
    assert decodes and all("reload_inputs" not in d for d in decodes)  # legacy form
    # requires_prefill_trace_warmup: a compile pass, then (prefill traced) a capture pass,
    # already_warmed_up_prefill reset between them; before any prefill.
    warmups = calls(result, "warmup_model_prefill")
    assert [w["enable_trace"] for w in warmups] == [False, True]
    assert all(w["can_sample_on_device"] and w["kv_cache"] for w in warmups)
    order = [name for name, _ in result["calls"]]
    assert order.index("warmup_model_prefill") < order.index("prefill_forward")
    assert not calls(result, "warmup_model_decode")


def _check_kolibri(result: dict) -> None:
    prefills = calls(result, "prefill_forward")
    assert prefills and all(p["prefill_output_mask"] is not None for p in prefills)
    rows = [
        (mask, start, end, original)
        for p in prefills
        for mask, start, end, original in zip(
            p["prefill_output_mask"], p["starts"], p["ends"], p["original_prompt_lens"]
        )
    ]
    # Only a chunk that ends its prompt outputs; the original prompt's length goes with it.
    assert any(not mask for mask, *_ in rows), "no chunk ended mid-prompt"
    lengths = {len(p) for p in PROMPTS}
    for mask, start, end, original in rows:
        assert original in lengths and start < end
        assert mask == (end == original)
    assert all(p["sampled"] for p in prefills if any(p["prefill_output_mask"]))
    decodes = calls(result, "decode_forward")
    assert decodes and all(d["sampled"] for d in decodes)  # never host sampling
    assert any(not d["reload_inputs"] for d in decodes)  # resident inputs
    (release,) = calls(result, "release_persistent_capture")
    assert release["closed_before"] is False


CHECKS = {
    "ExecutorLlama3Generator": _check_executor,
    "KolibriForCausalLM": _check_kolibri,
    "TTTransformersLlamaForCausalLM": _check_legacy_tt_transformers,
    "TTTransformersLlamaV1": _check_v1_tt_transformers,
    "HybridGptOssForCausalLM": _check_hybrid,
    "Qwen2_5_VLForConditionalGeneration": _check_qwen_vl,
    "DeepseekV3ForCausalLM": _check_deepseek,
    "T3000LlamaLegacy": _check_t3000,
    "T3000LlamaV1": _check_t3000,
}


def test_mllama_is_refused_at_load_as_not_supported_yet(tmp_path, demo_checkpoint):
    result = serve_twin(tmp_path, demo_checkpoint, "MllamaForConditionalGeneration")
    error = result.get("error", "")
    assert "TTB202" in error or "not supported yet" in error, result
    assert "images" in error and "cross_page_table" in error


def test_qwen2_5_vl_twin_serves_images_as_tt_metal_gathers_them(
    tmp_path, vision_checkpoint, vision_golden
):
    """TT-Metal's Qwen2.5-VL class (its signatures, its gathering of every row's images
    into one vision batch, its asserts) served through vLLM's engine with images on the
    tiny Qwen2.5-VL checkpoint: a mixed batch of image and text rows, each answer
    transformers' greedy one."""
    import numpy as np
    from PIL import Image

    bundle = tmp_path / "models" / "twin-qwen2-5-vl-images"
    bundle.mkdir(parents=True)
    (bundle / "adapter.py").write_text(FAMILIES.read_text())
    metadata = {
        "schema_version": 2,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": "Qwen2_5_VLForConditionalGeneration",
        "main_class": "adapter:Qwen2_5_VLWithImages",
        "capabilities": {
            "async_decode": True,
            "sample_on_device": ["decode_only"],
            "modalities": {"image": 1},  # TT-Metal's get_supported_mm_limits
        },
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(metadata))
    pictures = []
    for seed, (height, width) in enumerate([(84, 140), (112, 112)]):
        rng = np.random.default_rng(seed)
        path = tmp_path / f"picture{seed}.png"
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(path)
        pictures.append(path)
    processor = vision_golden.processor

    def prompt(images, text):
        content = [{"type": "image"} for _ in images] + [{"type": "text", "text": text}]
        rendered = processor.apply_chat_template(
            [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
        )
        return {"prompt": rendered, "images": [str(p) for p in images]}

    cases = [([pictures[0]], "Describe it."), ([], "Only text."), ([pictures[1]], "And this?")]
    spec = {
        "checkpoint": str(vision_checkpoint),
        "models_dir": str(bundle.parent),
        "image_prompts": [prompt(images, text) for images, text in cases],
        "max_tokens": MAX_TOKENS,
        "engine": {
            "max_model_len": 1024,
            "max_num_seqs": 4,
            "block_size": 16,
            "additional_config": {"tt": {"sample_on_device_mode": "decode_only"}},
        },
    }
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    done = subprocess.run(
        [sys.executable, str(SERVE), str(spec_file)], capture_output=True, text=True, timeout=600
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    result = json.loads(lines[-1])
    assert "error" not in result, result.get("error")
    for (images, _), ids, out in zip(cases, result["prompt_ids"], result["greedy"]):
        pils = [Image.open(p).convert("RGB") for p in images]
        assert vision_golden.disagreement(ids, pils, out) is None
    prefills = calls(result, "prefill_forward")
    assert any(p["rows_with_images"] == 2 and p["rows"] == 3 for p in prefills)
    assert all(d["deltas"] == 4 for d in calls(result, "decode_forward"))  # every slot


# The Qwen3.6 27B autoport: its GDN state is the generator's (a slot per request), async
# decode declared, no prefix caching, no chunked prefill (its prefill clears the slots it
# fills); its page a multiple of 32.
QWEN36 = (
    {
        "recurrent_state": {"owner": "generator", "layers": "from_config"},
        "async_decode": True,
        "sample_on_device": ALL,
    },
    {"sample_on_device_mode": "all"},
    {"block_size": 32},
)
QWEN_PROMPTS = [list(range(3, 3 + n)) for n in (40, 75, 9)]


def test_the_qwen3_6_autoport_twin_serves_its_own_slots_like_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.test_qwen3_5_reference import write_tiny_qwen3_5

    checkpoint = Path(write_tiny_qwen3_5(tmp_path / "qwen3_5"))
    engine = {**QWEN36[2], "prompts": QWEN_PROMPTS}
    result = serve_twin(
        tmp_path,
        checkpoint,
        "Qwen36AutoportForCausalLM",
        (QWEN36[0], QWEN36[1], engine),
        arch="Qwen3_5ForCausalLM",
    )
    assert "error" not in result, result.get("error")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    expected = [
        model.generate(
            torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
            do_sample=False,
        )[0, len(ids):].tolist()
        for ids in QWEN_PROMPTS
    ]  # fmt: skip
    assert result["greedy"] == expected
    assert result["greedy_again"] == expected[1:]
    assert result["seeded_alone"] == result["seeded_in_batch"]
    (allocated,) = calls(result, "allocate_kv_cache")
    assert allocated["num_layers"] == 2 and allocated["page"] % 32 == 0
    prefills = calls(result, "prefill_forward")
    # Whole prompts (no chunked prefill): every prefill starts at 0 in its own slot.
    assert prefills and all(set(p["start_pos"]) == {0} for p in prefills)
    decodes = calls(result, "decode_forward")
    assert any(not d["read_from_device"] for d in decodes)  # async decode ran
    assert all(d["slot_remap"] == [0, 1, 2, 3] for d in decodes)


# The Gemma 4 31B autoport, served as the built-in tt-gemma-4-31b bundle declares it: an
# environment class of a TT-Metal checkout (models/autoports/...: TT-Metal's classes read
# the sliding window from the config themselves), async decode, the class's KV specs
# (hybrid groups), host sampling (its device sampler is greedy-only) with the switch the
# class needs for it; its block size 64. Prompts past the 16-token window; whole prompts
# (the class reads no start_pos).
GEMMA4_31B_MODULE = "models.autoports.google_gemma_4_31b.tt.generator_vllm"
GEMMA4_31B_CAPABILITIES = {"async_decode": True, "kv_cache_spec": True, "sample_on_device": ALL}
GEMMA4_PROMPTS = [list(range(5, 5 + n)) for n in (40, 23, 9)]


def gemma4_31b_bundle(root: Path) -> Path:
    """A TT-Metal checkout's layout at `root`: the twin as the autoport's module, its
    bundle under models/autoports/vllm_bundles (the folder returned)."""
    module = root / Path(*GEMMA4_31B_MODULE.split("."))
    module.parent.mkdir(parents=True)
    module.with_suffix(".py").write_text(FAMILIES.read_text())
    bundles = root / "models" / "autoports" / "vllm_bundles"
    bundle = bundles / "twin-gemma4-31b"
    bundle.mkdir(parents=True)
    metadata = {
        "schema_version": 5,
        "name": bundle.name,
        "version": "1.0.0",
        "arch": "Gemma4ForCausalLM",
        "main_class": f"{GEMMA4_31B_MODULE}:Gemma4AutoportForCausalLM",
        "main_class_source": "environment",
        "capabilities": GEMMA4_31B_CAPABILITIES,
    }
    (bundle / "vllm_metadata.json").write_text(json.dumps(metadata))
    return bundles


def test_the_gemma4_31b_autoport_twin_serves_hybrid_groups_like_transformers(tmp_path):
    import torch
    from transformers import AutoModelForCausalLM

    from tests.conftest import GEMMA4_WINDOW, write_gemma4_checkpoint

    checkpoint = write_gemma4_checkpoint(tmp_path / "tiny-gemma4")
    assert max(len(p) for p in GEMMA4_PROMPTS) > 2 * GEMMA4_WINDOW
    tt_metal = tmp_path / "tt-metal"
    spec = {
        "checkpoint": str(checkpoint),
        "models_dir": str(gemma4_31b_bundle(tt_metal)),
        "python_path": str(tt_metal),
        "record_module": GEMMA4_31B_MODULE,
        # Host sampling (a call without sampling_params) raises unless this is set.
        "env": {"GEMMA4_31B_VLLM_HOST_SAMPLING_COMPAT": "1"},
        "prompts": GEMMA4_PROMPTS,
        "max_tokens": MAX_TOKENS,
        "engine": {
            "max_model_len": 256,
            "max_num_seqs": 4,
            "block_size": 64,
            "additional_config": {"tt": {"sample_on_device_mode": "all"}},
        },
    }
    result = run_spec(tmp_path, spec, "Gemma4AutoportForCausalLM")
    assert "error" not in result, result.get("error")
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    expected = [
        model.generate(
            torch.tensor([ids]), max_new_tokens=MAX_TOKENS, min_new_tokens=MAX_TOKENS,
            do_sample=False, pad_token_id=0,
        )[0, len(ids):].tolist()
        for ids in GEMMA4_PROMPTS
    ]  # fmt: skip
    assert result["greedy"] == expected
    assert result["greedy_again"] == expected[1:]
    assert result["seeded_alone"] == result["seeded_in_batch"]
    (init,) = calls(result, "initialize_vllm_model")
    assert init["max_seq_len"] == 256 and init["swallowed"] == []
    specs = calls(result, "get_kv_cache_spec")  # asked by the planner and the runner
    assert specs and all(s["kinds"] == ["FullAttentionSpec", "SlidingWindowSpec"] for s in specs)
    (allocated,) = calls(result, "allocate_kv_cache_per_layer")
    # Each layer in its own shape: the sliding layers' 2 KV heads of 16, the global 1 of 32.
    assert allocated["layers"] == 6
    assert allocated["shapes"] == [[1, 64, 32], [2, 64, 16]]
    prefills = calls(result, "prefill_forward")
    decodes = calls(result, "decode_forward")
    assert all(p["per_layer"] for p in prefills + decodes)
    # Its device sampler is greedy-only (sample_on_device_policy): greedy batches sample
    # there, the batch with a seeded row on the host (the class's host compatibility).
    assert {p["sampled"] for p in prefills} == {True, False}
    assert {d["sampled"] for d in decodes} == {True, False}
    # What its **_ swallowed: whole prompts from position 0, nothing else it needed.
    for p in prefills:
        assert set(p["swallowed"]) == {"start_pos", "empty_slots", "enable_trace"}, p
        assert set(p["swallowed"]["start_pos"]) == {0}, p
    assert {k for d in decodes for k in d["swallowed"]} == set(), decodes[0]
    device = [d for d in decodes if d["sampled"]]
    # Steady device decodes run on the device's own tokens (the host's may be stale): the
    # trace is prepared on the first decode of a batch only.
    assert device[0]["prepared"] and any(not d["prepared"] for d in device)
    assert any(not d["read_from_device"] for d in device)  # async decode ran
    assert all(c["is_tokens"] for c in calls(result, "process_decode_output_host"))
