"""Residency and placement policies over the fabric: a hub and two spokes, one labelled
region=eu and one region=us, each behind its own emulated WAN link.

Restricted files carry a random marker in every block; after each escape attempt by the
us spoke, its cache directory (index, data files, journal) is scanned for that marker.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from aiohttp import web
from botocore.config import Config
from botocore.exceptions import ClientError

from loomfs.core.catalog.base import Catalog, Put
from loomfs.core.placement import (
    REFUSED,
    PlacementAuthorizer,
    Policy,
    PolicyStore,
    Visibility,
    glob_prefix,
)
from loomfs.core.registry import open_catalog
from loomfs.core.sites import SiteRegistry
from loomfs.core.types import Action, ChangeOp, EntryKind, Principal
from loomfs.core.users import UserRegistry
from loomfs.errors import (
    Conflict,
    CorruptData,
    InvalidArgument,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from loomfs.namespace.base import Reader
from loomfs.namespace.chunklink import Opened
from loomfs.protocols.s3 import S3Gateway
from loomfs.spoke.namespace import EVICTED, SpokeNamespace
from loomfs.testing.fabric import Fabric, fabric
from loomfs.testing.hubproc import HubProcess, SpokeProcess, spoke_args

EU, US = "gpu-eu", "gpu-us"
WHO = Principal(user="tester", protocol="test")  # a user where the namespace runs
MiB = 1 << 20


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    labels = {EU: {"region": "eu"}, US: {"region": "us"}}
    async with fabric(tmp_path, (EU, US), lease_ttl=3.0, labels=labels) as created:
        await created.hub.namespace.mkdir(WHO, "/vol/eu")
        await created.hub.namespace.mkdir(WHO, "/vol/pub")
        yield created


def marked(size: int = 3 * MiB) -> tuple[bytes, bytes]:
    """A fresh marker, and data with the marker in every block."""
    marker = os.urandom(16).hex().encode()
    return marker, (marker + os.urandom(4096)) * (size // (len(marker) + 4096) + 1)


def holding(directory: Path, marker: bytes) -> list[Path]:
    """Files under ``directory`` (the whole cache: data, index, journal) with ``marker``."""
    return [p for p in directory.rglob("*") if p.is_file() and marker in p.read_bytes()]


async def tighten(env: Fabric, policy: Policy) -> None:
    """As `loomfs policy add`: store, then wait until the hub saw every spoke evict."""
    await env.hub.settle(await env.hub.placement.store.put(policy))


EU_ONLY = Policy.build("residency-eu", ["/vol/eu/**"], ["region=eu"], "residency=eu")


def cache_dir(env: Fabric, name: str) -> Path:
    return env.spokes[name].cache.directory


async def test_policy_spec_is_validated_and_round_trips(env: Fabric) -> None:
    bad = [
        ("bad name!", ["/vol/**"], ["region=eu"], None, "visible"),
        ("p", [], ["region=eu"], None, "visible"),
        ("p", ["vol/**"], ["region=eu"], None, "visible"),
        ("p", ["/vol/**"], [], None, "visible"),
        ("p", ["/vol/**"], ["region"], None, "visible"),
        ("p", ["/vol/**"], ["region=eu"], "notatag", "visible"),
        ("p", ["/vol/**"], ["region=eu"], None, "secret"),
    ]
    store = PolicyStore(env.hub.catalog)
    for args in bad:
        with pytest.raises(InvalidArgument):
            Policy.build(*args)
    hidden = Policy.build(
        "h", ["/vol/a/**", "/vol/b/*.bin"], ["region=eu", "cloud=x"], None, "hidden"
    )
    await store.put(hidden)
    assert await store.list() == [hidden]
    assert hidden.metadata is Visibility.HIDDEN and hidden.allows({"cloud": "x"})
    await store.remove("h")
    assert await store.list() == []
    with pytest.raises(NotFound):
        await store.remove("h")
    assert glob_prefix("/vol/b/*.bin") == "/vol/b"


async def test_a_compliant_site_reads_a_noncompliant_one_sees_names_only(env: Fabric) -> None:
    marker, data = marked()
    await env.hub.namespace.write_bytes(WHO, "/vol/eu/a.bin", data)
    eu, us = env.spokes[EU], env.spokes[US]
    assert await eu.read_bytes(WHO, "/vol/eu/a.bin") == data
    assert holding(cache_dir(env, EU), marker)  # the scan does find cached bytes
    await tighten(env, EU_ONLY)
    assert holding(cache_dir(env, EU), marker)  # a site the policy allows keeps its cache
    before = env.links[EU].down.bytes
    assert await eu.read_bytes(WHO, "/vol/eu/a.bin") == data
    assert env.links[EU].down.bytes - before < 64 * 1024  # served from it
    assert (await us.stat(WHO, "/vol/eu/a.bin")).size == len(data)  # metadata: visible
    assert [e.name async for e in us.list(WHO, "/vol/eu")] == ["a.bin"]
    for offset, length in ((0, None), (MiB + 5, 100), (len(data) - 10, 10)):
        with pytest.raises(PermissionDenied):
            await us.read_bytes(WHO, "/vol/eu/a.bin", offset, length)
    # users at the hub itself are not restricted by residency
    assert await env.hub.namespace.read_bytes(WHO, "/vol/eu/a.bin", 0, 10) == data[:10]
    # a site over the fabric is remote even if it is named like the hub or "local"
    for name in ("local", env.hub.config.site.name):
        remote = Principal(user=f"site:{name}", site=name, protocol="fabric")
        with pytest.raises(PermissionDenied):
            await env.hub.placement.check(remote, Action.READ, "/vol/eu/a.bin")
    assert not holding(cache_dir(env, US), marker)


async def test_hidden_metadata_looks_absent(env: Fabric) -> None:
    marker, data = marked(MiB)
    await env.hub.namespace.write_bytes(WHO, "/vol/eu/h.bin", data)
    await env.hub.namespace.write_bytes(WHO, "/vol/pub/ok.txt", b"public")
    hidden = Policy.build("eu-hidden", ["/vol/eu/**"], ["region=eu"], None, "hidden")
    await tighten(env, hidden)
    us = env.spokes[US]
    for attempt in (
        us.stat(WHO, "/vol/eu/h.bin"),
        us.read_bytes(WHO, "/vol/eu/h.bin"),
        us.get_tags(WHO, "/vol/eu/h.bin"),
    ):
        with pytest.raises(NotFound):
            await attempt
    with pytest.raises(NotFound):  # /vol/eu/** covers /vol/eu itself
        [e.name async for e in us.list(WHO, "/vol/eu")]
    assert "eu" not in [e.name async for e in us.list(WHO, "/vol")]
    assert await us.read_bytes(WHO, "/vol/pub/ok.txt") == b"public"
    assert [e.name async for e in env.spokes[EU].list(WHO, "/vol/eu")] == ["h.bin"]
    assert not holding(cache_dir(env, US), marker)
    # nor does the change feed tell the us site of new hidden files
    head = await env.hub.catalog.head_seq()
    await env.hub.namespace.write_bytes(WHO, "/vol/eu/h2.bin", b"new")
    us_feed, eu_feed = env.client(US), env.client(EU)
    try:
        seen_us = (await us_feed.changes(head)).changes
        seen_eu = (await eu_feed.changes(head)).changes
    finally:
        await us_feed.close()
        await eu_feed.close()
    assert [c.seq for c in seen_us] == [c.seq for c in seen_eu]  # no gap
    assert any(c.path == "/vol/eu/h2.bin" for c in seen_eu)
    assert not any("h2" in c.path or "h2" in (c.new_path or "") for c in seen_us)


async def _copy_as_spoke_user(env: Fabric, src: str, dst: str) -> str:
    """S3 CopyObject by a user of the us site, at its S3 gateway: the error code S3
    answers."""
    users = UserRegistry(env.hub.catalog)
    await users.add_user("bob")
    key = await users.add_access_key("bob")
    gateway = S3Gateway(  # the us site's own: at the hub, every listener is the hub's
        env.spokes[US],
        users,
        {"vol": "/vol"},
        staging=env.tmp / "s3-staging",
        uploads=env.hub.catalog.upload_records(),
        site=US,
    )
    runner = web.AppRunner(gateway.app())
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        client = boto3.client(
            "s3",
            endpoint_url=f"http://127.0.0.1:{port}",
            region_name="us-east-1",
            aws_access_key_id=key.access_key,
            aws_secret_access_key=key.secret,
            config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
        )

        def copy() -> str:
            try:
                client.copy_object(Bucket="vol", Key=dst, CopySource={"Bucket": "vol", "Key": src})
            except ClientError as exc:
                return str(exc.response["Error"]["Code"])
            return "copied"

        return await asyncio.to_thread(copy)
    finally:
        await runner.cleanup()


async def test_every_way_into_a_noncompliant_spoke_is_refused(env: Fabric) -> None:
    marker, data = marked()
    hub = env.hub.namespace
    await hub.write_bytes(WHO, "/vol/eu/s.bin", data)
    await hub.write_bytes(WHO, "/vol/pub/tagged.bin", data)
    await hub.set_tags(WHO, "/vol/pub/tagged.bin", {"residency": "eu"})
    await hub.symlink(WHO, "/vol/pub/rel-link", "../eu/s.bin")
    await hub.symlink(WHO, "/vol/pub/abs-link", str(env.volume / "eu" / "s.bin"))
    await hub.write_bytes(WHO, "/vol/pub/free.bin", b"free data")
    os.link(env.volume / "eu" / "s.bin", env.volume / "pub" / "hard.bin")  # behind our back
    await env.hub.rescan("/vol", lambda _: None)
    await tighten(env, EU_ONLY)
    us = env.spokes[US]
    refused_reads = REFUSED.labels("read")._value.get()

    # direct and ranged reads, of the path and of a file restricted by its tag
    for path in ("/vol/eu/s.bin", "/vol/pub/tagged.bin"):
        with pytest.raises(PermissionDenied):
            await us.read_bytes(WHO, path)
        with pytest.raises(PermissionDenied):
            await us.read_bytes(WHO, path, 2 * MiB, 4096)
    # what a prefetcher does: fill the cache for a known version
    entry = await us.stat(WHO, "/vol/eu/s.bin")
    with pytest.raises(PermissionDenied):
        await us.cache.read(entry.path, entry.version, entry.size, 0, entry.size, us._fetch)
    # warm-up: the restricted files are refused, the rest of the tree still comes
    with pytest.raises(PermissionDenied):
        await us.read_bytes(WHO, "/vol/pub/rel-link")
    stats = await us.warm(WHO, "/vol")
    assert stats.refused == 3 and stats.files == 1  # s.bin, tagged.bin, hard.bin; free.bin
    assert (await us.warm(WHO, "/vol/eu")).refused == 1
    # a hard link is the same bytes under another name
    with pytest.raises(PermissionDenied):
        await us.read_bytes(WHO, "/vol/pub/hard.bin")
    # symlinks are checked on what they resolve to, whoever made them
    for link in ("/vol/pub/rel-link", "/vol/pub/abs-link"):
        with pytest.raises(PermissionDenied):
            await us.read_bytes(WHO, link)
    await us.symlink(WHO, "/vol/pub/my-link", "../eu/s.bin")
    with pytest.raises(PermissionDenied):
        await us.read_bytes(WHO, "/vol/pub/my-link")
    # renames out of (an escape) and into (a write of its data) a restricted path
    with pytest.raises(PermissionDenied):
        await us.rename(WHO, "/vol/eu/s.bin", "/vol/pub/leak.bin")
    with pytest.raises(PermissionDenied):
        await us.rename(WHO, "/vol/pub/free.bin", "/vol/eu/free.bin")
    # untagging a file out of its policy
    with pytest.raises(PermissionDenied):
        await us.set_tags(WHO, "/vol/pub/tagged.bin", {}, ["residency"])
    # S3 CopyObject by a user of the us site, out of the restricted path
    assert await _copy_as_spoke_user(env, "eu/s.bin", "pub/copy.bin") == "AccessDenied"
    assert not await hub.exists(WHO, "/vol/pub/copy.bin")
    # a write at the us site into the restricted path: the waiting writer hears it
    with pytest.raises(PermissionDenied):
        await us.write_bytes(WHO, "/vol/eu/new.bin", b"from the us")
    # ...a write-back one too: its write lease is asked of the hub first
    us.write_back = True
    with pytest.raises(PermissionDenied):
        await us.write_bytes(WHO, "/vol/eu/early.bin", b"written back")
    assert not list(us.journal)
    # ...and one made while the link is down stays journaled, its refusal reported by sync
    env.links[US].cut()
    await us.write_bytes(WHO, "/vol/eu/late.bin", b"written back")
    env.links[US].restore()
    with pytest.raises(PermissionDenied, match="kept"):
        await asyncio.wait_for(us.sync(), 30)
    assert [p.path for p in us.journal] == ["/vol/eu/late.bin"]
    assert not await hub.exists(WHO, "/vol/eu/late.bin")
    assert not await hub.exists(WHO, "/vol/pub/leak.bin")

    assert not holding(cache_dir(env, US), marker)
    assert REFUSED.labels("read")._value.get() >= refused_reads + 10  # counted, each
    assert await env.spokes[EU].read_bytes(WHO, "/vol/pub/tagged.bin") == data


async def test_hard_links_obey_placement_as_renames_do(env: Fabric) -> None:
    """A refused site may not give a restricted file an unrestricted name, nor an
    unrestricted one a restricted name; nor make a special file where it may not write."""
    hub = env.hub.namespace
    marker, data = marked(MiB)
    await hub.write_bytes(WHO, "/vol/eu/s.bin", data)
    await hub.write_bytes(WHO, "/vol/pub/free.bin", b"free data")
    await tighten(env, EU_ONLY)
    us, eu = env.spokes[US], env.spokes[EU]
    with pytest.raises(PermissionDenied):
        await us.link(WHO, "/vol/eu/s.bin", "/vol/pub/leak.bin")
    with pytest.raises(PermissionDenied):
        await us.link(WHO, "/vol/pub/free.bin", "/vol/eu/free.bin")
    with pytest.raises(PermissionDenied):
        await us.mknod(WHO, "/vol/eu/fifo", stat.S_IFIFO | 0o644)
    assert not await hub.exists(WHO, "/vol/pub/leak.bin")
    assert not await hub.exists(WHO, "/vol/eu/free.bin")
    assert not await hub.exists(WHO, "/vol/eu/fifo")
    with pytest.raises(PermissionDenied):  # a special file needs admin by name anywhere
        await us.mknod(WHO, "/vol/pub/fifo", stat.S_IFIFO | 0o644)
    assert (await hub.mknod(WHO, "/vol/pub/fifo", stat.S_IFIFO | 0o644)).kind is EntryKind.FIFO
    # a special file has no content: never chunked, never cached
    with pytest.raises(NotSupported):
        await env.hub.chunks.chunk_map(WHO, "/vol/pub/fifo")
    with pytest.raises(NotSupported):
        await us.read_bytes(WHO, "/vol/pub/fifo")
    # a site the policy allows links freely; the new unrestricted name then carries the
    # restricted name's policy (every name of the inode is asked)
    assert (await eu.link(WHO, "/vol/eu/s.bin", "/vol/pub/alias.bin")).nlink == 2
    with pytest.raises(PermissionDenied):
        await us.read_bytes(WHO, "/vol/pub/alias.bin")
    assert await eu.read_bytes(WHO, "/vol/pub/alias.bin") == data
    assert not holding(cache_dir(env, US), marker)


async def evicted_and_refused(env: Fabric, marker: bytes, path: str) -> None:
    """The us spoke holds no byte of it, and asking again is refused."""
    assert not holding(cache_dir(env, US), marker)
    with pytest.raises(PermissionDenied):
        await env.spokes[US].read_bytes(WHO, path)


async def test_tightening_evicts_before_the_change_completes(env: Fabric) -> None:
    hub, us = env.hub.namespace, env.spokes[US]
    marks: dict[str, bytes] = {}
    datas: dict[str, bytes] = {}
    for name in ("data/x.bin", "pub/tag.bin", "pub/moved.bin", "dir/below.bin"):
        marks[name], data = marked(2 * MiB)
        datas[name] = data
        for top in ("data", "dir"):
            if name.startswith(top + "/"):
                await hub.mkdir(WHO, f"/vol/{top}", exist_ok=True)
        await hub.write_bytes(WHO, f"/vol/{name}", data)
        assert await us.read_bytes(WHO, f"/vol/{name}") == data
        assert holding(cache_dir(env, US), marks[name])
    await tighten(env, EU_ONLY)  # restricts none of them yet
    assert holding(cache_dir(env, US), marks["pub/tag.bin"])

    # a new policy over a path: evicted before tighten() returns
    evicted = EVICTED._value.get()
    await tighten(env, Policy.build("data-eu", ["/vol/data/**"], ["region=eu"]))
    assert EVICTED._value.get() == evicted + 1
    await evicted_and_refused(env, marks["data/x.bin"], "/vol/data/x.bin")
    # a re-tag at the hub into a policy: evicted before set_tags returns
    await hub.set_tags(WHO, "/vol/pub/tag.bin", {"residency": "eu"})
    await evicted_and_refused(env, marks["pub/tag.bin"], "/vol/pub/tag.bin")
    # a move at the hub into a restricted path: evicted before rename returns
    await hub.rename(WHO, "/vol/pub/moved.bin", "/vol/eu/moved.bin")
    await evicted_and_refused(env, marks["pub/moved.bin"], "/vol/eu/moved.bin")
    # a directory tagged into a policy covers what is below it
    await hub.set_tags(WHO, "/vol/dir", {"residency": "eu"})
    await evicted_and_refused(env, marks["dir/below.bin"], "/vol/dir/below.bin")
    # the compliant spoke still reads all of them
    eu = env.spokes[EU]
    for path, name in (("/vol/data/x.bin", "data/x.bin"), ("/vol/pub/tag.bin", "pub/tag.bin"),
                       ("/vol/eu/moved.bin", "pub/moved.bin"),
                       ("/vol/dir/below.bin", "dir/below.bin")):  # fmt: skip
        assert await eu.read_bytes(WHO, path) == datas[name]


async def test_a_policy_edited_by_another_process_is_followed(env: Fabric, tmp_path: Path) -> None:
    _, data = marked(MiB)
    await env.hub.namespace.write_bytes(WHO, "/vol/pub/p.bin", data)
    us: SpokeNamespace = env.spokes[US]
    assert await us.read_bytes(WHO, "/vol/pub/p.bin", 0, 10) == data[:10]
    other = open_catalog(env.hub.config.catalog_url)  # as the `loomfs policy` CLI does
    await other.open()
    try:
        seq = await PolicyStore(other).put(Policy.build("pub", ["/vol/pub/**"], ["region=eu"]))
    finally:
        await other.close()
    await env.hub.settle(seq)
    with pytest.raises(PermissionDenied):
        await us.read_bytes(WHO, "/vol/pub/p.bin", 0, 10)
    await PolicyStore(env.hub.catalog).remove("pub")
    await env.hub.placement.reload(force=True)
    assert await us.read_bytes(WHO, "/vol/pub/p.bin", 0, 10) == data[:10]


async def test_an_eviction_logged_by_another_process_reaches_the_site_it_concerns(
    env: Fabric,
) -> None:
    """The hub judges an eviction by the policy that made it, not by the policies it had
    loaded before (another process's policy: the hub reloads on its own only every few
    seconds); else the refused spoke is told of a metadata change and keeps the data."""
    # a hub's placement that looked just before the policy came, and not again for long
    placement = PlacementAuthorizer(env.hub.catalog, SiteRegistry(env.hub.catalog), refresh=3600)
    await placement.reload()
    head = await env.hub.catalog.head_seq()
    other = open_catalog(env.hub.config.catalog_url)  # as the `loomfs policy` CLI does
    await other.open()
    try:
        await PolicyStore(other).put(Policy.build("pub", ["/vol/pub/**"], ["region=eu"]))
    finally:
        await other.close()
    for_us = await placement.redact(US, await env.hub.catalog.changes(head))
    assert [c.op for c in for_us] == [ChangeOp.EVICT]


def loomfs(data_dir: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "loomfs.cli", *args],
        capture_output=True, check=False, timeout=120, env=env,
    )  # fmt: skip


async def aok(data_dir: Path, *args: str) -> str:
    result = await asyncio.to_thread(loomfs, data_dir, *args)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


async def test_policy_cli_returns_once_the_spoke_evicted(tmp_path: Path) -> None:
    hub_dir, spoke_dir, data = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    marker, secret = marked(2 * MiB)
    (data / "eu").mkdir(parents=True)
    (data / "eu" / "x.bin").write_bytes(secret)
    await aok(hub_dir, "site", "init", "--name", "hub-eu", "--label", "region=eu")
    await aok(spoke_dir, "site", "init", "--name", "gpu-us", "--label", "region=us")
    await aok(
        hub_dir,
        "site",
        "add",
        "gpu-us",
        "--offline",
        "--cert",
        str(spoke_dir / "identity/site.pem"),
    )
    env = {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0", "LOOMFS_HUB__LEASE_TTL": "3"}
    with HubProcess(hub_dir, env) as hub:
        at_hub = ("--hub", hub.url)
        await aok(hub_dir, *at_hub, "volume", "add", "/datasets/s", f"posix://{data}")
        args = spoke_args(hub_dir, hub.urls["fabric"], "/datasets/s")
        spoke = await asyncio.to_thread(SpokeProcess(spoke_dir, args=args).start)
        try:
            at_spoke = ("--hub", spoke.url)
            cat = await asyncio.to_thread(
                loomfs, spoke_dir, *at_spoke, "cat", "/datasets/s/eu/x.bin"
            )
            assert cat.returncode == 0 and cat.stdout == secret
            assert holding(spoke_dir / "cache", marker)

            bad = await asyncio.to_thread(
                loomfs, hub_dir, *at_hub, "policy", "add", "p", "--paths", "eu/**",
                "--allow-sites", "region=eu",
            )  # fmt: skip
            assert bad.returncode == 1 and b"absolute" in bad.stderr
            added = await aok(
                hub_dir, *at_hub, "policy", "add", "residency-eu",
                "--paths", "/datasets/s/eu/**", "--allow-sites", "region=eu",
            )  # fmt: skip
            assert "in force" in added
            assert not holding(spoke_dir / "cache", marker)  # evicted before the CLI returned
            refused = await asyncio.to_thread(
                loomfs, spoke_dir, *at_spoke, "cat", "/datasets/s/eu/x.bin"
            )
            assert refused.returncode == 1 and b"PermissionDenied" in refused.stderr
            listed = await aok(hub_dir, *at_hub, "policy", "list")
            assert "residency-eu" in listed and "region=eu" in listed and " p " not in listed
            await aok(hub_dir, *at_hub, "policy", "remove", "residency-eu")
            gone = await asyncio.to_thread(
                loomfs, hub_dir, *at_hub, "policy", "remove", "residency-eu"
            )
            assert gone.returncode == 1 and b"NotFound" in gone.stderr
        finally:
            await asyncio.to_thread(spoke.stop)


async def test_bytes_in_flight_when_an_eviction_lands_are_not_cached(env: Fabric) -> None:
    """Reads the hub answered under the old policy, whose eviction the spoke applied before
    the answer arrived: the cache keeps none of those bytes (the feed is simulated arriving
    at that moment; the policy and the hub are real)."""
    marker, data = marked(2 * MiB)
    await env.hub.namespace.write_bytes(WHO, "/vol/pub/race.bin", data)
    us = env.spokes[US]
    hub_read = us.hub.read
    evicted = False

    async def evict_now() -> None:
        nonlocal evicted
        if not evicted:
            evicted = True
            await env.hub.placement.store.put(Policy.build("race", ["/vol/pub/**"], ["region=eu"]))
            await env.hub.placement.reload(force=True)
            [change] = [c for c in await env.hub.catalog.changes(us.seq) if c.path == "/vol/pub"]
            us.apply_change(change)

    async def read_then_evicted(*args: Any, **kwargs: Any) -> Reader:
        reader = await hub_read(*args, **kwargs)
        await evict_now()
        return reader

    assert us.cache.chunks is not None
    link = us.cache.chunks.link  # the spoke's fabric client, as a chunk link
    hub_open = link.open_chunked

    async def open_then_evicted(*args: Any, **kwargs: Any) -> Opened:
        opened = await hub_open(*args, **kwargs)
        await evict_now()
        return opened

    us.hub.read = read_then_evicted  # type: ignore[method-assign]
    link.open_chunked = open_then_evicted  # type: ignore[method-assign]
    try:  # a cold open: its first blocks (or its chunk map) came with the answer
        with pytest.raises(PermissionDenied):  # the rest is asked for under the new policy
            await us.read_bytes(WHO, "/vol/pub/race.bin", 0, 4096)
    finally:
        us.hub.read = hub_read  # type: ignore[method-assign]
        link.open_chunked = hub_open  # type: ignore[method-assign]
    assert not holding(cache_dir(env, US), marker)

    await PolicyStore(env.hub.catalog).remove("race")
    await env.hub.placement.reload(force=True)
    evicted = False
    entry = await us.stat(WHO, "/vol/pub/race.bin")

    async def fetch_then_evicted(path: str, version: int, offset: int, length: int) -> bytes:
        got = await us._fetch(path, version, offset, length)
        await evict_now()
        return got

    chunks, us.cache.chunks = us.cache.chunks, None  # a fill by ranged reads
    try:
        with pytest.raises(Conflict, match="evicted"):
            await us.cache.read(entry.path, entry.version, entry.size, 0, MiB, fetch_then_evicted)
    finally:
        us.cache.chunks = chunks
    assert not holding(cache_dir(env, US), marker)

    # a fill by chunks: the map came under the old policy, the chunks are asked for under
    # the new one, which refuses them (they sit in no file this site may read), and so
    # does the ranged read the fill falls back to
    await PolicyStore(env.hub.catalog).remove("race")
    await env.hub.placement.reload(force=True)
    evicted = False
    entry = await us.stat(WHO, "/vol/pub/race.bin")
    link.open_chunked = open_then_evicted  # type: ignore[method-assign]
    try:
        with pytest.raises((Conflict, PermissionDenied)):
            await us.cache.read(entry.path, entry.version, entry.size, 0, MiB, us._fetch)
    finally:
        link.open_chunked = hub_open  # type: ignore[method-assign]
    assert not holding(cache_dir(env, US), marker)


async def test_policy_store_on_both_catalog_engines(catalog: Catalog) -> None:
    """The SQL of policies, evictions, inherited tags and hard-link lookups, on SQLite and
    PostgreSQL alike."""
    await catalog.add_volume("/v", "posix:///nowhere")
    await catalog.apply(
        [
            Put("/v/d", EntryKind.DIR),
            Put("/v/d/a.bin", EntryKind.FILE, inode=7),
            Put("/v/b.bin", EntryKind.FILE, inode=7),
            Put("/v/c.bin", EntryKind.FILE, inode=8),
        ]
    )
    await catalog.set_tags("/v/d", {"residency": "eu"})
    await catalog.set_tags("/v/c.bin", {"residency": "eu"})
    store = PolicyStore(catalog)
    generation, head = await store.generation(), await catalog.head_seq()
    policy = Policy.build("p", ["/v/x/**", "/v/x/y/*.bin"], ["region=eu"], "residency=eu")
    seq = await store.put(policy)
    evictions = await catalog.changes(head)
    assert seq == head + 3 == evictions[-1].seq
    # the nested glob is swept by its parent's eviction
    assert {(c.op, c.path) for c in evictions} == {
        (ChangeOp.EVICT, p) for p in ("/v/x", "/v/d", "/v/c.bin")
    }
    assert await store.generation() == generation + 1
    assert await store.list() == [policy]
    assert await store.tags_along("/v/d/a.bin") == {("residency", "eu")}
    assert await store.tags_along("/v/b.bin") == set()
    await store.remove("p")
    assert await store.list() == [] and await store.generation() == generation + 2


async def test_a_refused_site_gets_no_chunks_of_a_restricted_file(env: Fabric) -> None:
    """The chunk routes decide as reads and writes do: no chunk map of a restricted file,
    no frame of a chunk that sits only in files the site may not read (by whatever id it
    learned), no commit from such chunks, no write lease; a chunk also held in a file the
    site may read still comes, out of that file."""
    marker, data = marked(3 * MiB)
    hub, eu = env.hub.namespace, env.spokes[EU]
    await hub.write_bytes(WHO, "/vol/eu/c.bin", data)
    assert await eu.read_bytes(WHO, "/vol/eu/c.bin") == data  # the hub maps and indexes it
    await tighten(env, EU_ONLY)
    entry, cmap = await env.hub.chunks.chunk_map(WHO, "/vol/eu/c.bin")
    ids = sorted(cmap.ids())
    link = env.client(US)  # a fabric client as the us site: what a spoke can ask for
    with pytest.raises(PermissionDenied):
        await link.open_chunked("/vol/eu/c.bin")
    with pytest.raises(PermissionDenied):
        await link.open_chunked("/vol/eu/c.bin", small=8 * MiB)  # whole, as a small file
    assert [f async for f in link.fetch_chunks(ids)] == [None] * len(ids)
    based = link.fetch_chunks(ids, base=("/vol/eu/c.bin", entry.version), at=[0] * len(ids))
    assert [f async for f in based] == [None] * len(ids)
    assert sorted(await link.missing_chunks(ids)) == ids  # no probing what the hub holds
    with pytest.raises(CorruptData):  # nor assembling a copy from the index
        await link.commit_chunks("/vol/pub/leak.bin", cmap)
    assert not await hub.exists(WHO, "/vol/pub/leak.bin")
    with pytest.raises(PermissionDenied):
        await link.lease_write(WHO, "/vol/eu/c.bin")
    # the eu site is allowed all of it
    eu_link = env.client(EU)
    try:
        assert None not in [f async for f in eu_link.fetch_chunks(ids)]
        assert (await eu_link.open_chunked("/vol/eu/c.bin")).chunk_map == cmap
    finally:
        await eu_link.close()
    # the same bytes in a public file: those chunks come, out of that file
    await hub.write_bytes(WHO, "/vol/pub/same.bin", data)
    await env.hub.chunks.chunk_map(WHO, "/vol/pub/same.bin")
    frames = [f async for f in link.fetch_chunks(ids)]
    assert None not in frames
    await link.close()
    assert not holding(cache_dir(env, US), marker)
