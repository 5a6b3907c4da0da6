"""Moving one blob: upload (monolithic, streamed from the file) and verified download.

A download hashes while it writes and checks size and digest before the caller may use
the file; a blob is never held in memory whole (1 MiB chunks).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

from ttbundles.distribution.client import RegistryClient
from ttbundles.errors import TTBundleError

CHUNK = 1 << 20
Progress = Callable[[int, int], None]


def file_digest(path: Path) -> tuple[str, int]:
    """("sha256:<hex>", size) of a file, streamed."""
    sha = hashlib.sha256()
    size = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            sha.update(chunk)
            size += len(chunk)
    return "sha256:" + sha.hexdigest(), size


def exists(client: RegistryClient, digest: str) -> bool:
    response = client.request("HEAD", f"blobs/{digest}", ok=(200, 404), what=f"blob {digest}")
    return response.status_code == 200


def _chunks(path: Path, size: int, progress: Progress | None) -> Iterator[bytes]:
    done = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            done += len(chunk)
            if progress is not None:
                progress(done, size)
            yield chunk


def upload(
    client: RegistryClient,
    digest: str,
    size: int,
    *,
    path: Path | None = None,
    data: bytes | None = None,
    progress: Progress | None = None,
) -> bool:
    """Upload a blob unless the registry has it; whether it was sent."""
    if exists(client, digest):
        return False
    started = client.request(
        "POST", "blobs/uploads/", ok=(202,), what="a blob upload", headers={"Content-Length": "0"}
    )
    location = started.headers.get("location")
    if not location:
        raise TTBundleError.single(
            "TTB136", f"registry {client.ref.registry} started an upload without a Location"
        )
    separator = "&" if "?" in location else "?"
    body = data if data is not None else _chunks(path, size, progress)  # type: ignore[arg-type]
    client.request(
        "PUT",
        f"{location}{separator}digest={digest}",
        headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
        content=body,
        ok=(201,),
        what=f"blob {digest}",
    )
    return True


def mismatch(what: str, expected: str, actual: str, ref: object) -> TTBundleError:
    return TTBundleError.single(
        "TTB135",
        f"{ref}: {what} has digest {actual}, expected {expected}; nothing was written",
        hint="the registry or the network altered the data; push the bundle again",
    )


def fetch_bytes(client: RegistryClient, digest: str, size: int, limit: int, what: str) -> bytes:
    """A small blob (config, signature), checked against its digest and size."""
    if size > limit:
        raise TTBundleError.single(
            "TTB134", f"{client.ref}: {what} is {size} bytes, more than {limit}"
        )
    data = client.request("GET", f"blobs/{digest}", what=f"{what} {digest}").content
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != digest or len(data) != size:
        raise mismatch(what, digest, actual, client.ref)
    return data


def download(
    client: RegistryClient,
    digest: str,
    size: int,
    dest: Path,
    *,
    progress: Progress | None = None,
) -> None:
    """Stream blob `digest` into the new file `dest`, checking size and digest.

    On any failure `dest` is removed; the caller names a temporary file.
    """
    sha = hashlib.sha256()
    done = 0
    try:
        fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        with (
            os.fdopen(fd, "wb") as out,
            client.stream(f"blobs/{digest}", what=f"blob {digest}") as response,
        ):
            for chunk in response.iter_bytes(CHUNK):
                done += len(chunk)
                if done > size:
                    raise mismatch(
                        "the archive layer", digest, "(larger than declared)", client.ref
                    )
                sha.update(chunk)
                out.write(chunk)
                if progress is not None:
                    progress(done, size)
        actual = "sha256:" + sha.hexdigest()
        if actual != digest or done != size:
            raise mismatch("the archive layer", digest, actual, client.ref)
    except BaseException:
        dest.unlink(missing_ok=True)
        raise
