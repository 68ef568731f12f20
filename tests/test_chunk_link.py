"""Chunks over the fabric link: only missing chunks cross, verified end to end, both ways.

Byte bounds are derived from the chunk maps themselves (what changed, what the map costs),
counted at the link emulator, never from time.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from aiohttp import web

from loomfs.chunks import DEFAULT_WINDOW, ChunkMap, chunk_map_of
from loomfs.chunks.metrics import CORRUPT
from loomfs.core.catalog.base import Catalog
from loomfs.core.types import Principal
from loomfs.hub.chunks import MAPS_COMPUTED, HubChunks, Wanted
from loomfs.hub.namespace import HubNamespace
from loomfs.rest.server import RestServer
from loomfs.testing.fabric import Fabric, fabric

WHO = Principal(user="tester", site="spoke", protocol="test")
MiB = 1 << 20
# HTTP and TLS framing of a few requests and answers, and 35 bytes per chunk of a map
OVERHEAD = 32 * 1024


def map_of(data: bytes) -> ChunkMap:
    return chunk_map_of(io.BytesIO(data))


def new_bytes(old: bytes, new: bytes) -> int:
    """What a receiver holding ``old`` lacks of ``new``: its chunks not in ``old``."""
    held = map_of(old).ids()
    lacking = {p.id: p.length for p in map_of(new) if p.id not in held}
    return sum(lacking.values())


def map_cost(data: bytes) -> int:
    return len(map_of(data).serialize())


def blob(size: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(size)


@pytest.fixture
async def env(tmp_path: Path) -> AsyncIterator[Fabric]:
    async with fabric(tmp_path, lease_ttl=3.0) as created:
        yield created


async def test_a_re_read_after_two_scattered_edits_moves_only_the_changed_chunks(
    env: Fabric,
) -> None:
    old = blob(24 * MiB, 1)
    await env.hub.namespace.write_bytes(WHO, "/vol/shard.bin", old)
    assert await env.spoke.read_bytes(WHO, "/vol/shard.bin") == old
    edited = bytearray(old)
    edited[3 * MiB : 3 * MiB + 100] = b"x" * 100
    edited[17 * MiB : 17 * MiB + 50] = b"y" * 50
    new = bytes(edited)
    await env.hub.namespace.write_bytes(WHO, "/vol/shard.bin", new)
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/shard.bin") == new
    moved = env.link.down.bytes - before
    changed = new_bytes(old, new)
    assert 0 < changed <= 4 * DEFAULT_WINDOW.max_size  # two edits: a few chunks each
    assert changed <= moved <= changed + map_cost(new) + OVERHEAD


async def test_a_second_file_sharing_content_moves_almost_nothing(env: Fabric) -> None:
    shared = blob(12 * MiB, 2)
    await env.hub.namespace.mkdir(WHO, "/vol/a")
    await env.hub.namespace.write_bytes(WHO, "/vol/a/train.bin", shared)
    await env.hub.namespace.mkdir(WHO, "/vol/b")
    copy = shared + b"tail of the copy" * 10
    await env.hub.namespace.write_bytes(WHO, "/vol/b/train-copy.bin", copy)
    assert await env.spoke.read_bytes(WHO, "/vol/a/train.bin") == shared
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/b/train-copy.bin") == copy
    moved = env.link.down.bytes - before
    assert moved <= new_bytes(shared, copy) + map_cost(copy) + OVERHEAD
    assert moved < len(copy) // 20


async def test_a_chunk_corrupted_in_flight_is_refetched_and_never_served(env: Fabric) -> None:
    data = blob(6 * MiB, 3)
    await env.hub.namespace.write_bytes(WHO, "/vol/c.bin", data)
    damaged: list[bytes] = []

    def flip_first(frame: bytes) -> bytes:
        if damaged:
            return frame
        damaged.append(frame)
        return frame[:-1] + bytes([frame[-1] ^ 0xFF])

    env.hub.chunks.frame_hook = flip_first
    corrupt = CORRUPT.labels("spoke", "down")._value.get()
    assert await env.spoke.read_bytes(WHO, "/vol/c.bin") == data
    assert damaged, "the hook saw no frame: the read did not move chunks"
    assert CORRUPT.labels("spoke", "down")._value.get() == corrupt + 1


async def test_upload_of_a_checkpoint_sends_only_the_chunks_the_hub_lacks(env: Fabric) -> None:
    step1 = blob(16 * MiB, 4)
    await env.spoke.write_bytes(WHO, "/vol/step-100.pt", step1)
    edited = bytearray(step1)
    edited[5 * MiB : 6 * MiB] = blob(MiB, 5)  # the head trained, the backbone frozen
    step2 = bytes(edited)
    before = env.link.up.bytes
    await env.spoke.write_bytes(WHO, "/vol/step-200.pt", step2)
    sent = env.link.up.bytes - before
    assert (env.volume / "step-200.pt").read_bytes() == step2
    changed = new_bytes(step1, step2)
    assert MiB <= changed <= MiB + 2 * DEFAULT_WINDOW.max_size
    # the chunk list goes up as ids (missing?) and as the committed map
    assert changed <= sent <= changed + 32 * len(map_of(step2)) + map_cost(step2) + OVERHEAD
    # what the hub assembled is what it serves, chunk map included
    entry, cmap = await env.hub.chunks.chunk_map(WHO, "/vol/step-200.pt")
    assert cmap == map_of(step2) and entry.size == len(step2)


async def test_chunk_maps_are_reused_and_redone_after_an_in_place_change(
    catalog: Catalog, tmp_path: Path
) -> None:
    root = tmp_path / "vol"
    root.mkdir()
    hub = HubNamespace(catalog)
    await hub.add_volume("/v", f"posix://{root}")
    chunks = HubChunks(hub, tmp_path / "staging")
    try:
        data = blob(3 * MiB, 6)
        await hub.write_bytes(WHO, "/v/f.bin", data)
        computed = MAPS_COMPUTED._value.get()
        entry, first = await chunks.chunk_map(WHO, "/v/f.bin")
        _, again = await chunks.chunk_map(WHO, "/v/f.bin")
        assert first == again == map_of(data)
        assert MAPS_COMPUTED._value.get() == computed + 1  # reused while unchanged
        # the index finds every chunk, and serves verified frames of them
        assert await chunks.missing([p.id for p in first]) == []
        wanted = [Wanted(p.id) for p in first]
        records = [r async for r in chunks.frames(wanted)]
        assert len(records) == len(first) and all(len(r) > 1 for r in records)

        # changed in place behind the hub's back, size and mtime kept: not noticed, so the
        # index still points there; the hash check refuses the bytes
        st = os.stat(root / "f.bin")
        with open(root / "f.bin", "r+b") as f:
            f.seek(first[0].offset)
            f.write(b"\0" * 64)
        os.utime(root / "f.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
        [answer] = [r async for r in chunks.frames([Wanted(first[0].id)])]
        assert answer == b"\0"  # an empty record: no verified copy, nothing wrong sent
        assert first[0].id in await chunks.missing([first[0].id])  # the index forgot it

        # a change the hub notices (inotify, rescan) is a new version with a new map
        with open(root / "f.bin", "ab") as f:
            f.write(b"more")
        fresh = await hub.refresh("/v/f.bin")
        assert fresh is not None and fresh.version != entry.version
        _, redone = await chunks.chunk_map(WHO, "/v/f.bin")
        assert redone == map_of((root / "f.bin").read_bytes())
        assert MAPS_COMPUTED._value.get() == computed + 2
    finally:
        chunks.close()
        await hub.close()


async def test_loomfs_status_prints_the_transfer_counters(env: Fabric) -> None:
    data = blob(4 * MiB, 7)
    await env.hub.namespace.write_bytes(WHO, "/vol/s.bin", data)
    assert await env.spoke.read_bytes(WHO, "/vol/s.bin") == data
    # this process is hub and spoke at once: its /metrics holds both sides' counters
    runner = web.AppRunner(RestServer(env.hub.namespace).app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "loomfs.cli", "--hub", f"http://127.0.0.1:{port}", "status",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            env={**os.environ, "COLUMNS": "200"},
        )  # fmt: skip
        out, _ = await proc.communicate()
    finally:
        await runner.cleanup()
    text = out.decode()
    assert proc.returncode == 0, text
    cells = [[c.strip() for c in line.split("│")[1:-1]] for line in text.splitlines()]
    rows = {(c[0], c[1]): c[2:] for c in cells if len(c) > 3}
    assert ("hub", "down") in rows, text
    logical, wire = (int(v.replace(",", "")) for v in rows[("spoke", "down")][:2])
    assert logical >= len(data) and wire > 0, text  # this read, at least
