"""Image URLs that cannot reach inside: the API server fetches an http(s) `image_url`
only from public addresses, unless the operator allows more (TTB220).

Why: vLLM's media connector fetches whatever http(s) URL a client names, from the API
server. A TT inference server usually sits inside a lab or cluster network, so a client
could make it request `http://127.0.0.1:PORT/...`, a private address or a cloud metadata
address (169.254.169.254), and learn from the answer (200, or vLLM's 422 "HTTP 404
error") or its timing what is there. vLLM's `--allowed-media-domains` compares the
URL's host name only: a public-looking name may resolve inside, and redirects are
followed unchecked.

How: the check sits where the connection is made, on the addresses it is made to, never
on a look-up of its own before (which a name answering public first and private next,
DNS rebinding, would pass):
- async (aiohttp, what vLLM's OpenAI server uses): a `TCPConnector` whose host
  resolution (`_resolve_host`, aiohttp's one path to the addresses it connects to, for
  names, cached answers and address literals alike) refuses a host with any inside
  address;
- sync (requests/urllib3): connection classes that resolve, check every answer, then
  connect to those very answers.
Every redirect hop makes its connection through them, so a redirect to an inside address
is refused too, before anything is sent there. A refused host is never connected to, so
the answer (one 400, the same whether anything listens there) tells a client nothing of
what is inside; the server's log names the host and address for the operator.

An address is *inside* when it is loopback, private, link-local, multicast, unspecified
or otherwise not globally routable (reserved, shared, documentation ranges), IPv4 or
IPv6, including IPv4 addresses written into IPv6 (`::ffff:127.0.0.1`, 6to4, NAT64).
`tt.allow_private_media_urls` (`ServerOptions`) allows all of them or listed networks.

Proxies: the proxies this host is configured with (`HTTP(S)_PROXY`, as vLLM's clients
honour them) are the operator's own and are connected to; for a URL sent through one,
its host is resolved and checked here before the request (the proxy resolves it again,
and follows no redirect of ours: a proxy's own egress rules govern what it reaches).

The caps are vLLM's own and stay in force on these connections:
`VLLM_MAX_MEDIA_DOWNLOAD_SIZE_MB` per image, `VLLM_MAX_MEDIA_REQUEST_DOWNLOAD_SIZE_MB`
per request, `VLLM_IMAGE_FETCH_TIMEOUT` per attempt, `VLLM_MEDIA_FETCH_MAX_RETRIES`.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import urllib.request
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp
import requests
import urllib3.connection
import urllib3.connectionpool
from requests.adapters import HTTPAdapter
from urllib3.exceptions import ConnectTimeoutError, NameResolutionError, NewConnectionError
from urllib3.util.connection import allowed_gai_family
from urllib3.util.timeout import _DEFAULT_TIMEOUT
from vllm.exceptions import VLLMValidationError

from ttbundles.serving import compat

logger = logging.getLogger("vllm.ttbundles")

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
Address = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class InsideAddressError(VLLMValidationError):
    """An image URL (or a redirect hop) whose host is an inside address: vLLM answers
    it with 400 and, being no connection error, never retries it."""


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, well-known NAT64), if any."""
    if ip.ipv4_mapped is not None:
        return ip.ipv4_mapped
    if ip.sixtofour is not None:
        return ip.sixtofour
    if ip in _NAT64:
        return ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    return None


def _address(text: str) -> Address:
    return ipaddress.ip_address(text.split("%", 1)[0])  # drop an IPv6 zone (fe80::1%eth0)


def address_class(address: str) -> str | None:
    """What kind of inside address `address` is ("loopback", "private", "link-local",
    "multicast", "unspecified", "reserved"), or None for a public one."""
    ip = _address(address)
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:  # the IPv4 address itself, written as IPv6
            return address_class(str(ip.ipv4_mapped))
        embedded = _embedded_ipv4(ip)
        if embedded is not None and (kind := address_class(str(embedded))) is not None:
            return kind
    for kind, inside in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
    ):
        if inside:
            return kind
    return "reserved" if not ip.is_global else None


@dataclass(frozen=True)
class MediaURLPolicy:
    """Which inside addresses image URLs may name: none (the default), all, or those in
    `networks` (from `tt.allow_private_media_urls`)."""

    allow_all: bool = False
    networks: tuple[Network, ...] = ()

    @classmethod
    def from_option(cls, allow: bool | list[str]) -> MediaURLPolicy:
        if isinstance(allow, bool):
            return cls(allow_all=allow)
        return cls(networks=tuple(ipaddress.ip_network(n, strict=False) for n in allow))

    def refusal(self, address: str) -> str | None:
        """The class of inside address this policy refuses `address` as, or None."""
        kind = address_class(address)
        if kind is None or self.allow_all:
            return None
        ip = _address(address)
        candidates = [ip]
        if isinstance(ip, ipaddress.IPv6Address) and (v4 := _embedded_ipv4(ip)) is not None:
            candidates.append(v4)
        if any(c in n for c in candidates for n in self.networks if c.version == n.version):
            return None
        return kind


_current: list[MediaURLPolicy] = [MediaURLPolicy()]


def set_policy(policy: MediaURLPolicy) -> None:
    """The policy this process's guarded connections apply from now on."""
    _current[0] = policy


def policy() -> MediaURLPolicy:
    return _current[0]


def check_addresses(host: str, addresses: Iterable[str]) -> None:
    """Refuse `host` (InsideAddressError, TTB220) when any of its addresses is inside
    and not allowed: a name answering both public and inside addresses is refused
    whichever one the connection would try first."""
    current = policy()
    for address in addresses:
        kind = current.refusal(address)
        if kind is not None:
            logger.warning(
                "ttbundles: TTB220 refused to fetch an image from %s: it resolves to %s, a "
                "%s address (allow with --additional-config.tt.allow_private_media_urls)",
                host,
                address,
                kind,
            )
            raise InsideAddressError(
                "TTB220: the image URL's host (or a host it redirects to) is not a public "
                "address, and this server fetches images from public addresses only; send "
                "the image as a data URL (data:image/png;base64,...), or have the "
                "operator allow inside addresses (tt.allow_private_media_urls)",
                parameter="image_url",
            )


def _proxy_hosts() -> set[str]:
    """The hosts of the proxies this process is configured with (HTTP(S)_PROXY...)."""
    hosts = set()
    for scheme, url in urllib.request.getproxies().items():
        if scheme != "no":
            host = urlsplit(url if "://" in url else f"http://{url}").hostname
            if host:
                hosts.add(host.lower())
    return hosts


def _proxied(url: str) -> bool:
    """Whether the environment sends `url` through a proxy (as requests and aiohttp with
    `trust_env` read it)."""
    parts = urlsplit(url)
    return bool(
        urllib.request.getproxies().get(parts.scheme)
        and not urllib.request.proxy_bypass(parts.hostname or "")
    )


def _trusted(host: str) -> bool:
    return host.strip("[]").lower() in _proxy_hosts()


# --- sync: requests / urllib3 ---------------------------------------------------------


def _connect_checked(
    host: str,
    port: int,
    timeout: Any,
    source_address: tuple[str, int] | None,
    socket_options: Any,
) -> socket.socket:
    """urllib3's `create_connection`, checking every answer before connecting to any."""
    host = host.strip("[]")
    answers = socket.getaddrinfo(host, port, allowed_gai_family(), socket.SOCK_STREAM)
    if not _trusted(host):
        check_addresses(host, [str(sockaddr[0]) for *_, sockaddr in answers])
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in answers:
        sock = None
        try:
            sock = socket.socket(family, kind, proto)
            for option in socket_options or ():
                sock.setsockopt(*option)
            if timeout is not _DEFAULT_TIMEOUT:
                sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            if sock is not None:
                sock.close()
    raise error or OSError("getaddrinfo returns an empty list")


class _CheckedConnect:
    """`_new_conn` (urllib3's one place a connection's socket is made) over
    `_connect_checked`, with urllib3's own error mapping."""

    def _new_conn(self) -> socket.socket:
        conn: Any = self
        try:
            return _connect_checked(
                conn._dns_host, conn.port, conn.timeout, conn.source_address, conn.socket_options
            )
        except socket.gaierror as exc:
            raise NameResolutionError(conn.host, conn, exc) from exc
        except TimeoutError as exc:
            raise ConnectTimeoutError(
                conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
            ) from exc
        except OSError as exc:
            raise NewConnectionError(conn, f"Failed to establish a new connection: {exc}") from exc


class _HTTPConnection(_CheckedConnect, urllib3.connection.HTTPConnection):
    pass


class _HTTPSConnection(_CheckedConnect, urllib3.connection.HTTPSConnection):
    pass


class _HTTPPool(urllib3.connectionpool.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.connectionpool.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class GuardedAdapter(HTTPAdapter):
    """requests' adapter whose connections (direct, or to an HTTP proxy) are checked."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = dict(_POOLS)

    def proxy_manager_for(self, proxy: str, **kwargs: Any) -> Any:
        manager = super().proxy_manager_for(proxy, **kwargs)
        if not proxy.lower().startswith("socks"):
            manager.pool_classes_by_scheme = dict(_POOLS)
        return manager


def guarded_session() -> requests.Session:
    session = requests.Session()
    session.mount("http://", GuardedAdapter())
    session.mount("https://", GuardedAdapter())
    return session


# --- async: aiohttp -------------------------------------------------------------------


class GuardedConnector(aiohttp.TCPConnector):
    """aiohttp's connector, refusing inside addresses where it resolves a host (private
    aiohttp API `_resolve_host`, checked on aiohttp 3.14: names, its DNS cache and
    address literals all pass there, and it returns what is connected to)."""

    async def _resolve_host(self, host: str, port: int, traces: Any = None) -> Any:
        results = await super()._resolve_host(host, port, traces=traces)
        if not _trusted(host):
            check_addresses(host, [str(r["host"]) for r in results])
        return results


def guarded_client_session() -> aiohttp.ClientSession:
    """vLLM's client session (`trust_env=True`), over `GuardedConnector`."""
    return aiohttp.ClientSession(trust_env=True, connector=GuardedConnector())


# --- vLLM's connection ----------------------------------------------------------------


def _check_proxied(url: str) -> None:
    host = urlsplit(url).hostname or ""
    if _proxied(url) and not _trusted(host):
        answers = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
        check_addresses(host, [str(sockaddr[0]) for *_, sockaddr in answers])


def guarded_connection_class() -> type:
    """vLLM's `HTTPConnection` over guarded clients (its fetch, retries, size caps and
    redirects stay vLLM's)."""
    base, _ = compat.http_connection()

    class GuardedHTTPConnection(base):  # type: ignore[misc, valid-type]
        def get_sync_client(self) -> requests.Session:
            if self._sync_client is None or not self.reuse_client:
                self._sync_client = guarded_session()
            return self._sync_client

        async def get_async_client(self) -> aiohttp.ClientSession:
            if self._async_client is None or not self.reuse_client:
                self._async_client = guarded_client_session()
            return self._async_client

        def get_response(self, url: str, **kwargs: Any) -> Any:
            _check_proxied(url)
            return super().get_response(url, **kwargs)

        async def get_async_response(self, url: str, **kwargs: Any) -> Any:
            if _proxied(url):
                await asyncio.get_running_loop().run_in_executor(None, _check_proxied, url)
            return await super().get_async_response(url, **kwargs)

    return GuardedHTTPConnection


_connection: list[Any] = []


def guarded_connection() -> Any:
    """The process's one guarded connection (in place of vLLM's global one)."""
    if not _connection:
        _connection.append(guarded_connection_class()())
    return _connection[0]
