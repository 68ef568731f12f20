"""/readyz tells the truth (composition root and REST edge): each degraded state made for
real, a 503 naming its reason, and 200 again once it is mended; /healthz stays alive."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import functools
import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from loomfs import health
from loomfs.config import Config
from loomfs.fabric.identity import SiteIdentity
from loomfs.fabric.probe import check_link
from loomfs.rest.server import RestServer
from loomfs.service import HubService
from loomfs.spoke import namespace as spoke_namespace
from loomfs.spoke.namespace import SpokeNamespace
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.postgres import PostgresServer
from loomfs.testing.seaweedfs import SeaweedFS

Http = TestClient[web.Request, web.Application]


def hub_config(data_dir: Path, **site: Any) -> Config:
    return Config.model_validate(
        {"site": {"data_dir": str(data_dir), **site}, "audit": {"enabled": False},
         "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(data_dir.parent)]}}
    )  # fmt: skip


async def readyz(http: Http) -> tuple[int, dict[str, Any]]:
    answer = await http.get("/readyz")  # no credentials: a probe has none
    return answer.status, await answer.json()


async def ready(http: Http) -> None:
    status, body = await readyz(http)
    assert (status, body["status"], body["reasons"]) == (200, "ready", []), body
    alive = await http.get("/healthz")
    assert alive.status == 200 and (await alive.json())["status"] == "ok"


async def degraded(http: Http, check: str, *words: str) -> str:
    """The one reason /readyz gives, which must come from ``check`` and say ``words``;
    /healthz still answers 200 (the process is alive)."""
    status, body = await readyz(http)
    assert status == 503 and body["status"] == "degraded", body
    assert len(body["reasons"]) == 1, body["reasons"]
    reason: str = body["reasons"][0]
    assert reason.startswith(f"{check}: ") and not body["checks"][check]["ok"], body
    for word in words:
        assert word in reason, reason
    assert (await http.get("/healthz")).status == 200
    return reason


@pytest.fixture
async def hub_http(tmp_path: Path) -> AsyncIterator[tuple[HubService, Http]]:
    hub = HubService(hub_config(tmp_path / "hub"))
    await hub.start()
    try:
        server = RestServer(hub.governed, hub, site="hub", health=hub.health)
        async with TestClient(TestServer(server.app())) as http:
            yield hub, http
    finally:
        await hub.stop()


def tmpfs(where: Path, size: str) -> None:
    """A small file system of its own at ``where`` (these tests run as root)."""
    where.mkdir(parents=True)
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert made.returncode == 0, f"mounting a tmpfs needs root (and mount(8)): {made.stderr}"


async def test_a_hub_with_little_free_space_is_not_ready(tmp_path: Path) -> None:
    data = tmp_path / "small"
    tmpfs(data, "64m")
    try:
        hub = HubService(hub_config(data / "hub", min_free="24M"))
        await hub.start()
        try:
            server = RestServer(hub.governed, hub, site="hub", health=hub.health)
            async with TestClient(TestServer(server.app())) as http:
                await ready(http)
                filler = data / "filler"
                with filler.open("wb") as out:  # real bytes: tmpfs counts what is written
                    for _ in range(48):
                        out.write(b"\xff" * (1 << 20))
                await degraded(http, "disk", str(data / "hub"), "fewer than 25165824")
                filler.unlink()
                await ready(http)
        finally:
            await hub.stop()
    finally:
        subprocess.run(["umount", str(data)], check=True)


async def test_a_hub_with_an_unreadable_volume_is_not_ready(
    tmp_path: Path, hub_http: tuple[HubService, Http]
) -> None:
    hub, http = hub_http
    root = tmp_path / "data"
    root.mkdir()
    await hub.add_volume("/x", f"posix://{root}", lambda _: None)
    await ready(http)
    root.rmdir()
    root.write_text("where the directory was")  # an NFS mount gone stale, say
    await degraded(http, "volumes", "/x", "Not a directory")
    root.unlink()
    await degraded(http, "volumes", "/x", "No such file")
    root.mkdir()
    await ready(http)


async def test_a_hub_whose_bucket_is_gone_is_not_ready(
    hub_http: tuple[HubService, Http], seaweedfs: SeaweedFS, s3_env: None
) -> None:
    hub, http = hub_http
    bucket = seaweedfs.create_bucket(f"ready-{uuid.uuid4().hex[:10]}")
    await hub.add_volume("/s3", f"s3://{bucket}?endpoint={seaweedfs.endpoint}", lambda _: None)
    await ready(http)
    seaweedfs.client().delete_bucket(Bucket=bucket)
    await degraded(http, "volumes", "/s3", f"bucket {bucket} does not exist")
    seaweedfs.create_bucket(bucket)
    await ready(http)


async def test_a_hub_whose_catalog_is_unreachable_is_not_ready(tmp_path: Path) -> None:
    pg = PostgresServer().start()
    try:
        config = hub_config(tmp_path / "hub")
        config.catalog.url = pg.create_database()
        hub = HubService(config)
        await hub.start()
        try:
            server = RestServer(hub.governed, hub, site="hub", health=hub.health)
            async with TestClient(TestServer(server.app())) as http:
                await ready(http)
                pg.stop()
                status, body = await readyz(http)
                assert status == 503, body
                assert any(
                    r.startswith("catalog: the catalog is unreachable") for r in body["reasons"]
                )
        finally:
            with contextlib.suppress(Exception):  # its catalog is gone: stopping may complain
                await hub.stop()
    finally:
        pg.stop()


def expired_certificate(path: Path) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


async def test_a_hub_whose_site_certificate_expired_is_not_ready(
    hub_http: tuple[HubService, Http],
) -> None:
    hub, http = hub_http
    SiteIdentity.create(hub.config.identity_dir, "hub")
    await ready(http)
    expired_certificate(hub.config.identity_dir / "site.pem")
    await degraded(http, "certificates", "site certificate", "expired on")


# -- a spoke -------------------------------------------------------------------------------


async def until(spoke: SpokeNamespace, condition: Any) -> None:
    for _ in range(1500):  # the spoke learns it at its next poll of the feed
        if condition(spoke):
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the spoke never noticed")


def spoke_server(made: Fabric, hub_cert: Path) -> RestServer:
    """The spoke's REST API with the checks ``SpokeService`` gives it: a fresh
    handshake with the hub (as pinned when the spoke started) when the link is down."""
    name, spoke = made.first, made.spoke
    site_cert = made.ids[name].cert_path
    probe = functools.partial(
        check_link, f"https://127.0.0.1:{made.port}",
        made.ids[name].client_context(hub_cert.read_bytes()),
        site=name, site_cert=site_cert, hub_cert=hub_cert,
    )  # fmt: skip
    checks = functools.partial(
        health.spoke_checks, spoke, probe=probe,
        certs={"pinned hub certificate": hub_cert, "site certificate": site_cert},
    )  # fmt: skip
    return RestServer(spoke, spoke=spoke, site=name, health=checks)


async def test_a_spoke_is_not_ready_while_its_hub_is_stopped(tmp_path: Path) -> None:
    async with fabric(tmp_path) as made:
        server = spoke_server(made, made.hub_id.cert_path)
        async with TestClient(TestServer(server.app())) as http:
            await ready(http)
            assert made.runner is not None
            await made.runner.cleanup()  # the hub's fabric listener goes, as its process would
            made.runner = None
            await until(made.spoke, lambda s: not s.online)
            await degraded(http, "link", "the link to the hub is down", "cannot reach the hub")


async def test_a_spoke_is_not_ready_when_the_hub_is_not_the_pinned_one(tmp_path: Path) -> None:
    async with fabric(tmp_path) as made:
        pinned = made.hub_id.cert_path
        server = spoke_server(made, pinned)
        async with TestClient(TestServer(server.app())) as http:
            await ready(http)
            made.hub_id = SiteIdentity.create(tmp_path / "another-hub-id", "hub")
            await made.restart_hub()  # the same address, another certificate
            await until(made.spoke, lambda s: s.link_error is not None or not s.online)
            await degraded(http, "link", "is not the hub pinned in", str(pinned))
            expired_certificate(pinned)
            status, body = await readyz(http)
            assert status == 503
            assert any("pinned hub certificate" in r and "expired on" in r for r in body["reasons"])


async def test_a_revoked_spoke_is_not_ready(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a refusal waits the longest retry at once (nobody acted yet): 15 s; the re-pin below
    # is the act, and the test need not wait the production pause out
    monkeypatch.setattr(spoke_namespace, "RETRY_MAX", 1.0)
    async with fabric(tmp_path) as made:
        server = spoke_server(made, made.hub_id.cert_path)
        async with TestClient(TestServer(server.app())) as http:
            await ready(http)
            assert made.server is not None
            made.server.trust({})  # `loomfs site revoke`, as the hub follows it
            await until(made.spoke, lambda s: s.link_error is not None)
            await degraded(http, "link", "refused", "not trusted by the hub")
            made.server.trust({made.first: made.ids[made.first].cert_pem})  # pinned again
            await until(made.spoke, lambda s: s.link_error is None)
            await ready(http)
