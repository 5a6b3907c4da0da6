"""One answer to "can the model hub be reached?", the same fast way for every command.

huggingface_hub retries a connection it cannot open for about 23 s before it looks in
its cache, and vLLM and transformers retry on top of that (`plan` took 33 s, `test` two
and a half minutes, without a network). Here a connection to the hub's endpoint is tried
once (3 s at most): when it cannot open, a hub id is answered from the cache (offline from
then on, for this process and those it starts) or refused at once with TTB208. `init
--from-hf`, `plan` and `test` call `answer_offline`; the docs name TTB208 for it.

Imports only huggingface_hub's constants (no vLLM, no torch).
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path
from urllib.parse import urlsplit

from ttbundles.errors import TTBundleError

_PROXIES = ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def hub_reachable(timeout_s: float = 3.0) -> bool:
    """Whether a connection to the hub's endpoint opens (`HF_ENDPOINT`, default
    huggingface.co); False under HF_HUB_OFFLINE. With a proxy configured the probe cannot
    tell (only the proxy may be reachable): True, and the hub's own handling decides."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return False
    if any(os.environ.get(name) for name in _PROXIES):
        return True
    url = urlsplit(constants.ENDPOINT)
    if not url.hostname:
        return True
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout_s):
            return True
    except OSError:
        return False


def is_hub_id(source: str) -> bool:
    """`org/name`, not a path that exists here."""
    return bool(_REPO_ID.match(source)) and not Path(source).expanduser().exists()


def go_offline() -> None:
    """The hub off for this process (huggingface_hub reads its constant at each call) and
    for the processes it starts (the variable), so nothing retries a connection."""
    from huggingface_hub import constants

    os.environ["HF_HUB_OFFLINE"] = "1"
    constants.HF_HUB_OFFLINE = True


def answer_offline(source: str) -> None:
    """For a hub id when the hub cannot be reached: go offline when its config.json is in
    the hub cache, else TTB208 at once. Nothing for a folder, or a reachable hub."""
    if not is_hub_id(source) or hub_reachable():
        return
    from huggingface_hub import try_to_load_from_cache

    if isinstance(try_to_load_from_cache(source, "config.json"), str):
        go_offline()
        return
    raise TTBundleError.single(
        "TTB208",
        f"{source!r} is not in the hub cache, and the hub cannot be reached (no network, "
        "or HF_HUB_OFFLINE is set)",
        hint=f"download it where there is a network (hf download {source}), or pass the "
        "checkpoint's folder",
    )
