"""Print `export` lines that give uv the package sources pip is configured with.

scripts/setup installs with uv (the same packages as pip, in a fifth of the time: about
30 s instead of 140 s for a fresh venv here), but uv does not read pip's configuration
files nor its PIP_* variables. The machine's own pip configuration (extra indexes, local
wheels, constraints, a CA bundle) is what says where packages come from, so it is read
here (`pip config list`) and translated, never copied into this repository.
Run by the venv's Python: `python scripts/uv_env.py`.
"""

from __future__ import annotations

import shlex
import subprocess
import sys


def pip_settings() -> dict[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    settings: dict[str, str] = {}
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]  # global.find-links, install.constraint, :env:.cert
        # Later lines win: pip lists files, then the environment (which pip prefers).
        settings[name] = value.strip().strip("'\"")
    return settings


def uv_environment(settings: dict[str, str]) -> dict[str, str]:
    env = {
        # pip picks the best version across every index; uv's default stops at the first
        # index that has the package, which would take an older one from a local index.
        "UV_INDEX_STRATEGY": "unsafe-best-match",
    }
    if settings.get("index-url"):
        env["UV_DEFAULT_INDEX"] = settings["index-url"]
    if settings.get("extra-index-url"):
        env["UV_EXTRA_INDEX_URL"] = " ".join(settings["extra-index-url"].split())
    if settings.get("find-links"):
        env["UV_FIND_LINKS"] = ",".join(settings["find-links"].split())
    if settings.get("constraint"):
        env["UV_CONSTRAINT"] = " ".join(settings["constraint"].split())
    if settings.get("cert"):
        env["SSL_CERT_FILE"] = settings["cert"]
    if settings.get("timeout") or settings.get("default-timeout"):
        env["UV_HTTP_TIMEOUT"] = settings.get("timeout") or settings["default-timeout"]
    return env


if __name__ == "__main__":
    for name, value in uv_environment(pip_settings()).items():
        print(f"export {name}={shlex.quote(value)}")
