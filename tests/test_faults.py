"""Faults: a full disk and a hub killed in the middle of a write lose nothing acknowledged
and leave nothing half-written visible."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import aiohttp
import asyncssh
import boto3
import pytest
from aiohttp import web
from botocore.config import Config
from botocore.exceptions import ClientError

from loomfs.config import load_config
from loomfs.core.backends.posix import PosixBackend
from loomfs.core.registry import open_catalog
from loomfs.core.types import SYSTEM, Principal
from loomfs.errors import InsufficientStorage
from loomfs.hub.namespace import HubNamespace
from loomfs.rest.client import RestNamespace
from loomfs.rest.wire import API
from loomfs.service import HubService
from loomfs.testing.edges import ALL_OPS, PART, Edge, edge_site
from loomfs.testing.edges import BUCKET as EDGE_BUCKET
from loomfs.testing.fixtures import filled, tmpfs
from loomfs.testing.hubproc import HubProcess, SpokeProcess, cli_ok, site_config, spoke_args
from loomfs.testing.ports import free_port
from loomfs.testing.s3gateway import register_users

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef

T = TypeVar("T")

WHO = Principal(user="tester")


async def test_full_disk_is_a_clear_error_and_changes_nothing(
    tiny_fs: Path, tmp_path: Path
) -> None:
    (tiny_fs / "f").write_bytes(b"old")
    catalog = open_catalog(f"sqlite://{tmp_path / 'c.db'}")
    await catalog.open()
    hub = HubNamespace(catalog)
    try:
        await hub.add_volume("/v", f"posix://{tiny_fs}")
        before = await hub.stat(WHO, "/v/f")
        head = await catalog.head_seq()
        with pytest.raises(InsufficientStorage):
            await hub.write_bytes(WHO, "/v/f", os.urandom(2 << 20))
        assert (tiny_fs / "f").read_bytes() == b"old"
        assert sorted(p.name for p in tiny_fs.iterdir()) == ["f"]  # no temp file left
        assert await hub.stat(WHO, "/v/f") == before
        assert await catalog.head_seq() == head
        # and once there is room again, writes work
        assert (await hub.write_bytes(WHO, "/v/f", b"new")).version > before.version
    finally:
        await hub.close()
        await catalog.close()


async def test_hub_killed_during_a_write_keeps_the_old_version(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    (data / "f").write_bytes(b"old content")
    hub = HubProcess(tmp_path / "site").start()
    try:
        client = RestNamespace(hub.url, credentials=hub.admin)  # an administrator's client
        await client.add_volume("/v", f"posix://{data}")
        before = await client.stat(WHO, "/v/f")
        sent = asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            for _ in range(64):
                yield b"n" * (1 << 20)
                sent.set()
                await asyncio.sleep(0.05)

        async with aiohttp.ClientSession() as session:
            upload = asyncio.create_task(session.put(f"{hub.url}{API}/files/v/f", data=slow_body()))
            await sent.wait()
            await asyncio.sleep(0.3)
            hub.kill()
            with contextlib.suppress(aiohttp.ClientError):
                await upload
        await client.close()
        assert (data / "f").read_bytes() == b"old content"

        hub.start()
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            after = await client.stat(WHO, "/v/f")
            assert (after.version, after.size) == (before.version, before.size)
            assert await client.read_bytes(WHO, "/v/f") == b"old content"
            assert [e.name async for e in client.list(WHO, "/v")] == ["f"]
            stats = await client.rescan("/v")
            assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0)
        finally:
            await client.close()
    finally:
        hub.stop()


# -- a failed write leaves the volume and the catalog as they were, at every stage --------

MIB = 1 << 20
S3_USER = ("fay", "FAYACCESSKEY00000000", "fay-secret-" + "s" * 29)
BUCKET = "faults"
OLD = os.urandom(300_000)


class Hub:
    """A hub in this process, so that faults can be injected into it, serving REST and S3
    on free ports from an event loop in a thread of its own; its data directory and its
    volume each on a small tmpfs of their own."""

    def __init__(self, tmp: Path, data_fs: Path, volume_fs: Path) -> None:
        self.data_fs, self.volume_fs = data_fs, volume_fs
        self.vol = volume_fs / "vol"
        (self.vol / BUCKET).mkdir(parents=True)
        (self.vol / BUCKET / "existing").write_bytes(OLD)
        self.config = site_config(
            tmp / "loomfs.toml",
            data_fs / "site",
            f'[hub]\nrescan_interval = 0\nvolume_roots = ["{volume_fs}"]\n'
            '[s3]\nlisten = "127.0.0.1:0"\nbucket_root = "/s3"\n',
        )
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.runners: list[web.AppRunner] = []
        self.urls = self.call(self._start())
        self.rest = RestNamespace(self.urls["url"])

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout=120)

    async def _start(self) -> dict[str, str]:
        config = load_config(self.config)
        await register_users(config.catalog_url, [S3_USER])
        self.service = HubService(config)
        await self.service.start()
        try:
            await self.service.add_volume("/s3", f"posix://{self.vol}", lambda _: None)
        except BaseException:
            await self.service.stop()  # else its files keep the tmpfs busy
            raise
        urls = {}
        for name, app in (
            ("url", self.service.rest_server().app()),
            ("s3", self.service.s3_gateway().app()),
        ):
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            self.runners.append(runner)
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            urls[name] = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        return urls

    def close(self) -> None:
        async def stop() -> None:
            await self.rest.close()
            for runner in self.runners:
                await runner.cleanup()
            await self.service.stop()

        try:
            self.call(stop())
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)
            self.loop.close()

    def s3(self) -> S3Client:
        return boto3.client(
            "s3",
            endpoint_url=self.urls["s3"],
            region_name="us-east-1",
            aws_access_key_id=S3_USER[1],
            aws_secret_access_key=S3_USER[2],
            # standard retries: 500/502/503/504 and throttling would be retried
            config=Config(retries={"mode": "standard", "max_attempts": 3},
                          s3={"addressing_style": "path"}),
        )  # fmt: skip

    def state(self) -> tuple[dict[str, bytes | None], list[tuple[object, ...]]]:
        """Every name on the volume's disk (hidden ones too) with its bytes, and what the
        catalog holds of the volume: each file's version and content facts, each
        directory's name (a directory's mtime is the kernel's: a temp file made and
        removed in it moves it, and the catalog follows)."""
        disk: dict[str, bytes | None] = {}
        for top, dirs, files in os.walk(self.vol):
            for name in dirs + files:
                path = Path(top) / name
                disk[str(path.relative_to(self.vol))] = None if name in dirs else path.read_bytes()

        async def rows() -> list[tuple[object, ...]]:
            return [
                (e.path, e.kind) if e.is_dir else (e.path, e.version, e.size, e.etag, e.mtime_ns)
                async for e in self.service.namespace.walk(SYSTEM, "/s3")
            ]

        return disk, self.call(rows())

    @contextlib.contextmanager
    def fault(self, stage: str) -> Iterator[None]:
        """A write fails at ``stage``: its volume full (the temp file's bytes), the step
        right after the rename failing (the directory's fsync), the catalog's commit
        failing (as SQLite's on a full data directory), the data directory full (S3's
        multipart staging)."""
        if stage == "volume":
            with filled(self.volume_fs):
                yield
        elif stage == "staging":
            with filled(self.data_fs):
                yield
        elif stage == "rename":
            real = PosixBackend._commit

            def commit(
                backend: PosixBackend, staged: Any, mode: int | None, first: Any = None
            ) -> object:
                real(backend, staged, mode, first)
                raise OSError(errno.ENOSPC, "injected: the directory's fsync found no space")

            PosixBackend._commit = commit  # type: ignore[assignment,method-assign]
            try:
                yield
            finally:
                PosixBackend._commit = real  # type: ignore[method-assign]
        else:
            catalog = self.service.catalog
            db = self.service.config.site.data_dir / "catalog.db"

            async def apply(changes: object) -> object:
                raise InsufficientStorage(f"catalog {db}: database or disk is full")

            catalog.apply = apply  # type: ignore[method-assign,assignment]
            try:
                yield
            finally:
                del catalog.apply


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    tmp = tmp_path_factory.mktemp("faults")
    with tmpfs(tmp / "data", "48m") as data_fs, tmpfs(tmp / "volume", "12m") as volume_fs:
        made = Hub(tmp, data_fs, volume_fs)
        try:
            yield made
        finally:
            made.close()


def _rest_put(hub: Hub, key: str, body: bytes, stage: str) -> None:
    with hub.fault(stage), pytest.raises(InsufficientStorage) as failed:
        hub.call(hub.rest.write_bytes(WHO, f"/s3/{BUCKET}/{key}", body))
    if stage == "volume":
        assert str(hub.vol) in str(failed.value)  # says which disk is full


def _s3_refused(call: Callable[[], object], disk: Path | None) -> None:
    with pytest.raises(ClientError) as failed:
        call()
    response = failed.value.response
    assert response["Error"]["Code"] == "XMinioStorageFull"
    assert response["ResponseMetadata"]["HTTPStatusCode"] == 507
    assert response["ResponseMetadata"]["RetryAttempts"] == 0  # no client retries it
    if disk is not None:
        assert str(disk) in response["Error"]["Message"]


def _s3_put(hub: Hub, key: str, body: bytes, stage: str) -> None:
    s3 = hub.s3()
    disk = hub.vol if stage == "volume" else None
    with hub.fault(stage):
        _s3_refused(lambda: s3.put_object(Bucket=BUCKET, Key=key, Body=body), disk)


def _s3_multipart(hub: Hub, key: str, body: bytes, stage: str) -> None:
    s3 = hub.s3()
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    sizes = (5 * MIB, len(body))
    try:
        if stage == "staging":
            with hub.fault(stage):
                _s3_refused(
                    lambda: s3.upload_part(
                        Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=1, Body=bytes(sizes[0])
                    ),
                    hub.data_fs,
                )
            return
        parts: list[CompletedPartTypeDef] = []
        for number, part in enumerate((bytes(sizes[0]), body), 1):
            done = s3.upload_part(
                Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=number, Body=part
            )
            parts.append({"PartNumber": number, "ETag": done["ETag"]})
        disk = hub.vol if stage == "volume" else None
        with hub.fault(stage):
            _s3_refused(
                lambda: s3.complete_multipart_upload(
                    Bucket=BUCKET, Key=key, UploadId=upload, MultipartUpload={"Parts": parts}
                ),
                disk,
            )
    finally:
        s3.abort_multipart_upload(Bucket=BUCKET, Key=key, UploadId=upload)


OPS: dict[str, Callable[[Hub, str, bytes, str], None]] = {
    "rest": _rest_put,
    "s3-put": _s3_put,
    "s3-multipart": _s3_multipart,
}
CASES = [
    (op, target, stage)
    for op in OPS
    for target in ("new", "existing")
    for stage in ("volume", "rename", "catalog")
] + [("s3-multipart", "new", "staging"), ("s3-multipart", "existing", "staging")]


@pytest.mark.parametrize(("op", "target", "stage"), CASES)
def test_a_failed_write_changes_nothing_at_any_stage(
    hub: Hub, op: str, target: str, stage: str
) -> None:
    key = f"{op}-{stage}" if target == "new" else "existing"
    before = hub.state()
    OPS[op](hub, key, os.urandom(200_000), stage)
    assert hub.state() == before  # the volume's bytes, no stray file, the catalog's rows
    # and the hub goes on serving, and writing
    assert (
        hub.s3().get_object(Bucket=BUCKET, Key="existing")["Body"].read()
        == (hub.vol / BUCKET / "existing").read_bytes()
    )
    written = hub.call(hub.rest.write_bytes(WHO, f"/s3/{BUCKET}/after-{op}-{stage}", b"ok"))
    assert hub.call(hub.rest.read_bytes(WHO, written.path)) == b"ok"


# -- the same over the edges of a hub process, with its disks really full ------------------


@pytest.fixture(scope="module")
def edges(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Edge, Path, Path]]:
    """A hub process serving S3 and SFTP: its data directory on a small tmpfs, its volume
    on another; (its edges, the data tmpfs, the volume's directory)."""
    tmp = tmp_path_factory.mktemp("edges")
    with tmpfs(tmp / "data", "48m") as data_fs, tmpfs(tmp / "volume", "12m") as volume_fs:
        volume = volume_fs / "vol"
        hub, edge = asyncio.run(edge_site(data_fs / "site", volume, tmp / "loomfs.toml", {}, OLD))
        try:
            yield edge, data_fs, volume
        finally:
            hub.stop()  # before the tmpfs go: its files keep them busy


def _edge_state(edge: Edge, volume: Path) -> tuple[dict[str, bytes | None], list[object]]:
    """Every name on the volume (hidden ones too) with its bytes, and the catalog's rows of
    the volume (a directory's mtime aside: see ``Hub.state``)."""
    disk = {
        str(p.relative_to(volume)): None if p.is_dir() else p.read_bytes()
        for p in volume.rglob("*")
    }

    async def rows() -> list[object]:
        client = RestNamespace(edge.hub.url, credentials=edge.hub.admin)
        try:
            return [
                (e.path, e.kind) if e.is_dir else (e.path, e.version, e.size, e.etag, e.mtime_ns)
                async for e in client.walk(WHO, "/s3")
            ]
        finally:
            await client.close()

    return disk, asyncio.run(rows())


@pytest.mark.parametrize("full", ["volume", "data-dir"])
@pytest.mark.parametrize("target", ["new", "existing"])
@pytest.mark.parametrize("op", ALL_OPS)
def test_a_write_over_any_edge_onto_a_full_disk_changes_nothing(
    edges: tuple[Edge, Path, Path], op: str, target: str, full: str
) -> None:
    edge, data_fs, volume = edges
    key = f"{op}-{full}" if target == "new" else "existing"
    before = _edge_state(edge, volume)
    body = os.urandom(PART + 200_000 if op == "s3-multipart" else 200_000)
    with (
        filled(volume.parent if full == "volume" else data_fs),
        pytest.raises((ClientError, asyncssh.SFTPError, InsufficientStorage)) as failed,
    ):
        asyncio.run(edge.write(op, key, body))
    error = failed.value
    if isinstance(error, ClientError):  # S3 says so, in a code no client retries
        assert error.response["Error"]["Code"] == "XMinioStorageFull", error
    elif isinstance(error, InsufficientStorage):
        assert "full" in str(error), error
    else:
        assert isinstance(error, asyncssh.SFTPError) and error.code == asyncssh.FX_FAILURE
        assert "full" in error.reason, error.reason  # and which disk
    assert _edge_state(edge, volume) == before  # the volume's bytes, no stray file, the rows
    # and the hub goes on taking writes over that edge
    asyncio.run(edge.write(op, "after", body))
    assert (volume / EDGE_BUCKET / "after").read_bytes() == body


def test_a_write_back_spoke_with_its_cache_disk_full_changes_nothing(tmp_path: Path) -> None:
    """A write-back spoke whose cache directory (its journal's disk) is full refuses a
    write, new or over a hub file, saying so: nothing is journaled, the hub's volume and
    catalog keep what they had, and the spoke goes on serving and, with room again,
    writing through to the hub."""
    hub_dir, spoke_dir, volume = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    volume.mkdir()
    (volume / "f").write_bytes(OLD)
    cli_ok(hub_dir, "site", "init", "--name", "hub")
    cli_ok(spoke_dir, "site", "init", "--name", "gpu-west")
    cert = str(spoke_dir / "identity/site.pem")
    cli_ok(hub_dir, "site", "add", "gpu-west", "--cert", cert, "--offline")
    fabric = {"LOOMFS_FABRIC__LISTEN": f"127.0.0.1:{free_port()}"}
    with tmpfs(tmp_path / "cache", "16m") as cache, HubProcess(hub_dir, fabric) as hub:
        cli_ok(hub_dir, "--hub", hub.url, "volume", "add", "/vol", f"posix://{volume}")
        extra = ("--write-back", "--cache-dir", str(cache))
        args = spoke_args(hub_dir, hub.urls["fabric"], "/vol", *extra, cache_size="8M")
        with SpokeProcess(spoke_dir, {"LOOMFS_SITE__MIN_FREE": "0"}, args) as spoke:

            async def check() -> None:
                at_spoke, at_hub = RestNamespace(spoke.url), RestNamespace(hub.url)
                try:
                    assert await at_spoke.read_bytes(WHO, "/vol/f") == OLD  # cached now
                    before = [e async for e in at_hub.walk(WHO, "/vol")]
                    journal = sorted(os.listdir(cache / "journal"))
                    for path in ("/vol/f", "/vol/new"):
                        with filled(cache), pytest.raises(InsufficientStorage) as failed:
                            await at_spoke.write_bytes(WHO, path, os.urandom(1 << 20))
                        assert "full" in str(failed.value), failed.value
                        assert sorted(os.listdir(cache / "journal")) == journal, path
                    await at_spoke.sync()
                    assert [e async for e in at_hub.walk(WHO, "/vol")] == before
                    assert sorted(p.name for p in volume.iterdir()) == ["f"]
                    assert (volume / "f").read_bytes() == OLD
                    # it goes on serving, and writing once there is room
                    assert await at_spoke.read_bytes(WHO, "/vol/f") == OLD
                    await at_spoke.write_bytes(WHO, "/vol/new", b"room again")
                    await at_spoke.sync()
                    assert await at_hub.read_bytes(WHO, "/vol/new") == b"room again"
                finally:
                    await at_spoke.close()
                    await at_hub.close()

            asyncio.run(check())
