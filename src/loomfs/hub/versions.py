"""Versions of files in versioned directories (hub layer): the catalog rows and the bytes.

A directory set to ``Enabled`` keeps the old version of a file there when it is
overwritten or removed (a removal leaves a delete marker); ``Suspended`` keeps the
versions it has and makes new writes the one "null" version, as S3 does. The rows live in
the catalog (``versions``, ``versioning``), one per version a path has had since; the old
versions' bytes are content-defined chunks (``chunks.cdc``), stored once by id as zstd
frames under the store's directory, so a small edit of a big file keeps about the edit.
A version's id is its namespace version (the change sequence number of its content, so
never reused for a path), a delete marker's the sequence number of its removal.

Every chunk read back is verified against its id (``decode_frame``).
"""

from __future__ import annotations

import asyncio
import io
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from .. import paths
from ..chunks.cdc import Readable, iter_chunks
from ..chunks.codec import chunk_id, decode_frame, encode_chunk
from ..core.catalog.base import Catalog
from ..core.catalog.sql import Cursor, SqlCatalog
from ..core.streams import FileRegion
from ..core.types import Entry
from ..errors import CorruptData, InvalidArgument, NotFound, NotSupported, UnsupportedScheme
from ..namespace.base import NULL_VERSION, VERSIONING_STATES, Version

_COLUMNS = "path, vid, seq, marker, current, ns_version, size, mtime_ns, etag, chunks, tags"


@dataclass(frozen=True, slots=True)
class Row:
    path: str
    vid: str
    seq: int
    marker: bool
    current: bool
    ns_version: int
    size: int
    mtime_ns: int
    etag: str | None
    chunks: list[str]
    tags: dict[str, str]

    def version(self, latest: bool) -> Version:
        return Version(
            self.path, self.vid, self.seq, self.marker, latest,
            self.size, self.mtime_ns, self.etag, self.tags, self.ns_version,
        )  # fmt: skip


def _row(values: tuple[object, ...]) -> Row:
    path, vid, seq, marker, current, ns_version, size, mtime_ns, etag, chunks, tags = values
    return Row(
        str(path), str(vid), int(str(seq)), bool(marker), bool(current), int(str(ns_version)),
        int(str(size)), int(str(mtime_ns)), None if etag is None else str(etag),
        json.loads(str(chunks)), json.loads(str(tags)),
    )  # fmt: skip


class VersionStore:
    def __init__(self, catalog: Catalog, root: Path) -> None:
        if not isinstance(catalog, SqlCatalog):
            raise UnsupportedScheme(f"versions need a SQL catalog, not {catalog.url}")
        self._cat = catalog
        self.root = root
        #: every directory's state, loaded once: a write asks it, with no catalog trip
        self._states: dict[str, str] | None = None

    # -- states ----------------------------------------------------------------------------

    async def load(self) -> None:
        def fn(cur: Cursor) -> dict[str, str]:
            rows = self._cat._q(cur, "SELECT path, state FROM versioning").fetchall()
            return {str(p): str(s) for p, s in rows}

        self._states = await self._cat._run(self._cat._read, fn)

    def state_of(self, path: str) -> str | None:
        """The state of ``path``'s nearest set ancestor (or itself), None if none."""
        states = self._states
        if not states:
            return None
        while True:
            if path in states:
                return states[path]
            if path == "/":
                return None
            path = paths.split(path)[0]

    async def set_state(self, path: str, state: str) -> None:
        if state not in VERSIONING_STATES:
            raise InvalidArgument(f"versioning is Enabled or Suspended, not {state!r}", path=path)

        def fn(cur: Cursor) -> None:
            self._cat._q(cur, "DELETE FROM versioning WHERE path = ?", (path,))
            self._cat._q(cur, "INSERT INTO versioning (path, state) VALUES (?, ?)", (path, state))

        await self._cat._run(self._cat._write, fn)
        if self._states is None:
            await self.load()
        assert self._states is not None
        self._states[path] = state

    async def forget_state(self, path: str) -> None:
        """Drop the states of ``path`` and below (a removed directory: one made anew by
        that name starts unversioned)."""
        if not self._states or not any(paths.is_within(p, path) for p in self._states):
            return
        below = path.rstrip("/") + "/"

        def fn(cur: Cursor) -> None:
            self._cat._q(
                cur,
                "DELETE FROM versioning WHERE path = ? OR substr(path, 1, ?) = ?",
                (path, len(below), below),
            )

        await self._cat._run(self._cat._write, fn)
        self._states = {p: s for p, s in self._states.items() if not paths.is_within(p, path)}

    def versioned_near(self, path: str) -> bool:
        """Whether a state is set at, above or below ``path`` (else it has no versions)."""
        return bool(self._states) and any(
            paths.is_within(p, path) or paths.is_within(path, p) for p in self._states or ()
        )

    async def forget_rows(self, path: str) -> None:
        """Drop the version rows of ``path`` and below (a removed directory's)."""
        below = path.rstrip("/") + "/"

        def fn(cur: Cursor) -> None:
            self._cat._q(
                cur,
                "DELETE FROM versions WHERE path = ? OR substr(path, 1, ?) = ?",
                (path, len(below), below),
            )

        await self._cat._run(self._cat._write, fn)

    # -- rows ------------------------------------------------------------------------------

    async def rows(self, path: str) -> list[Row]:
        """The rows of ``path`` and every path below it, by path, newest first."""
        below = path.rstrip("/") + "/"

        def fn(cur: Cursor) -> list[Row]:
            found = self._cat._q(
                cur,
                f"SELECT {_COLUMNS} FROM versions WHERE path = ? OR substr(path, 1, ?) = ?",
                (path, len(below), below),
            ).fetchall()
            return [_row(tuple(r)) for r in found]

        found = await self._cat._run(self._cat._read, fn)
        return sorted(found, key=lambda r: (r.path, -r.seq))

    async def path_rows(self, path: str) -> list[Row]:
        def fn(cur: Cursor) -> list[Row]:
            found = self._cat._q(
                cur, f"SELECT {_COLUMNS} FROM versions WHERE path = ?", (path,)
            ).fetchall()
            return [_row(tuple(r)) for r in found]

        found = await self._cat._run(self._cat._read, fn)
        return sorted(found, key=lambda r: -r.seq)

    @staticmethod
    def current_of(rows: list[Row], entry: Entry | None) -> Row | None:
        """The row naming the file now at the path (``entry``), if it has one."""
        if entry is None:
            return None
        return next((r for r in rows if r.current and r.ns_version == entry.version), None)

    async def _put(self, row: Row, *, drop_current: bool = False) -> None:
        def fn(cur: Cursor) -> None:
            q = self._cat._q
            q(cur, "DELETE FROM versions WHERE path = ? AND vid = ?", (row.path, row.vid))
            if drop_current:
                q(cur, "DELETE FROM versions WHERE path = ? AND current = 1", (row.path,))
            q(
                cur,
                f"INSERT INTO versions ({_COLUMNS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    row.path, row.vid, row.seq, int(row.marker), int(row.current),
                    row.ns_version, row.size, row.mtime_ns, row.etag,
                    json.dumps(row.chunks), json.dumps(row.tags, sort_keys=True),
                ),
            )  # fmt: skip

        await self._cat._run(self._cat._write, fn)

    async def set_row_tags(self, path: str, vid: str, tags: dict[str, str]) -> None:
        """Make ``tags`` those an old version keeps (its object lock changed)."""

        def fn(cur: Cursor) -> None:
            self._cat._q(
                cur,
                "UPDATE versions SET tags = ? WHERE path = ? AND vid = ?",
                (json.dumps(tags, sort_keys=True), path, vid),
            )

        await self._cat._run(self._cat._write, fn)

    async def drop(self, path: str, *vids: str, current: bool = False) -> None:
        def fn(cur: Cursor) -> None:
            for vid in vids:
                self._cat._q(cur, "DELETE FROM versions WHERE path = ? AND vid = ?", (path, vid))
            if current:
                self._cat._q(cur, "DELETE FROM versions WHERE path = ? AND current = 1", (path,))

        await self._cat._run(self._cat._write, fn)

    # -- the namespace's hooks -------------------------------------------------------------

    async def keep(
        self, state: str, entry: Entry, tags: dict[str, str], data: bytes | Readable
    ) -> None:
        """Keep the file ``entry`` (its bytes ``data``, or a file to read them from) as an
        old version before it is replaced or removed; in a suspended directory the null
        version is not kept."""
        rows = await self.path_rows(entry.path)
        now = self.current_of(rows, entry)
        vid = now.vid if now is not None else NULL_VERSION
        if state != "Enabled" and vid == NULL_VERSION:
            await self.drop(entry.path, NULL_VERSION, current=True)
            return
        ids = await asyncio.to_thread(self._store, data)
        seq = now.seq if now is not None else entry.version
        row = Row(
            entry.path, vid, seq, False, False, entry.version, entry.size, entry.mtime_ns,
            entry.etag, ids, dict(tags),
        )  # fmt: skip
        await self._put(row, drop_current=True)

    async def written(self, state: str, entry: Entry, vid: str | None = None, seq: int = 0) -> None:
        """Name the file just written (``entry``): as ``vid`` (a restored version) or its
        own version while Enabled, else the null version (replacing an old null one)."""
        if vid is None:
            vid = str(entry.version) if state == "Enabled" else NULL_VERSION
        row = Row(
            entry.path, vid, seq or entry.version, False, True, entry.version, entry.size,
            entry.mtime_ns, entry.etag, [], {},
        )  # fmt: skip
        await self._put(row, drop_current=True)

    async def marked(self, state: str, path: str, seq: int) -> str:
        """Leave a delete marker at ``path`` (removed at change ``seq``); its id."""
        vid = str(seq) if state == "Enabled" else NULL_VERSION
        marker = Row(path, vid, seq, True, False, 0, 0, time.time_ns(), None, [], {})
        await self._put(marker, drop_current=True)
        return vid

    # -- bytes -----------------------------------------------------------------------------

    def _chunk_path(self, hex_id: str) -> Path:
        return self.root / hex_id[:2] / hex_id

    def _store(self, data: bytes | Readable) -> list[str]:
        ids = []
        for piece in iter_chunks(io.BytesIO(data) if isinstance(data, bytes) else data):
            hex_id = chunk_id(piece).hex()
            ids.append(hex_id)
            target = self._chunk_path(hex_id)
            if target.exists():  # stored by an earlier version: the dedup
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            staged = target.with_suffix(f".{os.getpid()}.tmp")
            staged.write_bytes(encode_chunk(piece))
            os.replace(staged, target)
        return ids

    def _load(self, ids: list[str]) -> bytes:
        out = bytearray()
        for hex_id in ids:
            try:
                frame = self._chunk_path(hex_id).read_bytes()
            except FileNotFoundError:
                raise CorruptData(f"chunk {hex_id} of a kept version is missing") from None
            out += decode_frame(frame, bytes.fromhex(hex_id))
        return bytes(out)

    async def content(self, row: Row) -> bytes:
        if row.marker:
            raise NotFound(f"version {row.vid} of {row.path} is a delete marker", path=row.path)
        return await asyncio.to_thread(self._load, row.chunks)


class RegionFile:
    """A region of an open local file as a ``Readable`` (``os.preadv`` at its offset)."""

    def __init__(self, region: FileRegion) -> None:
        self._fd, self._pos = region.fd, region.offset
        self._end = region.offset + region.length

    def readinto(self, buffer: memoryview, /) -> int:
        want = min(len(buffer), self._end - self._pos)
        if want <= 0:
            return 0
        got = os.preadv(self._fd, [buffer[:want]], self._pos)
        self._pos += got
        return got


def no_store(path: str) -> NotSupported:
    return NotSupported("this hub keeps no versions (it has no version store)", path=path)
