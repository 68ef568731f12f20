"""The namespace conformance suite against the hub (posix and S3 volumes, SQLite and
PostgreSQL catalogs) and through the REST API."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.core.acl import AclAuthorizer
from loomfs.core.registry import open_catalog
from loomfs.core.streams import LocalFile, aiter_bytes
from loomfs.core.types import Entry, Principal
from loomfs.errors import DirectoryNotEmpty, LoomError
from loomfs.hub.namespace import HubNamespace
from loomfs.namespace.base import Namespace
from loomfs.namespace.governed import GovernedNamespace
from loomfs.rest.client import RestNamespace
from loomfs.rest.server import RestServer
from loomfs.testing.namespace_suite import WHO, NamespaceSuite
from loomfs.testing.seaweedfs import SeaweedFS

Factory = Callable[[], AbstractAsyncContextManager[tuple[Namespace, str]]]


@contextlib.asynccontextmanager
async def hub_over(catalog_url: str, volume_url: str) -> AsyncIterator[HubNamespace]:
    catalog = open_catalog(catalog_url)
    await catalog.open()
    hub = HubNamespace(catalog)
    try:
        await hub.add_volume("/vol", volume_url)
        yield hub
    finally:
        await hub.close()
        await catalog.close()


def posix_factory(tmp_path: Path, catalog_url: Callable[[], str]) -> Factory:
    @contextlib.asynccontextmanager
    async def make() -> AsyncIterator[tuple[Namespace, str]]:
        root = tmp_path / uuid.uuid4().hex
        root.mkdir()
        async with hub_over(catalog_url(), f"posix://{root}") as hub:
            yield hub, "/vol"

    return make


class TestHubPosixSqlite(NamespaceSuite):
    @pytest.fixture
    def ns_factory(self, tmp_path: Path) -> Factory:
        return posix_factory(tmp_path, lambda: f"sqlite://{tmp_path / uuid.uuid4().hex}.db")


class TestHubPosixPostgres(NamespaceSuite):
    @pytest.fixture
    def ns_factory(self, tmp_path: Path, postgres: object) -> Factory:
        return posix_factory(tmp_path, postgres.create_database)  # type: ignore[attr-defined]


class TestHubS3(NamespaceSuite):
    @pytest.fixture
    def ns_factory(self, tmp_path: Path, seaweedfs: SeaweedFS, s3_env: None) -> Factory:
        @contextlib.asynccontextmanager
        async def make() -> AsyncIterator[tuple[Namespace, str]]:
            bucket = f"ns-{uuid.uuid4().hex[:12]}"
            seaweedfs.create_bucket(bucket)
            url = f"s3://{bucket}/some/prefix?endpoint={seaweedfs.endpoint}"
            async with hub_over(f"sqlite://{tmp_path / uuid.uuid4().hex}.db", url) as hub:
                yield hub, "/vol"

        return make


class TestRest(NamespaceSuite):
    @pytest.fixture
    def ns_factory(self, tmp_path: Path) -> Factory:
        inner = posix_factory(tmp_path, lambda: f"sqlite://{tmp_path / uuid.uuid4().hex}.db")

        @contextlib.asynccontextmanager
        async def make() -> AsyncIterator[tuple[Namespace, str]]:
            async with inner() as (hub, top):
                server = TestServer(RestServer(hub).app(), host="127.0.0.1", port=0)
                await server.start_server()
                client = RestNamespace(str(server.make_url("")))
                try:
                    yield client, top
                finally:
                    await client.close()
                    await server.close()

        return make


class TestGoverned(NamespaceSuite):
    """Through the governed namespace, as a user a rule allows (the tree is private, the
    tester granted admin, since the contract includes chown), every call recorded: the
    contract holds unchanged."""

    @pytest.fixture
    def ns_factory(self, tmp_path: Path) -> Factory:
        @contextlib.asynccontextmanager
        async def make() -> AsyncIterator[tuple[Namespace, str]]:
            root = tmp_path / uuid.uuid4().hex
            root.mkdir()
            async with hub_over(f"sqlite://{root}.db", f"posix://{root}") as hub:
                acl = AclAuthorizer(hub.catalog)
                await acl.store.set_private("/vol", True)
                await acl.store.grant(f"user:{WHO.user}", "admin", "/vol")
                events: list[tuple[str, str, str]] = []
                sink = Recorder(events)
                yield GovernedNamespace(hub, [acl], audit=sink, rules=acl), "/vol"
                assert events  # every call left a record

        return make


class Recorder:
    def __init__(self, events: list[tuple[str, str, str]]) -> None:
        self.events = events

    def record(
        self, who: Principal, op: str, path: str, result: str, *, nbytes: int = 0, detail: str = ""
    ) -> None:
        self.events.append((op, path, result))


async def test_a_local_file_body_keeps_its_holes_on_a_posix_volume(tmp_path: Path) -> None:
    """What FUSE and SFTP hand over (their spool, as a ``LocalFile``) lands sparse: a file
    truncated up to 1 GiB with 16 bytes written into it takes blocks for those bytes only,
    replacing a file or making a new one."""
    root = tmp_path / "vol"
    root.mkdir()
    (root / "old").write_bytes(b"old content")
    middle = 700 << 20
    async with hub_over(f"sqlite://{tmp_path / 'c.db'}", f"posix://{root}") as hub:
        await hub.sync_volume("/vol")
        with (tmp_path / "spool").open("w+b") as spool:
            spool.write(b"head")
            spool.truncate(1 << 30)
            spool.seek(middle)
            spool.write(b"0123456789abcdef")
            spool.flush()
            for name in ("old", "new"):
                entry = await hub.write(WHO, f"/vol/{name}", LocalFile(spool.fileno()))
                assert entry.size == 1 << 30
                assert (root / name).stat().st_blocks * 512 < 1 << 20, name
                got = await hub.read_bytes(WHO, f"/vol/{name}", middle - 2, 20)
                assert got == b"\0\0" + b"0123456789abcdef" + b"\0\0"
                assert await hub.read_bytes(WHO, f"/vol/{name}", 0, 6) == b"head\0\0"
        with (tmp_path / "empty").open("w+b") as empty:
            entry = await hub.write(WHO, "/vol/old", LocalFile(empty.fileno()))
        assert entry.size == 0 and (root / "old").read_bytes() == b""
        assert sorted(p.name for p in root.iterdir()) == ["new", "old"]  # no temp left


async def test_a_directory_the_catalog_still_has_children_in_stays_on_the_volume(
    tmp_path: Path,
) -> None:
    """A directory whose child's file is gone from the volume but not yet from the catalog
    (that child's removal is half done) is not empty: removing it is refused before the
    volume is touched, so the volume and the catalog never disagree about it (the
    directory went from the disk and stayed in the catalog, and a bucket with it)."""
    root = tmp_path / "vol"
    root.mkdir()
    async with hub_over(f"sqlite://{tmp_path / 'c.db'}", f"posix://{root}") as hub:
        await hub.mkdir(WHO, "/vol/d")
        await hub.write_bytes(WHO, "/vol/d/f", b"x")
        (root / "d" / "f").unlink()  # as the child's removal does, before its catalog row
        with pytest.raises(DirectoryNotEmpty):
            await hub.remove(WHO, "/vol/d")
        assert (root / "d").is_dir() and (await hub.stat(WHO, "/vol/d")).is_dir


_NAMES = ["/vol/a", "/vol/b", "/vol/d", "/vol/d/a", "/vol/d/b"]
_OPS = st.one_of(
    st.tuples(st.sampled_from(["write", "remove", "mkdir", "symlink"]), st.sampled_from(_NAMES)),
    st.tuples(st.just("rename"), st.sampled_from(_NAMES), st.sampled_from(_NAMES)),
)


# a change of a directory's names moved its mtime and ctime on the disk at once, and in the
# catalog only at the next rescan (or inotify's echo): NFS clients' and pjdfstest's
# getattr of the directory saw the old times
@settings(max_examples=15, deadline=None)
@given(st.lists(_OPS, min_size=1, max_size=12))
def test_a_directory_s_times_in_the_catalog_follow_every_change_in_it(
    ops: list[tuple[str, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_check_directory_times(Path(tmp), ops))


async def _check_directory_times(tmp: Path, ops: list[tuple[str, ...]]) -> None:
    root = tmp / "root"
    root.mkdir()
    async with hub_over(f"sqlite://{tmp / 'c.db'}", f"posix://{root}") as hub:
        for op, path, *other in ops:
            with contextlib.suppress(LoomError):
                if op == "write":  # a new file (an overwrite changes no name)
                    await hub.write_bytes(WHO, path, path.encode(), exclusive=True)
                elif op == "remove":
                    await hub.remove(WHO, path, recursive=True)
                elif op == "mkdir":
                    await hub.mkdir(WHO, path)
                elif op == "symlink":
                    await hub.symlink(WHO, path, "a")
                else:
                    await hub.rename(WHO, path, other[0], overwrite=True)
            for directory in ("/vol", "/vol/d"):
                on_disk = root / directory.removeprefix("/vol").lstrip("/")
                if not on_disk.is_dir() or on_disk.is_symlink():
                    continue
                entry = await hub.stat(WHO, directory)
                disk = on_disk.stat()
                assert (entry.mtime_ns, entry.ctime_ns) == (disk.st_mtime_ns, disk.st_ctime_ns), (
                    f"{directory} after {op} {path} {other}"
                )


# -- a FUSE close's write and attributes in one change (Samba's puts) ----------------------

_ATTRS = st.fixed_dictionaries(
    {},
    optional={
        "mode": st.sampled_from([0o600, 0o640, 0o644]),
        "mtime_ns": st.integers(1_000_000_000_000_000_000, 1_800_000_000_000_000_000),
        "atime_ns": st.integers(1_000_000_000_000_000_000, 1_800_000_000_000_000_000),
        "uid": st.just(1234),
        "gid": st.just(5678),
    },
).filter(bool)  # a close with no attributes set is a plain write


@settings(max_examples=12, deadline=None)
@given(_ATTRS, st.booleans(), st.booleans())
def test_a_write_with_attributes_is_one_change_decided_and_recorded_as_the_two_calls(
    attrs: dict[str, int], admin: bool, owner_optional: bool
) -> None:
    """``write_with_attrs`` on a posix volume ends where ``write`` then ``set_attrs_owning``
    (or ``set_attrs``) would, with the same audit records, in one catalog change instead
    of two; a refused change of owner is dropped only where it may be, and otherwise
    nothing is written."""
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_check_write_with_attrs(Path(tmp), attrs, admin, owner_optional))


async def _check_write_with_attrs(
    tmp: Path, attrs: dict[str, int], admin: bool, owner_optional: bool
) -> None:
    (tmp / "vol").mkdir()
    async with hub_over(f"sqlite://{tmp / 'c.db'}", f"posix://{tmp / 'vol'}") as hub:
        acl = AclAuthorizer(hub.catalog)
        await acl.store.set_private("/vol", True)
        await acl.store.grant(f"user:{WHO.user}", "admin" if admin else "write", "/vol")
        events: list[tuple[str, str, str]] = []
        ns = GovernedNamespace(hub, [acl], audit=Recorder(events), rules=acl)
        one, two = [await hub.write_bytes(WHO, f"/vol/{n}", b"") for n in ("one", "two")]
        assert hub.writes_attrs(one.path)
        refused = ("uid" in attrs or "gid" in attrs) and not admin
        before = await hub.catalog.head_seq()
        if refused and not owner_optional:
            with pytest.raises(LoomError, match="may not"):
                await ns.write_with_attrs(WHO, one.path, aiter_bytes(b"new bytes"),
                                          if_version=one.version, attrs=attrs)  # fmt: skip
            assert await hub.catalog.head_seq() == before
            assert await hub.read_bytes(WHO, one.path) == b""
            assert events == [("set_attrs", one.path, "denied")]
            return
        combined = await ns.write_with_attrs(
            WHO, one.path, aiter_bytes(b"new bytes"), if_version=one.version, attrs=attrs,
            owner_optional=owner_optional,
        )  # fmt: skip
        assert await hub.catalog.head_seq() == before + 1
        mine = sorted((op, result) for op, _, result in events)
        events.clear()
        await ns.write_bytes(WHO, two.path, b"new bytes", if_version=two.version)
        apart = await ns.set_attrs_owning(WHO, two.path, attrs)
        assert mine == sorted((op, result) for op, _, result in events)
        for entry in (combined, await hub.stat(WHO, one.path)):
            assert _attrs_of(entry, attrs) == _attrs_of(apart, attrs)
            for key, value in attrs.items():
                if not (refused and key in ("uid", "gid")):
                    got = entry.mode & 0o7777 if key == "mode" else getattr(entry, key)
                    assert got == value, key
        assert await hub.read_bytes(WHO, one.path) == b"new bytes"


def _attrs_of(entry: Entry, attrs: dict[str, int]) -> tuple[object, ...]:
    """What two writes at different moments share: their times only where set."""
    times = tuple(getattr(entry, key) for key in ("mtime_ns", "atime_ns") if key in attrs)
    return (entry.mode, entry.uid, entry.gid, entry.size, *times)
