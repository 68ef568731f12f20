"""A spoke over mutual TLS and an emulated WAN: the conformance suite, ranged on-demand
fetch, single-flight, coherence with the hub, offline reads, a persistent verified cache."""

from __future__ import annotations

import asyncio
import contextlib
import os
import stat
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from loomfs.chunks.cdc import DEFAULT_WINDOW
from loomfs.core.types import Entry, Principal, WriteTags
from loomfs.errors import (
    AuthenticationFailed,
    BackendUnavailable,
    Conflict,
    LoomError,
    PermissionDenied,
)
from loomfs.fabric.identity import SiteIdentity
from loomfs.namespace.base import Namespace
from loomfs.rest.client import RestNamespace
from loomfs.rest.server import RestServer
from loomfs.rest.wire import API
from loomfs.spoke.cache import CORRUPT
from loomfs.spoke.namespace import LEASED_OPENS, SpokeNamespace
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.namespace_suite import NamespaceSuite

WHO = Principal(user="tester", site="spoke", protocol="test")
MiB = 1 << 20
LEASE = 3.0


Factory = Callable[[], AbstractAsyncContextManager[tuple[Namespace, str]]]


class TestSpokeConformance(NamespaceSuite):
    @pytest.fixture
    def ns_factory(self, tmp_path: Path) -> Factory:
        @contextlib.asynccontextmanager
        async def make() -> AsyncIterator[tuple[Namespace, str]]:
            tmp = tmp_path / uuid.uuid4().hex
            tmp.mkdir()
            async with fabric(tmp, lease_ttl=LEASE) as env:
                yield env.spoke, "/vol"

        return make

    async def test_special_files(self, ns: Namespace, top: str) -> None:
        """A special file needs an admin right the hub checked itself: a user a spoke
        names is never one (a pinned site could name anyone), so none is made."""
        with pytest.raises(PermissionDenied):
            await ns.mknod(WHO, f"{top}/fifo", stat.S_IFIFO | 0o640)
        assert not await ns.exists(WHO, f"{top}/fifo")


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    async with fabric(tmp_path, lease_ttl=LEASE) as created:
        yield created


async def hub_write(env: Fabric, path: str, data: bytes) -> int:
    entry = await env.hub.namespace.write_bytes(WHO, path, data)
    return entry.version


async def test_a_small_read_of_a_big_file_fetches_about_that_much(env: Fabric) -> None:
    data = os.urandom(32 * MiB)
    await hub_write(env, "/vol/big.bin", data)
    before = env.link.down.bytes
    got = await env.spoke.read_bytes(WHO, "/vol/big.bin", 10 * MiB + 123, MiB)
    assert got == data[10 * MiB + 123 : 11 * MiB + 123]
    cold = env.link.down.bytes - before
    # at most the two blocks it touches, the chunks sticking out of them, and the chunk map
    assert MiB <= cold <= 2 * MiB + 2 * DEFAULT_WINDOW.max_size + 64 * 1024
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/big.bin", 10 * MiB + 123, MiB) == got
    assert env.link.down.bytes - before < 16 * 1024  # warm: one stat, no data


async def test_concurrent_misses_fetch_once(env: Fabric) -> None:
    data = os.urandom(8 * MiB)
    await hub_write(env, "/vol/shared.bin", data)
    before = env.link.down.bytes
    results = await asyncio.gather(
        *(env.spoke.read_bytes(WHO, "/vol/shared.bin") for _ in range(6))
    )
    assert all(r == data for r in results)
    assert env.link.down.bytes - before < 8 * MiB + 256 * 1024


async def test_a_change_at_the_hub_is_seen_at_the_next_open(env: Fabric) -> None:
    old = await hub_write(env, "/vol/f", b"old" * 1000)
    assert await env.spoke.read_bytes(WHO, "/vol/f") == b"old" * 1000
    assert env.spoke.cache.get("/vol/f", old) is not None
    new = await hub_write(env, "/vol/f", b"new content")
    assert await env.spoke.read_bytes(WHO, "/vol/f") == b"new content"
    for _ in range(200):  # the change feed drops the superseded version
        if env.spoke.cache.get("/vol/f", old) is None:
            break
        await asyncio.sleep(0.05)
    assert env.spoke.cache.get("/vol/f", old) is None
    assert env.spoke.seq >= new


async def test_writes_go_through_and_read_back_locally(env: Fabric) -> None:
    payload = os.urandom(3 * MiB + 5)
    entry = await env.spoke.write_bytes(WHO, "/vol/ckpt.pt", payload)
    assert (env.volume / "ckpt.pt").read_bytes() == payload
    assert (await env.hub.namespace.stat(WHO, "/vol/ckpt.pt")).version == entry.version
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/ckpt.pt") == payload
    assert env.link.down.bytes - before < 16 * 1024


async def test_cut_link_serves_cached_files_only(env: Fabric) -> None:
    await hub_write(env, "/vol/cached", b"c" * 5000)
    await hub_write(env, "/vol/cold", b"x" * 5000)
    assert await env.spoke.read_bytes(WHO, "/vol/cached") == b"c" * 5000
    env.link.cut()
    try:
        assert await env.spoke.read_bytes(WHO, "/vol/cached") == b"c" * 5000
        with pytest.raises(BackendUnavailable):
            await env.spoke.read_bytes(WHO, "/vol/cold")
        # writes are journaled, acknowledged, and readable here at once
        pending = await env.spoke.write_bytes(WHO, "/vol/new", b"written offline")
        assert pending.version == 0
        assert await env.spoke.read_bytes(WHO, "/vol/new") == b"written offline"
        with pytest.raises(BackendUnavailable):  # only writes are journaled
            await env.spoke.mkdir(WHO, "/vol/dir")
    finally:
        env.link.restore()
    assert await env.spoke.read_bytes(WHO, "/vol/cold") == b"x" * 5000
    async with asyncio.timeout(30):
        await env.spoke.sync()
    assert (env.volume / "new").read_bytes() == b"written offline"


async def test_write_back_returns_first_and_sync_waits(tmp_path: Path) -> None:
    async with fabric(tmp_path, lease_ttl=LEASE) as env:
        env.spoke.write_back = True
        env.link.cut()  # nothing can reach the hub, yet the write is acknowledged
        entry = await env.spoke.write_bytes(WHO, "/vol/step-100.pt", b"weights" * 1000)
        assert entry.version == 0 and len(env.spoke.journal) == 1
        assert not (env.volume / "step-100.pt").exists()
        # its writer reads it back by ranges too, as fsspec and pandas do (a ranged GET
        # resolves the range with stat_for_read: that asked the hub, which has it not yet)
        assert (await env.spoke.stat_for_read(WHO, "/vol/step-100.pt")).size == 7000
        server = RestServer(env.spoke, spoke=env.spoke)
        async with TestClient(TestServer(server.app())) as http:  # one writer over REST
            put = await http.put(f"{API}/files/vol/over-rest.pt", data=b"weights" * 1000)
            assert put.status in (200, 201), await put.text()
            got = await http.get(f"{API}/files/vol/over-rest.pt", headers={"Range": "bytes=7-13"})
            assert got.status == 206 and await got.read() == b"weights"
        env.link.restore()
        async with asyncio.timeout(30):
            await env.spoke.sync()
        assert (env.volume / "step-100.pt").read_bytes() == b"weights" * 1000
        assert (await env.spoke.stat(WHO, "/vol/step-100.pt")).version > 0


async def test_a_conflicting_writer_gets_a_clear_error(env: Fabric) -> None:
    first = await hub_write(env, "/vol/shared", b"v1")
    await hub_write(env, "/vol/shared", b"v2 from the hub")
    with pytest.raises(Conflict):
        await env.spoke.write_bytes(WHO, "/vol/shared", b"from the spoke", if_version=first)
    assert (env.volume / "shared").read_bytes() == b"v2 from the hub"
    assert len(env.spoke.journal) == 0


async def test_offline_conflict_keeps_both_versions(env: Fabric) -> None:
    await hub_write(env, "/vol/notes", b"original")
    assert await env.spoke.read_bytes(WHO, "/vol/notes") == b"original"
    env.link.cut()
    await env.spoke.write_bytes(WHO, "/vol/notes", b"edited at the spoke")
    await hub_write(env, "/vol/notes", b"edited at the hub")
    env.link.restore()
    async with asyncio.timeout(30):
        await env.spoke.sync()
    assert (env.volume / "notes").read_bytes() == b"edited at the hub"
    [kept] = [p for p in env.volume.iterdir() if p.name.startswith("notes.conflict-gpu-west-")]
    assert kept.read_bytes() == b"edited at the spoke"


async def test_restart_replays_acknowledged_writes_exactly_once(env: Fabric) -> None:
    env.spoke.write_back = True
    env.link.cut()
    for i in range(3):
        await env.spoke.write_bytes(WHO, f"/vol/ck{i}", f"checkpoint {i}".encode())
    # the upload of ck0 reached the hub just before the spoke died, and ck0 changed since
    [first, *_] = list(env.spoke.journal)
    at_spoke = Principal(WHO.user, site=env.spoke.site, protocol=WHO.protocol)
    await env.hub.namespace.write_bytes(
        at_spoke, "/vol/ck0", b"checkpoint 0", write_id=first.write_id
    )
    committed = await hub_write(env, "/vol/ck0", b"checkpoint 0, then changed")
    for task in env.spoke._tasks:  # a crash: no orderly shutdown of the journal
        task.cancel()
    await env.spoke.hub.close()
    env.link.restore()
    await env.new_spoke().start()
    async with asyncio.timeout(30):
        await env.spoke.sync()
    assert sorted(p.name for p in env.volume.iterdir()) == ["ck0", "ck1", "ck2"]
    assert (await env.hub.namespace.stat(WHO, "/vol/ck0")).version == committed
    assert (env.volume / "ck2").read_bytes() == b"checkpoint 2"


async def test_cache_survives_restart_and_corruption_is_refetched(env: Fabric) -> None:
    data = os.urandom(3 * MiB)
    version = await hub_write(env, "/vol/p.bin", data)
    assert await env.spoke.read_bytes(WHO, "/vol/p.bin") == data
    cached = env.spoke.cache.get("/vol/p.bin", version)
    assert cached is not None
    data_file = env.spoke.cache.directory / "data" / f"{cached.id}.bin"
    await env.spoke.close()
    with data_file.open("r+b") as f:  # bit rot in the middle block
        f.seek(MiB + 10)
        f.write(b"garbage")
    await env.new_spoke().start()
    corrupt_before = CORRUPT._value.get()
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/p.bin") == data
    assert CORRUPT._value.get() == corrupt_before + 1
    # only the chunks under the damage came again (at most the two the damage straddles,
    # with their requests' framing and TLS records): the rest of the bad block was still
    # there, verified chunk by chunk
    assert 0 < env.link.down.bytes - before < 2 * DEFAULT_WINDOW.max_size + 256 * 1024
    # a truncated data file is dropped at start and fetched whole
    await env.spoke.close()
    os.truncate(data_file, 100)
    await env.new_spoke().start()
    assert env.spoke.cache.get("/vol/p.bin", version) is None
    assert await env.spoke.read_bytes(WHO, "/vol/p.bin") == data


async def test_a_cache_index_that_lost_its_last_commits_serves_right(env: Fabric) -> None:
    """The cache's index commits without fsync (``synchronous=NORMAL``): a power loss may
    take its last transactions back. A file entered and filled after them must then be
    fetched again, right, while what the index kept is still served from the cache."""
    first, second = os.urandom(2 * MiB), os.urandom(2 * MiB)
    await hub_write(env, "/vol/kept.bin", first)
    version = await hub_write(env, "/vol/lost.bin", second)
    assert await env.spoke.read_bytes(WHO, "/vol/kept.bin") == first
    index = env.spoke.cache.directory / "index.db"
    await env.spoke.close()  # the last connection: the WAL is checkpointed into index.db
    kept = index.read_bytes()
    await env.new_spoke().start()
    assert await env.spoke.read_bytes(WHO, "/vol/lost.bin") == second
    lost = env.spoke.cache.get("/vol/lost.bin", version)
    await env.spoke.close()
    index.write_bytes(kept)  # as if the commits after it never reached the disk
    assert lost is not None and (index.parent / "data" / f"{lost.id}.bin").exists()
    await env.new_spoke().start()
    assert env.spoke.cache.get("/vol/lost.bin", version) is None
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/kept.bin") == first
    assert env.link.down.bytes - before < 64 * 1024  # from the cache: metadata at most
    assert await env.spoke.read_bytes(WHO, "/vol/lost.bin") == second
    assert env.link.down.bytes - before > MiB  # fetched again


async def test_the_cache_stays_within_its_capacity(tmp_path: Path) -> None:
    async with fabric(tmp_path, capacity=3 * MiB, lease_ttl=LEASE) as env:
        files = {f"/vol/f{i}": os.urandom(MiB) for i in range(6)}
        for path, data in files.items():
            await hub_write(env, path, data)
        for path, data in files.items():
            assert await env.spoke.read_bytes(WHO, path) == data
            assert env.spoke.cache.used_bytes <= 3 * MiB
        assert len(list(env.spoke.cache)) <= 3


async def test_an_unknown_site_is_refused(env: Fabric) -> None:
    intruder = SiteIdentity.create(env.tmp / "intruder", "intruder")
    client = RestNamespace(
        f"https://127.0.0.1:{env.port}", ssl_context=intruder.client_context(env.hub_id.cert_pem)
    )
    try:
        with pytest.raises((BackendUnavailable, AuthenticationFailed)):
            await client.stat(WHO, "/vol")
    finally:
        await client.close()


async def test_paths_outside_attached_exports_are_refused(env: Fabric) -> None:
    with pytest.raises(PermissionDenied):
        await env.spoke.read_bytes(WHO, "/elsewhere/file")
    assert [e.name async for e in env.spoke.list(WHO, "/")] == ["vol"]


async def wait_for_lease(spoke: SpokeNamespace) -> None:
    for _ in range(200):
        if spoke.leased:
            return
        await asyncio.sleep(0.02)
    raise AssertionError("the spoke never got a read lease")


async def test_a_commit_at_the_hub_is_seen_by_a_leased_spoke_without_asking(env: Fabric) -> None:
    await hub_write(env, "/vol/model.cfg", b"lr=0.1")
    assert await env.spoke.read_bytes(WHO, "/vol/model.cfg") == b"lr=0.1"
    await wait_for_lease(env.spoke)
    opens = LEASED_OPENS._value.get()
    before = env.link.down.bytes + env.link.up.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/model.cfg") == b"lr=0.1"
    assert LEASED_OPENS._value.get() == opens + 1
    assert env.link.down.bytes + env.link.up.bytes - before < 4096  # the poll at most
    # the hub's write returns only once the leased spoke has applied it...
    await hub_write(env, "/vol/model.cfg", b"lr=0.01")
    # ...so an open that begins after it sees the new version, lease or not
    assert await env.spoke.read_bytes(WHO, "/vol/model.cfg") == b"lr=0.01"


async def test_a_silent_spoke_delays_commits_by_one_lease_at_most(env: Fabric) -> None:
    await hub_write(env, "/vol/x", b"one")
    assert await env.spoke.read_bytes(WHO, "/vol/x") == b"one"
    await wait_for_lease(env.spoke)
    env.link.cut()
    try:
        await hub_write(env, "/vol/x", b"two")  # completes once the lease has run out
        assert not env.spoke.leased
        assert await env.spoke.read_bytes(WHO, "/vol/x") == b"one"  # offline: stale, counted
    finally:
        env.link.restore()
    assert await env.spoke.read_bytes(WHO, "/vol/x") == b"two"


async def test_warm_up_fetches_ahead_and_resumes(env: Fabric) -> None:
    files = {f"/vol/train/s{i}.bin": os.urandom(300_000) for i in range(5)}
    await env.hub.namespace.mkdir(WHO, "/vol/train")
    for path, data in files.items():
        await hub_write(env, path, data)
    await env.spoke.read_bytes(WHO, "/vol/train/s0.bin")  # one is cached already
    seen: list[int] = []
    stats = await env.spoke.warm(
        WHO, "/vol/train", pin=True, progress=lambda s: seen.append(s.files)
    )
    assert (stats.files, stats.bytes, stats.fetched) == (5, 1_500_000, 1_200_000)
    assert seen == [1, 2, 3, 4, 5, 5]  # each file, then the final report
    before = env.link.down.bytes
    for path, data in files.items():
        assert await env.spoke.read_bytes(WHO, path) == data
    assert env.link.down.bytes - before < 64 * 1024  # every read was a hit
    assert all(f.pinned for f in env.spoke.cache if f.path.startswith("/vol/train/"))
    again = await env.spoke.warm(WHO, "/vol/train")
    assert again.fetched == 0


async def test_a_new_file_beside_a_cached_one_keeps_it_cached(env: Fabric) -> None:
    version = await hub_write(env, "/vol/keep.bin", b"k" * 100_000)
    assert await env.spoke.read_bytes(WHO, "/vol/keep.bin") == b"k" * 100_000
    await hub_write(env, "/vol/neighbour", b"n")  # the directory's mtime moves: a MODIFY of it
    await env.spoke.read_bytes(WHO, "/vol/neighbour")  # the feed has caught up by now
    assert env.spoke.cache.get("/vol/keep.bin", version) is not None
    env.link.cut()
    try:
        assert await env.spoke.read_bytes(WHO, "/vol/keep.bin") == b"k" * 100_000
    finally:
        env.link.restore()


async def test_an_upload_whose_answer_was_lost_is_not_a_conflict(tmp_path: Path) -> None:
    """The hub may still commit an upload after its connection died (here it waits for a
    silent spoke's lease). The retry then meets the version it made itself: that is the
    same write, not a conflict, and no conflict copy appears."""
    async with fabric(tmp_path, ("east", "west"), lease_ttl=LEASE) as env:
        east, west = env.spokes["east"], env.spokes["west"]
        await hub_write(env, "/vol/ck", b"step 0")
        assert await west.read_bytes(WHO, "/vol/ck") == b"step 0"
        await wait_for_lease(west)
        env.links["west"].cut()  # a silent spoke: commits wait for its lease to run out
        east.write_back = True
        await east.write_bytes(WHO, "/vol/ck", b"step 1")
        await asyncio.sleep(0.5)  # the upload reached the hub, which waits on west's lease
        env.links["east"].cut()  # the answer is lost
        env.links["east"].restore()
        async with asyncio.timeout(30):
            await east.sync()
        env.links["west"].restore()
        assert sorted(p.name for p in env.volume.iterdir()) == ["ck"]
        assert (env.volume / "ck").read_bytes() == b"step 1"


async def test_a_refused_replay_is_never_overtaken_by_a_later_write(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two journaled writes of one path: the hub refuses the first once (it was shutting
    down). The second must wait behind it, or the first would later land on top of it."""
    await hub_write(env, "/vol/state", b"v0")
    assert await env.spoke.read_bytes(WHO, "/vol/state") == b"v0"
    env.link.cut()
    await env.spoke.write_bytes(WHO, "/vol/state", b"first")
    await env.spoke.write_bytes(WHO, "/vol/state", b"second")
    real_write = env.spoke.hub.write
    refused: list[str] = []

    async def refuse_once(who: Principal, path: str, *args: Any, **kwargs: Any) -> Entry:
        if not refused:
            refused.append(path)
            raise LoomError("internal error, see the server log")
        return await real_write(who, path, *args, **kwargs)

    monkeypatch.setattr(env.spoke.hub, "write", refuse_once)
    env.link.restore()
    async with asyncio.timeout(60):
        await env.spoke.sync()
    assert refused == ["/vol/state"]
    assert (env.volume / "state").read_bytes() == b"second"
    assert sorted(p.name for p in env.volume.iterdir()) == ["state"]


async def test_a_writer_at_another_site_is_refused_while_one_writes(tmp_path: Path) -> None:
    async with fabric(tmp_path, ("east", "west"), lease_ttl=LEASE) as env:
        east, west = env.spokes["east"], env.spokes["west"]
        await hub_write(env, "/vol/model.pt", b"v0")
        streaming, finish = asyncio.Event(), asyncio.Event()

        async def slow_body() -> AsyncIterator[bytes]:
            yield b"from east, part 1; "
            streaming.set()
            await finish.wait()
            yield b"part 2"

        writing = asyncio.create_task(east.write(WHO, "/vol/model.pt", slow_body()))
        await streaming.wait()
        with pytest.raises(Conflict, match="being written at site 'east'"):
            await west.write_bytes(WHO, "/vol/model.pt", b"from west")
        with pytest.raises(Conflict, match="being written at site 'east'"):
            await hub_write(env, "/vol/model.pt", b"from the hub")
        with pytest.raises(Conflict, match="being written at site 'east'"):
            await west.remove(WHO, "/vol/model.pt")
        await west.write_bytes(WHO, "/vol/other.pt", b"another path is free")
        finish.set()
        await writing
        assert (env.volume / "model.pt").read_bytes() == b"from east, part 1; part 2"
        await west.write_bytes(WHO, "/vol/model.pt", b"from west")  # released: west may write
        assert (env.volume / "model.pt").read_bytes() == b"from west"


@pytest.mark.parametrize("write_back", [False, True], ids=["default", "write-back"])
@pytest.mark.parametrize("size", [5000, 3 * MiB], ids=["whole", "chunked"])
async def test_a_writes_tags_reach_the_hub_with_its_bytes(
    env: Fabric, write_back: bool, size: int
) -> None:
    """Journaled and sent whole or as chunks, a write's tags are committed at the hub with
    its content: the stamped one under the version the hub gave it, stale ones gone."""
    await hub_write(env, "/vol/t", b"old")
    await env.hub.namespace.set_tags(WHO, "/vol/t", {"s3.meta.old": "1", "other": "kept"})
    env.spoke.write_back = write_back
    asked: list[int] = []

    def tags() -> WriteTags:  # asked once the bytes have ended
        asked.append(1)
        return WriteTags({"s3.meta.new": "2"}, {"s3.etag": '"e"'}, replace_prefix="s3.")

    await env.spoke.write_bytes(WHO, "/vol/t", b"n" * size, tags=tags)
    async with asyncio.timeout(30):
        await env.spoke.sync()
    entry, held = await env.hub.namespace.stat_tags(WHO, "/vol/t")
    assert entry.size == size and asked == [1]
    assert held == {"other": "kept", "s3.meta.new": "2", "s3.etag": f'{entry.version} "e"'}
