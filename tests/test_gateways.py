"""Several hub gateways over one PostgreSQL catalog and one posix volume (hub layer, over
REST): two real ``loomfs hub serve`` processes, one path hammered with conditional writes
from both, and a history checker: no two writes with the same expected version both
succeed, and no acknowledged write is lost. One gateway's change feed wakes for a commit
made through the other (LISTEN/NOTIFY), not at its next poll. And a gateway killed with
kill -9 in the middle of a commit is repaired by the other from the intent record in the
database: the volume and the catalog agree again, on the old state or the new. A spoke
given both gateways' URLs keeps reading and writing when one of them is killed; a write
lease taken through one is honoured by the other. A volume added or removed through one
gateway is mounted or unmounted by the other as it commits, without a restart. S3
multipart uploads and chunk uploads go on through any gateway; only the elected gateway
rescans, and another takes over when it is killed; a gateway whose lock session is cut
mid-commit leaves the volume and the catalog agreeing; each gateway's audit chain
verifies, and queries merge them."""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import random
import re
import shutil
import time
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import boto3
import psycopg
import pytest
from aiohttp import web
from botocore.client import Config as BotoConfig
from botocore.exceptions import ClientError
from click.testing import CliRunner
from mypy_boto3_s3 import S3Client
from mypy_boto3_s3.type_defs import CompletedMultipartUploadTypeDef

from loomfs import service
from loomfs.chunks.cdc import chunk_map_of
from loomfs.chunks.codec import encode_chunk
from loomfs.cli import main
from loomfs.config import Config
from loomfs.core.audit import AuditReader
from loomfs.core.catalog.postgres import PostgresCatalog, gateway_lock_key
from loomfs.core.types import SYSTEM, Entry
from loomfs.core.users import AccessKey, UserRegistry
from loomfs.errors import Conflict, NotFound, PermissionDenied
from loomfs.rest.client import RestNamespace
from loomfs.service import HubService
from loomfs.testing import stages
from loomfs.testing.hubproc import HubProcess, SpokeProcess, cli_ok, spoke_args
from loomfs.testing.postgres import PostgresServer

WHO = SYSTEM  # the REST server decides who the caller is, from the credentials sent
PATH = "/v/hot.txt"
WRITERS_PER_GATEWAY = 3
ATTEMPTS_PER_WRITER = 25
#: between the rename and the commit: the stage where the volume is ahead of the catalog
#: until someone repairs it (each stage of the local intent log: test_stage_kills)
KILLED_AT = "renamed"


@dataclass(frozen=True)
class Attempt:
    """One conditional write as its client saw it: ``version`` is None when refused."""

    gateway: int
    expected: int
    payload: bytes
    version: int | None


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def check_history(initial: int, attempts: list[Attempt]) -> list[Attempt]:
    """The acknowledged writes in commit order, asserting they are linearizable as
    compare-and-swaps: no two succeed on the same expected version, and each succeeds on
    the version the one before it made (so none was overwritten unseen: none lost)."""
    done = sorted((a for a in attempts if a.version is not None), key=lambda a: a.version or 0)
    expected = [a.expected for a in done]
    assert len(set(expected)) == len(expected), f"two writes won on one version: {done}"
    at = initial
    for attempt in done:
        assert attempt.expected == at, f"{attempt} did not follow version {at}: {done}"
        assert attempt.version is not None and attempt.version > at
        at = attempt.version
    return done


@pytest.fixture
def gateways(postgres: PostgresServer, tmp_path: Path) -> Iterator[list[HubProcess]]:
    volume = tmp_path / "volume"
    volume.mkdir()
    env = {"LOOMFS_CATALOG__URL": postgres.create_database(), "LOOMFS_HUB__RESCAN_INTERVAL": "0"}
    with HubProcess(tmp_path / "a", env) as first:
        cli_ok(first.data_dir, "--hub", first.url, "volume", "add", "/v", f"posix://{volume}")
        # the second finds the volume in the shared catalog
        with HubProcess(tmp_path / "b", env) as second:
            yield [first, second]


async def _hammer(urls: list[str], admin: tuple[str, str]) -> tuple[int, list[Attempt]]:
    clients = [RestNamespace(url, credentials=admin) for url in urls]
    try:
        initial = (await clients[0].write(WHO, PATH, _body(b"initial"))).version
        attempts: list[Attempt] = []

        async def writer(gateway: int, name: str) -> None:
            client = clients[gateway]
            for n in range(ATTEMPTS_PER_WRITER):
                expected = (await client.stat(WHO, PATH)).version
                payload = f"{name} {n}".encode()
                try:
                    made = await client.write(WHO, PATH, _body(payload), if_version=expected)
                except Conflict:
                    attempts.append(Attempt(gateway, expected, payload, None))
                else:
                    attempts.append(Attempt(gateway, expected, payload, made.version))

        await asyncio.gather(
            *(
                writer(gateway, f"g{gateway}w{w}")
                for gateway in range(len(clients))
                for w in range(WRITERS_PER_GATEWAY)
            )
        )
        return initial, attempts
    finally:
        for client in clients:
            await client.close()


async def _content(url: str, admin: tuple[str, str], path: str = PATH) -> tuple[int, bytes]:
    client = RestNamespace(url, credentials=admin)
    try:
        async with await client.read(WHO, path) as reader:
            return reader.entry.version, b"".join([chunk async for chunk in reader.chunks()])
    finally:
        await client.close()


def test_two_gateways_never_both_win_one_version_nor_lose_a_write(
    gateways: list[HubProcess], tmp_path: Path
) -> None:
    admin = gateways[0].admin
    urls = [gateway.url for gateway in gateways]
    initial, attempts = asyncio.run(_hammer(urls, admin))
    done = check_history(initial, attempts)
    # the hammering raced: some writes on each gateway were refused, some won
    assert any(a.version is None for a in attempts), attempts
    assert {a.gateway for a in done} == {0, 1}, done
    last = done[-1]
    for url in urls:  # both gateways, and the volume itself, hold the last acknowledged
        assert asyncio.run(_content(url, admin)) == (last.version, last.payload)
    assert (tmp_path / "volume" / "hot.txt").read_bytes() == last.payload


@pytest.mark.parametrize(
    ("attempts", "ok"),
    [
        ([Attempt(0, 1, b"a", 2), Attempt(1, 2, b"b", 3)], True),
        ([Attempt(0, 1, b"a", 2), Attempt(1, 1, b"b", 3)], False),  # both won on 1
        ([Attempt(0, 1, b"a", 3), Attempt(1, 2, b"b", 4)], False),  # b's 2 never acked
        ([Attempt(0, 1, b"a", None), Attempt(1, 1, b"b", 2)], True),
    ],
)
def test_the_history_checker_refuses_what_it_must(attempts: list[Attempt], ok: bool) -> None:
    if ok:
        assert check_history(1, attempts)
    else:
        with pytest.raises(AssertionError):
            check_history(1, attempts)


def _hub_config(data_dir: Path, catalog_url: str, *, audit: bool = False) -> Config:
    # one staging directory, as on storage the gateways share; the bucket "data" is /v
    return Config.model_validate(
        {"site": {"data_dir": str(data_dir)}, "audit": {"enabled": audit},
         "catalog": {"url": catalog_url}, "s3": {"buckets": {"data": "/v"}},
         "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(data_dir.parent)],
                 "staging_dir": str(data_dir.parent / "staging")}}
    )  # fmt: skip


async def _follows(gateway: HubService, mount: str, *, mounted: bool) -> None:
    """Wait until ``gateway`` has (un)mounted ``mount`` (the test's own watchdog: a
    minute), as another gateway's commit told it."""
    deadline = time.monotonic() + 60

    def followed() -> bool:
        return (mount in gateway.namespace.mounts) == mounted

    # its mounts are all it shows of the following: no event to wait on
    while not followed() and time.monotonic() < deadline:  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    assert followed(), f"{mount} never followed"


@contextlib.asynccontextmanager
async def _gateways(
    postgres: PostgresServer, tmp_path: Path, count: int, *, audit: bool = False
) -> AsyncIterator[list[HubService]]:
    """``count`` in-process gateways over one new database, with the volume /v, added
    through the first once all run (the others mount it as the catalog tells them)."""
    url = postgres.create_database()
    (tmp_path / "volume").mkdir()
    started: list[HubService] = []
    try:
        for name in "abc"[:count]:
            started.append(HubService(_hub_config(tmp_path / name, url, audit=audit)))
            await started[-1].start()
        await started[0].add_volume("/v", f"posix://{tmp_path / 'volume'}", lambda _: None)
        for other in started[1:]:
            await _follows(other, "/v", mounted=True)
        yield started
    finally:
        for gateway in reversed(started):
            await gateway.stop()


@contextlib.asynccontextmanager
async def _two_gateways(
    postgres: PostgresServer, tmp_path: Path
) -> AsyncIterator[tuple[HubService, HubService]]:
    async with _gateways(postgres, tmp_path, 2) as (first, second):
        yield first, second


async def test_a_volume_added_or_removed_through_one_gateway_is_followed_by_the_other(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no poll of the volumes would come in the test's lifetime: only a notification
    monkeypatch.setattr(service, "VOLUMES_POLL", 3600.0)
    async with _two_gateways(postgres, tmp_path) as (first, second):
        # served by the second, which was running when the first added it
        made = await second.namespace.write(SYSTEM, "/v/f.txt", _body(b"through b"))
        assert (tmp_path / "volume" / "f.txt").read_bytes() == b"through b"
        async with await first.namespace.read(SYSTEM, "/v/f.txt") as reader:
            assert reader.entry.version == made.version
        await first.remove_volume("/v")
        await _follows(second, "/v", mounted=False)
        # as one hub refuses them once a volume is gone: no entry, and nowhere to write
        with pytest.raises(NotFound):
            await second.namespace.stat(SYSTEM, "/v/f.txt")
        with pytest.raises(PermissionDenied, match="not inside a volume"):
            await second.namespace.write(SYSTEM, "/v/g.txt", _body(b"too late"))
        assert not (tmp_path / "volume" / "g.txt").exists()
        # the mount again, other storage: the second serves the new one's
        (tmp_path / "other").mkdir()
        await first.add_volume("/v", f"posix://{tmp_path / 'other'}", lambda _: None)
        await _follows(second, "/v", mounted=True)
        await second.namespace.write(SYSTEM, "/v/g.txt", _body(b"elsewhere"))
        assert (tmp_path / "other" / "g.txt").read_bytes() == b"elsewhere"


async def test_a_commit_on_one_gateway_wakes_a_long_poll_on_the_other(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # no poll would come in the test's lifetime: only a notification can wake the feed
    monkeypatch.setattr(PostgresCatalog, "NOTIFIED_POLL_S", 3600.0)
    waiting = asyncio.Event()
    woken: list[bool] = []  # each of the feed's waits: ended by a notification?
    changed = PostgresCatalog.changed

    async def waits(catalog: PostgresCatalog, seen: int, poll: float, limit: float) -> None:
        waiting.set()  # the feed found nothing and waits: what comes now must wake it
        await changed(catalog, seen, poll, limit)
        woken.append(catalog.commits_seen() != seen)

    monkeypatch.setattr(PostgresCatalog, "changed", waits)
    async with _two_gateways(postgres, tmp_path) as (first, second):
        head = await second.catalog.head_seq()
        polled = asyncio.ensure_future(second.feed(None, head, 100, wait=30.0))
        await waiting.wait()
        made = await first.namespace.write(SYSTEM, "/v/new.txt", _body(b"news"))
        feed = await polled
        # the new file, and its directory's new times in the same commit
        assert [(c.path, c.version) for c in feed.changes] == [
            ("/v/new.txt", made.version),
            ("/v", made.version + 1),
        ]
        # woken by notifications, never by the long poll's end (the old code). A late one
        # of the volume's import may wake it first, to find nothing new and wait again
        assert woken and all(woken), woken


async def test_a_write_lease_taken_through_one_gateway_holds_at_the_other(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    spoke, other = replace(SYSTEM, site="gpu-1"), replace(SYSTEM, site="gpu-2")
    async with _two_gateways(postgres, tmp_path) as (first, second):
        assert await first.namespace.lease_write(spoke, "/v/f.txt") > 0
        with pytest.raises(Conflict, match="gpu-1"):  # another site, another gateway
            await second.namespace.write(other, "/v/f.txt", _body(b"theirs"))
        with pytest.raises(Conflict, match="gpu-1"):
            await second.namespace.lease_write(other, "/v/f.txt")
        # the holder writes through either gateway, renews through the other
        made = await second.namespace.write(spoke, "/v/f.txt", _body(b"mine"))
        assert await second.namespace.lease_write(spoke, "/v/f.txt") > 0
        await first.namespace.release_write(spoke, "/v/f.txt")
        after = await second.namespace.write(other, "/v/f.txt", _body(b"theirs"))
        assert after.version > made.version


def _intents_left(url: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*) FROM intents").fetchone()
        return int(row[0]) if row else 0


def _repaired(url: str) -> bool:
    """Whether every intent record goes (the test's own watchdog: a minute)."""
    deadline = time.monotonic() + 60
    while _intents_left(url) and time.monotonic() < deadline:
        time.sleep(0.05)
    return _intents_left(url) == 0


async def _killed_mid_commit(killed: HubProcess, other: HubProcess, at: Path, catalog: str) -> None:
    admin = other.admin
    to_killed = RestNamespace(killed.url, credentials=admin)
    to_other = RestNamespace(other.url, credentials=admin)
    try:
        await to_other.write(WHO, "/v/f.txt", _body(b"old"))
        writing = asyncio.ensure_future(
            to_killed.write(WHO, "/v/f.txt", _body(b"new bytes"), write_id="w1")
        )
        await stages.reached(at, KILLED_AT, writing)
        assert _intents_left(catalog) == 1  # noted in the database before the volume moved
        killed.kill()
        with pytest.raises(Exception):  # noqa: B017 (its connection went with the process)
            await writing
        assert await asyncio.to_thread(_repaired, catalog), "the dead one's was never repaired"
        on_disk = (killed.data_dir.parent / "volume" / "f.txt").read_bytes()
        async with await to_other.read(WHO, "/v/f.txt") as reader:
            served = b"".join([chunk async for chunk in reader.chunks()])
        assert served == on_disk, "the catalog and the volume disagree after the repair"
        assert on_disk == b"new bytes"  # renamed into place: the repair recorded it
        # the writer's retry, through the survivor, is answered from the repair: not
        # landed twice
        again = await to_other.write(WHO, "/v/f.txt", _body(b"new bytes"), write_id="w1")
        assert again.version == reader.entry.version
    finally:
        await to_killed.close()
        await to_other.close()


def test_a_gateway_killed_mid_commit_is_repaired_by_the_other(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    (tmp_path / "volume").mkdir()
    catalog = postgres.create_database()
    env = {
        "LOOMFS_CATALOG__URL": catalog,
        "LOOMFS_HUB__RESCAN_INTERVAL": "0",  # only the repair can make the two agree
        "LOOMFS_HUB__WATCH": "false",
        "LOOMFS_HUB__REPAIR_INTERVAL": "0.1",
    }
    paused, at = stages.pausing(tmp_path, KILLED_AT)
    with HubProcess(tmp_path / "b", env) as other:
        cli_ok(
            other.data_dir,
            "--hub",
            other.url,
            "volume",
            "add",
            "/v",
            f"posix://{tmp_path / 'volume'}",
        )
        with HubProcess(tmp_path / "a", {**env, **paused}) as killed:
            asyncio.run(_killed_mid_commit(killed, other, at, catalog))


async def _through_spoke(url: str, admin: tuple[str, str], kill: Callable[[], None]) -> None:
    spoke = RestNamespace(url, credentials=admin)
    try:
        await spoke.write(WHO, "/v/before.txt", _body(b"before"))
        kill()  # the gateway the spoke was using
        await spoke.write(WHO, "/v/after.txt", _body(b"after"))
        for name, data in [("after.txt", b"after"), ("before.txt", b"before")]:
            async with await spoke.read(WHO, f"/v/{name}") as reader:
                assert b"".join([chunk async for chunk in reader.chunks()]) == data
        listed = [entry.path async for entry in spoke.list(WHO, "/v")]
        assert listed == ["/v/after.txt", "/v/before.txt"], listed
    finally:
        await spoke.close()


def test_a_spoke_of_two_gateways_goes_on_when_one_is_killed(
    postgres: PostgresServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_dir, second_dir, spoke_dir = tmp_path / "a", tmp_path / "b", tmp_path / "spoke"
    (tmp_path / "volume").mkdir()
    env = {
        "LOOMFS_CATALOG__URL": postgres.create_database(),
        "LOOMFS_FABRIC__LISTEN": "127.0.0.1:0",
        "LOOMFS_HUB__RESCAN_INTERVAL": "0",
    }
    for name, value in env.items():  # the CLI's offline commands too
        monkeypatch.setenv(name, value)
    # the gateways are one site: one identity, the one certificate the spoke pins
    cli_ok(first_dir, "site", "init", "--name", "hub")
    shutil.copytree(first_dir / "identity", second_dir / "identity")
    cli_ok(spoke_dir, "site", "init", "--name", "gpu-1")
    cli_ok(
        first_dir,
        "site",
        "add",
        "gpu-1",
        "--offline",
        "--cert",
        str(spoke_dir / "identity/site.pem"),
    )
    with HubProcess(first_dir, env) as first:
        volume = f"posix://{tmp_path / 'volume'}"
        cli_ok(first_dir, "--hub", first.url, "volume", "add", "/v", volume)
        with HubProcess(second_dir, env) as second:  # it finds the volume in the catalog
            both = f"{first.urls['fabric']},{second.urls['fabric']}"
            with SpokeProcess(spoke_dir, args=spoke_args(first_dir, both, "/v")) as spoke:
                asyncio.run(_through_spoke(spoke.url, first.admin, first.kill))
            # acknowledged through the survivor: on the volume and in its catalog
            assert (tmp_path / "volume" / "after.txt").read_bytes() == b"after"
            assert cli_ok(second_dir, "--hub", second.url, "cat", "/v/after.txt") == "after"


async def test_a_commit_through_one_gateway_waits_for_a_spoke_leased_at_the_other(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    async with _two_gateways(postgres, tmp_path) as (first, second):
        head = await first.catalog.head_seq()
        # a spoke's poll at the first gateway: leased, everything so far applied
        await first.feed("gpu-1", head, 100, ack=head)
        writing = asyncio.ensure_future(second.namespace.write(SYSTEM, "/v/f", _body(b"x")))
        # committed (with its directory's new times, in the same commit)
        changes = (await second.feed(None, head, 100, wait=60.0)).changes
        assert "/v/f" in {c.path for c in changes}
        seq = max(c.seq for c in changes)
        await asyncio.wait({writing}, timeout=0.3)  # settling, however long it is given
        assert not writing.done(), "acknowledged before the leased spoke applied it"
        await first.feed("gpu-1", seq, 100, ack=seq)  # its next poll, at the first again
        assert (await writing).version > 0


@contextlib.asynccontextmanager
async def _s3_endpoints(gateways: list[HubService]) -> AsyncIterator[list[str]]:
    """Each gateway's S3 listener, on a port of its own."""
    runners = [web.AppRunner(gateway.s3_gateway().app()) for gateway in gateways]
    try:
        urls = []
        for runner in runners:
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
            urls.append(f"http://127.0.0.1:{port}")
        yield urls
    finally:
        for runner in runners:
            await runner.cleanup()


def _s3_client(url: str, key: AccessKey) -> S3Client:
    return boto3.client(
        "s3", endpoint_url=url, region_name="us-east-1",
        aws_access_key_id=key.access_key, aws_secret_access_key=key.secret,
        config=BotoConfig(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
    )  # fmt: skip


async def test_uploads_go_on_through_any_gateway(postgres: PostgresServer, tmp_path: Path) -> None:
    """An S3 multipart upload created through one gateway takes parts through another
    and completes through a third; chunks a spoke uploads through one commit through
    another (one staging directory, as on shared storage)."""
    first_part, last_part = bytes(range(256)) * (5 << 12), b"the end"  # 5 MiB, then a tail
    async with _gateways(postgres, tmp_path, 3) as gateways, _s3_endpoints(gateways) as urls:
        users = UserRegistry(gateways[0].catalog)
        await users.add_user("alice")
        key = await users.add_access_key("alice")
        a, b, c = (_s3_client(url, key) for url in urls)
        made = await asyncio.to_thread(a.create_multipart_upload, Bucket="data", Key="big.bin")
        upload = made["UploadId"]
        # listed through another gateway before any part came
        listed = await asyncio.to_thread(c.list_multipart_uploads, Bucket="data")
        assert [u["UploadId"] for u in listed["Uploads"]] == [upload]
        sent = [
            await asyncio.to_thread(
                client.upload_part, Bucket="data", Key="big.bin", UploadId=upload,
                PartNumber=number, Body=body,
            )
            for client, number, body in [(b, 1, first_part), (a, 2, last_part)]
        ]  # fmt: skip
        shown = await asyncio.to_thread(c.list_parts, Bucket="data", Key="big.bin", UploadId=upload)
        assert [(p["PartNumber"], p["Size"]) for p in shown["Parts"]] == [
            (1, len(first_part)),
            (2, len(last_part)),
        ]
        parts: CompletedMultipartUploadTypeDef = {
            "Parts": [{"PartNumber": n, "ETag": s["ETag"]} for n, s in enumerate(sent, 1)]
        }

        def complete(client: S3Client) -> str:
            done = client.complete_multipart_upload(
                Bucket="data", Key="big.bin", UploadId=upload, MultipartUpload=parts
            )
            return done["ETag"]

        etag = await asyncio.to_thread(complete, c)
        assert etag.endswith('-2"')
        # a repeated Complete (a lost reply) through yet another gateway: the same answer
        assert await asyncio.to_thread(complete, b) == etag

        def read() -> tuple[str, bytes]:
            got = a.get_object(Bucket="data", Key="big.bin")
            return got["ETag"], got["Body"].read()

        assert await asyncio.to_thread(read) == (etag, first_part + last_part)
        assert (tmp_path / "volume" / "big.bin").read_bytes() == first_part + last_part
        assert list((tmp_path / "staging" / "s3-uploads").iterdir()) == []  # parts gone
        assert (await asyncio.to_thread(b.list_multipart_uploads, Bucket="data")).get(
            "Uploads", []
        ) == []
        # an upload aborted through one gateway is gone for the others
        other = (await asyncio.to_thread(b.create_multipart_upload, Bucket="data", Key="x"))[
            "UploadId"
        ]
        await asyncio.to_thread(c.abort_multipart_upload, Bucket="data", Key="x", UploadId=other)
        with pytest.raises(ClientError, match="NoSuchUpload"):
            await asyncio.to_thread(
                a.upload_part, Bucket="data", Key="x", UploadId=other, PartNumber=1, Body=b"late"
            )
        # chunks staged through the first, committed through the second
        data = random.Random(7).randbytes(3 << 20)
        cmap = chunk_map_of(io.BytesIO(data))

        async def frames() -> AsyncIterator[tuple[bytes, bytes]]:
            for piece in cmap:
                raw = data[piece.offset : piece.offset + piece.length]
                yield piece.id, encode_chunk(raw)

        assert await gateways[0].chunks.receive(frames()) == len(cmap)
        chunked = await gateways[1].chunks.commit(SYSTEM, "/v/chunked.bin", cmap)
        assert chunked.size == len(data)
        assert (tmp_path / "volume" / "chunked.bin").read_bytes() == data


def _scanned(gateway: HubProcess) -> float:
    """The entries ``gateway``'s imports and rescans went through (its /metrics)."""
    with urllib.request.urlopen(f"{gateway.url}/metrics") as response:
        text = response.read().decode()
    found = re.search(r"^loomfs_assimilated_entries_total (\S+)$", text, re.MULTILINE)
    assert found is not None, "no loomfs_assimilated_entries_total in /metrics"
    return float(found[1])


async def _add_volume(url: str, admin: tuple[str, str], volume: str) -> None:
    client = RestNamespace(url, credentials=admin)
    try:
        await client.add_volume("/v", volume)
    finally:
        await client.close()


def _until(done: Callable[[], bool], what: str) -> None:
    """Wait until ``done()`` (the test's own watchdog: a minute)."""
    deadline = time.monotonic() + 60
    while not done():
        assert time.monotonic() < deadline, f"never {what}"
        time.sleep(0.05)


def _cut_lock_session(url: str) -> None:
    """End the session holding the liveness lock of the gateway with intent records
    under way, as a broken connection ends it, with that gateway still running."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT owner FROM intents").fetchone()
        assert row is not None, "no change under way"
        key = gateway_lock_key(row[0])
        held = conn.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s AND objid = %s",
            ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
        ).fetchone()
        assert held is not None, "its liveness lock is not held"
        conn.execute("SELECT pg_terminate_backend(%s)", (held[0],))


async def _session_cut_mid_commit(
    cut: HubProcess, other: HubProcess, at: Path, catalog: str
) -> None:
    admin = other.admin
    to_cut = RestNamespace(cut.url, credentials=admin)
    to_other = RestNamespace(other.url, credentials=admin)
    try:
        await to_other.write(WHO, "/v/f.txt", _body(b"old"))
        writing = asyncio.ensure_future(
            to_cut.write(WHO, "/v/f.txt", _body(b"new bytes"), write_id="w1")
        )
        await stages.reached(at, KILLED_AT, writing)
        await asyncio.to_thread(_cut_lock_session, catalog)
        # the other takes the cut one for gone and repairs the change in flight
        assert await asyncio.to_thread(_repaired, catalog), "never repaired"
        # its path lock lapsed with the session: a writer through the other gets it
        theirs = await to_other.write(WHO, "/v/f.txt", _body(b"theirs"))
        Path(f"{at}.go").write_text("")  # and the cut one's write goes on
        try:
            mine: Entry | None = await writing
        except Conflict:  # refused: its version check was made before theirs
            mine = None
        on_disk = (cut.data_dir.parent / "volume" / "f.txt").read_bytes()
        for client in (to_cut, to_other):  # both gateways serve what the volume holds
            async with await client.read(WHO, "/v/f.txt") as reader:
                served = b"".join([chunk async for chunk in reader.chunks()])
                version = reader.entry.version
            assert served == on_disk, "the catalog and the volume disagree"
        # the last write acknowledged is what they hold (on the old code, the cut one's
        # undo put the old bytes back over theirs: an acknowledged write lost)
        last = b"theirs" if mine is None or mine.version < theirs.version else b"new bytes"
        assert on_disk == last, (on_disk, mine, theirs)
        assert version >= theirs.version
    finally:
        await to_cut.close()
        await to_other.close()


def test_a_cut_lock_session_stays_consistent_and_the_elected_gateway_is_replaced(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    """The adversary's route: the lock session of a gateway that lives ends (a broken
    connection), so another gateway takes it for gone and repairs its change in flight,
    and a writer through the other takes the path lock it lost; then the change goes on.
    The catalog and the volume must still agree, and hold the last acknowledged write.
    Then (the same two processes, to spare two starts) the elected gateway, the only one
    that rescans, is killed with kill -9, and the other is elected and rescans."""
    volume = tmp_path / "volume"
    volume.mkdir()
    catalog = postgres.create_database()
    env = {
        "LOOMFS_CATALOG__URL": catalog,
        "LOOMFS_HUB__RESCAN_INTERVAL": "0.1",  # no watch: only a rescan finds new files
        "LOOMFS_HUB__WATCH": "false",
        "LOOMFS_HUB__REPAIR_INTERVAL": "0.1",
    }
    paused, at = stages.pausing(tmp_path, KILLED_AT)
    with HubProcess(tmp_path / "b", env) as other:  # alone, so elected
        admin = other.admin  # the shared catalog's: good at every gateway
        asyncio.run(_add_volume(other.url, admin, f"posix://{volume}"))
        with HubProcess(tmp_path / "a", {**env, **paused}) as cut:
            asyncio.run(_session_cut_mid_commit(cut, other, at, catalog))
            (volume / "one.txt").write_bytes(b"one")
            # the volume was empty at its import: only a rescan counts a new file
            _until(lambda: _scanned(other) > 0, "rescanned by the elected gateway")
            assert _scanned(cut) == 0  # while the elected one lives, the other never scans
            other.kill()  # kill -9: its session, and its hold on the election, end
            (volume / "new.txt").write_bytes(b"new")
            _until(lambda: _scanned(cut) > 0, "rescanned by the next elected")
            assert asyncio.run(_content(cut.url, admin, "/v/new.txt"))[1] == b"new"


async def test_each_gateway_keeps_a_chain_that_verifies_and_queries_merge_them(
    postgres: PostgresServer, tmp_path: Path
) -> None:
    alice = replace(SYSTEM, user="alice", protocol="rest")
    async with _gateways(postgres, tmp_path, 2, audit=True) as gateways:
        await asyncio.gather(
            *(
                gateway.governed.write(alice, f"/v/{name}{n}", _body(b"x"))
                for name, gateway in zip("ab", gateways, strict=True)
                for n in range(10)
            )
        )
    # stopped: every record written; each gateway's chain whole on its own
    dirs = [str(tmp_path / name / "audit") for name in "ab"]
    for directory in dirs:
        assert AuditReader(Path(directory)).verify().ok
    cli = CliRunner()
    env = {"LOOMFS_SITE__DATA_DIR": str(tmp_path / "a"), "LOOMFS_CONFIG": ""}
    verified = cli.invoke(main, ["audit", "verify", "--dir", dirs[0], "--dir", dirs[1]], env=env)
    assert verified.exit_code == 0, verified.output
    assert verified.output.count("ok ") == 2
    queried = cli.invoke(
        main,
        ["audit", "query", "--user", "alice", "--op", "write", "--json",
         "--dir", dirs[0], "--dir", dirs[1]],
        env=env,
    )  # fmt: skip
    assert queried.exit_code == 0, queried.output
    lines = [json.loads(line) for line in queried.output.splitlines()]
    # both gateways' writes, in time order across the chains, each naming its chain
    assert sorted(line["path"] for line in lines) == sorted(
        f"/v/{name}{n}" for name in "ab" for n in range(10)
    )
    assert {line["chain"] for line in lines if line["path"].startswith("/v/a")} == {dirs[0]}
    assert {line["chain"] for line in lines if line["path"].startswith("/v/b")} == {dirs[1]}
    times = [line["time_ns"] for line in lines]
    assert times == sorted(times)
