"""`ttbundle demo`: a real model served by vLLM on the host mesh, in one command.

Prepares the demo model once into the cache (`model`: SmolLM2-135M-Instruct; or, with
`tiny`, the tiny random checkpoint of `checkpoint`; with `vision`, the tiny random
Qwen2.5-VL of `vision_checkpoint`, served by the demo-vision bundle), starts `vllm serve`
on it (`server`) on the host mesh whatever the shell's MESH_DEVICE says, waits until it
answers `/health`, then either asks it once with the OpenAI client (`query`; with
`vision`, one image chat with the picture of `picture`) and stops it, or keeps it serving
in the foreground until interrupted.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from ttbundles import envs
from ttbundles.demo import model
from ttbundles.demo.checkpoint import ensure_checkpoint
from ttbundles.demo.picture import draw_picture, png_bytes
from ttbundles.demo.query import (
    COMPLETION_PROMPT,
    IMAGE_PROMPT,
    DemoAnswers,
    VisionAnswers,
    query,
    query_image,
)
from ttbundles.demo.server import (
    DEFAULT_HOST,
    DEFAULT_PORT,
    check_port,
    check_vllm_args,
    free_port,
    serve_environment,
    start_server,
)
from ttbundles.demo.variants import write_lanes_bundle
from ttbundles.demo.vision_checkpoint import ensure_vision_checkpoint
from ttbundles.errors import TTBundleError
from ttbundles.format.meshes import HOST
from ttbundles.paths import user_cache_dir


def write_checkpoint_only(folder: Path, *, vision: bool = False) -> Path:
    """`demo --write-checkpoint DIR`: the tiny demo (or vision) checkpoint, written there."""
    from ttbundles.demo.checkpoint import write_demo_checkpoint

    if vision:
        from ttbundles.demo.vision_checkpoint import write_vision_checkpoint

        return write_demo_checkpoint(folder, writer=write_vision_checkpoint)
    return write_demo_checkpoint(folder)


def prepare_only(
    checkpoint_dir: Path | None,
    *,
    vision: bool = False,
    say: Callable[[str], None] = lambda _: None,
    progress: Callable[[int, int], None] | None = None,
) -> Path:
    """`demo --prepare`: the demo model (downloaded once and converted) or the vision
    checkpoint, in the cache or `checkpoint_dir`; its folder."""
    if vision:
        return ensure_vision_checkpoint(checkpoint_dir)[0]
    return model.prepare(checkpoint_dir, say=say, progress=progress)[0]


def run_demo(
    *,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    checkpoint_dir: Path | None = None,
    with_query: bool = False,
    tiny: bool = False,
    vllm_args: Sequence[str] = (),
    lanes: int = 1,
    vision: bool = False,
    say: Callable[[str], None] = lambda line: None,
    show: Callable[[DemoAnswers | VisionAnswers], None] = lambda answers: None,
    progress: Callable[[int, int], None] | None = None,
) -> DemoAnswers | VisionAnswers | None:
    """Serve the demo checkpoint; with `with_query`, query it once and stop it.

    Without `with_query` the server keeps serving until it exits (an error) or the
    caller is interrupted (KeyboardInterrupt propagates once the server has stopped).
    With `with_query` the server's output goes to `user_cache_dir()/demo-server.log` and the
    port defaults to a free one; in the foreground it is the terminal's, on port 8000.
    `say` receives one line per stage; `show` the answers, while the server still runs
    (so they come before "server stopped"); `progress` the real model's download in
    bytes (`model.prepare`). `lanes` > 1 serves the demo bundle's
    single-execute variant with `--data-parallel-size lanes`: that many in-process lanes
    in one engine (`demo.variants`). `vision` serves the tiny random-weight Qwen2.5-VL
    checkpoint (made locally, nothing fetched) with the demo-vision bundle (lanes:
    demo-vision-lanes) and asks it about the demo's picture.
    """
    check_vllm_args(vllm_args)
    if lanes < 1:
        raise TTBundleError.single("TTB209", f"--lanes {lanes}: give 1 or more lanes")
    if lanes > 1 and any(a.split("=", 1)[0] == "--data-parallel-size" for a in vllm_args):
        raise TTBundleError.single(
            "TTB209",
            "--data-parallel-size among the vllm serve options would contradict --lanes",
            hint="use --lanes alone",
        )
    if port is None:
        port = free_port(host) if with_query else DEFAULT_PORT
    check_port(host, port)  # before minutes of preparing a checkpoint (and again at start)
    if vision:
        checkpoint, written = ensure_vision_checkpoint(checkpoint_dir)
    elif tiny:
        checkpoint, written = ensure_checkpoint(checkpoint_dir)
    else:
        checkpoint, written = model.prepare(checkpoint_dir, say=say, progress=progress)
    say(f"checkpoint: {checkpoint} ({'prepared now' if written else 'cached'})")
    # vLLM's log always goes to its file: in the foreground too, so that it does not run
    # over the lines said here (the curl hint is the last line on the terminal).
    log_path = user_cache_dir() / "demo-server.log"
    # The host-mesh demo, whatever mesh the shell names.
    env = serve_environment({**os.environ, "MESH_DEVICE": HOST})
    if lanes > 1:
        models_dir = user_cache_dir() / "lanes-models"
        bundle = write_lanes_bundle(models_dir, "demo-vision" if vision else "demo")
        env["EXTRA_MODELS_DIR"] = os.pathsep.join([str(models_dir), *envs.EXTRA_MODELS_DIR])
        # One API server: the lanes are one engine (vLLM would start one per DP rank).
        vllm_args = [*vllm_args, "--data-parallel-size", str(lanes), "--api-server-count", "1"]
        say(f"serving {lanes} in-process lanes with {bundle.name} ({bundle})")
    server = start_server(
        checkpoint, host=host, port=port, vllm_args=vllm_args, log_path=log_path, env=env
    )
    ready = False
    try:
        say(
            f"starting vllm serve on {server.base_url} (pid {server.process.pid}"
            + (f", log: {log_path})" if log_path else ")")
        )
        seconds = server.wait_ready()
        ready = True
        say(f"ready after {seconds:.1f} s")
        if with_query:
            answers = query_image(server.api_url) if vision else query(server.api_url)
            show(answers)
            return answers
        say(f"vLLM's log: {log_path} (tail -f it to follow the server)")
        say(f"serving {checkpoint} at {server.api_url}; press Ctrl-C to stop")
        if vision:
            picture = user_cache_dir() / "demo-picture.png"
            picture.parent.mkdir(parents=True, exist_ok=True)
            picture.write_bytes(png_bytes(draw_picture()))
            say(_image_curl(server.api_url, checkpoint, picture))
            say("(random weights: the answers are noise; the image path is what is real)")
        else:
            say(
                f"try: curl {server.api_url}/completions -H 'Content-Type: application/json' "
                f'-d \'{{"model": "{checkpoint}", "prompt": "{COMPLETION_PROMPT}", '
                '"max_tokens": 16, "temperature": 0}\''
            )
        code = server.process.wait()
        raise TTBundleError.single("TTB209", f"vllm serve exited with code {code}")
    finally:
        server.stop()
        if ready:
            say("server stopped")


def _image_curl(api_url: str, checkpoint: Path, picture: Path) -> str:
    """A curl command (bash) that sends `picture` as a data URL with `IMAGE_PROMPT`."""
    payload = json.dumps(
        {
            "model": str(checkpoint),
            "max_tokens": 16,
            "temperature": 0,
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "image_url", "image_url": {"url": "data:image/png;base64,@"}},
                        {"type": "text", "text": IMAGE_PROMPT},
                    ],
                }
            ],
        }
    )
    before, after = payload.split("@")
    return (
        f"try: curl {api_url}/chat/completions -H 'Content-Type: application/json' "
        f"-d '{before}'\"$(base64 -w0 {picture})\"'{after}'"
    )
