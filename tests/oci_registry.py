"""A real OCI registry for the tests: Debian's `docker-registry` (distribution 2.8) on
127.0.0.1, on a free port, with a temporary storage folder, optionally behind htpasswd
basic auth. `scripts/setup` installs it where it can (root: apt); elsewhere the tests
that need it are skipped, saying why.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx

BINARY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
MISSING = (
    "Debian's docker-registry is not installed (scripts/setup installs it with apt-get "
    "when run as root; install the docker-registry and apache2-utils packages)"
)


def available() -> bool:
    return Path(BINARY).is_file() and shutil.which("htpasswd") is not None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass(frozen=True)
class Registry:
    host: str  # 127.0.0.1:PORT
    storage: Path
    user: str | None = None
    password: str | None = None

    def ref(self, path: str) -> str:
        return f"{self.host}/{path}"


def _htpasswd(path: Path, user: str, password: str) -> None:
    """A bcrypt htpasswd file (distribution accepts bcrypt only), by apache2-utils."""
    line = subprocess.run(
        ["htpasswd", "-nbB", "-C", "5", user, password], check=True, capture_output=True, text=True
    ).stdout.strip()
    path.write_text(line + "\n", encoding="utf-8")


@contextmanager
def running(folder: Path, *, user: str | None = None, password: str | None = None):
    """Start a registry in `folder`; stop it (and wait) on leaving."""
    folder.mkdir(parents=True, exist_ok=True)
    storage = folder / "storage"
    port = free_port()
    auth = ""
    if user is not None:
        _htpasswd(folder / "htpasswd", user, password or "")
        auth = f"auth:\n  htpasswd:\n    realm: test\n    path: {folder / 'htpasswd'}\n"
    config = folder / "config.yml"
    config.write_text(
        "version: 0.1\nlog:\n  level: error\n  accesslog:\n    disabled: true\n"
        f"storage:\n  filesystem:\n    rootdirectory: {storage}\n  delete:\n    enabled: true\n"
        f"http:\n  addr: 127.0.0.1:{port}\n{auth}",
        encoding="utf-8",
    )
    log = open(folder / "registry.log", "wb")  # noqa: SIM115 - closed below
    process = subprocess.Popen([BINARY, "serve", str(config)], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/v2/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(
                        f"docker-registry did not start: {(folder / 'registry.log').read_text()}"
                    ) from None
                time.sleep(0.05)
        yield Registry(f"127.0.0.1:{port}", storage, user, password)
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
