"""Images through the OpenAI API, end to end: `vllm serve` of the built-in demo-vision
bundle (the reference Qwen2.5-VL generator, TT-Metal's contract) on the host mesh, driven
by the `openai` client with data-URL images, checked token by token against transformers'
own Qwen2.5-VL on the same tiny checkpoint (`VisionGolden`: the prompt ids the server
prefilled, the checkpoint's own image processor, M-RoPE).

The "vision" server (conftest.py) allows 2 images per prompt, prefills in steps of 128
tokens, caches prefixes and decodes asynchronously; "vision-lanes" is its single-execute
variant as 2 in-process lanes. Every malformed request is answered 400 by the API server,
and the engine keeps serving.
"""

from __future__ import annotations

import base64
import io
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import openai
import pytest
from PIL import Image

from tests.e2e.conftest import Server
from tests.image_host import ImageHost, png_bytes
from ttbundles.demo.server import http_get

pytestmark = pytest.mark.server

IDS = {"ignore_eos": True, "return_token_ids": True}
LONG_TEXT = " ".join(
    ["A bundle holds metadata and an adapter class; the registry maps architectures."] * 16
)


def picture(seed: int, height: int, width: int) -> Image.Image:
    """Deterministic noise: random weights see no difference from a photograph."""
    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8))


WIDE = picture(1, 84, 140)
SQUARE = picture(2, 112, 112)
SMALL = picture(3, 56, 56)


def data_url(image: Image.Image) -> str:
    buffer = io.BytesIO()
    image.save(buffer, "PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


def chat(server: Server, content: list, max_tokens: int = 8, **kwargs):
    """One greedy chat request; plain strings in `content` are text parts."""
    content = [{"type": "text", "text": c} if isinstance(c, str) else c for c in content]
    with server.client() as client:
        return client.chat.completions.create(
            model=server.model,
            messages=[{"role": "user", "content": content}],
            max_tokens=max_tokens,
            temperature=0,
            extra_body=IDS,
            **kwargs,
        )


def ask(server: Server, images: list[Image.Image], text: str, max_tokens: int = 8):
    """(prompt ids, output ids) of one greedy chat request with these images."""
    response = chat(server, [*(image_part(data_url(im)) for im in images), text], max_tokens)
    return list(response.prompt_token_ids), list(response.choices[0].token_ids)


def assert_golden(golden, images, prompt_ids, output_ids):
    """Transformers' greedy tokens, up to a near-tie of random weights (`disagreement`)."""
    assert golden.disagreement(prompt_ids, images, output_ids) is None


def refused(server: Server, content: list) -> str:
    """The message of the 400 the server answers; the server keeps serving after it."""
    with pytest.raises(openai.BadRequestError) as excinfo:
        chat(server, content, max_tokens=2)
    return str(excinfo.value)


# --- greedy parity ----------------------------------------------------------------------


def test_one_image_matches_transformers(vision_server, vision_golden):
    prompt, out = ask(vision_server, [WIDE], "What is in the picture?", max_tokens=12)
    assert prompt.count(vision_golden.image_token_id) == 15  # 6 x 10 patches, merged 2 x 2
    assert_golden(vision_golden, [WIDE], prompt, out)


def test_two_images_in_one_prompt_match_transformers(vision_server, vision_golden):
    prompt, out = ask(vision_server, [SQUARE, SMALL], "Compare the two pictures.")
    assert_golden(vision_golden, [SQUARE, SMALL], prompt, out)


def test_a_mixed_batch_of_image_and_text_requests_matches_transformers(
    vision_server, vision_golden
):
    """Four requests at once: the prefill steps mix image rows and text-only rows."""
    cases = [
        ([WIDE], "Describe it."),
        ([], "Say something about bundles."),
        ([SQUARE, SMALL], "Which is larger?"),
        ([], "Hello there."),
    ]
    barrier = threading.Barrier(len(cases))

    def send(case):
        barrier.wait()
        return ask(vision_server, *case, max_tokens=10)

    before = vision_server.settled_stats()
    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(send, cases))
    for (images, _), (prompt, out) in zip(cases, results):
        assert_golden(vision_golden, images, prompt, out)
    delta = vision_server.stats_delta(before)
    assert delta.get("step.prefill", 0) >= 1 and delta.get("step.decode", 0) >= 9


def test_a_long_image_prompt_prefills_in_chunks_and_matches(vision_server, vision_golden):
    before = vision_server.settled_stats()
    prompt, out = ask(vision_server, [SQUARE], LONG_TEXT, max_tokens=8)
    assert len(prompt) > 3 * 128  # the server's step budget: several prefill chunks
    assert_golden(vision_golden, [SQUARE], prompt, out)
    assert vision_server.stats_delta(before).get("step.prefill", 0) >= 4


def test_a_prefix_cache_hit_on_an_image_prompt_matches(vision_server, vision_golden):
    """The second request's image lies in cached blocks: vLLM sends its grid, not its
    pixels, and the generator still places every token with M-RoPE."""
    text = LONG_TEXT + " Now describe the picture."
    first = ask(vision_server, [WIDE], text, max_tokens=6)
    hits = vision_server.metrics().get("vllm:prefix_cache_hits_total", 0.0)
    second = ask(vision_server, [WIDE], text, max_tokens=6)
    assert second == first
    after = vision_server.wait_for_metric("vllm:prefix_cache_hits_total", hits + 64)
    assert after["vllm:prefix_cache_hits_total"] >= hits + 64  # the image's blocks and more
    assert_golden(vision_golden, [WIDE], *second)


def test_image_requests_decode_asynchronously(vision_server):
    before = vision_server.settled_stats()
    ask(vision_server, [SMALL], "Go on.", max_tokens=12)
    delta = vision_server.stats_delta(before)
    assert delta.get("decode.async", 0) >= 10  # submitted without waiting for readback


# --- lanes with request-specific RoPE -------------------------------------------------------


def test_lanes_serve_image_requests_with_a_rope_delta_per_slot(vision_lanes_server, vision_golden):
    """The reference plugin refuses M-RoPE in lanes; here 4 image requests spread over 2
    lanes, each slot with its own delta, and every answer equals transformers'."""
    assert "2 in-process lanes in one engine" in vision_lanes_server.log_since(0)
    cases = [([WIDE], "One."), ([SQUARE], "Two."), ([SMALL, WIDE], "Three."), ([], "Four.")]
    barrier = threading.Barrier(len(cases))

    def send(case):
        barrier.wait()
        return ask(vision_lanes_server, *case, max_tokens=10)

    with ThreadPoolExecutor(len(cases)) as pool:
        results = list(pool.map(send, cases))
    for (images, _), (prompt, out) in zip(cases, results):
        assert_golden(vision_golden, images, prompt, out)
    assigned = vision_lanes_server.lane_metrics()["ttbundles:lane_requests_assigned"]
    assert len([lane for lane, n in assigned.items() if n > 0]) == 2


# --- bad input: a 400 naming the problem, and the server lives on -------------------------


def test_more_images_than_the_bundle_takes_is_refused(vision_server):
    urls = [data_url(im) for im in (WIDE, SQUARE, SMALL)]
    message = refused(vision_server, [image_part(u) for u in urls] + ["three"])
    assert "At most 2 image(s)" in message


def test_a_video_to_an_image_only_bundle_is_refused(vision_server):
    video = {"type": "video_url", "video_url": {"url": "data:video/mp4;base64,AAAA"}}
    assert "At most 0 video(s)" in refused(vision_server, [video, "what happens?"])


def test_audio_is_refused(vision_server):
    audio = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
    assert "At most 0 audio(s)" in refused(vision_server, [audio, "listen"])


@pytest.mark.parametrize(
    ("url", "says"),
    [
        ("data:image/png;base64,!!!not-base64!!!", "base64"),
        ("data:image/png,rawbytes", "Write the image as data:<media type>;base64,<data>"),
        ("file:///etc/hostname", "file:// URLs are not allowed on this server"),
    ],
    ids=["malformed-base64", "not-base64", "file-scheme"],
)
def test_a_bad_image_url_is_refused(vision_server, url, says):
    assert says in refused(vision_server, [image_part(url), "what is it?"])


@pytest.fixture(scope="module")
def image_hosts():
    """Real image hosts serving SMALL: 127.0.0.1 (inside, refused everywhere) and
    127.0.0.2 (allowed by the "vision-lanes" server's tt.allow_private_media_urls)."""
    png = png_bytes(SMALL)
    inside, allowed = ImageHost("127.0.0.1", png=png), ImageHost("127.0.0.2", png=png)
    yield inside, allowed
    inside.close()
    allowed.close()


def test_an_image_url_inside_the_network_is_refused_whatever_is_there(vision_server, image_hosts):
    inside, allowed = image_hosts
    found = refused(vision_server, [image_part(f"{inside.url}/pic.png"), "what is it?"])
    missing = refused(vision_server, [image_part(f"{inside.url}/missing.png"), "what is it?"])
    assert "TTB220" in found and "allow_private_media_urls" in found
    assert found == missing  # nothing tells what exists inside
    for url in (
        f"http://[::1]:{inside.port}/pic.png",
        f"http://[::ffff:127.0.0.1]:{inside.port}/pic.png",
        f"http://localhost:{inside.port}/pic.png",
        f"{allowed.url}/pic.png",  # allowed on "vision-lanes" only
        "http://169.254.169.254/latest/meta-data/",
    ):
        assert "TTB220" in refused(vision_server, [image_part(url), "what is it?"])
    assert inside.paths == [] and allowed.paths == []


def test_an_allowed_image_host_is_fetched_and_its_redirect_inside_refused(
    vision_lanes_server, vision_golden, image_hosts
):
    inside, allowed = image_hosts
    before = len(allowed.paths)
    response = chat(vision_lanes_server, [image_part(f"{allowed.url}/pic.png"), "Here?"], 6)
    prompt, out = list(response.prompt_token_ids), list(response.choices[0].token_ids)
    assert_golden(vision_golden, [SMALL], prompt, out)
    redirect = f"{allowed.url}/to?url={inside.url}/pic.png"
    assert "TTB220" in refused(vision_lanes_server, [image_part(redirect), "what is it?"])
    assert allowed.paths[before:] == ["/pic.png", f"/to?url={inside.url}/pic.png"]
    assert inside.paths == []
    message = refused(vision_lanes_server, [image_part(f"{inside.url}/pic.png"), "it?"])
    assert "TTB220" in message


def test_an_image_over_the_pixel_limit_is_refused(vision_server):
    # The server runs with VLLM_MAX_IMAGE_PIXELS=250000: 600 x 500 is 300,000 pixels.
    message = refused(vision_server, [image_part(data_url(picture(4, 500, 600))), "big"])
    assert "250000" in message


def test_placeholders_that_no_image_fills_are_refused(vision_server):
    pads = "<|vision_start|><|image_pad|><|vision_end|>"
    message = refused(vision_server, [{"type": "text", "text": f"{pads} what is this?"}])
    assert "1 image placeholder token(s) that no image sent with it fills" in message
    message = refused(
        vision_server,
        [image_part(data_url(SMALL)), {"type": "text", "text": f"and {pads} this?"}],
    )
    assert "placeholder token(s) that no image sent with it fills" in message
    with vision_server.client() as client, pytest.raises(openai.BadRequestError):
        client.completions.create(model=vision_server.model, prompt=f"{pads} hi", max_tokens=2)


def test_the_server_serves_on_after_the_refusals(vision_server, vision_golden):
    status, _ = http_get(f"{vision_server.process.base_url}/health")
    assert status == 200
    prompt, out = ask(vision_server, [SMALL], "Still there?", max_tokens=4)
    assert_golden(vision_golden, [SMALL], prompt, out)


def test_an_image_to_a_text_only_bundle_is_refused(demo_server):
    """The demo bundle serves a text checkpoint: vLLM has no processor for it."""
    message = refused(demo_server, [image_part(data_url(SMALL)), "what is it?"])
    assert "is not a multimodal model" in message


# --- abort mid-prefill ----------------------------------------------------------------------


def test_an_image_request_aborted_mid_prefill_frees_its_slot_and_cache(
    vision_server, vision_golden
):
    content = [image_part(data_url(SQUARE)), {"type": "text", "text": LONG_TEXT}]
    before = vision_server.settled_stats().get("step.prefill", 0)
    with vision_server.client() as client:
        stream = client.chat.completions.create(
            model=vision_server.model,
            messages=[{"role": "user", "content": content}],
            max_tokens=200,
            temperature=0,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        # Its ~400 tokens prefill in steps of 128: close once the first step ran (the
        # worker's counters are written after every step), before its first token.
        deadline = time.monotonic() + 30
        while vision_server.stats().get("step.prefill", 0) <= before:
            assert time.monotonic() < deadline, "the request never started to prefill"
            time.sleep(0.005)
        stream.close()
    deadline = time.monotonic() + 30
    while True:
        values = vision_server.metrics()
        idle = (
            values.get("vllm:num_requests_running", 1) == 0
            and values.get("vllm:num_requests_waiting", 1) == 0
            and values.get("vllm:kv_cache_usage_perc", 1) == 0
        )
        if idle or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert idle, {k: v for k, v in values.items() if "requests" in k or "kv_cache" in k}
    prompt, out = ask(vision_server, [WIDE], "After the abort.", max_tokens=6)
    assert_golden(vision_golden, [WIDE], prompt, out)
