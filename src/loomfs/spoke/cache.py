"""The spoke's cache of file versions (spoke layer): ranged, verified, persistent, bounded.

Each cached file version is one sparse local file, filled block by block (1 MiB) as reads
miss; the index (SQLite, beside the data) records which blocks are present and the BLAKE3
hash of each. Blocks are verified against their hash the first time they are served after
the spoke starts and whenever the data file was touched by anything but the cache itself
(its mtime is recorded after every fill), so a torn, truncated or corrupted cache file is
refetched, never served. Reads hand back a ``FileRegion`` of the cache file, so servers
can sendfile and the kernel's page cache serves warm reads.

With a ``BlockCipher`` (cache encryption at rest) each block is sealed with AES-GCM in a
slot of its own (the block, its nonce and tag); reads decrypt block by block into memory,
which costs the sendfile shortcut, and the authentication is the verification. A cache
directory sealed with another key (or none) is emptied when opened.

Misses are single-flight: readers needing the same block wait for one fetch. The cache is
bounded: when a fill would pass the capacity, the eviction policy (LRU by default; the
prefetcher supplies a smarter one) picks whole file versions to drop; versions being read,
or pinned, are never dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import blake3
from prometheus_client import Counter, Gauge

from ..chunks import bundle
from ..chunks.chunkmap import ChunkMap
from ..core.metrics import SPOKE
from ..core.streams import ByteSource, LocalFileSource
from ..core.types import Principal
from ..errors import Conflict, CorruptData, InsufficientStorage, LoomError
from ..namespace.chunklink import ChunkLink
from ..prefetch.policy import EvictionPolicy, LRUPolicy
from .chunkfill import SCHEMA as CHUNK_SCHEMA
from .chunkfill import ChunkFiller
from .sealed import FRAME, OVERHEAD, BlockCipher, SealedSource, cache_context

log = logging.getLogger(__name__)

BLOCK = FRAME  # 1 MiB: a sealed block is one sealed frame
PLAIN_BLOCKS = 8  # opened blocks kept for the chunk index (one block holds many chunks)
FETCHES_IN_FLIGHT = 16  # ranged requests of up to 8 blocks: 128 MiB in flight at most
SERVED = Counter(
    "loomfs_cache_served_bytes_total", "Bytes read out of the spoke cache", registry=SPOKE
)
MISSES = Counter(
    "loomfs_cache_miss_bytes_total", "Bytes fetched into the spoke cache", registry=SPOKE
)
CORRUPT = Counter(
    "loomfs_cache_corrupt_blocks_total", "Cache blocks that failed verification", registry=SPOKE
)
USED = Gauge("loomfs_cache_used_bytes", "Bytes held by the spoke cache", registry=SPOKE)
CAPACITY = Gauge("loomfs_cache_capacity_bytes", "Bytes the spoke cache may hold", registry=SPOKE)
READS = Counter(
    "loomfs_cache_reads_total", "Demand reads, by whether the cache held them", ["hit"],
    registry=SPOKE,
)  # fmt: skip
HIT, MISS = READS.labels("true"), READS.labels("false")
# Files up to this size are fetched whole, without a chunk map: below it a map saves too
# little to pay for its round trip (see docs/BENCHMARKS.md, "Chunks over the link").
SMALL_FILE = 1 << 20

#: fetch(path, version, offset, length) -> the bytes of that range of that version
Fetch = Callable[[str, int, int, int], Awaitable[bytes]]

#: set by the prefetcher around its reads: they fill the cache but are no demand reads
PREFETCHING: ContextVar[bool] = ContextVar("loomfs_prefetching", default=False)


class CacheObserver(Protocol):
    """Told of every demand read (with the blocks it covered) and every drop or
    retirement (the prefetcher's hook and metrics; a version may be told of twice)."""

    def on_read(self, entry: CachedFile, hit: bool, stall_s: float, blocks: range) -> None: ...

    def on_drop(self, entry: CachedFile) -> None: ...


_SCHEMA = """
CREATE TABLE IF NOT EXISTS files (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    path TEXT NOT NULL,
    version INTEGER NOT NULL,
    size INTEGER NOT NULL,
    pinned INTEGER NOT NULL DEFAULT 0,
    data_mtime_ns INTEGER NOT NULL DEFAULT 0,
    UNIQUE (path, version)
);
CREATE TABLE IF NOT EXISTS blocks (
    file_id INTEGER NOT NULL REFERENCES files(id) ON DELETE CASCADE,
    idx INTEGER NOT NULL,
    hash BLOB NOT NULL,
    PRIMARY KEY (file_id, idx)
);
CREATE TABLE IF NOT EXISTS settings (name TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def block_span(offset: int, length: int) -> range:
    """The blocks that hold bytes [offset, offset+length)."""
    if length <= 0:
        return range(0)
    return range(offset // BLOCK, (offset + length - 1) // BLOCK + 1)


@dataclass(slots=True)
class CachedFile:
    id: int
    path: str
    version: int
    size: int
    hashes: dict[int, bytes] = field(default_factory=dict)  # present blocks
    verified: set[int] = field(default_factory=set)  # checked since start or last fill
    data_mtime_ns: int = 0
    pinned: bool = False
    readers: int = 0
    # The cache's own writes to the data file under way (fills, chunks kept beside a
    # run): while any is, an mtime that moved is this cache's doing, not a foreign edit.
    writing: int = 0
    # replaced at the hub: never served again, kept only as a source of chunks until evicted
    retired: bool = False

    @property
    def blocks(self) -> int:
        return (self.size + BLOCK - 1) // BLOCK

    def block_len(self, idx: int) -> int:
        return min(BLOCK, self.size - idx * BLOCK)

    @property
    def cached_bytes(self) -> int:
        return sum(self.block_len(i) for i in self.hashes)

    def complete(self) -> bool:
        return len(self.hashes) == self.blocks

    def touches_present(self, offset: int, length: int) -> bool:
        """Whether some present block overlaps bytes [offset, offset+length)."""
        last = (offset + max(length, 1) - 1) // BLOCK
        return any(i in self.hashes for i in range(offset // BLOCK, last + 1))


class Cache:
    def __init__(
        self,
        directory: Path,
        capacity: int,
        policy: EvictionPolicy | None = None,
        *,
        link: ChunkLink | None = None,
        cipher: BlockCipher | None = None,
    ) -> None:
        """With ``link``, misses of files above ``SMALL_FILE`` move chunks (``chunkfill``);
        with ``cipher``, blocks are sealed at rest (chunk fills too: they are stored as
        blocks, and the chunk index reads chunks back through ``_read_plain``)."""
        self.directory = directory
        self.capacity = capacity
        CAPACITY.set(capacity)
        self.policy = policy or LRUPolicy()
        self.cipher = cipher
        self._slot = BLOCK + (OVERHEAD if cipher is not None else 0)  # bytes per block on disk
        self._files: dict[int, CachedFile] = {}
        self._by_key: dict[tuple[str, int], int] = {}
        self._inflight: dict[tuple[int, int], asyncio.Future[None]] = {}
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()  # the index is written from worker threads
        self._slots = asyncio.Semaphore(FETCHES_IN_FLIGHT)
        self._plain: OrderedDict[tuple[int, int], bytes] = OrderedDict()  # opened blocks
        self._plain_lock = threading.Lock()
        self.observer: CacheObserver | None = None
        # demand reads and those the cache held already, for the spoke's status
        self.reads = self.hits = 0
        self._reserved = 0  # room made for fills whose blocks are being written
        self._room_freed = asyncio.Event()
        self.chunks = (
            ChunkFiller(
                link,
                self._connection,
                self._db_lock,
                self._read_plain,
                self._write_plain,
                lambda: self._files,
            )
            if link is not None
            else None
        )

    # -- lifecycle -------------------------------------------------------------------------

    def open(self) -> None:
        """Load the index and check it against the data files: a missing or resized data
        file is dropped; every block will be verified before it is served."""
        (self.directory / "data").mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(
            self.directory / "index.db", isolation_level=None, check_same_thread=False
        )
        # synchronous=NORMAL: a commit no longer waits for an fsync, which held the event
        # loop (files are entered there) for a fifth of the spoke's busy time while
        # training read through it. The index is only a cache's: a power loss may take
        # its last commits back, and what they said is then absent (fetched again) or
        # dropped as torn at open, and every block is verified before it is served.
        self._db.executescript(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL; PRAGMA foreign_keys=ON;"
            + _SCHEMA
            + CHUNK_SCHEMA
        )
        self._check_sealing()  # after the chunk maps' table: emptying cascades to it
        rows = self._db.execute(
            "SELECT id, path, version, size, pinned, data_mtime_ns FROM files"
        ).fetchall()
        for file_id, path, version, size, pinned, mtime in rows:
            entry = CachedFile(
                file_id, path, version, size, data_mtime_ns=mtime, pinned=bool(pinned)
            )
            data = self._data_path(file_id)
            try:
                on_disk = data.stat().st_size
            except FileNotFoundError:
                on_disk = -1
            if on_disk != self._disk_size(entry):
                log.warning("dropping a torn cache file", extra={"path": path, "version": version})
                self._delete_row(file_id)
                data.unlink(missing_ok=True)
                continue
            self._files[file_id] = entry
            self._by_key[(path, version)] = file_id
        for file_id, idx, digest in self._db.execute("SELECT file_id, idx, hash FROM blocks"):
            if file_id in self._files:
                self._files[file_id].hashes[idx] = bytes(digest)
        for entry in self._files.values():
            if entry.hashes:
                self.policy.insert(entry.id, entry.cached_bytes)
                if entry.pinned:
                    self.policy.pin(entry.id)
        if self.chunks is not None:
            self.chunks.load()
        USED.set(self.policy.used_bytes)

    def _check_sealing(self) -> None:
        """Empty a cache written with another key, or none: its blocks can't be opened."""
        assert self._db is not None
        want = self.cipher.key_id if self.cipher is not None else "none"
        row = self._db.execute("SELECT value FROM settings WHERE name = 'sealing'").fetchone()
        if row is not None and row[0] == want:
            return
        ids = [r[0] for r in self._db.execute("SELECT id FROM files").fetchall()]
        if ids:
            log.warning("cache sealed otherwise; emptying it", extra={"files": len(ids)})
        self._db.execute("DELETE FROM files")
        for file_id in ids:
            self._data_path(file_id).unlink(missing_ok=True)
        self._db.execute(
            "INSERT OR REPLACE INTO settings (name, value) VALUES ('sealing', ?)", (want,)
        )

    def _pos(self, idx: int) -> int:
        return idx * self._slot

    def _slot_len(self, entry: CachedFile, idx: int) -> int:
        return entry.block_len(idx) + self._slot - BLOCK

    def _disk_size(self, entry: CachedFile) -> int:
        if self.cipher is None or not entry.size:
            return entry.size
        last = entry.blocks - 1
        return self._pos(last) + self._slot_len(entry, last)

    def close(self) -> None:
        if self.chunks is not None:
            self.chunks.close()
        if self._db is not None:
            self._db.close()
            self._db = None

    @property
    def used_bytes(self) -> int:
        return self.policy.used_bytes

    def _connection(self) -> sqlite3.Connection:
        assert self._db is not None, "open() first"
        return self._db

    def _data_path(self, file_id: int) -> Path:
        return self.directory / "data" / f"{file_id}.bin"

    def _sql(self, sql: str, params: tuple[object, ...] = ()) -> list[Any]:
        """Run one statement to completion under the lock: a cursor left half-read would
        keep its statement open and make another thread's COMMIT fail."""
        assert self._db is not None, "open() first"
        with self._db_lock:
            return self._db.execute(sql, params).fetchall()

    def _delete_row(self, file_id: int) -> None:
        self._sql("DELETE FROM files WHERE id = ?", (file_id,))

    # -- lookups ---------------------------------------------------------------------------

    def by_id(self, file_id: int) -> CachedFile | None:
        return self._files.get(file_id)

    def get(self, path: str, version: int) -> CachedFile | None:
        file_id = self._by_key.get((path, version))
        return None if file_id is None else self._files[file_id]

    def versions(self, path: str) -> list[CachedFile]:
        return [f for f in self._files.values() if f.path == path and not f.retired]

    def _ensure(self, path: str, version: int, size: int) -> CachedFile:
        found = self.get(path, version)
        if found is not None:
            return found
        for old in self._files.values():
            if old.retired and (old.path, old.version) == (path, version):
                old.retired = False  # that very version again (say, renamed back)
                self._by_key[(path, version)] = old.id
                return old
        [row] = self._sql(
            "INSERT INTO files (path, version, size) VALUES (?, ?, ?) RETURNING id",
            (path, version, size),
        )
        entry = CachedFile(row[0], path, version, size)
        with open(self._data_path(entry.id), "wb") as data:
            data.truncate(self._disk_size(entry))  # sparse: blocks take room only once filled
        self._files[entry.id] = entry
        self._by_key[(path, version)] = entry.id
        return entry

    # -- reading ---------------------------------------------------------------------------

    async def read(
        self,
        path: str,
        version: int,
        size: int,
        offset: int,
        length: int,
        fetch: Fetch,
        *,
        opened_s: float = 0.0,
    ) -> ByteSource:
        """The bytes [offset, offset+length) of a file version, fetched where missing.

        ``opened_s``: how long the caller already waited for an open that brought this
        file's first bytes or its map (its own cold open, or another request's it waited
        for). Such a read found its blocks here only because it waited: for the observer
        it is a miss, and the wait part of its stall."""
        entry = self._ensure(path, version, size)
        span = block_span(offset, length)
        entry.readers += 1
        began = time.monotonic() - opened_s
        ready = self._ready(entry, span)
        hit = ready and opened_s <= 0
        try:
            if not ready:
                await self._fill(entry, span, fetch)
                self._still_held(entry)
                await asyncio.to_thread(self._verify, entry, span)
                missing = [i for i in span if i not in entry.hashes]
                if missing:  # a block failed verification: fetch it once more
                    await self._fill(entry, range(min(missing), max(missing) + 1), fetch)
            fd = os.open(self._data_path(entry.id), os.O_RDONLY | os.O_CLOEXEC)
        except BaseException:
            entry.readers -= 1
            if not entry.hashes and not entry.readers:
                self._drop(entry.id)  # refused or failed before any byte: leave no trace
            raise
        if not PREFETCHING.get():
            if entry.id in self.policy:
                self.policy.access(entry.id)
            SERVED.inc(length)
            self.reads += 1
            self.hits += hit
            (HIT if hit else MISS).inc()
            if self.observer is not None:
                stall_s = 0.0 if hit else time.monotonic() - began
                self.observer.on_read(entry, hit, stall_s, span)
        if self.cipher is not None:
            return SealedSource(
                fd, offset, length, lambda idx: self._block(entry, fd, idx),
                lambda: self._release(entry),
            )  # fmt: skip
        return _CacheSource(fd, offset, length, path, lambda: self._release(entry))

    def _still_held(self, entry: CachedFile) -> None:
        if entry.id not in self._files:
            raise Conflict(
                f"{entry.path} was evicted from this cache while it was read; read it again",
                path=entry.path,
            )

    def _ready(self, entry: CachedFile, span: range) -> bool:
        """Every block present and verified, and the data file as the cache left it: the
        warm path, which then costs one stat and no thread hop."""
        if not all(i in entry.verified for i in span):
            return False
        try:
            return os.stat(self._data_path(entry.id)).st_mtime_ns == entry.data_mtime_ns
        except FileNotFoundError:
            return False

    def _release(self, entry: CachedFile) -> None:
        entry.readers -= 1

    async def _fill(self, entry: CachedFile, span: range, fetch: Fetch) -> None:
        """Fetch the absent blocks of ``span``: runs of blocks that nobody is fetching go
        out as one ranged request each; blocks already in flight are awaited."""
        waits: list[asyncio.Future[None]] = []
        runs: list[list[int]] = []
        for idx in span:
            if idx in entry.hashes:
                continue
            pending = self._inflight.get((entry.id, idx))
            if pending is not None:
                waits.append(pending)
            elif runs and runs[-1][-1] == idx - 1 and len(runs[-1]) < 8:
                runs[-1].append(idx)
            else:
                runs.append([idx])
        loop = asyncio.get_running_loop()
        mine: list[tuple[list[int], asyncio.Future[None]]] = []
        for run in runs:
            future: asyncio.Future[None] = loop.create_future()
            for idx in run:
                self._inflight[(entry.id, idx)] = future
            mine.append((run, future))
        try:
            await asyncio.gather(*(self._fetch_run(entry, run, fetch) for run, _ in mine))
        except BaseException as exc:
            for _, future in mine:
                if not future.done():
                    future.set_exception(exc)
                    future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            for run, future in mine:
                if not future.done():
                    future.set_result(None)
                for idx in run:
                    self._inflight.pop((entry.id, idx), None)
        await asyncio.gather(*waits)

    async def _fetch_run(self, entry: CachedFile, run: list[int], fetch: Fetch) -> None:
        start = run[0] * BLOCK
        length = sum(entry.block_len(i) for i in run)
        async with self._slots:  # enough requests in flight to fill the link, not more
            data = None
            if self.chunks is not None and entry.size > SMALL_FILE:
                data = await self.chunks.assemble(entry, start, length)
            elif self.chunks is not None:  # small: whole and compressed, not a raw range
                data = await self.chunks.whole(entry, SMALL_FILE, start, length)
            if data is None:
                data = await fetch(entry.path, entry.version, start, length)
        if len(data) != length:
            raise CorruptData(
                f"fetched {len(data)} of {length} bytes of {entry.path}", path=entry.path
            )
        MISSES.inc(length)
        async with self._room(length, keep=entry.id):
            entry.writing += 1
            try:
                await asyncio.to_thread(self._store, entry, run, data)
            finally:
                entry.writing -= 1
            self._account(entry)

    def _account(self, entry: CachedFile) -> None:
        if entry.id in self._files:  # not dropped while its blocks were written
            self.policy.insert(entry.id, entry.cached_bytes, prefetched=PREFETCHING.get())
        USED.set(self.policy.used_bytes)

    def _store(self, entry: CachedFile, run: list[int], data: bytes) -> None:
        view = memoryview(data)
        digests: list[tuple[int, int, bytes]] = []
        try:
            fd = os.open(self._data_path(entry.id), os.O_WRONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            if entry.id not in self._files:
                return  # evicted while its blocks were on their way: they are not kept
            raise
        try:
            pos = 0
            for idx in run:
                piece = view[pos : pos + entry.block_len(idx)]
                stored = piece if self.cipher is None else self._seal(entry, idx, piece)
                try:
                    os.pwrite(fd, stored, self._pos(idx))
                except OSError as exc:
                    raise InsufficientStorage(f"spoke cache: {exc.strerror}") from exc
                digests.append((entry.id, idx, blake3.blake3(piece).digest()))
                pos += len(piece)
            mtime = os.fstat(fd).st_mtime_ns
        finally:
            os.close(fd)
        self._record(entry, digests, mtime)

    def _record(self, entry: CachedFile, digests: list[tuple[int, int, bytes]], mtime: int) -> None:
        """Make blocks present: index first (a crash before it leaves them absent, and so
        refetched), then memory."""
        with self._db_lock:
            assert self._db is not None
            if entry.id not in self._files:
                return  # dropped while its blocks were being written: nothing to record
            self._db.execute("BEGIN")
            self._db.executemany(
                "INSERT OR REPLACE INTO blocks (file_id, idx, hash) VALUES (?, ?, ?)", digests
            )
            self._db.execute("UPDATE files SET data_mtime_ns = ? WHERE id = ?", (mtime, entry.id))
            self._db.execute("COMMIT")
        for _, idx, digest in digests:
            entry.hashes[idx] = digest
            entry.verified.add(idx)
        # max: a concurrent fill may have recorded the mtime of a later write already
        entry.data_mtime_ns = max(entry.data_mtime_ns, mtime)

    def _seal(self, entry: CachedFile, idx: int, plain: bytes | memoryview) -> bytes:
        assert self.cipher is not None
        return self.cipher.seal(cache_context(entry.id, entry.version, idx), plain)

    def _block(self, entry: CachedFile, fd: int, idx: int) -> bytes:
        """Block ``idx`` of a cache file as the reader gets it (opened, where sealed)."""
        stored = os.pread(fd, self._slot_len(entry, idx), self._pos(idx))
        if self.cipher is None:
            return stored
        return self.cipher.open(cache_context(entry.id, entry.version, idx), stored)

    def _read_plain(self, file_id: int, offset: int, length: int) -> bytes | None:
        """Bytes [offset, offset+length) of a cached file as written, for the chunk index
        (which verifies them by hash); None when they can't be read: the file is gone or,
        sealed, a block is absent or fails authentication. Worker threads call this."""
        if self.cipher is None:  # holes read as zeros, which fail the caller's hash
            try:
                fd = os.open(self._data_path(file_id), os.O_RDONLY | os.O_CLOEXEC)
            except FileNotFoundError:
                return None
            try:
                return os.pread(fd, length, offset)
            finally:
                os.close(fd)
        entry = self._files.get(file_id)
        if entry is None or length <= 0:
            return None if entry is None else b""
        first, last = offset // BLOCK, (offset + length - 1) // BLOCK
        if last >= entry.blocks or any(i not in entry.hashes for i in range(first, last + 1)):
            return None
        parts: list[bytes] = []
        fd = -1
        try:
            for idx in range(first, last + 1):
                with self._plain_lock:
                    block = self._plain.get((file_id, idx))
                    if block is not None:
                        self._plain.move_to_end((file_id, idx))
                if block is None:
                    if fd < 0:
                        fd = os.open(self._data_path(file_id), os.O_RDONLY | os.O_CLOEXEC)
                    block = self._block(entry, fd, idx)
                    with self._plain_lock:
                        self._plain[(file_id, idx)] = block
                        while len(self._plain) > PLAIN_BLOCKS:
                            self._plain.popitem(last=False)
                parts.append(block)
        except (FileNotFoundError, CorruptData):
            return None
        finally:
            if fd >= 0:
                os.close(fd)
        start = offset - first * BLOCK
        return b"".join(parts)[start : start + length]

    def _write_plain(self, file_id: int, pieces: Sequence[tuple[int, bytes]]) -> None:
        """Keep chunk bytes outside the blocks being filled (the chunk index finds them,
        verified by hash, for the next fill). Sealed, there is no such place: a block is
        sealed whole, so those chunks are fetched again by the fill that needs them."""
        if self.cipher is not None:
            return
        with contextlib.suppress(FileNotFoundError):
            fd = os.open(self._data_path(file_id), os.O_WRONLY | os.O_CLOEXEC)
            try:
                for offset, data in pieces:
                    os.pwrite(fd, data, offset)
                mtime = os.fstat(fd).st_mtime_ns
            finally:
                os.close(fd)
            entry = self._files.get(file_id)
            if entry is not None:  # the cache's own write: present blocks stay ready
                entry.data_mtime_ns = max(entry.data_mtime_ns, mtime)

    def _verify(self, entry: CachedFile, span: range) -> None:
        """Check present blocks of ``span`` against their hashes where not yet checked;
        a block that fails is forgotten (and so fetched again)."""
        path = self._data_path(entry.id)
        st = path.stat()
        disk_size = self._disk_size(entry)
        moved = st.st_mtime_ns != entry.data_mtime_ns and not entry.writing
        if moved or st.st_size != disk_size:
            # touched by something other than the cache (a concurrent fill's write, not
            # yet recorded, once cleared every other run's blocks: reads missed)
            entry.verified.clear()
        todo = [i for i in span if i in entry.hashes and i not in entry.verified]
        if not todo:
            return
        with open(path, "rb") as data:
            for idx in todo:
                try:
                    block = self._block(entry, data.fileno(), idx)
                except CorruptData:
                    block = b""  # fails the hash below
                if blake3.blake3(block).digest() == entry.hashes[idx]:
                    entry.verified.add(idx)
                    continue
                CORRUPT.inc()
                log.warning(
                    "cache block failed verification; refetching",
                    extra={"path": entry.path, "version": entry.version, "block": idx},
                )
                del entry.hashes[idx]
                self._sql("DELETE FROM blocks WHERE file_id = ? AND idx = ?", (entry.id, idx))
        if st.st_size != disk_size:
            with open(path, "r+b") as data:
                data.truncate(disk_size)

    async def store(self, path: str, version: int, size: int, offset: int, data: bytes) -> None:
        """Keep bytes fetched along with something else: whole blocks from ``offset`` (a
        block boundary) on; anything else is left to the regular fill."""
        entry = self._ensure(path, version, size)
        span = list(block_span(offset, len(data)))
        whole = offset % BLOCK == 0 and len(data) == sum(entry.block_len(i) for i in span)
        if not whole or any(i in entry.hashes for i in span):
            return
        MISSES.inc(len(data))
        async with self._room(len(data), keep=entry.id):
            await asyncio.to_thread(self._store, entry, span, data)
            self._account(entry)
        USED.set(self.policy.used_bytes)

    def incoming(self) -> Path:
        """A fresh temp path beside the data, for a file being written through the spoke."""
        (self.directory / "incoming").mkdir(exist_ok=True)
        fd, name = tempfile.mkstemp(dir=self.directory / "incoming")
        os.close(fd)
        return Path(name)

    async def adopt(self, path: str, version: int, source: Path) -> None:
        """Take a complete local file (just written through this spoke) as the cached copy
        of that version, so reading back what was written costs no fetch."""
        if self.cipher is not None:  # sealed: the plaintext file is read, then goes
            fd = os.open(source, os.O_RDONLY | os.O_CLOEXEC)
            try:
                size = os.fstat(fd).st_size
                await self.adopt_stream(path, version, size, LocalFileSource(fd, 0, size, path))
            finally:
                source.unlink(missing_ok=True)
            return
        size = source.stat().st_size
        async with self._room(size, keep=-1):
            entry = self._ensure(path, version, size)
            await asyncio.to_thread(self._adopt, entry, source)
            if entry.hashes:
                self.policy.insert(entry.id, entry.cached_bytes)
        USED.set(self.policy.used_bytes)

    async def adopt_stream(self, path: str, version: int, size: int, data: ByteSource) -> None:
        """Take the bytes of a version as they stream (in ``BLOCK`` pieces, the last one
        shorter), stored block by block; the source is closed."""
        try:
            async with self._room(size, keep=-1):
                entry = self._ensure(path, version, size)
                idx = 0
                async for block in data.chunks():
                    if idx >= entry.blocks or len(block) != entry.block_len(idx):
                        raise CorruptData(f"{path}: a piece of a written file is not a block")
                    await asyncio.to_thread(self._store, entry, [idx], block)
                    idx += 1
                self._account(entry)
        finally:
            await data.aclose()

    def _adopt(self, entry: CachedFile, source: Path) -> None:
        data = self._data_path(entry.id)
        os.replace(source, data)
        with open(data, "rb") as f:
            digests = [
                (
                    entry.id,
                    idx,
                    blake3.blake3(os.pread(f.fileno(), entry.block_len(idx), idx * BLOCK)).digest(),
                )
                for idx in range(entry.blocks)
            ]
            mtime = os.fstat(f.fileno()).st_mtime_ns
        self._record(entry, digests, mtime)

    # -- room, pins, invalidation ----------------------------------------------------------

    @contextlib.asynccontextmanager
    async def _room(self, incoming: int, keep: int) -> AsyncIterator[None]:
        """Room for ``incoming`` bytes, held for this fill until its blocks are in the
        policy: fills run concurrently, and each writes its blocks on a thread between
        making room and counting them, so room made but not yet used is reserved."""
        await self._make_room(incoming, keep)
        self._reserved += incoming
        try:
            yield
        finally:
            self._reserved -= incoming
            self._room_freed.set()

    async def _make_room(self, incoming: int, keep: int) -> None:
        # Dropping awaits a thread, and meanwhile another fill may take the room freed: so
        # evict until this fill fits, and give up only when nothing evictable is left.
        while (over := self.policy.used_bytes + self._reserved + incoming - self.capacity) > 0:
            busy = [
                f.id
                for f in self._files.values()
                if (f.readers or f.id == keep) and f.id in self.policy
            ]
            for file_id in busy:
                self.policy.pin(file_id)
            try:
                victims = self.policy.evict(over)
            finally:
                for file_id in busy:
                    if not self._files[file_id].pinned:
                        self.policy.unpin(file_id)
            if not victims and self._reserved:  # room held by fills under way: once they
                self._room_freed.clear()  # are counted, their files may be evictable
                await self._room_freed.wait()
                continue
            if not victims:
                raise InsufficientStorage(
                    f"spoke cache is full ({self.capacity:,} bytes) of pinned or busy files"
                )
            dropped = [v for v in victims if self._forget(v)]
            for victim in dropped:  # gone from every lookup already: only the disk is left
                await asyncio.to_thread(self._erase, victim)

    def _drop(self, file_id: int) -> None:
        if self._forget(file_id):
            self._erase(file_id)

    def _forget(self, file_id: int) -> bool:
        """Take a version out of memory: lookups, the chunk index, the policy. On the
        event loop, always: these structures are read there without locks (a fill's
        ``_make_room`` iterating the files, the chunk index choosing delta bases)."""
        entry = self._files.pop(file_id, None)
        if entry is None:
            return False
        if self._by_key.get((entry.path, entry.version)) == file_id:
            del self._by_key[(entry.path, entry.version)]
        if self.chunks is not None:
            self.chunks.forget(file_id)
        if self._plain:
            with self._plain_lock:
                for key in [k for k in self._plain if k[0] == file_id]:
                    del self._plain[key]
        if self.observer is not None:
            self.observer.on_drop(entry)
        self.policy.remove(file_id)
        USED.set(self.policy.used_bytes)
        return True

    def _erase(self, file_id: int) -> None:
        """Remove a forgotten version's row (blocks and chunk map go with it) and data.
        A fill of it still writing finds it gone from ``_files`` and records nothing."""
        self._delete_row(file_id)
        self._data_path(file_id).unlink(missing_ok=True)

    def invalidate(
        self,
        path: str,
        keep_version: int | None = None,
        *,
        below: bool = False,
        evict: bool = False,
    ) -> int:
        """Drop every cached version of ``path`` (and, with ``below``, of everything under
        it) except ``keep_version``; returns how many were dropped. Versions being read
        stay until their readers close, and versions with a chunk map are retired (kept
        as chunk sources), unless ``evict``: an eviction the data's owner demands drops
        them all, and every retired version too, and their chunks leave the chunk index
        (the readers' open descriptors still finish)."""
        prefix = path.rstrip("/") + "/"
        doomed = [
            f.id
            for f in self._files.values()
            if (f.path == path or (below and f.path.startswith(prefix)))
            and f.version != keep_version
            and (evict or (not f.retired and not f.readers))
        ]
        if evict:
            # retired versions are chunk sources of no current path, and which of them
            # hold the evicted data (one renamed into the restricted path since) can't be
            # told here: an eviction drops them all, at the cost of dedup against them
            doomed += [f.id for f in self._files.values() if f.retired and f.id not in doomed]
        for file_id in doomed:
            if evict:  # gone, with its chunk maps and its place in the chunk index
                self._drop(file_id)
            else:
                self._retire_or_drop(file_id)
        return len(doomed)

    def _retire_or_drop(self, file_id: int) -> None:
        """A version with a chunk map stays as a source of chunks (the next version shares
        most of them), and a small one held whole as the bytes a rewrite with the same
        content names by id (``ChunkFiller.whole``); out of every lookup; eviction drops
        it like any other."""
        entry = self._files[file_id]
        small = entry.size <= SMALL_FILE and entry.complete()
        if (
            self.chunks is None
            or not entry.hashes
            or (file_id not in self.chunks.maps and not small)
        ):
            self._drop(file_id)
            return
        entry.retired = True
        if self.observer is not None:  # never read again as itself: a drop to the prefetcher
            self.observer.on_drop(entry)
        self._by_key.pop((entry.path, entry.version), None)
        self._sql("UPDATE files SET pinned = 0 WHERE id = ?", (file_id,))
        if entry.pinned:
            entry.pinned = False
            self.policy.unpin(file_id)

    async def prefetch_map(self, path: str, version: int, size: int) -> None:
        """Ask for a version's chunk map ahead of its fill (a warm-up does, for the file
        after the one it is fetching), so the link does not idle while the hub maps it.
        Failures are left to the fill, which asks again and reports them."""
        if self.chunks is not None and size > SMALL_FILE:
            with contextlib.suppress(Exception):
                await self.chunks.chunk_map(self._ensure(path, version, size))

    async def fill_small(
        self, files: Sequence[tuple[str, int, int]], who: Principal | None = None
    ) -> set[tuple[str, int]]:
        """Fetch the small files of ``files`` (path, version, size) this cache lacks, in
        one request per bundle (``ChunkFiller.bundle``) read for ``who`` (None: the spoke
        itself), ahead of their reads (a warm-up does, for a directory's files); the
        (path, version) of those the bundles brought. What the hub sent none of, or a
        bundle that failed, is left to each file's own fill, which asks again and reports
        why."""
        brought: set[tuple[str, int]] = set()
        if self.chunks is None:
            return brought
        lacking = [
            entry
            for path, version, size in files
            if 0 < size <= SMALL_FILE
            and not (entry := self._ensure(path, version, size)).complete()
        ]
        batch: list[CachedFile] = []
        for index, entry in enumerate(lacking):
            batch.append(entry)
            full = sum(f.size for f in batch) + SMALL_FILE > bundle.MAX_BYTES
            if full or len(batch) == bundle.MAX_FILES or index == len(lacking) - 1:
                brought |= await self._fill_bundle(batch, who)
                batch = []
        return brought

    async def _fill_bundle(
        self, entries: list[CachedFile], who: Principal | None
    ) -> set[tuple[str, int]]:
        assert self.chunks is not None
        brought: set[tuple[str, int]] = set()
        try:
            got = await self.chunks.bundle(entries, SMALL_FILE, who)
        except LoomError as exc:  # say, a hub from before bundles (404): each file alone
            log.warning("a bundle of small files failed; fetching them one by one: %s", exc)
            return brought
        for entry, data in zip(entries, got, strict=True):
            if data is not None and len(data) == entry.size:
                await self.store(entry.path, entry.version, entry.size, 0, data)
                brought.add((entry.path, entry.version))
        return brought

    def set_map(self, path: str, version: int, size: int, chunk_map: ChunkMap) -> None:
        """Keep the chunk map of a version (read from the hub with its entry)."""
        if self.chunks is not None:
            self.chunks.set_map(self._ensure(path, version, size).id, chunk_map)

    def set_pinned(self, path: str, version: int, pinned: bool) -> None:
        entry = self.get(path, version)
        if entry is None:
            return
        entry.pinned = pinned
        self._sql("UPDATE files SET pinned = ? WHERE id = ?", (int(pinned), entry.id))
        (self.policy.pin if pinned else self.policy.unpin)(entry.id)

    def __iter__(self) -> Iterator[CachedFile]:
        return iter(list(self._files.values()))


class _CacheSource(LocalFileSource):
    """A cache file region that releases its version (for eviction) when closed."""

    def __init__(
        self, fd: int, offset: int, length: int, path: str, release: Callable[[], None]
    ) -> None:
        super().__init__(fd, offset, length, path, fixed=True)
        self._release = release

    async def verify(self) -> None:
        # filled blocks never change (a new version is a new file) and these were verified;
        # the file's mtime moves whenever other blocks are filled, so it proves nothing here
        return None

    async def aclose(self) -> None:
        await super().aclose()
        with contextlib.suppress(Exception):
            release, self._release = self._release, lambda: None
            release()
