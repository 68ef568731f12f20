"""Faults: a full disk and a hub killed in the middle of a write lose nothing acknowledged
and leave nothing half-written visible."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from loomfs.core.registry import open_catalog
from loomfs.core.types import Principal
from loomfs.errors import InsufficientStorage
from loomfs.hub.namespace import HubNamespace
from loomfs.rest.client import RestNamespace
from loomfs.rest.wire import API
from loomfs.testing.hubproc import HubProcess

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
