"""A real OCI registry for the tests: Debian's `docker-registry` (distribution 2.8) on
127.0.0.1, on a free port, with a temporary storage folder, optionally behind htpasswd
basic auth or the bearer-token flow (`auth: token`, with `TokenServer` as its realm).
`scripts/test` installs it where it can (root: apt); elsewhere the tests that need it
are skipped, saying why.
"""

from __future__ import annotations

import base64
import datetime
import json
import shutil
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import httpx

BINARY = shutil.which("docker-registry") or "/usr/bin/docker-registry"
MISSING = (
    "Debian's docker-registry is not installed (scripts/test installs it with apt-get "
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


SERVICE = "ttbundles-test-registry"
ISSUER = "ttbundles-test-token-server"


@dataclass
class TokenServer:
    """A token service as the bearer-token flow has it (docker's token spec), on
    127.0.0.1: `GET /token?service=...&scope=...` with basic credentials answers
    `{"token": JWT, "expires_in": N}`, the JWT signed RS256 by a key made here, with the
    self-signed certificate of that key in its `x5c` header, which the registry trusts
    (`rootcertbundle`). `grant(user, type, name, actions)` decides the actions granted
    (default: all asked); `lifetime` the seconds a token lives (negative: issued
    expired). `requests` records (user, scope) of each token asked for."""

    user: str
    password: str
    folder: Path
    grant: Callable[[str, str, str, list[str]], list[str]] = lambda u, t, n, a: a
    lifetime: int = 300
    requests: list[tuple[str | None, str | None]] = field(default_factory=list)

    def __post_init__(self) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import rsa
        from cryptography.x509.oid import NameOID

        self._key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, ISSUER)])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.folder.mkdir(parents=True, exist_ok=True)
        self.certificate = self.folder / "token-root.pem"
        self.certificate.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        self._x5c = base64.b64encode(cert.public_bytes(serialization.Encoding.DER)).decode()
        self._http = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.realm = f"http://127.0.0.1:{self._http.server_address[1]}/token"
        self._thread = threading.Thread(target=self._http.serve_forever, daemon=True)

    def issue(self, subject: str, scopes: list[str], lifetime: int | None = None) -> str:
        """A signed token for `subject` granting what `grant` allows of `scopes`."""
        import jwt

        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            granted = self.grant(subject, kind, name, actions.split(",") if actions else [])
            if granted:
                access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        lifetime = self.lifetime if lifetime is None else lifetime
        claims = {
            "iss": ISSUER,
            "sub": subject,
            "aud": SERVICE,
            "iat": now if lifetime > 0 else now + lifetime - 60,
            "nbf": now - 5 if lifetime > 0 else now + lifetime - 60,
            "exp": now + lifetime,
            "jti": uuid.uuid4().hex,
            "access": access,
        }
        return jwt.encode(claims, self._key, algorithm="RS256", headers={"x5c": [self._x5c]})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # quiet
                pass

            def _answer(self, status: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:  # noqa: N802 - http.server's name
                url = urlsplit(self.path)
                query = parse_qs(url.query)
                user = None
                header = self.headers.get("Authorization", "")
                if header.startswith("Basic "):
                    decoded = base64.b64decode(header[6:]).decode("utf-8", "replace")
                    user, _, password = decoded.partition(":")
                    if (user, password) != (server.user, server.password):
                        server.requests.append((user, None))
                        self._answer(401, {"details": "wrong username or password"})
                        return
                scopes = query.get("scope", [])
                server.requests.append((user, " ".join(scopes) or None))
                if url.path != "/token" or query.get("service") != [SERVICE]:
                    self._answer(400, {"details": "unknown service"})
                    return
                if user is None:  # anonymous: a token that grants nothing
                    scopes = []
                token = server.issue(user or "", scopes)
                self._answer(200, {"token": token, "expires_in": server.lifetime})

        return Handler

    def __enter__(self) -> TokenServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._http.shutdown()
        self._http.server_close()
        self._thread.join(10)


@contextmanager
def running(
    folder: Path,
    *,
    user: str | None = None,
    password: str | None = None,
    tokens: TokenServer | None = None,
):
    """Start a registry in `folder`; stop it (and wait) on leaving. With `tokens`, the
    registry demands the bearer-token flow, `tokens` being its realm."""
    folder.mkdir(parents=True, exist_ok=True)
    storage = folder / "storage"
    port = free_port()
    auth = ""
    if tokens is not None:
        auth = (
            f"auth:\n  token:\n    realm: {tokens.realm}\n    service: {SERVICE}\n"
            f"    issuer: {ISSUER}\n    rootcertbundle: {tokens.certificate}\n"
        )
    elif user is not None:
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
