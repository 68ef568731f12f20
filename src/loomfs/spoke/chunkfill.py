"""Filling the spoke cache with chunks instead of byte ranges (spoke layer).

How chunks map onto the block cache: the cache keeps storing each file version as one
sparse data file of 1 MiB blocks (presence, hashes, eviction and restart checks as
before); chunks are not stored apart. What is added is the chunk map of each cached
version (persisted beside the block index) and, built from those maps, an in-memory chunk
index: chunk id -> every (cached file, offset, length) where a map puts it. A chunk counts
as held where its bytes, read back from that data file, hash to its id: holes of a sparse
file, torn writes and bit rot all fail that check, so nothing unverified is ever reused.

A miss on a run of blocks then asks for the version's map (once), lists the chunks that
cover the run, copies those held anywhere (any file, any version, including versions the
hub has since replaced: those are retired, never served, kept as chunk sources until
evicted) and fetches the rest in one batch. Frames are decoded and verified on worker
threads as they arrive (network, decoding and disk overlap, and the cache runs several
fills at once); a corrupt or truncated frame is fetched again, a chunk the hub no longer
holds sends the run back to the ranged fetch. Chunks sticking out of the run are written
too, so the next run finds them held. When the spoke holds an older version of the same
file (changed in place at the hub) or another cached file in the same directory shares the
file's layout (a checkpoint series), the hub may send delta frames against it: it is named
as the base only when complete here, and decoding failures fall back to plain frames.

Small files (up to the cache's ``SMALL_FILE``) come whole, never by map: one by one as
reads miss, or many in one bundle (``chunks.bundle``) as a warm-up asks for a tree. Either
way the spoke names the id of the version of the path it holds: the same bytes cost that
id, changed ones (in a bundle) a delta against it. A bundle also names (as a filter,
``bundle.holds``) the ids of the small files held here under any path, memoized per
cached version: a copy or a rename of one costs its id, and is read back from that file
and checked against the id.

The filler never touches the cache's data files itself: it reads chunk bytes back through
the cache (``read``: decrypted where the cache is sealed at rest, so a sealed cache's
chunk index works the same) and assembled runs are stored by the cache as blocks (sealed
there). Chunks sticking out of a run go through ``write``, which a sealed cache declines
(a block is sealed whole): those few chunks are fetched again by the next run. Uploads
read the journaled write through a ``PlainFile`` (opened frame by frame where sealed), so
the hub always gets plaintext and nothing plain is written to disk on the way.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import PurePosixPath
from typing import TYPE_CHECKING, Any, NamedTuple

from ..chunks import bundle
from ..chunks.chunkmap import ChunkEntry, ChunkMap
from ..chunks.codec import REFERENCE_KINDS, chunk_id, decode_frame, encode_chunk
from ..chunks.metrics import CORRUPT, Transfer
from ..chunks.pipeline import ChunkPipeline
from ..chunks.plan import choose_reference, plan_transfer
from ..chunks.records import record
from ..core.types import Entry, Principal
from ..errors import Conflict, CorruptData
from ..namespace.chunklink import ChunkLink, Named, SmallAsk
from .journal import PlainFile

if TYPE_CHECKING:
    from .cache import CachedFile

log = logging.getLogger(__name__)

ATTEMPTS = 3  # a chunk whose frame fails verification this often fails the read
MAX_BATCH = 4096  # chunk ids per request, as the hub accepts them
DECODE_GROUP = 1 << 20  # frame bytes decoded per thread hop
# Files of one directory and suffix whose base, picked by name alone, brought no delta
# frame, after which such siblings are no longer named as bases (``ChunkFiller._base``).
FRUITLESS_FILES = 2
# Held small files named to the hub (by a filter of their ids) per file a bundle asks for,
# the newest first: 12 bytes of filter a file asked, a third of its own held id (lodash's
# update, 17 files asked of 1,049 held: at 32, 0.8 KB of filter cost 0.02x rsync's bytes).
HOLDS_PER_FILE = 8
SCHEMA = """
CREATE TABLE IF NOT EXISTS chunk_maps (
    file_id INTEGER PRIMARY KEY REFERENCES files(id) ON DELETE CASCADE,
    map BLOB NOT NULL
);
"""

Location = tuple[int, int, int]  # (cached file id, offset, length)
#: read(file id, offset, length): those bytes of a cached file as written (None: unreadable)
ReadCached = Callable[[int, int, int], "bytes | None"]
#: write(file id, [(offset, bytes)]): keep chunk bytes outside the blocks being filled
WriteCached = Callable[[int, Sequence[tuple[int, bytes]]], None]


class _Base(NamedTuple):
    """The cached version named to the hub as the base of delta frames."""

    file: CachedFile
    map: ChunkMap
    by_name: bool  # a sibling sharing no chunk, picked by its name (``choose_reference``)


class _FileReference:
    """A cached file version as the base of delta frames (unreadable bytes read as none,
    which fails the frame's verification: the chunk is fetched again as a plain frame)."""

    def __init__(self, read: ReadCached, file_id: int) -> None:
        self._read = read
        self._file_id = file_id

    def read(self, offset: int, length: int) -> bytes:
        return self._read(self._file_id, offset, length) or b""


class ChunkFiller:
    def __init__(
        self,
        link: ChunkLink,
        db: Callable[[], sqlite3.Connection],
        lock: threading.Lock,
        read: ReadCached,
        write: WriteCached,
        files: Callable[[], dict[int, CachedFile]],
    ) -> None:
        self.link = link
        self._db = db
        self._lock = lock
        self._read = read
        self._write = write
        self._files = files
        self.maps: dict[int, ChunkMap] = {}
        self._where: dict[bytes, list[Location]] = {}
        self._inflight: dict[bytes, asyncio.Future[bytes]] = {}
        self._asking: dict[int, asyncio.Future[ChunkMap]] = {}
        self._pipeline: ChunkPipeline | None = None
        #: (directory, suffix) -> files there whose by-name base brought no delta frame
        self._fruitless: dict[tuple[PurePosixPath, str], set[int]] = {}
        #: cached file id -> BLAKE3 id of its whole bytes (small files a bundle named held)
        self._content: dict[int, bytes] = {}

    def close(self) -> None:
        if self._pipeline is not None:
            self._pipeline.close()
            self._pipeline = None

    # -- maps and the index ----------------------------------------------------------------

    def load(self) -> None:
        """Rebuild the chunk index from the maps of the versions the cache kept."""
        with self._lock:
            rows = self._db().execute("SELECT file_id, map FROM chunk_maps").fetchall()
        for file_id, blob in rows:
            if file_id in self._files():
                self._index(file_id, ChunkMap.deserialize(bytes(blob)))

    def _index(self, file_id: int, cmap: ChunkMap) -> None:
        self.maps[file_id] = cmap
        for piece in cmap:
            self._where.setdefault(piece.id, []).append((file_id, piece.offset, piece.length))

    def set_map(self, file_id: int, cmap: ChunkMap) -> None:
        if file_id in self.maps or file_id not in self._files():
            return  # known, or dropped (say evicted) while its map was on its way
        with self._lock:
            self._db().execute(
                "INSERT OR REPLACE INTO chunk_maps (file_id, map) VALUES (?, ?)",
                (file_id, cmap.serialize()),
            )
        self._index(file_id, cmap)

    def forget(self, file_id: int) -> None:
        """The file was dropped (its row, and so its map row, went with it)."""
        self._content.pop(file_id, None)
        cmap = self.maps.pop(file_id, None)
        if cmap is None:
            return
        for cid in cmap.ids():
            places = [p for p in self._where.get(cid, ()) if p[0] != file_id]
            if places:
                self._where[cid] = places
            else:
                self._where.pop(cid, None)

    def _places(self, cid: bytes) -> list[Location]:
        """Where the index puts chunk ``cid`` in bytes the cache may hold: a place that
        touches no present block is a hole (above all the very run being filled, whose
        own map listed it) and is not read. A chunk kept beside a run (``assemble``'s
        ``outside``) overlaps that run's blocks, so it is still found."""
        files = self._files()
        return [
            (file_id, offset, length)
            for file_id, offset, length in self._where.get(cid, ())
            if (cached := files.get(file_id)) is not None and cached.touches_present(offset, length)
        ]

    def _held(self, wanted: Sequence[tuple[bytes, list[Location]]]) -> dict[bytes, bytes]:
        """The bytes of each chunk ``wanted`` from the first of its places that verifiably
        holds them (one thread hop for all: one per chunk queued a run's request behind
        a hundred hops when nothing was held)."""
        found: dict[bytes, bytes] = {}
        for cid, places in wanted:
            for file_id, offset, length in places:
                data = self._read(file_id, offset, length)
                if data is not None and chunk_id(data) == cid:
                    found[cid] = data
                    break
        return found

    # -- filling ---------------------------------------------------------------------------

    async def chunk_map(self, entry: CachedFile) -> ChunkMap:
        """The version's map, asked of the hub once however many runs of it miss at once."""
        cmap = self.maps.get(entry.id)
        if cmap is not None:
            return cmap
        pending = self._asking.get(entry.id)
        if pending is None:
            pending = self._asking[entry.id] = asyncio.ensure_future(self._ask_map(entry))
            pending.add_done_callback(lambda _: self._asking.pop(entry.id, None))
        return await asyncio.shield(pending)

    async def _ask_map(self, entry: CachedFile) -> ChunkMap:
        opened = await self.link.open_chunked(entry.path)
        if opened.entry.version != entry.version or opened.chunk_map is None:
            raise Conflict(
                f"{entry.path} is at version {opened.entry.version}, not {entry.version}",
                path=entry.path,
            )
        self.set_map(entry.id, opened.chunk_map)
        return opened.chunk_map

    async def whole(self, entry: CachedFile, small: int, start: int, length: int) -> bytes | None:
        """A small file's bytes as one zstd frame (the hub answers files up to ``small``
        bytes whole, verified by their id), or none at all when they are those of the
        version of the path held here (rewritten with the same bytes, as upgrades and
        copies leave files); None if the hub is at another version now (the caller
        fetches the range, which says so)."""
        held, have = await asyncio.to_thread(self._newest_whole, self._others(entry, small))
        opened = await self.link.open_chunked(entry.path, small=small, have=have)
        if opened.entry.version != entry.version:
            return None
        data = held if opened.held is not None else opened.whole
        return None if data is None else data[start : start + length]

    async def bundle(
        self, entries: Sequence[CachedFile], small: int, who: Principal | None = None
    ) -> list[bytes | None]:
        """The bytes of each of ``entries`` (small files) in one request, read for ``who``
        (None: the spoke itself), verified: a file
        whose bytes are held here (a version of its path, or any small file: a copy, a
        rename) costs its id, a changed one a delta against the version of its path where
        the hub still has it (``chunks.bundle``); None for a file the hub sent none of or
        named by an id not found here (the caller fetches it alone)."""

        wanted = {entry.path for entry in entries}
        others: dict[str, list[CachedFile]] = {}
        whole: list[CachedFile] = []
        for cached in self._files().values():  # on the loop's thread, which changes them
            if cached.size <= small and cached.complete():
                whole.append(cached)
                if cached.path in wanted:
                    others.setdefault(cached.path, []).append(cached)
        # the newest first: a tree's copies are most likely of what came with it
        whole.sort(key=lambda f: f.id, reverse=True)
        whole = whole[: min(bundle.MAX_HOLDS, HOLDS_PER_FILE * len(entries))]
        known = dict(self._content)

        def asks() -> tuple[list[SmallAsk], dict[int, bytes]]:
            out = []
            for entry in entries:
                mine = [f for f in others.get(entry.path, ()) if f.id != entry.id]
                held, have = self._newest_whole(mine)
                out.append(SmallAsk(entry.path, entry.version, held, have))
            ids = {}
            for cached in whole:
                cid = known.get(cached.id)
                if cid is None:  # hashed once: a cached version's bytes never change
                    data = self._read(cached.id, 0, cached.size)
                    if data is None or len(data) != cached.size:
                        continue
                    cid = chunk_id(data)
                ids[cached.id] = cid
            return out, ids

        asked, ids = await asyncio.to_thread(asks)
        files = self._files()
        self._content.update((i, c) for i, c in ids.items() if i in files)
        holds = bundle.holds(set(ids.values()))
        got = await self.link.fetch_small(asked, small=small, holds=holds, who=who)
        if not any(isinstance(g, Named) for g in got):
            return [None if isinstance(g, Named) else g for g in got]
        # sizes as listed before the hop: a file dropped since reads back as None
        sizes = {cached.id: cached.size for cached in whole}
        by_id = {cid: (file_id, sizes[file_id]) for file_id, cid in ids.items()}

        def found() -> list[bytes | None]:
            out: list[bytes | None] = []
            for answer in got:
                if not isinstance(answer, Named):
                    out.append(answer)
                    continue
                file_id, size = by_id.get(answer.id, (0, 0))
                data = self._read(file_id, 0, size) if size else None
                # checked again: a false positive of the filter, or bytes gone since
                out.append(data if data is not None and chunk_id(data) == answer.id else None)
            return out

        return await asyncio.to_thread(found)

    def _others(self, entry: CachedFile, small: int) -> list[CachedFile]:
        """The other versions of ``entry``'s path cached whole (up to ``small`` bytes)."""
        return [
            f
            for f in self._files().values()
            if f.path == entry.path and f.id != entry.id and f.size <= small and f.complete()
        ]

    def _newest_whole(self, versions: list[CachedFile]) -> tuple[bytes | None, bytes]:
        """The bytes and id of the newest of ``versions`` that reads back whole; (None, b"")
        if none does (worker threads call this)."""
        for other in sorted(versions, key=lambda f: f.version, reverse=True):
            data = self._read(other.id, 0, other.size)
            if data is not None and len(data) == other.size:
                return data, chunk_id(data)
        return None, b""

    async def assemble(self, entry: CachedFile, start: int, length: int) -> bytes | None:
        """The bytes [start, start+length) of ``entry``, from chunks held here and fetched;
        None when the hub holds some chunk no more (the caller fetches the range)."""
        cmap = await self.chunk_map(entry)
        end = start + length
        pieces = [p for p in cmap if p.end > start and p.offset < end]
        transfer = Transfer("spoke", "down", entry.path)
        wanted = {p.id: self._places(p.id) for p in pieces if p.id in self._where}
        wanted = {cid: places for cid, places in wanted.items() if places}
        got = await asyncio.to_thread(self._held, list(wanted.items())) if wanted else {}
        for piece in pieces:
            if piece.id in got:
                transfer.held(piece.length)
        lacking = list(dict.fromkeys(p.id for p in pieces if p.id not in got))
        try:
            fetched = await self._fetch(entry, cmap, lacking, transfer)
        finally:
            transfer.done()
        if fetched is None:
            return None
        got.update(fetched)
        # The pieces tile the run: joining them copies each byte once (a zeroed buffer
        # filled slice by slice, then copied out, took three passes on the event loop's
        # thread, which carries the link too)
        parts: list[memoryview] = []
        outside: list[tuple[int, bytes]] = []
        for piece in pieces:
            data = got[piece.id]
            lo, hi = max(piece.offset, start), min(piece.end, end)
            parts.append(memoryview(data)[lo - piece.offset : hi - piece.offset])
            if piece.offset < start or piece.end > end:
                outside.append((piece.offset, data))
        if outside:  # the next run will find these chunks held
            entry.writing += 1
            try:
                await asyncio.to_thread(self._write, entry.id, outside)
            finally:
                entry.writing -= 1
        return b"".join(parts)

    async def _fetch(
        self, entry: CachedFile, cmap: ChunkMap, ids: list[bytes], transfer: Transfer
    ) -> dict[bytes, bytes] | None:
        """Fetch ``ids`` (single-flight per chunk id across fills); None if the hub lacks
        one of them."""
        waits = {cid: self._inflight[cid] for cid in ids if cid in self._inflight}
        mine = [cid for cid in ids if cid not in waits]
        loop = asyncio.get_running_loop()
        futures = {cid: loop.create_future() for cid in mine}
        self._inflight.update(futures)
        try:
            got = await self._fetch_batch(entry, cmap, mine, transfer)
        except BaseException as exc:
            for future in futures.values():
                if not future.done():
                    # waiters fall back to a ranged fetch of their own
                    future.set_exception(CorruptData(f"the fetch failed: {exc!r}"))
                    future.exception()
            raise
        finally:
            for cid in mine:
                self._inflight.pop(cid, None)
        for cid, future in futures.items():
            if cid in got:
                future.set_result(got[cid])
            else:
                future.set_exception(CorruptData("the hub lacks this chunk"))
                future.exception()
        if len(got) < len(mine):
            return None
        for cid, future in waits.items():
            try:
                got[cid] = await asyncio.shield(future)
            except CorruptData:
                return None
        return got

    async def _fetch_batch(
        self, entry: CachedFile, cmap: ChunkMap, ids: list[bytes], transfer: Transfer
    ) -> dict[bytes, bytes]:
        got: dict[bytes, bytes] = {}
        if not ids:
            return got
        base = self._base(entry, cmap)
        todo = ids
        for attempt in range(ATTEMPTS):
            if not todo:
                break
            use_base = base if attempt == 0 else None  # a retry asks for plain frames
            bad = await self._one_batch(entry, cmap, todo, use_base, got, transfer)
            todo = [cid for cid in todo if cid in bad]
        if todo:
            raise CorruptData(
                f"{len(todo)} chunks of {entry.path} failed verification {ATTEMPTS} times",
                path=entry.path,
            )
        return got

    async def _one_batch(
        self,
        entry: CachedFile,
        cmap: ChunkMap,
        ids: list[bytes],
        base: _Base | None,
        got: dict[bytes, bytes],
        transfer: Transfer,
    ) -> set[bytes]:
        """One request; returns the ids whose frames failed verification. Ids the hub
        does not hold are left out of ``got``."""
        at: list[int | None] = []
        reference = None
        if base is not None:
            estimates = {
                s.entry.id: s.delta_from
                for s in plan_transfer(cmap, cmap.ids() - set(ids), base.map)
            }
            at = [estimates.get(cid) for cid in ids]
            reference = _FileReference(self._read, base.file.id)
        bad: set[bytes] = set()
        deltas = 0  # frames that came as deltas against ``base``
        decoding: list[asyncio.Task[None]] = []

        def decode(cid: bytes, frame: bytes) -> bytes | None:
            try:
                return decode_frame(frame, cid, reference)
            except CorruptData:
                return None

        async def decode_all(frames: list[tuple[bytes, bytes]]) -> None:
            nonlocal deltas
            datas = await asyncio.to_thread(lambda: [decode(c, f) for c, f in frames])
            for (cid, frame), data in zip(frames, datas, strict=True):
                deltas += frame[0] & 0x0F in REFERENCE_KINDS
                if data is not None:
                    got[cid] = data
                    transfer.sent(len(data), len(frame) + len(cid))
                    continue
                CORRUPT.labels("spoke", "down").inc()
                log.warning("a chunk frame failed verification; fetching it again",
                            extra={"path": entry.path, "chunk": cid.hex()[:16]})  # fmt: skip
                bad.add(cid)

        # Frames are decoded a group at a time on a worker thread as they arrive: one
        # thread hop per frame cost the event loop as much as a plain copy's whole work
        # on incompressible data (bench/transfer.py, corpus 5).
        group: list[tuple[bytes, bytes]] = []
        size = 0
        try:
            hub_base = (base.file.path, base.file.version) if base is not None else None
            frames = self.link.fetch_chunks(ids, base=hub_base, at=at)
            index = 0
            try:
                async for frame in frames:
                    if frame is not None:
                        group.append((ids[index], frame))
                        size += len(frame)
                    index += 1
                    if size >= DECODE_GROUP or (group and index == len(ids)):
                        decoding.append(asyncio.create_task(decode_all(group)))
                        group, size = [], 0
            except CorruptData:  # the batch broke off: what did not arrive is retried
                bad.update(ids[index:])
            if group:
                decoding.append(asyncio.create_task(decode_all(group)))
            await asyncio.gather(*decoding)
        finally:
            for task in decoding:
                task.cancel()
        if base is not None and base.by_name and not bad and any(a is not None for a in at):
            kind = _kind(entry.path)
            if deltas:
                self._fruitless.pop(kind, None)
            else:
                self._fruitless.setdefault(kind, set()).add(entry.id)
        return bad

    # -- upload --------------------------------------------------------------------------

    async def upload(self, path: str, data: Callable[[], PlainFile], **preconditions: Any) -> Entry:
        """Write the file ``data`` opens to ``path`` at the hub sending only the chunks it
        holds in no file: the map first, then the missing chunks' frames, then a commit of
        the map with the write's preconditions. ``CorruptData`` if the hub could not
        assemble it (a source changed meanwhile): the caller may send the bytes whole."""
        if self._pipeline is None:
            self._pipeline = ChunkPipeline()
        pipeline = self._pipeline

        def map_data() -> ChunkMap:
            source = data()
            try:
                return pipeline.map_stream(source)
            finally:
                source.close()

        cmap = await asyncio.to_thread(map_data)
        ids = list(dict.fromkeys(p.id for p in cmap))
        lacking: set[bytes] = set()
        for i in range(0, len(ids), MAX_BATCH):
            lacking.update(await self.link.missing_chunks(ids[i : i + MAX_BATCH]))
        transfer = Transfer("spoke", "up", path, wire=32 * len(ids))
        sent: set[bytes] = set()

        async def records() -> AsyncIterator[bytes]:
            source = await asyncio.to_thread(data)
            try:
                for piece in cmap:
                    if piece.id not in lacking or piece.id in sent:
                        if piece.id not in sent:
                            transfer.held(piece.length)
                        continue
                    sent.add(piece.id)
                    frame = await asyncio.to_thread(_read_encode, source, piece)
                    transfer.sent(piece.length, len(frame) + len(piece.id))
                    yield record(frame, piece.id)
            finally:
                await asyncio.to_thread(source.close)

        try:
            if lacking:
                await self.link.upload_chunks(records())
            transfer.wire += len(cmap.serialize())
            return await self.link.commit_chunks(path, cmap, **preconditions)
        finally:
            transfer.done()

    def _base(self, entry: CachedFile, cmap: ChunkMap) -> _Base | None:
        """A complete cached version for the hub to delta-encode against: the newest
        older version of the same path (changed in place: the hub's delta store may still
        keep its bytes), else the file of the same directory most alike
        (``choose_reference``). The hub checks that it holds the version named, in its
        volume or its delta store, and sends plain frames if not."""
        folder = PurePosixPath(entry.path).parent
        held: dict[str, tuple[CachedFile, ChunkMap]] = {}
        for file_id, other in self.maps.items():
            cached = self._files().get(file_id)
            if (
                cached is None
                or cached.id == entry.id
                or PurePosixPath(cached.path).parent != folder
                or (cached.retired and cached.path != entry.path)
                or not cached.complete()
            ):
                continue
            known = held.get(cached.path)
            if known is None or known[0].version < cached.version:
                held[cached.path] = (cached, other)
        name = choose_reference(entry.path, cmap, {p: m for p, (_, m) in held.items()})
        if name is None:
            return None
        cached, other = held[name]
        by_name = name != entry.path and not cmap.ids() & other.ids()
        if by_name and len(self._fruitless.get(_kind(entry.path), ())) >= FRUITLESS_FILES:
            # Siblings by name brought nothing here (random bytes beside random bytes):
            # each file's hub trials cost a region search per chunk holding the GIL
            # (bench/transfer.py, corpus 5). A by-name base that pays clears this.
            return None
        return _Base(cached, other, by_name)


def _kind(path: str) -> tuple[PurePosixPath, str]:
    """The siblings ``choose_reference`` picks among by name: same directory and suffix."""
    pure = PurePosixPath(path)
    return pure.parent, pure.suffix


def _read_encode(source: PlainFile, piece: ChunkEntry) -> bytes:
    data = source.pread(piece.length, piece.offset)
    if len(data) != piece.length or chunk_id(data) != piece.id:
        raise CorruptData("a journaled file changed while it was uploaded")
    return encode_chunk(data)
