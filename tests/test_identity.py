"""Site identities and mutual TLS: pinned sites get in, unknown and revoked ones don't, and
the hub logs each handshake it refuses, with the peer and the reason."""

from __future__ import annotations

import asyncio
import logging
import ssl
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from loomfs.core.certs import certificate_name, fingerprint
from loomfs.errors import AlreadyExists, NotFound
from loomfs.fabric.identity import SiteIdentity
from loomfs.fabric.server import TlsSite


@pytest.fixture
def sites(tmp_path: Path) -> dict[str, SiteIdentity]:
    return {n: SiteIdentity.create(tmp_path / n, n) for n in ("hub", "gpu-west", "intruder")}


async def peer_name(request: web.Request) -> web.Response:
    der = request.transport.get_extra_info("ssl_object").getpeercert(binary_form=True)  # type: ignore[union-attr]
    return web.Response(text=str(len(der)))


@pytest.fixture
async def hub_server(
    sites: dict[str, SiteIdentity],
) -> AsyncIterator[Callable[[list[bytes]], Awaitable[int]]]:
    runners: list[web.AppRunner] = []

    async def start(trusted: list[bytes]) -> int:
        app = web.Application()
        app.router.add_get("/", peer_name)
        runner = web.AppRunner(app)
        await runner.setup()
        site = TlsSite(runner, "127.0.0.1", 0, ssl_context=sites["hub"].server_context(trusted))
        await site.start()
        runners.append(runner)
        return int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    yield start
    for runner in runners:
        await runner.cleanup()


async def get(port: int, context: ssl.SSLContext) -> int:
    async with (
        aiohttp.ClientSession() as session,
        session.get(f"https://127.0.0.1:{port}/", ssl=context) as response,
    ):
        return response.status


async def test_pinned_spoke_gets_in_others_do_not(
    sites: dict[str, SiteIdentity],
    hub_server: Callable[[list[bytes]], Awaitable[int]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    hub, spoke, intruder = sites["hub"], sites["gpu-west"], sites["intruder"]
    port = await hub_server([spoke.cert_pem])
    caplog.set_level(logging.WARNING, "loomfs.fabric.server")
    assert await get(port, spoke.client_context(hub.cert_pem)) == 200
    assert not caplog.records  # a pinned site's handshake is no news
    with pytest.raises(aiohttp.ClientError):
        await get(port, intruder.client_context(hub.cert_pem))
    for _ in range(500):  # the hub's side of the handshake ends as the client gives up
        if caplog.records:
            break
        await asyncio.sleep(0.01)
    refused = caplog.records  # one per try: the client tries a GET again on a new link
    assert refused and all(r.getMessage() == "refused a TLS handshake" for r in refused)
    assert all(r.peer.startswith("127.0.0.1:") for r in refused)  # type: ignore[attr-defined]
    assert all("CERTIFICATE_VERIFY_FAILED" in r.reason for r in refused)  # type: ignore[attr-defined]
    # plain HTTP on the TLS port: refused and logged too
    before = len(refused)
    async with aiohttp.ClientSession() as session:
        with pytest.raises(aiohttp.ClientError):
            await session.get(f"http://127.0.0.1:{port}/")
    for _ in range(500):
        if len(caplog.records) > before:
            break
        await asyncio.sleep(0.01)
    assert len(caplog.records) > before
    # a spoke that pins another hub refuses this one
    with pytest.raises(aiohttp.ClientError):
        await get(port, spoke.client_context(intruder.cert_pem))
    # revoked: the hub's next context no longer pins it
    revoked_port = await hub_server([])
    with pytest.raises(aiohttp.ClientError):
        await get(revoked_port, spoke.client_context(hub.cert_pem))


def test_identity_files(tmp_path: Path, sites: dict[str, SiteIdentity]) -> None:
    spoke = sites["gpu-west"]
    assert stat.S_IMODE(spoke.key_path.stat().st_mode) == 0o600
    assert certificate_name(spoke.cert_pem) == "gpu-west"
    assert SiteIdentity.load(tmp_path / "gpu-west") == spoke
    assert len(fingerprint(spoke.cert_pem)) == 64
    assert fingerprint(spoke.cert_pem) != fingerprint(sites["hub"].cert_pem)
    with pytest.raises(AlreadyExists):
        SiteIdentity.create(tmp_path / "gpu-west", "gpu-west")
    with pytest.raises(NotFound, match="loomfs site init"):
        SiteIdentity.load(tmp_path / "nowhere")
