"""The REST API at the HTTP level: status codes, headers, OpenAPI, metrics, bad input."""

from __future__ import annotations

import asyncio
import logging
import stat
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from loomfs.config import HubSection, load_config
from loomfs.core.certs import fingerprint
from loomfs.core.registry import open_catalog
from loomfs.core.types import SYSTEM, WriteTags
from loomfs.errors import AuthenticationFailed, ConfigError
from loomfs.fabric.identity import https_certificate
from loomfs.hub.namespace import HubNamespace
from loomfs.hub.versions import VersionStore
from loomfs.rest.admin import routes as admin_routes
from loomfs.rest.chunks import ChunkRoutes
from loomfs.rest.client import RestNamespace
from loomfs.rest.local import LocalReads
from loomfs.rest.openapi import spec
from loomfs.rest.plans import routes as plan_routes
from loomfs.rest.server import RestServer
from loomfs.rest.wire import API, TAGS_HEADER
from loomfs.sdk.fsspec import LoomFileSystem
from loomfs.service import listener_tls
from loomfs.testing.hubproc import HubProcess, cli_ok, run_cli
from loomfs.testing.private import PRIVATE, private_site


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[TestClient[web.Request, web.Application]]:
    root = tmp_path / "vol"
    root.mkdir()
    (root / "data.bin").write_bytes(bytes(range(256)) * 4)
    (root / "dir").mkdir()
    catalog = open_catalog(f"sqlite://{tmp_path / 'c.db'}")
    await catalog.open()
    hub = HubNamespace(catalog)
    await hub.add_volume("/v", f"posix://{root}")
    client = TestClient(TestServer(RestServer(hub).app()))
    await client.start_server()
    yield client
    await client.close()
    await hub.close()
    await catalog.close()


def test_openapi_is_valid_and_covers_every_route() -> None:
    document = spec()
    validate(document)
    app = RestServer(
        namespace=None,  # type: ignore[arg-type]
        admin=object(),  # type: ignore[arg-type]
        spoke=object(),  # type: ignore[arg-type]
        routes=[
            *plan_routes(None),  # type: ignore[arg-type]
            *admin_routes(None, None),  # type: ignore[arg-type]
            *LocalReads(None, None).routes(),  # type: ignore[arg-type]
        ],
    ).app()
    ChunkRoutes(RestServer(namespace=None), chunks=None).register(app)  # type: ignore[arg-type]
    routes = {
        r.resource.canonical.replace("/{path}", "/{path}")
        for r in app.router.routes()
        if r.resource is not None and r.method != "HEAD"
    }
    described = set(document["paths"])
    assert {r.replace("{path:.*}", "{path}") for r in routes} <= described


async def test_ranges(http: TestClient[web.Request, web.Application]) -> None:
    whole = await http.get(f"{API}/files/v/data.bin")
    assert whole.status == 200 and whole.headers["Accept-Ranges"] == "bytes"
    body = await whole.read()
    assert len(body) == 1024
    part = await http.get(f"{API}/files/v/data.bin", headers={"Range": "bytes=10-19"})
    assert part.status == 206 and await part.read() == body[10:20]
    assert part.headers["Content-Range"] == "bytes 10-19/1024"
    suffix = await http.get(f"{API}/files/v/data.bin", headers={"Range": "bytes=-4"})
    assert suffix.status == 206 and await suffix.read() == body[-4:]
    past = await http.get(f"{API}/files/v/data.bin", headers={"Range": "bytes=5000-"})
    assert past.status == 416
    assert (await past.json())["error"]["code"] == "RangeNotSatisfiable"
    bogus = await http.get(f"{API}/files/v/data.bin", headers={"Range": "lines=1-2"})
    assert bogus.status == 200 and len(await bogus.read()) == 1024
    head = await http.head(f"{API}/files/v/data.bin")
    assert head.status == 200 and head.headers["Content-Length"] == "1024"


async def test_conditional_requests(http: TestClient[web.Request, web.Application]) -> None:
    stat = await (await http.get(f"{API}/stat/v/data.bin")).json()
    etag = f'"{stat["version"]}"'
    ok = await http.get(f"{API}/files/v/data.bin", headers={"If-Match": etag})
    assert ok.status == 200 and ok.headers["ETag"] == etag
    stale = await http.put(f"{API}/files/v/data.bin", data=b"x", headers={"If-Match": '"1"'})
    assert stale.status == 412 and (await stale.json())["error"]["code"] == "Conflict"
    created = await http.put(f"{API}/files/v/new", data=b"x", headers={"If-None-Match": "*"})
    assert created.status == 201
    again = await http.put(f"{API}/files/v/new", data=b"y", headers={"If-None-Match": "*"})
    assert again.status == 409 and (await again.json())["error"]["code"] == "AlreadyExists"
    bad = await http.put(f"{API}/files/v/new", data=b"y", headers={"If-Match": "nope"})
    assert bad.status == 400


@pytest.mark.parametrize(
    ("method", "url", "status", "code"),
    [
        ("GET", f"{API}/stat/v/missing", 404, "NotFound"),
        ("GET", f"{API}/stat/v/a%2F..%2F..%2Fetc", 400, "InvalidPath"),
        ("GET", f"{API}/files/v/a%00b", 400, "InvalidPath"),
        ("GET", f"{API}/files/v/dir", 409, "IsADirectory"),
        ("GET", f"{API}/list/v/data.bin", 409, "NotADirectory"),
        ("PUT", f"{API}/files/outside", 403, "PermissionDenied"),
        ("DELETE", f"{API}/files/v", 403, "PermissionDenied"),
        ("POST", f"{API}/mkdir/v/a/b", 404, "NotFound"),
    ],
)
async def test_errors_map_to_statuses(
    http: TestClient[web.Request, web.Application], method: str, url: str, status: int, code: str
) -> None:
    response = await http.request(method, url, skip_auto_headers=["Content-Type"])
    assert response.status == status
    assert (await response.json())["error"]["code"] == code


async def test_what_a_special_file_or_symlink_cannot_do_is_a_clear_4xx(
    http: TestClient[web.Request, web.Application], tmp_path: Path
) -> None:
    made = (
        await http.post(f"{API}/symlink/v/link", json={"target": "data.bin"}),
        await http.post(f"{API}/mknod/v/fifo", json={"mode": stat.S_IFIFO | 0o644}),
    )
    assert [response.status for response in made] == [201, 201]
    chmod = await http.patch(f"{API}/attrs/v/link", json={"mode": 0o600})  # Linux: no lchmod
    read = await http.get(f"{API}/files/v/fifo")
    for response, says in ((chmod, "a symlink has no mode"), (read, "special file")):
        assert response.status == 409
        error = (await response.json())["error"]
        assert error["code"] == "NotSupported" and says in error["message"]
    assert (tmp_path / "vol/data.bin").stat().st_mode & 0o777 != 0o600


async def test_malformed_bodies(http: TestClient[web.Request, web.Application]) -> None:
    for body in (b"{not json", b"[1, 2]", b'{"src": 1}'):
        response = await http.post(f"{API}/rename", data=body)
        assert response.status == 400, body
    tags = await http.patch(f"{API}/tags/v/data.bin", json={"set": {"k": 5}})
    assert tags.status == 400
    assert await (await http.get(f"{API}/tags/v/data.bin")).json() == {}


async def test_traversal_never_leaves_the_namespace(
    http: TestClient[web.Request, web.Application],
) -> None:
    async with aiohttp.ClientSession() as raw:
        # sent byte for byte, not normalized by the client
        url = http.make_url("").with_path(f"{API}/files/v/../../etc/passwd", encoded=True)
        async with raw.get(url) as response:
            assert response.status in (400, 403, 404)
            assert b"root:" not in await response.read()


async def test_listing_streams_json_lines(http: TestClient[web.Request, web.Application]) -> None:
    for i in range(30):
        await http.put(f"{API}/files/v/dir/f{i:02d}", data=b"x")
    response = await http.get(f"{API}/list/v/dir", params={"limit": "7"})
    assert response.headers["Content-Type"].startswith("application/x-ndjson")
    lines = (await response.text()).splitlines()
    assert len(lines) == 7
    rest = await http.get(f"{API}/list/v/dir", params={"start_after": "f06"})
    assert len((await rest.text()).splitlines()) == 23


async def test_metrics_and_health(http: TestClient[web.Request, web.Application]) -> None:
    await http.get(f"{API}/files/v/data.bin")
    metrics = await (await http.get("/metrics")).text()
    assert "loomfs_http_requests_total" in metrics and "loomfs_read_bytes_total" in metrics
    assert (await (await http.get("/healthz")).json())["status"] == "ok"


# -- HTTPS ----------------------------------------------------------------------------------

LOOPBACK = ("127.0.0.1", "127.8.9.10", "::1", "localhost")
BEYOND = ("0.0.0.0", "::", "10.1.2.3", "gpu-west.example")


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    host=st.sampled_from(LOOPBACK + BEYOND),
    mode=st.sampled_from(["auto", "on", "off"]),
    files=st.booleans(),
)
def test_a_listener_serves_tls_unless_told_not_to_beyond_loopback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, host: str, mode: str, files: bool
) -> None:
    """Files where given; else a self-signed certificate beyond loopback ("auto") or
    everywhere ("on"); plain HTTP beyond loopback only when told ("off"), and then a
    WARNING says so."""
    files = files and mode != "off"
    own = https_certificate(tmp_path / "own", "own", ["127.0.0.1"])
    site = tmp_path / uuid.uuid4().hex
    keys = {"tls": mode, **({"tls_cert": str(own[0]), "tls_key": str(own[1])} if files else {})}
    config = load_config(env={"LOOMFS_SITE__DATA_DIR": str(site)}).model_copy(
        update={"hub": HubSection(listen=f"{host}:7070", **keys)}  # type: ignore[arg-type]
    )
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="loomfs.service"):
        context = listener_tls(config, "hub", config.hub, (host, 7070))
    beyond = host in BEYOND
    assert (context is not None) == (files or mode == "on" or (mode == "auto" and beyond))
    made = site / "identity" / "https.pem"
    assert made.exists() == (context is not None and not files)
    if made.exists():
        assert fingerprint(made.read_bytes()) in caplog.text
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert bool(warned) == (context is None and beyond)
    assert all(getattr(r, "listener", None) == "hub" for r in warned)


def test_tls_files_go_in_pairs() -> None:
    with pytest.raises(ConfigError, match="tls_cert and tls_key go together"):
        load_config(env={"LOOMFS_S3__TLS_CERT": "/etc/loomfs/s3.pem"})
    with pytest.raises(ConfigError, match='tls = "off" serves no certificate'):
        load_config(
            env={
                "LOOMFS_HUB__TLS": "off",
                "LOOMFS_HUB__TLS_CERT": "/c",
                "LOOMFS_HUB__TLS_KEY": "/k",
            }
        )


def test_rest_over_https_with_the_sites_self_signed_certificate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The CLI, the SDK and a RestNamespace reach an HTTPS hub when they trust its
    certificate (the file whose fingerprint it logs), and are refused with a certificate
    error, not a network one, when they do not. The certificate survives a restart."""
    secret = b"over tls only"
    site = private_site(tmp_path / "site", {"a.txt": secret}, sections='tls = "on"\n')
    cert = site.data_dir / "identity" / "https.pem"
    alice = (site.key, site.secret)
    for name in ("LOOMFS_ACCESS_KEY", "LOOMFS_SECRET_KEY", "LOOMFS_CA_CERT", "LOOMFS_HUB"):
        monkeypatch.delenv(name, raising=False)

    async def read(url: str, ca_cert: Path | None) -> bytes:
        client = RestNamespace(url, ca_cert=ca_cert, credentials=alice)
        try:
            return await client.read_bytes(SYSTEM, f"{PRIVATE}/a.txt")
        finally:
            await client.close()

    for _ in range(2):  # the second start serves the certificate the first one made
        with HubProcess(site.data_dir, site.env) as hub:
            assert hub.url.startswith("https://127.0.0.1:")
            assert fingerprint(cert.read_bytes()) in hub.log_path.read_text()
            assert asyncio.run(read(hub.url, cert)) == secret
            with pytest.raises(
                AuthenticationFailed, match=r"certificate of https://.* not trusted"
            ):
                asyncio.run(read(hub.url, None))
    with HubProcess(site.data_dir, site.env) as hub:
        for name, value in site.credentials.items():
            monkeypatch.setenv(name, value)
        refused = run_cli(tmp_path / "cli", "--hub", hub.url, "cat", f"{PRIVATE}/a.txt")
        assert refused.returncode == 1 and b"not trusted" in refused.stderr, refused.stderr
        monkeypatch.setenv("LOOMFS_CA_CERT", str(cert))
        assert (
            cli_ok(tmp_path / "cli", "--hub", hub.url, "cat", f"{PRIVATE}/a.txt") == "over tls only"
        )
        monkeypatch.delenv("LOOMFS_CA_CERT")
        sdk = LoomFileSystem(
            sites={"secure": hub.url}, key=site.key, secret=site.secret, ca_cert=str(cert),
            skip_instance_cache=True,
        )  # fmt: skip
        assert sdk.cat_file(f"loomfs://secure{PRIVATE}/a.txt") == secret


async def test_an_old_version_is_read_over_rest(tmp_path: Path) -> None:
    """A file overwritten in a versioned directory keeps its old version, which the REST
    API (?version=) and its client (read_version, what `loomfs cat --version` calls)
    serve; an id the file never had is 404."""
    (tmp_path / "vol").mkdir()
    catalog = open_catalog(f"sqlite://{tmp_path / 'c.db'}")
    await catalog.open()
    hub = HubNamespace(catalog, versions=VersionStore(catalog, tmp_path / "versions"))
    await hub.add_volume("/v", f"posix://{tmp_path / 'vol'}")
    await hub.set_versioning(SYSTEM, "/v", "Enabled")
    first = await hub.write_bytes(SYSTEM, "/v/f", b"first" * 1000)
    await hub.write_bytes(SYSTEM, "/v/f", b"second")
    client = TestClient(TestServer(RestServer(hub).app()))
    await client.start_server()
    rest = RestNamespace(str(client.make_url("")))
    try:
        response = await client.get(f"{API}/files/v/f", params={"version": str(first.version)})
        assert response.status == 200 and await response.read() == b"first" * 1000
        assert (await client.get(f"{API}/files/v/f", params={"version": "7777"})).status == 404
        async with await rest.read_version(SYSTEM, "/v/f", str(first.version), 5, 5) as reader:
            assert await reader.read_all() == b"first"
        assert await rest.read_bytes(SYSTEM, "/v/f") == b"second"
    finally:
        await rest.close()
        await client.close()
        await hub.close()
        await catalog.close()


async def test_a_writes_tags_asked_once_its_body_ended_travel_with_it(
    http: TestClient[web.Request, web.Application],
) -> None:
    rest = RestNamespace(str(http.make_url("")))
    sent: list[bytes] = []

    async def body() -> AsyncIterator[bytes]:
        for chunk in (b"ab", b"cd"):
            sent.append(chunk)
            yield chunk

    def tags() -> WriteTags:  # what the body was, once it has ended
        return WriteTags({"seen": str(len(sent))}, {"etag": "x"})

    try:
        entry = await rest.write(SYSTEM, "/v/t", body(), tags=tags)
        assert await rest.get_tags(SYSTEM, "/v/t") == {"seen": "2", "etag": f"{entry.version} x"}
        assert await rest.read_bytes(SYSTEM, "/v/t") == b"abcd"
    finally:
        await rest.close()
    bad = await http.put(f"{API}/files/v/u", data=b"x", headers={TAGS_HEADER: "[1"})
    assert bad.status == 400 and not (await http.get(f"{API}/files/v/u")).ok
