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
        # answers lookups by key on the event loop, opened at the first one
        self._reader: sqlite3.Connection | None = None

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

    async def _lookup(self, fn: Callable[[Cursor], T]) -> T:
        # A lookup by key takes SQLite microseconds, a hand-off to the catalog's thread and
        # back far longer (a FUSE create made several): a second connection answers it
        # where it is asked. WAL lets it read beside the writer, seeing every commit made
        # before it starts; it never waits for a lock, and when one is in the way (rare
        # for a WAL reader) the catalog's thread answers instead.
        if self._conn is None:
            return await super()._lookup(fn)
        if self._reader is None:
            self._reader = sqlite3.connect(
                self.path, isolation_level=None, check_same_thread=False, timeout=0
            )
            self._reader.execute("PRAGMA query_only = ON")
        cur = self._reader.cursor()
        try:
            return fn(cur)
        except sqlite3.Error as exc:
            if not isinstance(exc, sqlite3.OperationalError) or not _in_the_way(exc):
                raise self._translate(exc) or exc from exc
        finally:
            cur.close()  # ends the read: the next one sees later commits
        return await super()._lookup(fn)

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
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
