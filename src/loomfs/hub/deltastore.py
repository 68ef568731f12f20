"""The hub's delta store (hub layer): bytes of file versions spokes hold, kept after the
volume's file has moved on, so that a version changed in place can be sent as deltas.

Files change in place: once a shard is rewritten, the hub's volume holds only the new
bytes, while a spoke still holds the old version in its cache. Delta frames need the old
bytes at both ends (``chunks.codec``), so the hub keeps, for a bounded LRU of recent
versions, their chunk maps and their chunks' zstd frames, the very frames it sent (so
keeping them costs a write, not a second compression). Chunks are stored once by id:
consecutive versions of a file share most of them, so a version costs the store about
its changed chunks' compressed size.

Why this and not rsync-style signatures from the spoke (block checksums of the old
region per missing chunk, then copy/literal instructions): that is what ``rsync -az``
itself does, and on a dataset with 10% of rows changed throughout, blocks small enough to
fit between edits make the signatures cost more than zstd's dictionary deltas save; the
goal is 0.7x of rsync's bytes, which its own method cannot reach (docs/BENCHMARKS.md).

Every chunk read back is decoded against its id (BLAKE3-verified): a damaged store row
reads as missing. A reference returns the longest run of the version it can rebuild from
its start offset, so a chunk evicted (or never sent: the spoke held it from another file)
only shortens the delta's dictionary window; a version the store no longer knows gives no
reference at all, and the hub sends plain frames. Nothing wrong is ever sent: the spoke
decodes each delta against its own copy of the version and checks the chunk's id.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path

from prometheus_client import Counter, Gauge

from ..chunks.chunkmap import ChunkMap
from ..chunks.codec import FrameKind, decode_frame, encode_chunk
from ..core.metrics import HUB
from ..errors import CorruptData

log = logging.getLogger(__name__)

STORE_BYTES = Gauge(
    "loomfs_delta_store_bytes", "Bytes of chunk frames in the hub's delta store", registry=HUB
)
STORE_EVICTED = Counter(
    "loomfs_delta_store_evicted_total", "Chunks evicted from the delta store", registry=HUB
)
BASES = Counter(
    "loomfs_delta_store_bases_total",
    "Delta bases the hub looked up in its delta store, by outcome",
    ["outcome"],
    registry=HUB,
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS chunks (id BLOB PRIMARY KEY, frame BLOB NOT NULL, used INTEGER);
CREATE TABLE IF NOT EXISTS versions (
    path TEXT NOT NULL, version INTEGER NOT NULL, map BLOB NOT NULL, used INTEGER,
    PRIMARY KEY (path, version)
);
"""
# Maps are ~0.04% of their file's bytes; this share of the store bounds them, so a store
# of many versions of tiny files cannot grow without limit in map rows.
MAP_SHARE = 32
# Decoded chunks a reference keeps: a delta's dictionary window spans the chunk's own
# length plus 2 x 256 KiB around it, and consecutive chunks share most of it.
DECODED = 16


class DeltaStore:
    """Chunk frames and maps of recent versions, bounded to ``capacity`` bytes of frames
    (least recently used chunks go first). Safe to call from several threads."""

    def __init__(self, path: Path, capacity: int) -> None:
        self.capacity = capacity
        path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._db = self._open(path)
        self._clock = 0
        # in LRU order, oldest first: id -> frame size; (path, version) -> map size
        self._chunks: OrderedDict[bytes, int] = OrderedDict()
        self._versions: OrderedDict[tuple[str, int], int] = OrderedDict()
        for cid, size, used in self._db.execute(
            "SELECT id, length(frame), used FROM chunks ORDER BY used"
        ):
            self._chunks[bytes(cid)] = size
            self._clock = max(self._clock, used)
        for name, version, size, used in self._db.execute(
            "SELECT path, version, length(map), used FROM versions ORDER BY used"
        ):
            self._versions[(name, version)] = size
            self._clock = max(self._clock, used)
        self.size = sum(self._chunks.values())
        self._map_bytes = sum(self._versions.values())
        STORE_BYTES.set(self.size)

    @staticmethod
    def _open(path: Path) -> sqlite3.Connection:
        """The store is a cache: a file that does not open as one is started afresh."""
        for attempt in range(2):
            try:
                db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=OFF")  # losing the tail on a crash is fine
                db.executescript(SCHEMA)
                return db
            except sqlite3.DatabaseError:
                if attempt:
                    raise
                log.warning("the delta store does not open; starting it afresh",
                            extra={"path": str(path)})  # fmt: skip
                for stale in (path, path.with_name(path.name + "-wal")):
                    stale.unlink(missing_ok=True)
        raise AssertionError("unreachable")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tick(self) -> int:
        self._clock += 1
        return self._clock

    # -- filling ---------------------------------------------------------------------------

    def record(self, path: str, version: int, cmap: ChunkMap) -> None:
        """Keep ``cmap`` as the map of ``path`` at ``version`` (a spoke is about to hold
        that version) and mark its chunks as recently used."""
        if self.capacity <= 0:
            return
        key = (path, version)
        with self._lock:
            used = self._tick()
            if key in self._versions:
                self._versions.move_to_end(key)
                self._db.execute(
                    "UPDATE versions SET used = ? WHERE path = ? AND version = ?",
                    (used, path, version),
                )
            else:
                blob = cmap.serialize()
                self._db.execute(
                    "INSERT OR REPLACE INTO versions (path, version, map, used) "
                    "VALUES (?, ?, ?, ?)",
                    (path, version, blob, used),
                )
                self._versions[key] = len(blob)
                self._map_bytes += len(blob)
            held = [cid for cid in cmap.ids() if cid in self._chunks]
            for cid in held:
                self._chunks.move_to_end(cid)
            self._db.executemany(
                "UPDATE chunks SET used = ? WHERE id = ?", [(used, cid) for cid in held]
            )
            self._evict()

    def keep(self, cid: bytes, data: bytes, frame: bytes | None = None) -> None:
        """Keep chunk ``cid`` (bytes ``data``, already verified against it). ``frame`` is
        the plain frame already made for it, if any (a delta frame is no use here).

        Incompressible chunks (raw frames) are not kept: media and compressed shards are
        rewritten whole when they change, so their old bytes would rarely serve as a
        base, and writing them cost a plain copy's speed (bench/transfer.py, corpus 5)."""
        if self.capacity <= 0 or cid in self._chunks:
            return
        if frame is None or frame[0] & 0x0F not in (FrameKind.RAW, FrameKind.ZSTD):
            frame = encode_chunk(data)
        if frame[0] & 0x0F == FrameKind.RAW:
            return
        with self._lock:
            if cid in self._chunks:
                return
            self._db.execute(
                "INSERT OR REPLACE INTO chunks (id, frame, used) VALUES (?, ?, ?)",
                (cid, frame, self._tick()),
            )
            self._chunks[cid] = len(frame)
            self.size += len(frame)
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently used chunks, then maps, past the bounds (lock held)."""
        doomed = []
        while self.size > self.capacity and self._chunks:
            cid, size = self._chunks.popitem(last=False)
            self.size -= size
            doomed.append((cid,))
        if doomed:
            self._db.executemany("DELETE FROM chunks WHERE id = ?", doomed)
            STORE_EVICTED.inc(len(doomed))
        gone = []
        while self._map_bytes > self.capacity // MAP_SHARE and len(self._versions) > 1:
            (path, version), size = self._versions.popitem(last=False)
            self._map_bytes -= size
            gone.append((path, version))
        if gone:
            self._db.executemany("DELETE FROM versions WHERE path = ? AND version = ?", gone)
        STORE_BYTES.set(self.size)

    # -- reading ---------------------------------------------------------------------------

    def reference(self, path: str, version: int) -> StoreReference | None:
        """The bytes of ``path`` at ``version`` as a delta reference, or None if the store
        does not know that version."""
        with self._lock:
            row = self._db.execute(
                "SELECT map FROM versions WHERE path = ? AND version = ?", (path, version)
            ).fetchone()
        if row is None:
            BASES.labels("unknown").inc()
            return None
        BASES.labels("found").inc()
        return StoreReference(self, ChunkMap.deserialize(bytes(row[0])))

    def chunk(self, cid: bytes) -> bytes | None:
        """The bytes of chunk ``cid``, verified, or None (not kept, or damaged: dropped)."""
        with self._lock:
            row = self._db.execute("SELECT frame FROM chunks WHERE id = ?", (cid,)).fetchone()
        if row is None:
            return None
        try:
            return decode_frame(bytes(row[0]), cid)
        except CorruptData:
            log.warning("a delta store chunk failed verification; dropping it",
                        extra={"chunk": cid.hex()[:16]})  # fmt: skip
            with self._lock:
                self._db.execute("DELETE FROM chunks WHERE id = ?", (cid,))
                with contextlib.suppress(KeyError):
                    self.size -= self._chunks.pop(cid)
            return None


class StoreReference:
    """One version rebuilt from the store's chunks on demand (``codec.Reference``)."""

    def __init__(self, store: DeltaStore, cmap: ChunkMap) -> None:
        self._store = store
        self._map = cmap
        self._starts = [piece.offset for piece in cmap]
        self._lock = threading.Lock()
        self._decoded: OrderedDict[int, bytes | None] = OrderedDict()

    def _piece(self, index: int) -> bytes | None:
        with self._lock:
            if index in self._decoded:
                self._decoded.move_to_end(index)
                return self._decoded[index]
        data = self._store.chunk(self._map[index].id)
        with self._lock:
            self._decoded[index] = data
            if len(self._decoded) > DECODED:
                self._decoded.popitem(last=False)
        return data

    def read(self, offset: int, length: int) -> bytes:
        """The version's bytes from ``offset`` on, up to ``length`` of them, stopping
        short at the first chunk the store lacks (a shorter, still exact, reference)."""
        end = min(offset + length, self._map.size)
        out = bytearray()
        index = bisect.bisect_right(self._starts, offset) - 1
        while offset < end and 0 <= index < len(self._map):
            piece = self._map[index]
            data = self._piece(index)
            if data is None:
                break
            out += data[offset - piece.offset : min(end, piece.end) - piece.offset]
            offset = piece.end
            index += 1
        return bytes(out)
