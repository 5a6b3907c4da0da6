"""Registry credentials: the environment first, then the standard docker config.

`TT_BUNDLES_REGISTRY_USERNAME`/`TT_BUNDLES_REGISTRY_PASSWORD` (read through
`ttbundles.envs`) apply to every registry; otherwise `auths[host].auth` (base64
`user:password`) or `username`/`password` from `$DOCKER_CONFIG/config.json`
(`~/.docker/config.json`). Credential helpers (`credsStore`) are not run: a helper is
another program, and pushing to a registry should not start one behind the user's back.
"""

from __future__ import annotations

import base64
import binascii
import json
from pathlib import Path

from ttbundles import envs


def docker_config_path() -> Path:
    folder = envs.DOCKER_CONFIG
    return Path(folder) / "config.json" if folder else Path.home() / ".docker" / "config.json"


def credentials_for(registry: str) -> tuple[str, str] | None:
    """(username, password) for `registry` (host[:port]), or None: anonymous."""
    user, password = envs.TT_BUNDLES_REGISTRY_USERNAME, envs.TT_BUNDLES_REGISTRY_PASSWORD
    if user is not None:
        return user, password or ""
    path = docker_config_path()
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    auths = config.get("auths") if isinstance(config, dict) else None
    if not isinstance(auths, dict):
        return None
    for key in (registry, f"https://{registry}", f"http://{registry}", f"https://{registry}/v2/"):
        entry = auths.get(key)
        if isinstance(entry, dict):
            found = _decode(entry)
            if found is not None:
                return found
    return None


def _decode(entry: dict) -> tuple[str, str] | None:
    if isinstance(entry.get("auth"), str) and entry["auth"]:
        try:
            user, _, password = base64.b64decode(entry["auth"]).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        return user, password
    if isinstance(entry.get("username"), str):
        return entry["username"], str(entry.get("password", ""))
    return None


__all__ = ["credentials_for", "docker_config_path"]
