"""Chunks over the fabric link: only missing chunks cross, verified end to end, both ways.

Byte bounds are derived from the chunk maps themselves (what changed, what the map costs),
counted at the link emulator, never from time.
"""

from __future__ import annotations

import asyncio
import io
import os
import random
import sqlite3
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from loomfs.chunks.cdc import DEFAULT_WINDOW, chunk_map_of
from loomfs.chunks.chunkmap import ChunkMap
from loomfs.chunks.codec import encode_chunk
from loomfs.chunks.metrics import CORRUPT
from loomfs.core.catalog.base import Catalog
from loomfs.core.types import Principal
from loomfs.hub import chunks as hub_chunks
from loomfs.hub.chunks import MAPS_COMPUTED, HubChunks
from loomfs.hub.deltastore import BASES, DeltaStore
from loomfs.hub.namespace import HubNamespace
from loomfs.namespace.chunklink import Wanted
from loomfs.rest.server import RestServer
from loomfs.spoke import chunkfill as spoke_chunkfill
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
    # random bytes: the hub's delta store keeps no incompressible chunks, so the changed
    # chunks go whole
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
        records = [r async for batch in chunks.frames(wanted) for r in batch]
        assert len(records) == len(first) and all(len(r) > 1 for r in records)

        # changed in place behind the hub's back, size and mtime kept: not noticed, so the
        # index still points there; the hash check refuses the bytes
        st = os.stat(root / "f.bin")
        with open(root / "f.bin", "r+b") as f:
            f.seek(first[0].offset)
            f.write(b"\0" * 64)
        os.utime(root / "f.bin", ns=(st.st_atime_ns, st.st_mtime_ns))
        [answer] = [r async for batch in chunks.frames([Wanted(first[0].id)]) for r in batch]
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


def text_rows(rng: random.Random, count: int) -> list[bytes]:
    """JSONL-like lines of pseudo-words: compresses about 3x, never repeats itself."""
    words = ["".join(rng.choices("etaoinshrdlucmfwyp", k=rng.randint(2, 8))) for _ in range(3000)]
    return [
        b'{"id": %d, "text": "%s"}\n' % (i, " ".join(rng.choices(words, k=40)).encode())
        for i in range(count)
    ]


def edited_rows(rng: random.Random, rows: list[bytes], share: float) -> list[bytes]:
    """``share`` of the rows rewritten in place, scattered through the file."""
    fresh = text_rows(rng, len(rows))
    out = list(rows)
    for index in rng.sample(range(len(rows)), int(len(rows) * share)):
        out[index] = fresh[index]
    return out


def plain_cost(old: bytes, new: bytes) -> int:
    """What the chunks of ``new`` missing from ``old`` cost as plain zstd frames."""
    held = map_of(old).ids()
    return sum(len(encode_chunk(new[p.offset : p.end])) for p in map_of(new) if p.id not in held)


async def test_a_file_changed_in_place_moves_as_deltas_against_the_version_the_spoke_holds(
    env: Fabric,
) -> None:
    rng = random.Random(8)
    rows = text_rows(rng, 24_000)
    old = b"".join(rows)
    await env.hub.namespace.write_bytes(WHO, "/vol/train.jsonl", old)
    assert await env.spoke.read_bytes(WHO, "/vol/train.jsonl") == old
    new = b"".join(edited_rows(rng, rows, 0.02))
    await env.hub.namespace.write_bytes(WHO, "/vol/train.jsonl", new)  # in place
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/train.jsonl") == new
    moved = env.link.down.bytes - before
    plain = plain_cost(old, new)
    assert new_bytes(old, new) > len(new) // 2  # edits everywhere: most chunks changed
    assert moved < plain // 4


@pytest.mark.parametrize("lost", ["version", "chunks"])
async def test_a_base_the_delta_store_lost_falls_back_to_plain_frames(
    env: Fabric, tmp_path: Path, lost: str
) -> None:
    """The store forgot the version (a fresh store) or kept its map but evicted its chunks
    (a store too small to hold it): the read still gets the right bytes, as plain frames."""
    chunks = env.hub.chunks
    assert chunks.delta_store is not None
    chunks.delta_store.close()
    chunks.delta_store = DeltaStore(tmp_path / "small.db", 256 * 1024)
    rng = random.Random(9)
    rows = text_rows(rng, 12_000)
    old = b"".join(rows)
    await env.hub.namespace.write_bytes(WHO, "/vol/evicted.jsonl", old)
    assert await env.spoke.read_bytes(WHO, "/vol/evicted.jsonl") == old
    if lost == "version":
        chunks.delta_store.close()
        chunks.delta_store = DeltaStore(tmp_path / "fresh.db", 1 << 30)
    new = b"".join(edited_rows(rng, rows, 0.02))
    await env.hub.namespace.write_bytes(WHO, "/vol/evicted.jsonl", new)
    unknown = BASES.labels("unknown")._value.get()
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/evicted.jsonl") == new
    moved = env.link.down.bytes - before
    plain = plain_cost(old, new)
    # at most the last chunks kept (256 KiB of frames) could serve as a base
    assert plain - 256 * 1024 <= moved <= plain + map_cost(new) + OVERHEAD
    assert BASES.labels("unknown")._value.get() == unknown + (lost == "version")


def test_the_delta_store_is_bounded_survives_a_restart_and_never_returns_damaged_bytes(
    tmp_path: Path,
) -> None:
    data = b"".join(text_rows(random.Random(10), 6_000))
    cmap = map_of(data)
    frames = {p.id: encode_chunk(data[p.offset : p.end]) for p in cmap}
    path = tmp_path / "store.db"
    store = DeltaStore(path, sum(len(f) for f in frames.values()))
    store.record("/f", 1, cmap)
    for piece in cmap:
        store.keep(piece.id, data[piece.offset : piece.end], frames[piece.id])
    reference = store.reference("/f", 1)
    assert reference is not None and reference.read(0, len(data)) == data
    assert store.reference("/f", 2) is None
    store.close()

    store = DeltaStore(path, store.capacity)  # reopened: all still there
    assert store.size == sum(len(f) for f in frames.values())
    noise = blob(5000, 16)  # incompressible chunks are not kept
    store.keep(chunk_map_of(io.BytesIO(noise))[0].id, noise)
    assert store.size == sum(len(f) for f in frames.values())
    # one more chunk than fits: the least recently used (the first kept) goes
    extra = b"x" * 5000
    store.keep(chunk_map_of(io.BytesIO(extra))[0].id, extra)
    assert store.size <= store.capacity
    reference = store.reference("/f", 1)
    assert reference is not None
    assert reference.read(0, len(data)) == b""  # the first chunk is gone: nothing exact
    # from the second chunk on, bytes are exact up to the first damaged chunk
    second, third = cmap[1], cmap[2]
    with sqlite3.connect(path) as db:
        db.execute("UPDATE chunks SET frame = ? WHERE id = ?", (frames[cmap[0].id], third.id))
    assert reference.read(second.offset, len(data)) == data[second.offset : third.offset]
    store.close()


async def test_a_small_file_is_warmed_whole_and_compressed(env: Fabric) -> None:
    data = b"".join(text_rows(random.Random(11), 2_000))
    assert len(data) <= 1 << 20  # a file the spoke fetches whole, without a chunk map
    await env.hub.namespace.mkdir(WHO, "/vol/small")
    await env.hub.namespace.write_bytes(WHO, "/vol/small/rows.jsonl", data)
    before = env.link.down.bytes
    await env.spoke.warm(WHO, "/vol/small")
    moved = env.link.down.bytes - before
    assert await env.spoke.read_bytes(WHO, "/vol/small/rows.jsonl") == data
    assert moved <= len(encode_chunk(data)) + OVERHEAD < len(data)


async def test_a_small_file_rewritten_with_the_same_bytes_moves_no_content(env: Fabric) -> None:
    """A new version of the same bytes (a new mtime, as upgrades and copies leave files)
    costs the spoke its id, not the bytes; changed bytes still come whole."""
    data = b"".join(text_rows(random.Random(12), 2_000))
    await env.hub.namespace.mkdir(WHO, "/vol/small")
    await env.hub.namespace.write_bytes(WHO, "/vol/small/rows.jsonl", data)
    await env.spoke.warm(WHO, "/vol/small")
    await env.hub.namespace.write_bytes(WHO, "/vol/small/rows.jsonl", data)
    before = env.link.down.bytes
    await env.spoke.warm(WHO, "/vol/small")
    moved = env.link.down.bytes - before
    assert await env.spoke.read_bytes(WHO, "/vol/small/rows.jsonl") == data
    assert moved < len(encode_chunk(data)) // 4
    edited = data.replace(b"a", b"b", 50)
    await env.hub.namespace.write_bytes(WHO, "/vol/small/rows.jsonl", edited)
    await env.spoke.warm(WHO, "/vol/small")
    assert await env.spoke.read_bytes(WHO, "/vol/small/rows.jsonl") == edited


async def test_a_base_that_gives_no_delta_is_dropped_after_a_few_chunks(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random files picked as each other's base by their names: the hub stops trying
    deltas against it after DELTA_TRIAL chunks; a related base is tried for every chunk."""
    tried: list[bytes] = []
    real = hub_chunks.encode_delta  # type: ignore[attr-defined]

    def counted(data: bytes | memoryview, *args: Any) -> bytes:
        tried.append(bytes(data[:8]))
        return real(data, *args)

    monkeypatch.setattr(hub_chunks, "encode_delta", counted)
    ns, chunks = env.hub.namespace, env.hub.chunks
    rows = text_rows(random.Random(12), 12_000)
    for name, data in [
        ("a.bin", blob(4 * MiB, 13)),
        ("b.bin", blob(4 * MiB, 14)),
        ("old.jsonl", b"".join(rows)),
        ("new.jsonl", b"".join(edited_rows(random.Random(15), rows, 0.02))),
    ]:
        await ns.write_bytes(WHO, f"/vol/{name}", data)
    for target, base in [("b.bin", "a.bin"), ("new.jsonl", "old.jsonl")]:
        _, cmap = await chunks.chunk_map(WHO, f"/vol/{target}")
        held, _ = await chunks.chunk_map(WHO, f"/vol/{base}")
        wanted = [Wanted(p.id, p.offset) for p in cmap]
        tried.clear()
        records = [
            r async for batch in chunks.frames(wanted, (held.path, held.version)) for r in batch
        ]
        assert len(records) == len(cmap) > hub_chunks.DELTA_TRIAL
        if base == "a.bin":  # each encoder thread may start one more before it stops
            assert len(tried) <= hub_chunks.DELTA_TRIAL + chunks.pipeline.workers
            assert len(tried) < len(cmap) // 2
        else:
            assert len(tried) == len(cmap)


async def test_a_warm_up_asks_each_map_once_and_overlaps_consecutive_files(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Files of several runs each: their runs miss together, yet ask for the map once;
    maps are asked one at a time in walk order (the first file's is not held up behind
    the others'); the next file's map is asked, and its fetch started, while the one
    before is still being fetched."""
    chunks, fill = env.hub.chunks, env.spoke.cache.chunks
    assert fill is not None
    events: list[str] = []
    chunk_map, assemble = chunks.chunk_map, fill.assemble

    async def mapped(who: Principal, path: str) -> tuple[Any, ChunkMap]:
        events.append(f"map {path}")
        try:
            return await chunk_map(who, path)
        finally:
            events.append(f"mapped {path}")

    async def filled(entry: Any, start: int, length: int) -> bytes | None:
        events.append(f"fill {entry.path}")
        try:
            return await assemble(entry, start, length)
        finally:
            events.append(f"filled {entry.path}")

    monkeypatch.setattr(chunks, "chunk_map", mapped)
    monkeypatch.setattr(fill, "assemble", filled)
    await env.hub.namespace.mkdir(WHO, "/vol/warm")
    files = {f"/vol/warm/{i}.bin": blob(12 * MiB, 20 + i) for i in range(3)}
    for path, data in files.items():
        await env.hub.namespace.write_bytes(WHO, path, data)
    await env.spoke.warm(WHO, "/vol/warm")
    asked = [e.removeprefix("map ") for e in events if e.startswith("map ")]
    assert asked == sorted(files)  # once each, though each file is two runs; in order
    maps = [e for e in events if e.startswith("map")]
    assert maps == [f"{e} {path}" for path in sorted(files) for e in ("map", "mapped")]
    last_fill_of_first = max(i for i, e in enumerate(events) if e == "filled /vol/warm/0.bin")
    assert events.index("map /vol/warm/1.bin") < last_fill_of_first
    # two files at a time: the second one's fills start before the first one's end
    assert events.index("fill /vol/warm/1.bin") < last_fill_of_first
    for path, data in files.items():
        assert await env.spoke.read_bytes(WHO, path) == data


async def test_a_cold_fill_reads_no_holes_yet_finds_chunks_kept_beside_an_earlier_run(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The chunk index lists a file's own places as soon as its map is here: a run being
    filled must not read them back (holes; a thread hop per chunk held up each run's
    request on bench/transfer.py's corpus 5). A chunk kept beside an earlier run, across
    the block it shares with the next one, is still reused by that next run."""
    fill = env.spoke.cache.chunks
    assert fill is not None
    reads: list[tuple[int, int, int]] = []
    fetched: list[bytes] = []
    read, fetch = fill._read, fill.link.fetch_chunks

    def counted(file_id: int, offset: int, length: int) -> bytes | None:
        reads.append((file_id, offset, length))
        return read(file_id, offset, length)

    def fetching(ids: Any, **kwargs: Any) -> AsyncIterator[bytes | None]:
        fetched.extend(ids)
        return fetch(ids, **kwargs)

    monkeypatch.setattr(fill, "_read", counted)
    monkeypatch.setattr(fill.link, "fetch_chunks", fetching)
    data = blob(12 * MiB, 30)
    await env.hub.namespace.write_bytes(WHO, "/vol/cold.bin", data)
    async with await env.spoke.read(WHO, "/vol/cold.bin", 0, 4 * MiB) as reader:
        assert await reader.read_all() == data[: 4 * MiB]
    assert reads == []  # nothing cached could hold any of it
    cmap = map_of(data)
    straddling = next(p for p in cmap if p.offset < 4 * MiB < p.end)
    assert straddling.id in fetched
    fetched.clear()
    assert await env.spoke.read_bytes(WHO, "/vol/cold.bin") == data
    assert straddling.id not in fetched  # read back from beside the first run
    assert {p.id for p in cmap if p.offset >= 4 * MiB} - {straddling.id} <= set(fetched)
    assert any(offset == straddling.offset for _, offset, _ in reads)


async def test_siblings_by_name_that_bring_no_delta_are_no_longer_named_as_bases(
    env: Fabric, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Random files picked as each other's base by their names alone: once FRUITLESS_FILES
    of them brought no delta frame, the spoke names no such base in that directory (the
    hub's trials cost a region search per chunk, holding the GIL). Files of another suffix
    there still get their by-name base, and it pays."""
    fill = env.spoke.cache.chunks
    assert fill is not None
    bases: list[str | None] = []
    fetch = fill.link.fetch_chunks

    def fetching(ids: Any, *, base: Any = None, at: Any = ()) -> AsyncIterator[bytes | None]:
        bases.append(base[0] if base is not None else None)
        return fetch(ids, base=base, at=at)

    monkeypatch.setattr(fill.link, "fetch_chunks", fetching)
    ns = env.hub.namespace
    await ns.mkdir(WHO, "/vol/media")
    clips = {f"/vol/media/clip-{i}.bin": blob(3 * MiB, 40 + i) for i in range(4)}
    named: list[set[str | None]] = []
    for path, data in clips.items():
        await ns.write_bytes(WHO, path, data)
        bases.clear()
        assert await env.spoke.read_bytes(WHO, path) == data
        named.append(set(bases))
    assert named == [{None}, {"/vol/media/clip-0.bin"}, {"/vol/media/clip-1.bin"}, {None}]
    assert spoke_chunkfill.FRUITLESS_FILES == 2  # what the list above spells out
    rows = b"".join(text_rows(random.Random(16), 12_000))
    edited = bytearray(rows)
    for at in range(0, len(edited), 8192):  # every chunk changes, none moves
        edited[at] ^= 1
    assert not map_of(rows).ids() & map_of(bytes(edited)).ids()
    await ns.write_bytes(WHO, "/vol/media/rows-1.jsonl", rows)
    await ns.write_bytes(WHO, "/vol/media/rows-2.jsonl", bytes(edited))
    assert await env.spoke.read_bytes(WHO, "/vol/media/rows-1.jsonl") == rows
    bases.clear()
    before = env.link.down.bytes
    assert await env.spoke.read_bytes(WHO, "/vol/media/rows-2.jsonl") == edited
    assert set(bases) == {"/vol/media/rows-1.jsonl"}
    assert env.link.down.bytes - before < len(edited) // 10  # deltas, not whole chunks
