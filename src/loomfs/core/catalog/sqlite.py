"""SQLite catalog engine (core layer): the embedded default, one file, WAL mode."""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from ...errors import (
    AlreadyExists,
    BackendUnavailable,
    ConfigError,
    InsufficientStorage,
    LoomError,
)
from .sql import Cursor, Dialect, SqlCatalog, T

#: small commits on the event loop between two checkpoints: a change writes a few pages
#: of the WAL (entry, its index, change log, counter), SQLite checkpoints every 1000
_CHECKPOINT_EVERY = 250


def _in_the_way(exc: sqlite3.Error) -> bool:
    """Whether another connection's lock refused the statement."""
    return "locked" in str(exc) or "busy" in str(exc)


class SqliteCatalog(SqlCatalog):
    """``sqlite:///absolute/path/catalog.db``; the parent directory is created."""

    dialect = Dialect(
        name="sqlite",
        param="?",
        id_column="INTEGER PRIMARY KEY AUTOINCREMENT",  # ids are never reused
        text="TEXT",  # SQLite's default BINARY collation already orders bytewise
        begin_write="BEGIN IMMEDIATE",
    )

    def __init__(self, url: str, path: Path) -> None:
        super().__init__(url)
        self.path = path
        # answers lookups by key, and small changes when not durable, on the event loop
        # (opened at the first)
        self._loop_conn: sqlite3.Connection | None = None
        #: commits made on the loop since the last checkpoint asked for
        self._unchecked = 0

    @classmethod
    def from_url(cls, url: str) -> SqliteCatalog:
        parts = urlsplit(url)
        if parts.netloc or not parts.path.startswith("/") or parts.path == "/":
            raise ConfigError(
                "a SQLite catalog URL names an absolute file "
                f"(sqlite:///path/to/catalog.db), not {url!r}"
            )
        return cls(url, Path(parts.path))

    def _connect(self) -> Any:
        if sqlite3.sqlite_version_info < (3, 39):
            # the scan diff uses UPDATE ... FROM (3.33) and IS DISTINCT FROM (3.39)
            raise ConfigError(
                f"the SQLite catalog needs SQLite 3.39 or newer; Python here is linked "
                f"with {sqlite3.sqlite_version}"
            )
        self.path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        for pragma in (
            "journal_mode = WAL",
            # FULL: a commit the hub acknowledged survives power loss. NORMAL: the WAL is
            # written at each commit (a process crash loses nothing) but flushed by ``sync``
            "synchronous = FULL" if self.durable else "synchronous = NORMAL",
            "foreign_keys = ON",
            "busy_timeout = 10000",
            "cache_size = -65536",
            "temp_store = MEMORY",  # apply_scan's scratch tables
        ):
            conn.execute(f"PRAGMA {pragma}")
        return conn

    def _on_loop(self) -> sqlite3.Connection:
        """The connection that answers where it is asked (on the event loop): lookups, and
        when not durable small commits too. One connection for both keeps one page cache;
        with a second one for lookups, each read the pages the other had just written
        back from the WAL (six reads per FUSE create). It never waits for a lock: when
        one is in the way the catalog's thread answers instead."""
        if self._loop_conn is None:
            self._loop_conn = self._connect()
            self._loop_conn.execute("PRAGMA busy_timeout = 0")
            # checkpoints stay on the catalog's thread (``_sync`` relies on it), asked
            # for by ``_change`` at about the rate SQLite's own (1000 WAL pages) would run
            self._loop_conn.execute("PRAGMA wal_autocheckpoint = 0")
            if self.durable:
                self._loop_conn.execute("PRAGMA query_only = ON")  # its commits: the thread's
        return self._loop_conn

    async def _lookup(self, fn: Callable[[Cursor], T]) -> T:
        # A lookup by key takes SQLite microseconds, a hand-off to the catalog's thread and
        # back far longer (a FUSE create made several). WAL lets the loop's connection
        # read beside the thread's writer, seeing every commit made before it starts.
        if self._conn is None:
            return await super()._lookup(fn)
        cur = self._on_loop().cursor()
        try:
            return fn(cur)
        except sqlite3.Error as exc:
            if not isinstance(exc, sqlite3.OperationalError) or not _in_the_way(exc):
                raise self._translate(exc) or exc from exc
        finally:
            cur.close()  # ends the read: the next one sees later commits
        return await super()._lookup(fn)

    async def _change(self, fn: Callable[[Cursor], T]) -> T:
        # Not durable (a mount's own hub): a commit appends to the WAL and flushes nothing
        # (it survives kill -9, not power loss), which takes SQLite tens of microseconds,
        # and a hand-off to the catalog's thread and back took several times that (twice
        # per FUSE create or unlink: bench/ns_meta.py), so the loop's connection commits
        # it. When the catalog's thread holds the write lock (a scan), that thread commits
        # this change after. Durable, the commit's fsync is milliseconds and belongs off
        # the event loop.
        if self.durable or self._conn is None:
            return await super()._change(fn)
        conn = self._on_loop()
        try:
            result = self._write(fn, cur=conn.cursor())
        except sqlite3.Error as exc:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            if not isinstance(exc, sqlite3.OperationalError) or not _in_the_way(exc):
                raise self._translate(exc) or exc from exc
            return await super()._change(fn)  # nothing was committed: the thread's turn
        self._unchecked += 1
        if self._unchecked >= _CHECKPOINT_EVERY:
            self._unchecked = 0
            await self._run(self._checkpoint)
        return result

    def _checkpoint(self) -> None:
        # PASSIVE: copies what no reader still needs, never waits for one
        self._cur().execute("PRAGMA wal_checkpoint(PASSIVE)").fetchall()

    async def close(self) -> None:
        if self._loop_conn is not None:
            self._loop_conn.close()
            self._loop_conn = None
        await super().close()

    async def sync(self) -> None:
        if not self.durable:
            await self._run(self._sync)

    def _sync(self) -> None:
        # On the catalog's thread, so no checkpoint runs meanwhile: the commits not yet
        # checkpointed are in the WAL file, and those checkpointed were flushed with the
        # database by the checkpoint itself (synchronous = NORMAL's rule).
        try:
            fd = os.open(f"{self.path}-wal", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return  # closed cleanly: everything is checkpointed and flushed
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _translate(self, exc: Exception) -> Exception | None:
        if isinstance(exc, LoomError) or not isinstance(exc, sqlite3.Error):
            return None
        text = str(exc)
        if isinstance(exc, sqlite3.IntegrityError) and "UNIQUE" in text:
            return AlreadyExists(f"already exists ({text})")
        if "full" in text:
            return InsufficientStorage(f"catalog {self.path}: {text}")
        if _in_the_way(exc):
            return BackendUnavailable(f"catalog {self.path} is busy: {text}")
        return BackendUnavailable(f"catalog {self.path}: {text}")
