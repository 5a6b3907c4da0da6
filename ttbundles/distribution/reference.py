"""A registry reference, `host[:port]/repo/path[:tag][@sha256:hex]`, parsed once.

The host is required (no implicit Docker Hub): a bundle reference names where it lives.
Plain HTTP is used only for a loopback host or when the caller asks (`--plain-http`).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass

from ttbundles.errors import TTBundleError

_REPOSITORY = re.compile(
    r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$"
)
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
_HOST = re.compile(r"^(?:\[[0-9a-fA-F:.]+\]|[A-Za-z0-9.-]+)(?::[0-9]{1,5})?$")

EXAMPLE = "127.0.0.1:5000/team/my-llama:1.2.0"


@dataclass(frozen=True)
class Reference:
    """A parsed REF: `registry` (host[:port]), `repository`, and a tag or a digest."""

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def target(self) -> str:
        """What a manifest request names: the digest when given, else the tag."""
        return self.digest or self.tag or "latest"

    @property
    def host(self) -> str:
        host = self.registry
        if host.startswith("["):
            return host[1 : host.index("]")]
        return host.rsplit(":", 1)[0] if ":" in host else host

    @property
    def loopback(self) -> bool:
        """Whether the registry is this machine (where plain HTTP is acceptable)."""
        if self.host == "localhost":
            return True
        try:
            return ipaddress.ip_address(self.host).is_loopback
        except ValueError:
            return False

    def with_digest(self, digest: str) -> Reference:
        return Reference(self.registry, self.repository, None, digest)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def _invalid(ref: str, why: str) -> TTBundleError:
    return TTBundleError.single(
        "TTB130",
        f"{ref!r} is not a registry reference: {why}",
        hint=f"write HOST[:PORT]/REPOSITORY[:TAG][@sha256:DIGEST], e.g. {EXAMPLE}",
    )


def parse_reference(ref: str) -> Reference:
    """Parse `ref`; TTB130 naming what is wrong otherwise."""
    text = ref.strip()
    if "://" in text:
        raise _invalid(ref, "no scheme: the registry decides http or https")
    digest = None
    if "@" in text:
        text, digest = text.split("@", 1)
        if not _DIGEST.fullmatch(digest):
            raise _invalid(ref, f"digest {digest!r} is not sha256:<64 hex digits>")
    host, slash, rest = text.partition("/")
    if not slash or not rest:
        raise _invalid(ref, "it names no repository")
    if not (("." in host or ":" in host or host == "localhost") and _HOST.fullmatch(host)):
        raise _invalid(ref, f"{host!r} is not a registry host (a name with a dot, or host:port)")
    tag = None
    last = rest.rsplit("/", 1)[-1]
    if ":" in last:
        rest, tag = rest.rsplit(":", 1)
        if not _TAG.fullmatch(tag):
            raise _invalid(ref, f"tag {tag!r} is not valid (letters, digits, '.', '_', '-')")
    if not _REPOSITORY.fullmatch(rest):
        raise _invalid(ref, f"repository {rest!r} is not valid (lower case, digits, . _ - /)")
    if tag is None and digest is None:
        tag = "latest"
    return Reference(host, rest, tag, digest)
