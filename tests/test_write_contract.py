"""The write contract at a spoke (issue 22): a conditional write keeps its precondition to
the hub's commit in every mode, a journaled write lands exactly once (its idempotency key),
nobody but its writer reads a write the hub has not acknowledged, and writers of one path
at one spoke share its write lease."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from loomfs.core.types import Entry, Principal
from loomfs.errors import BackendUnavailable, Conflict, InvalidArgument
from loomfs.rest.client import RestNamespace
from loomfs.spoke.cache import SMALL_FILE
from loomfs.spoke.journal import Journal, Pending
from loomfs.spoke.namespace import REFUSED, SpokeNamespace
from loomfs.testing.fabric import Fabric, fabric

WHO = Principal(user="tester", site="spoke", protocol="test")
OTHER = Principal(user="another", site="spoke", protocol="test")
LEASE = 3.0


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    async with fabric(tmp_path, lease_ttl=LEASE) as created:
        yield created


async def hub_write(env: Fabric, path: str, data: bytes) -> int:
    return (await env.hub.namespace.write_bytes(WHO, path, data)).version


def conflict_copies(env: Fabric) -> list[str]:
    return sorted(p.name for p in env.volume.iterdir() if ".conflict-" in p.name)


async def synced(spoke: SpokeNamespace) -> None:
    async with asyncio.timeout(60):
        await spoke.sync()


# -- 1. the precondition goes to the hub's commit -------------------------------------------


async def test_write_back_keeps_the_writers_precondition(env: Fabric) -> None:
    """Acknowledged at once, then refused at the commit (the hub moved on): never landed
    over the newer version, nor kept as a copy, and reported."""
    first = await hub_write(env, "/vol/f", b"v1")
    assert await env.spoke.read_bytes(WHO, "/vol/f") == b"v1"
    env.spoke.write_back = True
    env.link.cut()
    await env.spoke.write_bytes(WHO, "/vol/f", b"if still v1", if_version=first)
    await hub_write(env, "/vol/f", b"v2 from the hub")
    refused = REFUSED._value.get()
    env.link.restore()
    with pytest.raises(Conflict, match="refused"):
        await synced(env.spoke)
    assert (env.volume / "f").read_bytes() == b"v2 from the hub"
    assert conflict_copies(env) == [] and len(env.spoke.journal) == 0
    assert REFUSED._value.get() == refused + 1
    await synced(env.spoke)  # reported once


async def test_write_back_commits_a_precondition_that_holds(env: Fabric) -> None:
    first = await hub_write(env, "/vol/f", b"v1")
    env.spoke.write_back = True
    entry = await env.spoke.write_bytes(WHO, "/vol/f", b"v2", if_version=first)
    assert entry.version == 0
    await synced(env.spoke)
    assert (env.volume / "f").read_bytes() == b"v2"


async def test_the_default_mode_never_acknowledges_a_conditional_write_unchecked(
    env: Fabric,
) -> None:
    """The spoke last saw v2, the writer asks for v1: with the link down nobody can check
    it, so it is refused as unreachable rather than acknowledged and replayed over v2."""
    stale = await hub_write(env, "/vol/f", b"v1")
    await hub_write(env, "/vol/f", b"v2")
    assert await env.spoke.read_bytes(WHO, "/vol/f") == b"v2"
    env.link.cut()
    with pytest.raises(BackendUnavailable):
        await env.spoke.write_bytes(WHO, "/vol/f", b"if still v1", if_version=stale)
    with pytest.raises(BackendUnavailable):
        await env.spoke.write_bytes(WHO, "/vol/new", b"create only", exclusive=True)
    assert len(env.spoke.journal) == 0
    env.link.restore()
    await synced(env.spoke)
    assert (env.volume / "f").read_bytes() == b"v2"
    assert not (env.volume / "new").exists()


# -- 2. each journaled write lands once ---------------------------------------------------


async def test_a_repeated_write_id_gets_the_first_answer_across_a_hub_restart(
    env: Fabric,
) -> None:
    """Over the fabric link (the Idempotency-Key header): the repeat writes nothing, even
    once the path has moved on and the hub has restarted."""
    client = env.client(env.first)
    try:
        first = await client.write_bytes(WHO, "/vol/f", b"once", write_id="k1")
        await hub_write(env, "/vol/f", b"changed since")
        assert await client.write_bytes(WHO, "/vol/f", b"once", write_id="k1") == first
        await env.restart_hub()
        assert await client.write_bytes(WHO, "/vol/f", b"once", write_id="k1") == first
        assert (env.volume / "f").read_bytes() == b"changed since"
        # another key is another write
        again = await client.write_bytes(WHO, "/vol/f", b"twice", write_id="k2")
        assert again.version > first.version
    finally:
        await client.close()


@pytest.mark.parametrize("size", [100, SMALL_FILE + 1], ids=["whole", "chunked"])
async def test_a_replay_whose_answer_was_lost_lands_once(
    env: Fabric, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """The hub commits the upload, the answer is lost, the path changes at the hub: the
    replay is that same write (no conflict copy), not a second one."""
    await hub_write(env, "/vol/ck", b"step 0")
    assert await env.spoke.read_bytes(WHO, "/vol/ck") == b"step 0"
    link = env.spoke.cache.chunks.link if env.spoke.cache.chunks else None
    assert isinstance(link, RestNamespace) and link is env.spoke.hub
    lost: list[str] = []
    committed, changed = asyncio.Event(), asyncio.Event()

    def losing(real: Callable[..., Awaitable[Entry]]) -> Callable[..., Awaitable[Entry]]:
        async def call(*args: Any, **kwargs: Any) -> Entry:
            if lost:  # the replay, once the path has changed
                await changed.wait()
                return await real(*args, **kwargs)
            entry = await real(*args, **kwargs)
            lost.append(entry.path)
            committed.set()
            raise BackendUnavailable("the answer was lost")

        return call

    monkeypatch.setattr(link, "write", losing(link.write))
    monkeypatch.setattr(link, "commit_chunks", losing(link.commit_chunks))
    env.spoke.write_back = True
    entry = await env.spoke.write_bytes(WHO, "/vol/ck", os.urandom(size))
    assert entry.version == 0
    await committed.wait()
    await hub_write(env, "/vol/ck", b"changed at the hub")
    changed.set()
    await synced(env.spoke)
    assert lost == ["/vol/ck"]
    assert conflict_copies(env) == []
    assert (env.volume / "ck").read_bytes() == b"changed at the hub"


async def test_a_clients_key_at_a_spoke_makes_its_retries_one_write(env: Fabric) -> None:
    """A REST client's Idempotency-Key at a spoke: a retry while the write is journaled
    is answered from the journal, one after the commit by the hub, and a retry that
    carries other bytes puts none of them in the spoke's cache."""
    env.spoke.write_back = True
    env.link.cut()  # it stays journaled meanwhile
    first = await env.spoke.write_bytes(WHO, "/vol/k", b"the write", write_id="client-1")
    again = await env.spoke.write_bytes(WHO, "/vol/k", b"the write", write_id="client-1")
    assert first == again and len(env.spoke.journal) == 1
    env.link.restore()
    await synced(env.spoke)
    committed = await env.hub.namespace.stat(WHO, "/vol/k")
    await env.spoke.write_bytes(WHO, "/vol/k", b"other bytes", write_id="client-1")
    await synced(env.spoke)
    assert await env.hub.namespace.stat(WHO, "/vol/k") == committed
    assert await env.spoke.read_bytes(OTHER, "/vol/k") == b"the write"


async def test_a_malformed_key_is_refused(env: Fabric) -> None:
    client = env.client(env.first)
    try:
        with pytest.raises(InvalidArgument, match="Idempotency-Key"):
            await client.write_bytes(WHO, "/vol/f", b"x", write_id="k" * 129)
    finally:
        await client.close()
    assert not (env.volume / "f").exists()


def test_a_journal_written_before_keys_gets_one_per_write(tmp_path: Path) -> None:
    journal = Journal(tmp_path)
    seq, spool = journal.reserve()
    spool.write(b"old")
    spool.close()
    journal.commit(Pending(seq, "/vol/f", None, None, False, None, 0, early=True))
    [reloaded] = Journal(tmp_path)
    assert len(reloaded.write_id) == 32 and [p.write_id for p in Journal(tmp_path)] == [
        reloaded.write_id
    ]  # given once, kept


# -- 3. no dirty reads ----------------------------------------------------------------------


async def test_a_write_the_hub_has_not_acknowledged_is_read_by_nobody(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a writer waits for the hub, other readers (of any user, its own too) read
    the hub's version: the hub may refuse the write, as it does here."""
    stale = await hub_write(env, "/vol/f", b"v1")
    await hub_write(env, "/vol/f", b"v2")
    link = env.spoke.hub
    real_write = link.write
    reached, go = asyncio.Event(), asyncio.Event()

    async def slow_write(*args: Any, **kwargs: Any) -> Entry:
        reached.set()
        await go.wait()
        return await real_write(*args, **kwargs)

    monkeypatch.setattr(link, "write", slow_write)
    writing = asyncio.create_task(
        env.spoke.write_bytes(WHO, "/vol/f", b"if still v1", if_version=stale)
    )
    await reached.wait()
    for reader in (WHO, OTHER):
        assert await env.spoke.read_bytes(reader, "/vol/f") == b"v2"
        assert (await env.spoke.stat(reader, "/vol/f")).version > stale
    go.set()
    with pytest.raises(Conflict):
        await writing


async def test_an_acknowledged_pending_write_is_read_back_by_its_writer_only(
    env: Fabric,
) -> None:
    await hub_write(env, "/vol/f", b"v1")
    assert await env.spoke.read_bytes(WHO, "/vol/f") == b"v1"
    env.spoke.write_back = True
    env.link.cut()
    await env.spoke.write_bytes(WHO, "/vol/f", b"mine, not yet at the hub")
    assert await env.spoke.read_bytes(WHO, "/vol/f") == b"mine, not yet at the hub"
    assert (await env.spoke.stat(WHO, "/vol/f")).version == 0
    env.link.restore()
    assert await env.spoke.read_bytes(OTHER, "/vol/f") == b"v1"
    await synced(env.spoke)
    assert await env.spoke.read_bytes(OTHER, "/vol/f") == b"mine, not yet at the hub"


# -- 4. writers of one path at one spoke ------------------------------------------------------


async def test_concurrent_writers_of_a_path_share_its_write_lease(tmp_path: Path) -> None:
    async with fabric(tmp_path, ("east", "west"), lease_ttl=LEASE) as env:
        east, west = env.spokes["east"], env.spokes["west"]
        await hub_write(env, "/vol/f", b"v0")
        entries = await asyncio.gather(
            *(east.write_bytes(WHO, "/vol/f", f"writer {i}".encode()) for i in range(4))
        )
        assert len({e.version for e in entries}) == 4  # each committed, once
        newest = max(range(4), key=lambda i: entries[i].version)
        assert (env.volume / "f").read_bytes() == f"writer {newest}".encode()
        assert east._writing == {}  # no lease kept, no renewal left running
        # released at the hub: another site may write the path now
        await west.write_bytes(WHO, "/vol/f", b"from west")
        assert (env.volume / "f").read_bytes() == b"from west"
