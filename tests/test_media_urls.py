"""The image URL guard (`serving.api_server.media_urls`): which addresses are inside, and that
vLLM's own fetch (its `HTTPConnection`, sync and async) through the guarded clients
refuses them where it connects: literals, names, redirect hops and a name whose answer
turns from allowed to inside (DNS rebinding). Real sockets: an HTTP server on 127.0.0.1
serving a real PNG, and a second one on 127.0.0.2 playing the allowed host.
"""

from __future__ import annotations

import asyncio
import io
import socket
from collections.abc import Iterator

import aiohttp
import pytest
from PIL import Image

from tests.image_host import ImageHost, png_bytes
from ttbundles.serving.api_server import media_urls
from ttbundles.serving.api_server.media_urls import InsideAddressError, MediaURLPolicy


@pytest.mark.parametrize(
    ("address", "kind"),
    [
        ("127.0.0.1", "loopback"),
        ("127.8.9.10", "loopback"),
        ("::1", "loopback"),
        ("::ffff:127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("172.16.0.1", "private"),
        ("192.168.1.1", "private"),
        ("fd12:3456::1", "private"),
        ("::ffff:10.0.0.1", "private"),
        ("2002:0a00:0001::1", "private"),  # 6to4 of 10.0.0.1
        ("64:ff9b::7f00:1", "loopback"),  # NAT64 of 127.0.0.1
        ("169.254.169.254", "link-local"),
        ("fe80::1%eth0", "link-local"),
        ("224.0.0.1", "multicast"),
        ("239.255.255.250", "multicast"),
        ("ff02::1", "multicast"),
        ("0.0.0.0", "unspecified"),
        ("::", "unspecified"),
        ("240.0.0.1", "reserved"),
        ("100.64.0.1", "reserved"),  # shared address space (carrier-grade NAT)
        ("192.0.2.1", "private"),  # documentation
        ("8.8.8.8", None),
        ("1.1.1.1", None),
        ("2606:4700:4700::1111", None),
        ("::ffff:8.8.8.8", None),
    ],
)
def test_addresses_are_classed_inside_or_public(address, kind):
    assert media_urls.address_class(address) == kind


def test_a_policy_allows_all_inside_addresses_or_only_its_networks():
    assert MediaURLPolicy().refusal("10.1.2.3") == "private"
    assert MediaURLPolicy().refusal("8.8.8.8") is None
    assert MediaURLPolicy.from_option(True).refusal("127.0.0.1") is None
    listed = MediaURLPolicy.from_option(["10.1.2.0/24", "fd00::/8"])
    assert listed.refusal("10.1.2.3") is None
    assert listed.refusal("::ffff:10.1.2.3") is None
    assert listed.refusal("fd00::5") is None
    assert listed.refusal("10.1.3.1") == "private"
    assert listed.refusal("127.0.0.1") == "loopback"
    assert listed.refusal("169.254.169.254") == "link-local"


PNG = png_bytes(Image.new("RGB", (8, 6), (200, 30, 40)))


@pytest.fixture(scope="module")
def inside() -> Iterator[ImageHost]:
    server = ImageHost("127.0.0.1")
    yield server
    server.close()


@pytest.fixture(scope="module")
def allowed_host() -> Iterator[ImageHost]:
    """127.0.0.2, allowed by the tests' policy as an operator's listed network: the
    stand-in for a public host (no test reaches the internet)."""
    server = ImageHost("127.0.0.2")
    yield server
    server.close()


@pytest.fixture
def policy() -> Iterator[None]:
    media_urls.set_policy(MediaURLPolicy.from_option(["127.0.0.2/32"]))
    yield
    media_urls.set_policy(MediaURLPolicy())


def _sync_get(url: str) -> bytes:
    return media_urls.guarded_connection_class()().get_bytes(url, timeout=30)


def _async_get(url: str) -> bytes:
    async def get() -> bytes:
        connection = media_urls.guarded_connection_class()()
        try:
            return await connection.async_get_bytes(url, timeout=30)
        finally:
            if connection._async_client is not None:
                await connection._async_client.close()

    return asyncio.run(get())


FETCHES = {"sync": _sync_get, "async": _async_get}


@pytest.mark.parametrize("fetch", FETCHES.values(), ids=FETCHES.keys())
def test_an_inside_address_is_refused_before_anything_is_sent(inside, policy, fetch):
    before = list(inside.paths)
    for url in (f"{inside.url}/pic.png", f"{inside.url}/missing.png"):
        with pytest.raises(InsideAddressError, match="TTB220") as refused:
            fetch(url)
        # Found or missing inside: the same answer, naming no address.
        assert "127.0.0.1" not in str(refused.value)
    assert inside.paths == before


@pytest.mark.parametrize("fetch", FETCHES.values(), ids=FETCHES.keys())
def test_names_and_ipv6_forms_of_inside_addresses_are_refused(inside, policy, fetch):
    for url in (
        f"http://localhost:{inside.port}/pic.png",
        f"http://[::1]:{inside.port}/pic.png",
        f"http://[::ffff:127.0.0.1]:{inside.port}/pic.png",
        f"http://0.0.0.0:{inside.port}/pic.png",
    ):
        with pytest.raises(InsideAddressError, match="TTB220"):
            fetch(url)


@pytest.mark.parametrize("fetch", FETCHES.values(), ids=FETCHES.keys())
def test_an_allowed_address_serves_the_image(allowed_host, policy, fetch):
    data = fetch(f"{allowed_host.url}/pic.png")
    assert data == PNG
    assert Image.open(io.BytesIO(data)).size == (8, 6)


@pytest.mark.parametrize("fetch", FETCHES.values(), ids=FETCHES.keys())
def test_a_redirect_from_an_allowed_host_to_an_inside_one_is_refused(
    inside, allowed_host, policy, fetch
):
    before = list(inside.paths)
    with pytest.raises(InsideAddressError, match="TTB220"):
        fetch(f"{allowed_host.url}/to?url={inside.url}/pic.png")
    assert allowed_host.paths[-1] == f"/to?url={inside.url}/pic.png"
    assert inside.paths == before
    # The same redirect to the allowed host itself is followed.
    assert fetch(f"{allowed_host.url}/to?url={allowed_host.url}/pic.png") == PNG


@pytest.mark.parametrize("fetch", FETCHES.values(), ids=FETCHES.keys())
def test_allowing_all_inside_addresses_serves_loopback(inside, fetch):
    media_urls.set_policy(MediaURLPolicy.from_option(True))
    try:
        assert fetch(f"{inside.url}/pic.png") == PNG
    finally:
        media_urls.set_policy(MediaURLPolicy())


class _Rebinding(aiohttp.abc.AbstractResolver):
    """A resolver whose answer for `rebind.test` turns from 127.0.0.2 (allowed) to
    127.0.0.1 (inside) after its first look-up, as a rebinding DNS server's would."""

    def __init__(self) -> None:
        self.answers = ["127.0.0.2", "127.0.0.1"]

    async def resolve(self, host: str, port: int = 0, family: int = socket.AF_INET) -> list:
        address = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None:
        pass


def _pair_on_one_port() -> tuple[ImageHost, ImageHost]:
    """Servers on 127.0.0.2 and 127.0.0.1 at the same port: a rebound name then reaches
    the inside one exactly where the allowed one was."""
    for _ in range(20):
        allowed = ImageHost("127.0.0.2")
        try:
            return allowed, ImageHost("127.0.0.1", allowed.port)
        except OSError:
            allowed.close()
    pytest.skip("no port free on both 127.0.0.1 and 127.0.0.2")


def test_a_name_rebound_to_an_inside_address_is_refused_where_it_connects(policy):
    allowed, inside = _pair_on_one_port()
    url = f"http://rebind.test:{allowed.port}/pic.png"

    async def run() -> tuple[bytes, BaseException | None]:
        # A new connection, and a new look-up, for every request.
        connector = media_urls.GuardedConnector(
            resolver=_Rebinding(), use_dns_cache=False, force_close=True
        )
        async with aiohttp.ClientSession(connector=connector) as session:
            async with session.get(url) as first:
                first.raise_for_status()
                data = await first.read()
            try:
                async with session.get(url) as second:
                    await second.read()
            except InsideAddressError as error:
                return data, error
        return data, None

    try:
        data, error = asyncio.run(run())
        assert data == PNG
        assert allowed.paths == ["/pic.png"]
        assert error is not None and "TTB220" in str(error)
        assert inside.paths == []
    finally:
        allowed.close()
        inside.close()


def test_vllms_media_connector_fetches_through_the_guard_once_installed(inside):
    """What the API server runs: `image_requests.install` (the platform's hook), then
    vLLM's own `MediaConnector` loading an `image_url`."""
    from vllm.multimodal.media.connector import MediaConnector

    from ttbundles.serving.api_server import image_requests

    url = f"{inside.url}/pic.png"
    image_requests.install()
    try:

        async def fetch_async() -> None:
            connection = media_urls.guarded_connection()
            try:
                await MediaConnector().fetch_image_async(url)
            finally:
                if connection._async_client is not None:  # bound to this event loop
                    await connection._async_client.close()
                    connection._async_client = None

        with pytest.raises(InsideAddressError, match="TTB220"):
            asyncio.run(fetch_async())
        with pytest.raises(InsideAddressError, match="TTB220"):
            MediaConnector().fetch_image(url)
        image_requests.install(allow_private_media_urls=True)
        assert MediaConnector().fetch_image(url).size == (8, 6)
    finally:
        image_requests.install()
