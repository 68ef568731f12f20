"""Each route an attacker found around governance, closed (one test a route).

The governed namespace decides on what a call really touches: through a symlink the
target, through a hard link every name, for a directory everything below it; residency
sits in the same chain; a spoke serves cached bytes only on the hub's word that the user
may *read*; path globs match any name; the change feed names no hidden path.
"""

from __future__ import annotations

import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable
from functools import partial
from pathlib import Path

import pytest
from aiohttp.test_utils import TestClient, TestServer

from loomfs.core.acl import AclStore
from loomfs.core.placement import Policy
from loomfs.core.types import SYSTEM, ChangeOp, Principal
from loomfs.core.users import UserRegistry
from loomfs.errors import NotFound, PermissionDenied
from loomfs.namespace import governed
from loomfs.namespace.base import Reader
from loomfs.rest import wire
from loomfs.rest.auth import HubAuthenticator
from loomfs.rest.server import RestServer
from loomfs.testing.fabric import Fabric, fabric

EU, US = "gpu-eu", "gpu-us"
ALICE, BOB = Principal("alice", protocol="api"), Principal("bob", protocol="api")


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    """/vol/home/alice is alice's (write); /vol/bob is private to bob; /vol/eu may reach
    region=eu sites only; the rest is open."""
    labels = {EU: {"region": "eu"}, US: {"region": "us"}}
    async with fabric(tmp_path, (EU, US), labels=labels) as made:
        hub = made.hub.namespace
        for d in ("/vol/home/alice", "/vol/bob", "/vol/eu/sub", "/vol/open/d/private"):
            await hub.mkdir(SYSTEM, d, parents=True)
        await hub.write_bytes(SYSTEM, "/vol/bob/private.txt", b"bob's secret")
        await hub.write_bytes(SYSTEM, "/vol/eu/sub/f.bin", b"eu only")
        await hub.write_bytes(SYSTEM, "/vol/open/d/private/p.txt", b"private inside open")
        users = UserRegistry(made.hub.catalog)
        for name in ("alice", "bob"):
            await users.add_user(name)
        acl = AclStore(made.hub.catalog)
        await acl.grant("user:alice", "write", "/vol/home/alice")
        await acl.set_private("/vol/bob", True)
        await acl.grant("user:bob", "write", "/vol/bob")
        await acl.set_private("/vol/open/d/private", True)
        await made.hub.authorizer.reload()
        policy = Policy.build("eu", ["/vol/eu/**"], ["region=eu"])
        await made.hub.settle(await made.hub.placement.store.put(policy))
        yield made


async def test_reading_through_a_symlink_needs_read_on_its_target(env: Fabric) -> None:
    gov = env.hub.governed
    await gov.symlink(ALICE, "/vol/home/alice/x", "../../bob/private.txt")  # her own name
    with pytest.raises(PermissionDenied):
        await gov.read_bytes(ALICE, "/vol/home/alice/x")
    with pytest.raises(PermissionDenied):
        await gov.stat_for_read(ALICE, "/vol/home/alice/x")
    with pytest.raises(PermissionDenied):
        await env.spokes[EU].read_bytes(ALICE, "/vol/home/alice/x")
    # through a link in an open directory, bob reads his file: the target's bytes and
    # size, not the link's; alice still nothing
    await env.hub.namespace.symlink(SYSTEM, "/vol/open/to-bob", "../bob/private.txt")
    assert await gov.read_bytes(BOB, "/vol/open/to-bob") == b"bob's secret"
    assert (await gov.stat_for_read(BOB, "/vol/open/to-bob")).size == len(b"bob's secret")
    with pytest.raises(PermissionDenied):
        await gov.read_bytes(ALICE, "/vol/open/to-bob")


async def test_a_hard_link_is_readable_only_where_every_name_is(env: Fabric) -> None:
    volume = env.volume
    os.link(volume / "bob" / "private.txt", volume / "home" / "alice" / "h")  # behind loomfs
    await env.hub.namespace.refresh("/vol/home/alice/h")
    with pytest.raises(PermissionDenied):
        await env.hub.governed.read_bytes(ALICE, "/vol/home/alice/h")
    with pytest.raises(PermissionDenied):  # nor may she make one through loomfs
        await env.hub.governed.link(ALICE, "/vol/bob/private.txt", "/vol/home/alice/h2")


async def test_list_is_not_enough_to_read_at_a_spoke(env: Fabric) -> None:
    acl = AclStore(env.hub.catalog)
    await acl.grant("user:alice", "list", "/vol/bob")
    await env.hub.authorizer.reload()
    spoke = env.spokes[EU]
    assert (await spoke.stat(ALICE, "/vol/bob/private.txt")).size == 12  # list: metadata
    assert await spoke.read_bytes(BOB, "/vol/bob/private.txt") == b"bob's secret"  # cached
    with pytest.raises(PermissionDenied):
        await spoke.read_bytes(ALICE, "/vol/bob/private.txt")


async def test_a_directory_moves_or_goes_only_with_every_right_below(env: Fabric) -> None:
    gov = env.hub.governed
    # /vol/open is open, but a private directory sits inside: moving its parent would
    # take the private file out from under its rule
    with pytest.raises(PermissionDenied):
        await gov.rename(ALICE, "/vol/open/d", "/vol/home/alice/d")
    with pytest.raises(PermissionDenied):
        await gov.remove(ALICE, "/vol/open/d", recursive=True)
    assert await env.hub.namespace.exists(SYSTEM, "/vol/open/d/private/p.txt")


async def test_a_policy_on_a_tree_holds_its_root_and_any_name(env: Fabric) -> None:
    us = env.spokes[US]
    odd = "/vol/eu/sub/line\nbreak.bin"
    await env.hub.namespace.write_bytes(SYSTEM, odd, b"eu, oddly named")
    for call in (
        partial(us.rename, ALICE, "/vol/eu", "/vol/moved"),  # the policy's own directory
        partial(us.remove, ALICE, "/vol/eu", recursive=True),
        partial(us.rename, ALICE, "/vol/eu/sub", "/vol/open/sub"),
        partial(us.read_bytes, ALICE, odd),
        partial(us.link, ALICE, odd, "/vol/open/out.bin"),
    ):
        with pytest.raises((PermissionDenied, NotFound)):
            await call()
    assert await env.spokes[EU].read_bytes(ALICE, odd) == b"eu, oddly named"  # reachable
    assert await env.hub.namespace.read_bytes(SYSTEM, odd) == b"eu, oddly named"
    assert not await env.hub.namespace.exists(SYSTEM, "/vol/moved")


async def test_special_files_and_set_id_bits_need_an_administrator(env: Fabric) -> None:
    gov = env.hub.governed
    with pytest.raises(PermissionDenied):
        await gov.mknod(ALICE, "/vol/home/alice/null", stat.S_IFCHR | 0o666, os.makedev(1, 3))
    with pytest.raises(PermissionDenied):
        await gov.write_bytes(ALICE, "/vol/home/alice/sh", b"#!", mode=0o4755)
    await gov.write_bytes(ALICE, "/vol/home/alice/sh", b"#!", mode=0o755)
    with pytest.raises(PermissionDenied):
        await gov.set_attrs(ALICE, "/vol/home/alice/sh", mode=0o2755)
    # over REST, the anonymous caller in an open directory: the same refusal
    async with TestClient(TestServer(env.hub.rest_server().app())) as http:
        mode = {"X-Loomfs-Mode": str(0o4755)}  # the header is decimal, as JSON numbers are
        made = await http.put("/v1/files/vol/open/s", data=b"x", headers=mode)
        assert made.status in (401, 403)
    assert not await env.hub.namespace.exists(SYSTEM, "/vol/home/alice/null")
    assert not await env.hub.namespace.exists(SYSTEM, "/vol/open/s")
    entry = await env.hub.namespace.stat(SYSTEM, "/vol/home/alice/sh")
    assert entry.mode & 0o7777 == 0o755


async def test_renames_into_hidden_names_leak_no_name(env: Fabric) -> None:
    hub, gov = env.hub.namespace, env.hub.governed
    head = await env.hub.catalog.head_seq()
    await hub.write_bytes(SYSTEM, "/vol/open/moving", b"x")
    await hub.rename(SYSTEM, "/vol/open/moving", "/vol/bob/renamed-secretly")
    shown = await gov.visible_changes(ALICE, await env.hub.catalog.changes(head))
    # (the directories' new times follow it, as changes of their own)
    assert [(c.op, c.path, c.new_path) for c in shown if c.path == "/vol/open/moving"][-1] == (
        ChangeOp.DELETE,
        "/vol/open/moving",
        None,
    )
    assert not any("secretly" in f"{c.path}{c.new_path}" for c in shown)
    # a site a hidden policy refuses: the move into it is a removal too, seq gap-free
    await env.hub.settle(
        await env.hub.placement.store.put(
            Policy.build("hide", ["/vol/hidden/**"], ["region=eu"], None, "hidden")
        )
    )
    await hub.mkdir(SYSTEM, "/vol/hidden")
    head = await env.hub.catalog.head_seq()
    await hub.write_bytes(SYSTEM, "/vol/open/going", b"y")
    await hub.rename(SYSTEM, "/vol/open/going", "/vol/hidden/gone-quietly")
    for_us = await env.hub.placement.redact(US, await env.hub.catalog.changes(head))
    assert [c.seq for c in for_us] == [c.seq for c in await env.hub.catalog.changes(head)]
    assert not any("quietly" in f"{c.path}{c.new_path}" for c in for_us), for_us
    moved = [c for c in for_us if c.path == "/vol/open/going"][-1]
    assert (moved.op, moved.path) == (ChangeOp.DELETE, "/vol/open/going")
    # what it held of the old name goes: the policy's root is evicted, naming no file
    assert [c.path for c in for_us if c.op is ChangeOp.EVICT] == ["/vol/hidden"]


async def stopped_by(
    open_read: Callable[[], Awaitable[Reader]], change: Callable[[], Awaitable[None]]
) -> None:
    """Two reads open, one streaming (a chunk already served), one to be served from its
    file region; after ``change`` the stream stops at its next chunk and the other fails
    its verification, each with PermissionDenied."""
    streaming, by_region = await open_read(), await open_read()
    try:
        chunks = streaming.chunks()
        assert await anext(chunks)  # served while the right holds
        await change()
        with pytest.raises(PermissionDenied):
            async for _ in chunks:
                pass
        with pytest.raises(PermissionDenied):
            await by_region.verify()
    finally:
        await streaming.aclose()
        await by_region.aclose()


async def test_an_open_stream_stops_when_its_right_goes(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A right revoked while a read streams stops it at its next chunk (asked again each
    time here), and a read served from the file region fails its verification."""
    monkeypatch.setattr(governed, "RECHECK", 0.0)
    hub, gov = env.hub.namespace, env.hub.governed
    await hub.write_bytes(SYSTEM, "/vol/bob/big.bin", os.urandom(8 << 20))

    async def revoke() -> None:
        await AclStore(env.hub.catalog).revoke("user:bob", "write", "/vol/bob")
        await env.hub.authorizer.reload()

    await stopped_by(partial(gov.read, BOB, "/vol/bob/big.bin"), revoke)


async def test_a_read_of_the_cache_stops_when_its_eviction_lands(env: Fabric) -> None:
    """Tightened while a spoke reads a cached file: the read stops at its next chunk, and
    one served from the cache file's region fails its verification."""
    hub, us = env.hub.namespace, env.spokes[US]
    await hub.write_bytes(SYSTEM, "/vol/open/later-eu.bin", os.urandom(4 << 20))
    assert len(await us.read_bytes(ALICE, "/vol/open/later-eu.bin")) == 4 << 20  # cached
    policy = Policy.build("later", ["/vol/open/later-eu.bin"], ["region=eu"])

    async def tighten() -> None:  # settled: the spoke applied the eviction
        await env.hub.settle(await env.hub.placement.store.put(policy))

    await stopped_by(partial(us.read, ALICE, "/vol/open/later-eu.bin"), tighten)


async def test_a_user_reads_at_a_cut_off_spoke_what_the_hub_let_them_read(env: Fabric) -> None:
    """With the link down, a spoke's user with credentials reads what the hub admitted
    them to before (credentials and admission as the hub last said), and nothing else."""
    hub = env.hub.namespace
    await hub.write_bytes(SYSTEM, "/vol/home/alice/notes.txt", b"alice's notes")
    await hub.write_bytes(SYSTEM, "/vol/home/alice/never.txt", b"never read here")
    key = await UserRegistry(env.hub.catalog).add_access_key("alice")
    basic = {"Authorization": wire.basic_authorization(key.access_key, key.secret)}
    # ttl 0: every request asks the hub, so the offline ones find no fresh answer
    check = HubAuthenticator(env.client(env.first), site=env.first, anonymous=False, ttl=0.0)
    server = RestServer(env.spoke, spoke=env.spoke, site=env.first, authenticate=check)
    try:
        async with TestClient(TestServer(server.app())) as http:
            online = await http.get("/v1/files/vol/home/alice/notes.txt", headers=basic)
            assert (online.status, await online.read()) == (200, b"alice's notes")
            env.link.cut()
            try:
                offline = await http.get("/v1/files/vol/home/alice/notes.txt", headers=basic)
                assert (offline.status, await offline.read()) == (200, b"alice's notes")
                never = await http.get("/v1/files/vol/home/alice/never.txt", headers=basic)
                assert never.status == 503  # never admitted here: the hub is needed
            finally:
                env.link.restore()
    finally:
        await check.hub.close()
