"""A spoke cut off from its hub lists what the hub last listed to the same user, as the
hub has it (never stale, never an empty directory), and says the hub is unreachable for
anything else."""

from __future__ import annotations

import asyncio
import contextlib
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.types import SYSTEM, Principal
from loomfs.errors import BackendUnavailable, NotFound
from loomfs.namespace.base import Namespace
from loomfs.testing.fabric import Fabric, fabric

ALICE = Principal(user="alice", site="spoke", protocol="test")
BOB = Principal(user="bob", site="spoke", protocol="test")
Listed = list[tuple[str, int, int]]


async def listed(
    ns: Namespace, who: Principal, path: str, start_after: str | None = None, limit: int = 0
) -> Listed:
    entries = ns.list(who, path, start_after=start_after, limit=limit or None)
    return [(e.name, e.version, e.size) async for e in entries]


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    async with fabric(tmp_path) as created:
        yield created


async def test_a_cut_off_spoke_lists_what_it_listed_to_that_user(env: Fabric) -> None:
    hub = env.hub.namespace
    await hub.mkdir(SYSTEM, "/vol/a")
    await hub.mkdir(SYSTEM, "/vol/b")
    for name in ("x", "y"):
        await hub.write_bytes(SYSTEM, f"/vol/a/{name}", name.encode() * 10)
    await hub.write_bytes(SYSTEM, "/vol/b/z", b"z")
    online = await listed(env.spoke, ALICE, "/vol/a")
    assert await env.spoke.read_bytes(BOB, "/vol/b/z") == b"z"
    assert [name for name, _, _ in online] == ["x", "y"]
    await env.caught_up()
    env.link.cut()
    try:
        assert await listed(env.spoke, ALICE, "/vol/a") == online
        assert await listed(env.spoke, ALICE, "/vol/a", start_after="x") == online[1:]
        assert await listed(env.spoke, ALICE, "/vol/a", limit=1) == online[:1]
        assert (await env.spoke.stat(ALICE, "/vol/a/y")).size == 10
        with pytest.raises(BackendUnavailable, match="keeps no listing of /vol/b"):
            await listed(env.spoke, ALICE, "/vol/b")  # never listed here
        with pytest.raises(BackendUnavailable, match="listed to bob"):
            await listed(env.spoke, BOB, "/vol/a")  # listed, but to someone else
        with pytest.raises(BackendUnavailable):
            await env.spoke.stat(BOB, "/vol/a/y")
        assert (await env.spoke.stat(BOB, "/vol/b/z")).size == 1  # bob read it: he may stat it
        with pytest.raises(BackendUnavailable):
            await env.spoke.stat(ALICE, "/vol/b/z")
    finally:
        env.link.restore()
    # a change in the directory drops what was kept: unknown offline, never stale
    await hub.write_bytes(SYSTEM, "/vol/a/new", b"new")
    await env.caught_up()
    env.link.cut()
    try:
        with pytest.raises(BackendUnavailable):
            await listed(env.spoke, ALICE, "/vol/a")
    finally:
        env.link.restore()


SUBDIR = "/vol/a/sub"  # stays a directory: writes and removes of it are left out
DIRS = ("/vol/a", SUBDIR, "/vol/b")
NAMES = ("f", "g", "sub")
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("write"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
        st.tuples(st.just("remove"), st.sampled_from(DIRS), st.sampled_from(NAMES)),
        st.tuples(st.just("list"), st.sampled_from(DIRS), st.sampled_from((ALICE, BOB))),
        st.tuples(st.just("cut"), st.just(""), st.just("")),
    ),
    min_size=1,
    max_size=10,
)


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(OPS)
def test_offline_listings_are_the_hubs_or_unavailable(ops: list[tuple[str, str, object]]) -> None:
    """Whatever the hub changed after a listing, once its feed reached the spoke: cut
    off, the spoke lists each directory exactly as the hub has it, or says it can't."""
    with tempfile.TemporaryDirectory() as tmp:
        asyncio.run(_offline_history(Path(tmp), [*ops, ("cut", "", "")]))


async def _offline_history(tmp: Path, ops: list[tuple[str, str, object]]) -> None:
    async with fabric(tmp) as env:
        hub = env.hub.namespace
        await hub.mkdir(SYSTEM, SUBDIR, parents=True)
        await hub.mkdir(SYSTEM, "/vol/b")
        for op, directory, arg in ops:
            path = f"{directory}/{arg}"
            if op == "write" and path != SUBDIR:
                await hub.write_bytes(SYSTEM, path, str(ops).encode())
            elif op == "remove" and path != SUBDIR:
                with contextlib.suppress(NotFound):
                    await hub.remove(SYSTEM, path)
            elif op == "list":
                assert isinstance(arg, Principal)
                await listed(env.spoke, arg, directory)
            elif op == "cut":
                await env.caught_up()
                env.link.cut()
                try:
                    for directory_ in DIRS:
                        truth = await listed(hub, SYSTEM, directory_)
                        for who in (ALICE, BOB):
                            with contextlib.suppress(BackendUnavailable):
                                assert await listed(env.spoke, who, directory_) == truth
                finally:
                    env.link.restore()
