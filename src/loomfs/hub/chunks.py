"""The hub's chunks (hub layer): chunk maps per file version and the chunk index.

Files stay in their original form in the volumes; chunks are only the unit of transfer
and dedup. The first time a spoke asks for a file version's chunk map the hub computes it
(FastCDC + BLAKE3 on the pipeline's threads) and keeps it in the catalog, with one index
row per chunk: chunk id -> (entry, version, offset, length), pointing into the file as it
is. Index rows of a version the entry no longer has are ignored (and dropped when the
entry's next map is stored), and every chunk read through the index is verified by its
hash: a file changed in place without a new version (same size and mtime) fails there,
its rows are dropped, and the chunk is answered as unavailable, never with wrong bytes.

Uploads: a spoke asks which of a file's chunks the hub lacks, sends only those (verified
on receipt, staged on local disk), then commits the file assembled from the staged chunks
and chunks the index finds in any file, through the namespace's write: atomically in
place, with the writer's version precondition, leases and the change feed as for any
write. The map of the committed version is known then and stored at once.

Small files go whole, alone or many in one bundle (``chunks.bundle``); each one sent is
kept in the delta store by its id, the base of a delta when its next version is bundled.

With a ``ChunkGate`` (the hub's governed namespace) every call names its caller and is
decided as the namespace would: a chunk map is a read of its file, a commit a write of
its path, and a chunk asked for by id is sent only out of a file the caller may read. A
chunk that sits only in files refused to the caller is answered as not held (an empty
frame: the spoke falls back to a ranged read of its own file, itself checked), counts as
missing for upload dedup (the caller sends its own bytes) and can't be committed from
the index. So no chunk id, learned however, opens a restricted file's bytes, and asking
reveals no more than that the hub holds the chunk in no file the caller may read.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import Counter

from ..chunks import bundle as bundles
from ..chunks.chunkmap import ChunkMap
from ..chunks.codec import (
    DEFAULT_SETTINGS,
    REFERENCE_KINDS,
    Reference,
    chunk_id,
    decode_frame,
    encode_chunk,
    encode_delta,
)
from ..chunks.metrics import Transfer
from ..chunks.pipeline import BATCH_BYTES, ChunkPipeline
from ..chunks.records import record
from ..core.catalog.sql import Cursor, SqlCatalog, _join
from ..core.metrics import HUB
from ..core.streams import FileRegion
from ..core.types import SPECIAL_KINDS, SYSTEM, Entry, Principal, WriteTags
from ..errors import (
    Conflict,
    CorruptData,
    InvalidArgument,
    IsADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
    UnsupportedScheme,
)
from ..namespace.base import Reader
from ..namespace.chunklink import Wanted
from .deltastore import DeltaStore
from .namespace import HubNamespace

log = logging.getLogger(__name__)

MAPS_COMPUTED = Counter(
    "loomfs_chunk_maps_computed_total", "Chunk maps computed at the hub", registry=HUB
)
STALE_SOURCES = Counter(
    "loomfs_chunk_stale_sources_total",
    "Index entries found changed in place when read",
    registry=HUB,
)

DELTA_TRIAL = 8  # chunks tried against a base before giving up on it (``_DeltaOdds``)
MAX_BATCH = 4096  # chunk ids per request: ~400 MiB of average chunks, 150 KiB of JSON
_IN = 400  # ids per IN (...) lookup


@dataclass(frozen=True, slots=True)
class Source:
    """Where the index says a chunk's bytes sit."""

    entry_id: int
    path: str
    version: int
    offset: int
    length: int


class ChunkGate(Protocol):
    """What a caller may receive or write through chunks (the governed namespace)."""

    async def guarded(self, who: Principal) -> bool:
        """Whether anything may be refused to ``who`` (else no per-file checks)."""
        ...

    async def check_read(self, who: Principal, path: str) -> None: ...

    async def check_write(self, who: Principal, path: str) -> None: ...


class _RegionReference:
    """A file version read in place through an open region (posix volumes)."""

    def __init__(self, region: FileRegion) -> None:
        self._region = region

    def read(self, offset: int, length: int) -> bytes:
        end = min(offset + length, self._region.length)
        if offset >= end:
            return b""
        return os.pread(self._region.fd, end - offset, self._region.offset + offset)


class _DeltaOdds:
    """Whether delta frames against one request's base still look worth their cost. A
    base that gave no delta frame for the first ``DELTA_TRIAL`` chunks (an unrelated file
    the receiver picked by its name: random bytes beside random bytes) is not tried for
    the rest of the request, sparing a region search and a ~560 KiB dictionary load per
    chunk. Shared by the encoder threads: a count off by one only shifts when it stops."""

    def __init__(self) -> None:
        self.tried = self.paid = 0

    def worth(self) -> bool:
        return self.paid > 0 or self.tried < DELTA_TRIAL

    def saw(self, frame: bytes) -> None:
        self.tried += 1
        if frame[0] & 0x0F in REFERENCE_KINDS:
            self.paid += 1


class _SyncStream:
    """A blocking ``readinto`` over a Reader, for the pipeline's cutting thread: preads
    where the bytes sit in a local file, else the async stream through the event loop."""

    def __init__(self, reader: Reader, loop: asyncio.AbstractEventLoop) -> None:
        self._region = reader.region
        self._chunks = reader.chunks()
        self._loop = loop
        self._pos = 0
        self._left = memoryview(b"")

    def readinto(self, buffer: memoryview, /) -> int:
        if self._region is not None:
            want = min(len(buffer), self._region.length - self._pos)
            if want <= 0:
                return 0
            got = os.preadv(self._region.fd, [buffer[:want]], self._region.offset + self._pos)
            self._pos += got
            return got
        if not self._left:
            future = asyncio.run_coroutine_threadsafe(anext(self._chunks, b""), self._loop)
            self._left = memoryview(future.result())
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


class HubChunks:
    def __init__(
        self,
        namespace: HubNamespace,
        staging: Path,
        workers: int | None = None,
        gate: ChunkGate | None = None,
        delta_store: DeltaStore | None = None,
    ) -> None:
        catalog = namespace.catalog
        if not isinstance(catalog, SqlCatalog):
            raise UnsupportedScheme(f"chunk maps need a SQL catalog, not {catalog.url}")
        self._cat = catalog
        self.namespace = namespace
        #: placement: what each caller may receive or write through chunks
        self.gate = gate
        self.staging = staging
        self.pipeline = ChunkPipeline(workers)
        self._encoders = ThreadPoolExecutor(self.pipeline.workers, thread_name_prefix="loomfs-enc")
        self._mapping: dict[tuple[str, int], asyncio.Future[ChunkMap]] = {}
        #: bytes of versions spokes hold, for deltas once the volume's file moved on
        self.delta_store = delta_store
        #: a test hook: applied to every frame before it is sent (to corrupt one in flight)
        self.frame_hook: Callable[[bytes], bytes] | None = None

    def close(self) -> None:
        self.pipeline.close()
        self._encoders.shutdown(wait=True, cancel_futures=True)
        if self.delta_store is not None:
            self.delta_store.close()

    # -- chunk maps ------------------------------------------------------------------------

    async def chunk_map(self, who: Principal, path: str) -> tuple[Entry, ChunkMap]:
        """The entry of ``path`` and its current version's chunk map: stored, or computed
        now (one computation per version however many spokes ask at once)."""
        if self.gate is not None:
            await self.gate.check_read(who, path)  # the map names the file's bytes
        # a symlink's map is its target's (the bytes a read of it returns)
        entry = await self.namespace.stat_for_read(who, path)
        if entry.is_dir:
            raise IsADirectory(f"is a directory: {path}", path=path)
        if entry.kind in SPECIAL_KINDS:  # nothing to cut, and opening one may block
            raise NotSupported(f"{path} is a special file: it has no content", path=path)
        stored = await self._stored_map(entry)
        if stored is None:
            stored = await self._map_once(who, entry)
        if self.delta_store is not None:  # the asker will hold this version
            await asyncio.to_thread(self.delta_store.record, entry.path, entry.version, stored)
        return entry, stored

    async def _map_once(self, who: Principal, entry: Entry) -> ChunkMap:
        key = (entry.path, entry.version)
        pending = self._mapping.get(key)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[ChunkMap] = asyncio.get_running_loop().create_future()
        self._mapping[key] = future
        try:
            cmap = await self._compute(who, entry)
            await self.remember(entry, cmap)
        except BaseException as exc:
            if isinstance(exc, Exception):
                future.set_exception(exc)
                future.exception()  # the waiters re-raise it themselves
            else:
                future.cancel()
            raise
        finally:
            del self._mapping[key]
        future.set_result(cmap)
        return cmap

    async def _compute(self, who: Principal, entry: Entry) -> ChunkMap:
        async with await self.namespace.read(who, entry.path, if_version=entry.version) as reader:
            stream = _SyncStream(reader, asyncio.get_running_loop())
            cmap = await asyncio.to_thread(self.pipeline.map_stream, stream)
            await reader.verify()  # changed in place while it was cut: refuse the map
        if cmap.size != entry.size:
            raise Conflict(f"{entry.path} changed while it was chunked", path=entry.path)
        MAPS_COMPUTED.inc()
        return cmap

    async def _stored_map(self, entry: Entry) -> ChunkMap | None:
        def fn(cur: Cursor) -> str | None:
            hit = self._cat._get(cur, entry.path)
            if hit is None:
                return None
            row = self._cat._q(
                cur,
                "SELECT chunk_map FROM chunk_maps WHERE entry_id = ? AND version = ?",
                (hit[0], entry.version),
            ).fetchone()
            return None if row is None else str(row[0])

        text = await self._cat._run(self._cat._read, fn)
        return None if text is None else ChunkMap.deserialize(bytes.fromhex(text))

    async def remember(self, entry: Entry, cmap: ChunkMap) -> None:
        """Store the map of ``entry``'s version and index its chunks, replacing what the
        entry had; nothing is stored if the entry has moved on to another version."""
        first: dict[bytes, tuple[int, int]] = {}
        for piece in cmap:
            first.setdefault(piece.id, (piece.offset, piece.length))

        def fn(cur: Cursor) -> None:
            q = self._cat._q
            hit = self._cat._get(cur, entry.path)
            if hit is None or hit[1].version != entry.version:
                return
            entry_id = hit[0]
            q(cur, "DELETE FROM chunk_maps WHERE entry_id = ?", (entry_id,))
            q(cur, "DELETE FROM chunk_index WHERE entry_id = ?", (entry_id,))
            q(
                cur,
                "INSERT INTO chunk_maps (entry_id, version, chunk_map) VALUES (?, ?, ?)",
                (entry_id, entry.version, cmap.serialize().hex()),
            )
            cur.executemany(
                self._cat._sql(
                    "INSERT INTO chunk_index (chunk_id, entry_id, version, pos, length) "
                    "VALUES (?, ?, ?, ?, ?)"
                ),
                [(cid.hex(), entry_id, entry.version, o, n) for cid, (o, n) in first.items()],
            )

        await self._cat._run(self._cat._write, fn)

    async def _forget(self, entry_id: int) -> None:
        def fn(cur: Cursor) -> None:
            self._cat._q(cur, "DELETE FROM chunk_maps WHERE entry_id = ?", (entry_id,))
            self._cat._q(cur, "DELETE FROM chunk_index WHERE entry_id = ?", (entry_id,))

        await self._cat._run(self._cat._write, fn)

    # -- the chunk index -------------------------------------------------------------------

    async def sources(
        self, ids: Sequence[bytes], who: Principal | None = None
    ) -> dict[bytes, Source]:
        """One place each of ``ids`` sits in a file at the version the index recorded;
        with ``who``, in a file the gate lets ``who`` read (else the id is left out)."""
        places = await self._places(ids)
        if who is None or self.gate is None or not await self.gate.guarded(who):
            return {cid: found[0] for cid, found in places.items()}
        gate = self.gate
        readable: dict[str, bool] = {}
        out: dict[bytes, Source] = {}
        for cid, found in places.items():
            for source in found:
                if source.path not in readable:
                    try:
                        await gate.check_read(who, source.path)
                        readable[source.path] = True
                    except (PermissionDenied, NotFound):
                        readable[source.path] = False
                if readable[source.path]:
                    out[cid] = source
                    break
        return out

    async def _places(self, ids: Sequence[bytes]) -> dict[bytes, list[Source]]:
        """Every place each of ``ids`` sits in a file at the version the index recorded."""

        def fn(cur: Cursor) -> dict[bytes, list[Source]]:
            found: dict[bytes, list[Source]] = {}
            wanted = sorted({cid.hex() for cid in ids})
            for i in range(0, len(wanted), _IN):
                part = wanted[i : i + _IN]
                rows = self._cat._q(
                    cur,
                    "SELECT ci.chunk_id, ci.entry_id, e.parent, e.name, ci.version, ci.pos, "
                    "ci.length FROM chunk_index ci JOIN entries e "
                    "ON e.id = ci.entry_id AND e.version = ci.version "
                    f"WHERE ci.chunk_id IN ({','.join('?' * len(part))})",
                    part,
                ).fetchall()
                for cid, entry_id, parent, name, version, pos, length in rows:
                    found.setdefault(bytes.fromhex(cid), []).append(
                        Source(entry_id, _join(parent, name), version, pos, length)
                    )
            return found

        return await self._cat._run(self._cat._read, fn)

    async def missing(self, ids: Sequence[bytes], who: Principal | None = None) -> list[bytes]:
        """Which of ``ids`` the hub holds in no file (nor staged from an earlier upload);
        with ``who``, in no file ``who`` may read."""
        _check_batch(ids)
        held = await self.sources(ids, who)
        return [cid for cid in dict.fromkeys(ids) if cid not in held and not self._staged(cid)]

    # -- download --------------------------------------------------------------------------

    async def frames(
        self,
        wanted: Sequence[Wanted],
        base: tuple[str, int] | None = None,
        transfer: Transfer | None = None,
        who: Principal | None = None,
    ) -> AsyncGenerator[list[bytes], None]:
        """One record per wanted chunk, in order, a list per encoded batch (a route
        writes each list at once: a write per record cost the event loop, which carries
        the link, a TLS and socket round per ~80 KiB chunk): its frame (encoded on the
        worker threads, two batches ahead), or empty where no verified copy exists (with
        ``who``: none in a file ``who`` may read). With ``base`` (a file version the
        receiver holds, still at that version here, and readable by ``who``), chunks
        with a delta estimate are encoded against it."""
        _check_batch([w.id for w in wanted])
        sources = await self.sources([w.id for w in wanted], who)
        if base is not None and who is not None and self.gate is not None:
            try:
                await self.gate.check_read(who, base[0])
            except (PermissionDenied, NotFound):
                base = None  # plain frames: a delta against it would tell of its bytes
        readers: dict[tuple[str, int], Reader | None] = {}
        held: Reader | None = None
        try:
            for found in sources.values():
                key = (found.path, found.version)
                if key not in readers:
                    readers[key] = await self._open(found.path, found.version)
            reference: Reference | None = None
            if base is not None:
                held = await self._open(*base)
                if held is not None and held.region is not None:
                    reference = _RegionReference(held.region)
                elif self.delta_store is not None:
                    # changed in place since the receiver got it (or in an object store,
                    # not read in place): the delta store may keep it
                    reference = await asyncio.to_thread(self.delta_store.reference, *base)
            odds = _DeltaOdds()
            loop = asyncio.get_running_loop()
            pending: list[asyncio.Future[list[tuple[bytes, int, int]]]] = []
            batch: list[tuple[Wanted, Source | None, bytes | None]] = []
            size = 0
            for index, want in enumerate(wanted):
                source = sources.get(want.id)
                reader = readers.get((source.path, source.version)) if source else None
                data = None
                if source is not None and reader is not None and reader.region is None:
                    data = await self._read_range(source)  # no local file: read it now
                    reader = reader if data is not None else None
                batch.append((want, source if reader is not None else None, data))
                size += source.length if source else 0
                if size >= BATCH_BYTES or index == len(wanted) - 1:
                    job = self._encode_batch(batch, readers, reference, odds)
                    pending.append(loop.run_in_executor(self._encoders, job))
                    batch, size = [], 0
                if len(pending) >= 2:
                    yield await self._emit(pending.pop(0), transfer)
            while pending:
                yield await self._emit(pending.pop(0), transfer)
        finally:
            for reader in [*readers.values(), held]:
                if reader is not None:
                    await reader.aclose()

    async def _emit(
        self, job: Awaitable[list[tuple[bytes, int, int]]], transfer: Transfer | None
    ) -> list[bytes]:
        out = []
        for encoded, raw_length, bad_entry in await job:
            if bad_entry >= 0:
                STALE_SOURCES.inc()
                log.warning("a chunk source changed in place; forgetting its map")
                await self._forget(bad_entry)
            frame = self.frame_hook(encoded) if self.frame_hook and encoded else encoded
            if transfer is not None and frame:
                transfer.sent(raw_length, len(frame))
            out.append(record(frame or None))
        return out

    def _encode_batch(
        self,
        batch: list[tuple[Wanted, Source | None, bytes | None]],
        readers: dict[tuple[str, int], Reader | None],
        reference: Reference | None,
        odds: _DeltaOdds,
    ) -> Callable[[], list[tuple[bytes, int, int]]]:
        """(frame or b"", raw length, entry id to forget or -1) per chunk."""

        def run() -> list[tuple[bytes, int, int]]:
            out: list[tuple[bytes, int, int]] = []
            for want, source, fetched in batch:
                if source is None:
                    out.append((b"", 0, -1))
                    continue
                data = fetched
                if data is None:
                    reader = readers[(source.path, source.version)]
                    assert reader is not None and reader.region is not None
                    region = reader.region
                    data = os.pread(region.fd, source.length, region.offset + source.offset)
                if chunk_id(data) != want.id:
                    out.append((b"", 0, source.entry_id))
                    continue
                if reference is not None and want.delta_from is not None and odds.worth():
                    frame = encode_delta(data, reference, want.delta_from, DEFAULT_SETTINGS)
                    odds.saw(frame)
                else:
                    frame = encode_chunk(data, DEFAULT_SETTINGS)
                if self.delta_store is not None:  # the receiver will hold it: a future base
                    self.delta_store.keep(want.id, data, frame)
                out.append((frame, len(data), -1))
            return out

        return run

    async def _open(self, path: str, version: int) -> Reader | None:
        """The whole file at ``version`` (None: it is no longer at that version)."""
        try:
            return await self.namespace.read(SYSTEM, path, if_version=version)
        except (Conflict, NotFound, IsADirectory):
            return None

    async def _read_range(self, source: Source) -> bytes | None:
        try:
            async with await self.namespace.read(
                SYSTEM, source.path, source.offset, source.length, if_version=source.version
            ) as reader:
                return await reader.read_all()
        except (Conflict, NotFound):
            return None

    # -- small files in bundles -----------------------------------------------------------

    async def keep_whole(self, data: bytes, frame: bytes) -> None:
        """A small file sent whole (as ``frame``), kept by its id: the receiver holds it
        now, and it is the base of a bundle's delta of its next version."""
        if self.delta_store is not None:
            await asyncio.to_thread(self.delta_store.keep, chunk_id(data), data, frame)

    async def bundle(self, files: Sequence[tuple[bytes, bytes]]) -> tuple[list[int], bytes]:
        """One frame (``chunks.bundle``) of the bytes of ``files``, given as (bytes, the
        BLAKE3 id of the version the receiver holds of that path, or b""), and the
        indices of the files whose held version is its dictionary, in order: those
        changed whose held bytes the delta store keeps. Each file sent is kept there by
        its id (it will be held, a base for its next version)."""

        def run() -> tuple[list[int], bytes]:
            store = self.delta_store
            bases: list[int] = []
            base_bytes: list[bytes] = []
            for index, (_, have) in enumerate(files):
                if store is None or not have:
                    continue
                held = store.chunk(have)
                if held is not None and sum(map(len, base_bytes)) + len(held) <= bundles.MAX_BYTES:
                    bases.append(index)
                    base_bytes.append(held)
            frame = bundles.encode([data for data, _ in files], base_bytes)
            if store is not None:
                for data, _ in files:
                    store.keep(chunk_id(data), data)
            return bases, frame

        return await asyncio.get_running_loop().run_in_executor(self._encoders, run)

    # -- upload ----------------------------------------------------------------------------

    def _staged_path(self, cid: bytes) -> Path:
        return self.staging / cid.hex()

    def _staged(self, cid: bytes) -> bool:
        return self._staged_path(cid).exists()

    async def receive(
        self, records: AsyncIterator[tuple[bytes, bytes]], transfer: Transfer | None = None
    ) -> int:
        """Decode, verify and stage uploaded chunks; a bad frame fails the whole request
        (its good chunks stay staged) and nothing unverified is ever kept."""
        self.staging.mkdir(parents=True, exist_ok=True)
        count = 0
        async for cid, frame in records:
            data = await asyncio.to_thread(decode_frame, frame, cid)
            await asyncio.to_thread(self._stage, cid, data)
            if transfer is not None:
                transfer.sent(len(data), len(frame) + len(cid))
            count += 1
        return count

    def _stage(self, cid: bytes, data: bytes) -> None:
        fd, temp = tempfile.mkstemp(dir=self.staging, prefix=".in-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(data)
            os.replace(temp, self._staged_path(cid))
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            raise

    async def commit(
        self,
        who: Principal,
        path: str,
        cmap: ChunkMap,
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        transfer: Transfer | None = None,
        tags: WriteTags | None = None,
    ) -> Entry:
        """Write ``path`` assembled from ``cmap``'s chunks through the namespace. Every
        chunk must be staged or indexed (else ``Conflict`` before anything is written) and
        is verified again as it is copied, so a source changed meanwhile aborts the write,
        which then leaves the old version in place (``CorruptData``: retryable, unlike a
        precondition's ``Conflict``). With the gate, ``who`` must be allowed to write
        ``path``, and only chunks staged or held in files ``who`` may read are used."""
        if self.gate is not None:
            await self.gate.check_write(who, path)
        staged = {c for c in cmap.ids() if self._staged(c)}
        sources = await self.sources([c for c in cmap.ids() if c not in staged], who)
        lacking = cmap.ids() - staged - set(sources)
        if lacking:
            raise CorruptData(
                f"the hub lacks {len(lacking)} chunks of {path}; upload them first", path=path
            )

        async def body() -> AsyncIterator[bytes]:
            for piece in cmap:
                if piece.id in staged:
                    data = await asyncio.to_thread(self._staged_path(piece.id).read_bytes)
                else:
                    data = await self._read_range(sources[piece.id]) or b""
                if len(data) != piece.length or chunk_id(data) != piece.id:
                    raise CorruptData(f"a chunk source of {path} changed; retry", path=path)
                if transfer is not None and piece.id not in staged:
                    transfer.held(piece.length)
                yield data

        entry = await self.namespace.write(
            who, path, body(), if_version=if_version, exclusive=exclusive, mode=mode,
            write_id=write_id, tags=tags,
        )  # fmt: skip
        with contextlib.suppress(Conflict, NotFound):
            await self.remember(entry, cmap)
        for cid in staged:
            with contextlib.suppress(FileNotFoundError):
                self._staged_path(cid).unlink()
        return entry

    def clear_staging(self, older_than: float | None = None) -> None:
        """Drop staged chunks of uploads that never committed (at start): all, or those
        staged more than ``older_than`` seconds ago."""
        if older_than is None:
            shutil.rmtree(self.staging, ignore_errors=True)
            return
        cutoff = time.time() - older_than
        for staged in self.staging.glob("*"):
            with contextlib.suppress(FileNotFoundError):
                if staged.stat().st_mtime < cutoff:
                    staged.unlink()


def _check_batch(ids: Sequence[Any]) -> None:
    if len(ids) > MAX_BATCH:
        raise InvalidArgument(f"at most {MAX_BATCH} chunk ids per request, not {len(ids)}")
