"""`ttbundle test` with images: the tests section's `image_prompts` (format, plan, the
images drawn or read), the comparison against a golden that takes pixels (fast tier); and
the command on demo-vision and on a generator that loses the pixels (`-m server`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import jsonschema
import numpy as np
import pytest

from ttbundles.conformance.compare import (
    CaseResult,
    FileSource,
    LiveSource,
    check_thresholds,
    compare_logits,
)
from ttbundles.conformance.plan import resolve_plan
from ttbundles.errors import InvalidBundleError, TTBundleError
from ttbundles.format.golden_file import GoldenFile
from ttbundles.format.metadata import Thresholds
from ttbundles.format.parse import parse_metadata
from ttbundles.format.prompts import load_image
from ttbundles.format.schema import generate_schema

REPO = Path(__file__).parents[1]
DEMO_VISION = REPO / "bundles" / "demo-vision"
META = "vllm_metadata.json"
BASE = {
    "schema_version": 2,
    "name": "v",
    "version": "1.0.0",
    "arch": "Qwen2_5_VLForConditionalGeneration",
    "main_class": "adapter:Gen",
    "capabilities": {"modalities": {"image": 2}},
}
ONE = {"text": "What is this?", "images": [{"seed": 1, "width": 70, "height": 42}]}


def parsed(tests, **extra):
    text = json.dumps({**BASE, **extra, "tests": tests}, indent=2)
    return parse_metadata(text, file=Path(META))


def only_error(tests, **extra):
    loaded = parsed(tests, **extra)
    assert loaded.metadata is None and len(loaded.diagnostics) == 1, [
        str(d) for d in loaded.diagnostics
    ]
    return loaded.diagnostics[0]


# --- the format -------------------------------------------------------------------------


def test_image_prompts_parse_and_the_schema_accepts_them():
    tests = {
        "prompts": ["Hello"],
        "image_prompts": [
            ONE,
            {"text": "Two", "images": [{"file": "tests/cat.png"}, {"seed": 2}], "x-note": 1},
        ],
    }
    loaded = parsed(tests)
    assert loaded.diagnostics == []
    prompts = loaded.metadata.tests.image_prompts
    assert [len(p.images) for p in prompts] == [1, 2]
    assert prompts[1].images[0].file == "tests/cat.png" and prompts[1].images[1].seed == 2
    assert (prompts[1].images[1].width, prompts[1].images[1].height) == (64, 64)
    assert prompts[1].extensions == {"x-note": 1}
    jsonschema.validate({**BASE, "tests": tests}, generate_schema())


def test_schema_1_refuses_image_prompts_in_the_model_and_the_schema():
    d = only_error({"image_prompts": [ONE]}, schema_version=1, capabilities={})
    assert d.code == "TTB020" and "tests.image_prompts needs schema_version 2" in d.message
    document = {**BASE, "schema_version": 1, "capabilities": {}, "tests": {"image_prompts": [ONE]}}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(document, generate_schema())


@pytest.mark.parametrize(
    ("prompt", "code", "pointer", "fix"),
    [
        ({"text": "a", "imgs": []}, "TTB030", "/tests/image_prompts/0/imgs", "'images'"),
        (
            {"text": "a", "images": [{"sed": 1}]},
            "TTB030",
            "/tests/image_prompts/0/images/0/sed",
            "'seed'",
        ),
        ({"text": "a", "images": []}, "TTB033", "/tests/image_prompts/0/images", None),
        ({"text": "a", "images": [{}]}, "TTB033", "/tests/image_prompts/0/images/0", "seed"),
        (
            {"text": "a", "images": [{"seed": 1, "file": "a.png"}]},
            "TTB033",
            "/tests/image_prompts/0/images/0",
            "seed",
        ),
        (
            {"text": "a", "images": [{"file": "../a.png"}]},
            "TTB033",
            "/tests/image_prompts/0/images/0/file",
            "relative",
        ),
        ({"text": "", "images": [{"seed": 1}]}, "TTB033", "/tests/image_prompts/0/text", None),
    ],
)
def test_bad_image_prompts_are_diagnosed_with_their_pointer(prompt, code, pointer, fix):
    loaded = parsed({"image_prompts": [prompt]})
    assert loaded.metadata is None
    # A misspelt required key also reports the key as missing: the one named here is there.
    found = [d for d in loaded.diagnostics if (d.code, d.pointer) == (code, pointer)]
    assert len(found) == 1, [str(d) for d in loaded.diagnostics]
    d = found[0]
    if fix is not None:
        assert fix in f"{d.message} {d.hint}", str(d)


# --- the plan and the images ------------------------------------------------------------


def plan_for(tmp_path, tests, capabilities=BASE["capabilities"], files=None):
    folder = tmp_path / "b"
    folder.mkdir(exist_ok=True)
    for name, data in (files or {}).items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(data)
    document = {**BASE, "capabilities": capabilities, "tests": tests}
    loaded = parse_metadata(json.dumps(document), file=folder / META)
    assert loaded.metadata is not None, [str(d) for d in loaded.diagnostics]
    return resolve_plan(folder, loaded.metadata)


def png(tmp_path) -> bytes:
    image = load_image({"seed": 9, "width": 20, "height": 10})
    image.save(tmp_path / "x.png")
    return (tmp_path / "x.png").read_bytes()


def test_image_prompts_follow_the_texts_and_replace_the_defaults(tmp_path):
    plan = plan_for(tmp_path, {"image_prompts": [ONE]})
    assert [(p.name, p.text) for p in plan.prompts] == [("i0", "What is this?")]
    assert plan.prompts[0].images == ({"seed": 1, "width": 70, "height": 42},)
    assert plan.prompts[0].label() == "i0 'What is this?' +1 image" and plan.has_images
    plan = plan_for(
        tmp_path,
        {"prompts": ["a"], "image_prompts": [{"text": "b", "images": [{"file": "t/x.png"}]}]},
        files={"t/x.png": png(tmp_path)},
    )
    assert [p.name for p in plan.prompts] == ["p0", "i0"]
    assert plan.prompts[1].images == ({"file": str(tmp_path / "b" / "t" / "x.png")},)
    spec = plan.harness_spec(models_dir=tmp_path, checkpoint="c", out_dir=tmp_path)
    assert spec["prompts"][1]["images"] == [{"file": str(tmp_path / "b" / "t" / "x.png")}]


@pytest.mark.parametrize(
    ("capabilities", "images", "code", "message"),
    [
        ({}, [{"seed": 1}], "TTB110", "takes no image input"),
        ({"modalities": {"image": 1}}, [{"seed": 1}, {"seed": 2}], "TTB110", "at most 1"),
        (BASE["capabilities"], [{"file": "missing.png"}], "TTB111", "does not exist"),
        (BASE["capabilities"], [{"file": "bad.png"}], "TTB111", "not an image"),
    ],
)
def test_image_prompts_a_bundle_cannot_take_are_refused(
    tmp_path, capabilities, images, code, message
):
    with pytest.raises(InvalidBundleError) as caught:
        plan_for(
            tmp_path,
            {"image_prompts": [{"text": "a", "images": images}]},
            capabilities=capabilities,
            files={"bad.png": b"not a png"},
        )
    (d,) = caught.value.diagnostics
    assert d.code == code and message in d.message, str(d)
    assert d.pointer.startswith("/tests/image_prompts/0/images"), str(d)


def test_validate_reports_a_missing_image_file(tmp_path, run_cli):
    folder = tmp_path / "demo-vision"
    shutil.copytree(DEMO_VISION, folder)
    meta = json.loads((folder / META).read_text())
    meta["tests"]["image_prompts"][0]["images"] = [{"file": "tests/gone.png"}]
    (folder / META).write_text(json.dumps(meta, indent=2))
    done = run_cli("validate", folder)
    assert done.returncode == 1 and "TTB111" in done.stdout + done.stderr
    assert "'tests/gone.png' does not exist" in done.stdout + done.stderr


def test_drawn_images_are_the_same_pixels_for_a_seed_and_files_read_as_rgb(tmp_path):
    a = np.asarray(load_image({"seed": 4, "width": 30, "height": 20}))
    assert a.shape == (20, 30, 3) and a.dtype == np.uint8
    assert np.array_equal(a, np.asarray(load_image({"seed": 4, "width": 30, "height": 20})))
    assert not np.array_equal(a, np.asarray(load_image({"seed": 5, "width": 30, "height": 20})))
    load_image({"seed": 4, "width": 30, "height": 20}).convert("L").save(tmp_path / "g.png")
    assert load_image({"file": str(tmp_path / "g.png")}).mode == "RGB"


# --- the comparison ---------------------------------------------------------------------


class PixelGolden:
    """A golden whose logits depend on the image pixels and on where the prompt ends, like
    transformers' image-text class: each call is recorded."""

    name = "transformers"
    image_token_id = 7

    def __init__(self, vocab=16):
        self.vocab = vocab
        self.calls = []

    def sequence_logits(self, ids, images=(), prompt_tokens=None):
        self.calls.append((list(ids), len(images), prompt_tokens))
        shift = sum(float(np.asarray(i, dtype=np.float64).mean()) for i in images)
        rows = np.array(
            [
                [np.sin(0.7 * t + 0.3 * v + j + shift) for v in range(self.vocab)]
                for j, t in enumerate(ids)
            ],
            dtype=np.float32,
        )
        return rows


def served_rows(golden, context, tokens, images):
    logits = golden.sequence_logits(context + tokens[:-1], [load_image(i) for i in images])
    return logits[len(context) - 1 :]


def test_image_cases_are_compared_with_the_same_pixels_and_the_prompt_length():
    golden = PixelGolden()
    images = ({"seed": 1, "width": 28, "height": 28},)
    context, tokens = [1, 7, 7, 2], [3, 4, 5]
    rows = served_rows(golden, context, tokens, images)
    case = CaseResult("decode", "i0", "i0", "transformers")
    compare_logits(case, context, tokens, rows, LiveSource(golden).with_images(images))
    check_thresholds(case, Thresholds())
    assert case.passed and len(case.compared) == 3
    assert case.summary()["pcc_min"] > 0.9999
    assert golden.calls[-1] == (context + tokens[:-1], 1, len(context))
    # Served from other pixels (a generator that lost the image): the comparison sees it.
    other = served_rows(golden, context, tokens, ({"seed": 2, "width": 28, "height": 28},))
    case = CaseResult("decode", "i0", "i0", "transformers")
    compare_logits(case, context, tokens, other, LiveSource(golden).with_images(images))
    check_thresholds(case, Thresholds())
    assert not case.passed and case.failures[0].code == "TTB120"
    assert "step 0" in case.failures[0].message


def test_goldens_without_images_refuse_image_prompts():
    class TextGolden:
        name = "reference"

        def sequence_logits(self, ids):
            raise AssertionError("not reached")

    with pytest.raises(TTBundleError) as caught:
        LiveSource(TextGolden()).with_images(({"seed": 1},))
    assert caught.value.diagnostics[0].code == "TTB125"
    recorded = GoldenFile(
        golden="transformers", model={}, max_tokens=1, top_k=1, prompts=[], perplexity=None
    )
    with pytest.raises(TTBundleError, match="not supported yet"):
        FileSource(recorded, "g").with_images(({"seed": 1},))


def test_the_vision_golden_teacher_forced_logits_are_its_greedy_steps(vision_checkpoint):
    """VisionGolden.sequence_logits on the prompt and its greedy continuation gives, at
    each position, the logits transformers' generate chose each token from; the prompt's
    image placeholders only are image positions."""
    import torch

    from ttbundles.reference.vl_golden import VisionGolden

    golden = VisionGolden(vision_checkpoint)
    image = load_image({"seed": 3, "width": 56, "height": 84})
    content = [{"type": "image"}, {"type": "text", "text": "What is this?"}]
    text = golden.processor.apply_chat_template(
        [{"role": "user", "content": content}], add_generation_prompt=True, tokenize=False
    )
    ids = list(golden.processor(text=[text], images=[image])["input_ids"][0])
    assert ids.count(golden.image_token_id) == 6  # 84x56 pixels: 6x4 patches, 2x2 merged
    inputs = golden.inputs(ids, [image])
    with torch.no_grad():
        out = golden.model.generate(
            **inputs,
            max_new_tokens=4,
            min_new_tokens=4,
            do_sample=False,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(ids) :].tolist()
    steps = torch.stack([s[0] for s in out.logits]).float().numpy()
    logits = golden.sequence_logits(ids + tokens[:-1], [image], len(ids))
    assert np.allclose(logits[len(ids) - 1 :], steps, atol=1e-4)
    # Without the pixels the same ids give other logits: the image is really used.
    blank = load_image({"seed": 4, "width": 56, "height": 84})
    assert not np.allclose(golden.sequence_logits(ids, [blank])[-1], steps[0], atol=1e-3)


# --- the command (served by vLLM's engine) ----------------------------------------------

SERVE_TIMEOUT = 900


def serve_cli(*args):
    from tests.conftest import _run_cli_process

    return _run_cli_process("test", *args, "--format", "json", timeout=SERVE_TIMEOUT)


@pytest.mark.server
def test_demo_vision_passes_on_image_prompts_and_a_generator_without_pixels_fails(
    tmp_path, vision_checkpoint
):
    done = serve_cli(DEMO_VISION, "--model", vision_checkpoint)
    assert done.stdout.strip(), done.stderr[-3000:]
    report = json.loads(done.stdout)
    assert done.returncode == 0 and report["passed"], report["diagnostics"]
    cases = {(c["path"], c["prompt"]): c for c in report["cases"]}
    assert set(cases) == {(p, n) for p in ("prefill", "decode") for n in ("p0", "i0", "i1")}
    for (path, name), case in cases.items():
        assert case["golden"] == "transformers"
        assert case["summary"]["compared"] == (1 if path == "prefill" else 8)
        assert case["summary"]["pcc_min"] >= 0.99 and case["summary"]["top1"] == 1.0
        assert case["details"].get("images") == {"p0": None, "i0": 1, "i1": 2}[name]
    # The image prompts were prefilled with their placeholders expanded.
    assert cases["prefill", "i1"]["details"]["prompt_tokens"] > 20

    # The same bundle whose prefill drops the pixels: only the image prompts fail.
    broken = tmp_path / "demo-vision"
    shutil.copytree(DEMO_VISION, broken)
    adapter = (broken / "adapter.py").read_text()
    call = "return super().prefill_forward(\n"
    assert adapter.count(call) == 1
    adapter = adapter.replace(
        call,
        "kwargs['pixel_values'] = [\n"
        "            None if p is None else [0 * x for x in p] if isinstance(p, list) else 0 * p\n"
        "            for p in kwargs.get('pixel_values') or []\n"
        "        ] or None\n"
        "        " + call,
    )
    (broken / "adapter.py").write_text(adapter)
    done = serve_cli(broken, "--model", vision_checkpoint)
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["passed"]
    failed = {(c["path"], c["prompt"]) for c in report["cases"] if not c["passed"]}
    assert failed == {(p, n) for p in ("prefill", "decode") for n in ("i0", "i1")}
    assert any("PCC" in d["message"] and "i0" in d["message"] for d in report["diagnostics"])
