"""NFS file handles (protocol layer): stable, authenticated names of namespace objects.

A handle is ``magic | export id | object id | MAC``: the export id is the first bytes of a
hash of the export's path, the object id a number this server gave the object in its
handle table (SQLite, under the data directory), and the MAC an HMAC of both with a key
kept beside it. So a handle survives a restart (the table and key are on disk), and a forged
or altered one is NFS3ERR_BADHANDLE before anything is looked up. Inode numbers cannot
serve: a namespace write replaces a posix file atomically, under a new inode.

An object id stands for the entry's identity where the namespace gives one (``Entry.id``,
the hub catalog's row, which a rename or a new version keeps) and remembers the path it
was last seen at. The server looks there first and, where that path is gone or now names
another entry, asks the namespace where the entry went (``Namespace.locate``): a rename
over any protocol keeps the handle valid, and a removed object is NFS3ERR_STALE. Where the
namespace has no ids (a spoke), the path is all there is: renames through NFS move the ids
below the old name to the new one, and a rename over another protocol leaves them stale.
The object id doubles as NFS's ``fileid`` and READDIR's cookie, both stable across restarts.

A file with hard links is one object whatever name it is reached by (a client caches a
file's attributes by its handle: names with handles of their own would show each other's
chmod, write or unlink only after the attribute cache timed out). The catalog has a row
per name, so the entries of the other names are the object's *aliases*
(``HandleTable.alias``): looked up by entry, an alias gives the object's id; the object
keeps the path and entry of one name, and when that name goes the server moves it to an
alias's (``NfsServer._stat``).
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from .errors import NFS3ERR_BADHANDLE, NfsError

MAGIC = b"L\x01"
HANDLE_SIZE = len(MAGIC) + 4 + 8 + 16
KEY_FILE = "handle.key"
DB_FILE = "handles.db"
#: rows ``HandleTable`` keeps read (each call of a client's names one or two of them)
_CACHED = 65536


def export_id(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "big")


class Known(NamedTuple):
    path: str
    live: bool
    #: the entry's identity (``Entry.id``); None where the namespace gave none
    entry: int | None


def _load_key(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    partial = path.with_name(path.name + ".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, key)
        os.fsync(fd)
    finally:
        os.close(fd)
    partial.replace(path)
    return key


def _below(path: str) -> tuple[str, str]:
    """The bounds of the paths strictly below ``path``, as a range the path index walks
    (a substr() comparison scanned the whole table: every REMOVE paid for every handle
    ever made): every such path starts with ``path/``, and so sorts (bytewise, as SQLite
    compares text) from ``path/`` up to, not including, ``path0`` ('0' follows '/')."""
    top = path.rstrip("/")
    return top + "/", top + "0"


class HandleTable:
    """The table, with what GETATTR, LOOKUP and ACCESS read of it (an object by its id, by
    its entry) kept in memory: each call reads one or two rows, which SQLite took a fifth
    of a GETATTR's time for. Every write to the table goes through ``_change``, which
    forgets all that was kept, so what is kept is always what the table holds (this
    server is its only writer)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.key = _load_key(directory / KEY_FILE)
        self._known: dict[int, Known | None] = {}
        self._entries: dict[int, tuple[int, str | None] | None] = {}
        self._decoded: dict[bytes, tuple[int, int]] = {}
        self._encoded: dict[tuple[int, int], bytes] = {}
        self.db = sqlite3.connect(directory / DB_FILE, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        # WAL with NORMAL: a commit survives the process being killed (not power loss,
        # which a client's handles would not survive either)
        self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS handles (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "path TEXT NOT NULL, live INTEGER NOT NULL DEFAULT 1)"
        )
        columns = {row[1] for row in self.db.execute("PRAGMA table_info(handles)")}
        if "entry" not in columns:  # a table of a server that keyed its handles by path
            self.db.execute("ALTER TABLE handles ADD COLUMN entry INTEGER")
        # two live ids may hold one path for a while (an entry renamed away over another
        # protocol, then a new one at its name), never one entry
        self.db.execute("DROP INDEX IF EXISTS handles_live")
        self.db.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS handles_entry ON handles (entry) "
            "WHERE live = 1 AND entry IS NOT NULL"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS handles_path ON handles (path)")
        # the entries of a hard-linked file's other names, each standing for the object;
        # ``cookie``: a retired row of ``handles`` that keeps the name's path, so a READDIR
        # cookie names the name, as an object id names its own
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS aliases (entry INTEGER PRIMARY KEY, "
            "object INTEGER NOT NULL, cookie INTEGER NOT NULL)"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS aliases_object ON aliases (object)")

    def close(self) -> None:
        self.db.close()

    # -- handles ---------------------------------------------------------------------------

    def mac(self, body: bytes) -> bytes:
        """The server's HMAC of ``body`` (16 bytes): what no client can make up."""
        return hmac.digest(self.key, body, "sha256")[:16]

    def encode(self, export: int, object_id: int) -> bytes:
        # the same numbers make the same bytes: READDIRPLUS makes one handle an entry
        handle = self._encoded.get((export, object_id))
        if handle is None:
            body = MAGIC + export.to_bytes(4, "big") + object_id.to_bytes(8, "big")
            handle = body + self.mac(body)
            if len(self._encoded) >= _CACHED:
                self._encoded.clear()
            self._encoded[export, object_id] = handle
        return handle

    def decode(self, handle: bytes) -> tuple[int, int]:
        """(export id, object id) of a handle this server made; BADHANDLE otherwise. A
        handle checked once is remembered by its bytes (a client sends the same few
        again and again): the same bytes carry the same MAC."""
        decoded = self._decoded.get(handle)
        if decoded is not None:
            return decoded
        body, mac = handle[:-16], handle[-16:]
        if (
            len(handle) != HANDLE_SIZE
            or not handle.startswith(MAGIC)
            or not hmac.compare_digest(mac, self.mac(body))
        ):
            raise NfsError(NFS3ERR_BADHANDLE, "not a handle of this server")
        decoded = int.from_bytes(body[2:6], "big"), int.from_bytes(body[6:14], "big")
        if len(self._decoded) >= _CACHED:
            self._decoded.clear()
        self._decoded[handle] = decoded
        return decoded

    # -- the table -------------------------------------------------------------------------

    def _forget(self) -> None:
        self._known.clear()
        self._entries.clear()

    def _change(self, sql: str, params: Sequence[object]) -> sqlite3.Cursor:
        """One write to the table (alone, or in a ``_transaction``)."""
        self._forget()
        return self.db.execute(sql, params)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        self.db.execute("BEGIN")
        try:
            yield
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        finally:
            self._forget()  # nothing read inside it outlives a rollback

    def known(self, object_id: int) -> Known | None:
        if object_id in self._known:
            return self._known[object_id]
        row = self.db.execute("SELECT path, live, entry FROM handles WHERE id = ?", (object_id,))
        found = row.fetchone()
        known = None if found is None else Known(found[0], bool(found[1]), found[2])
        if len(self._known) >= _CACHED:
            self._known.clear()
        self._known[object_id] = known
        return known

    def find(self, path: str, entry: int | None = None) -> int | None:
        """The object id of the entry ``entry`` (else of what is at ``path``), if it has one."""
        if entry is not None and (held := self._of_entry(entry)) is not None:
            return held[0]
        return self._at(path, entry)

    def id(self, path: str, entry: int | None = None) -> int:
        """The object id of the entry ``entry`` now at ``path`` (of whatever is at ``path``
        where the namespace gave no identity), made if it has none."""
        if entry is not None and (held := self._of_entry(entry)) is not None:
            if held[1] not in (path, None):  # renamed over another protocol: its name now
                self._change("UPDATE handles SET path = ? WHERE id = ?", (path, held[0]))
            return held[0]
        # without an identity (a create's answer, a spoke's own pending write): what is at
        # the path; with one, an id given before it was known
        object_id = self._at(path, entry)
        if object_id is not None:
            if entry is not None:
                self._change("UPDATE handles SET entry = ? WHERE id = ?", (entry, object_id))
            return object_id
        cur = self._change("INSERT INTO handles (path, entry) VALUES (?, ?)", (path, entry))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def _of_entry(self, entry: int) -> tuple[int, str | None] | None:
        """(object id, path) of the live object that is ``entry``, or (object id, None)
        of the one that has it as an alias (whose path is another name's)."""
        if entry in self._entries:
            return self._entries[entry]
        found = self._of_entry_read(entry)
        if len(self._entries) >= _CACHED:
            self._entries.clear()
        self._entries[entry] = found
        return found

    def _of_entry_read(self, entry: int) -> tuple[int, str | None] | None:
        row = self.db.execute(
            "SELECT id, path FROM handles WHERE entry = ? AND live = 1", (entry,)
        ).fetchone()
        if row is not None:
            return int(row[0]), str(row[1])
        row = self.db.execute(
            "SELECT h.id FROM aliases a JOIN handles h ON h.id = a.object "
            "WHERE a.entry = ? AND h.live = 1",
            (entry,),
        ).fetchone()
        return None if row is None else (int(row[0]), None)

    def alias(self, entry: int, object_id: int, path: str) -> None:
        """``entry``, at ``path`` (another name of the object's file), stands for
        ``object_id``: a handle of its own, where one was given, is retired."""
        with self._transaction():
            self._change(
                "UPDATE handles SET live = 0 WHERE entry = ? AND live = 1 AND id != ?",
                (entry, object_id),
            )
            cur = self._change("INSERT INTO handles (path, live) VALUES (?, 0)", (path,))
            self._change(
                "INSERT OR REPLACE INTO aliases (entry, object, cookie) VALUES (?, ?, ?)",
                (entry, object_id, cur.lastrowid),
            )

    def cookie(self, object_id: int, entry: int | None, path: str) -> int:
        """The number READDIR's cookie for the name ``path`` is made of: the object id,
        or an alias's own (its path kept as the name is now)."""
        if entry is None:
            return object_id
        row = self.db.execute(
            "SELECT a.cookie, h.path FROM aliases a JOIN handles h ON h.id = a.cookie "
            "WHERE a.entry = ? AND a.object = ?",
            (entry, object_id),
        ).fetchone()
        if row is None:
            return object_id
        if row[1] != path:
            self._change("UPDATE handles SET path = ? WHERE id = ?", (path, row[0]))
        return int(row[0])

    def aliases(self, object_id: int) -> list[int]:
        rows = self.db.execute("SELECT entry FROM aliases WHERE object = ?", (object_id,))
        return [int(row[0]) for row in rows]

    def unalias(self, entry: int) -> None:
        """``entry``'s name is gone (an alias's: the object lives on under its own)."""
        self._change("DELETE FROM aliases WHERE entry = ?", (entry,))

    def moved_to(self, object_id: int, path: str, entry: int) -> None:
        """The object's own name is gone; it lives on as ``entry`` (its alias) at ``path``."""
        with self._transaction():
            self._change("DELETE FROM aliases WHERE entry = ?", (entry,))
            self._change(
                "UPDATE handles SET path = ?, entry = ? WHERE id = ?", (path, entry, object_id)
            )

    def _at(self, path: str, entry: int | None) -> int | None:
        """The live object id at ``path`` known only by it (any, for ``entry`` None):
        never another entry's whose path is out of date (it was renamed away)."""
        row = self.db.execute(
            "SELECT id FROM handles WHERE path = ? AND live = 1 AND (entry IS NULL OR ? IS NULL) "
            "ORDER BY id DESC LIMIT 1",
            (path, entry),
        ).fetchone()
        return None if row is None else int(row[0])

    def adopt(self, object_id: int, entry: int) -> None:
        """The object ``object_id`` (given without an identity) is the entry ``entry``."""
        self._change(
            "UPDATE handles SET entry = ? WHERE id = ? AND entry IS NULL AND NOT EXISTS "
            "(SELECT 1 FROM handles WHERE entry = ? AND live = 1)",
            (entry, object_id, entry),
        )

    def retire(self, object_id: int) -> None:
        """The object is gone: its handles are stale."""
        self._change("UPDATE handles SET live = 0 WHERE id = ?", (object_id,))
        self._change("DELETE FROM aliases WHERE object = ?", (object_id,))

    def removed(self, path: str) -> None:
        """``path`` and everything below it are gone: the handles of what is known only by
        its path are stale (an entry with an identity is found gone when next looked at,
        since it may have been renamed away before)."""
        self._change(
            "UPDATE handles SET live = 0 WHERE live = 1 AND entry IS NULL "
            "AND (path = ? OR (path >= ? AND path < ?))",
            (path, *_below(path)),
        )

    def renamed(self, src: str, dst: str) -> None:
        """``src`` (and everything below it) is now ``dst``; what ``dst`` was is gone."""
        with self._transaction():
            self.removed(dst)
            self._change(
                "UPDATE handles SET path = ? || substr(path, ?) "
                "WHERE live = 1 AND (path = ? OR (path >= ? AND path < ?))",
                (dst, len(src) + 1, src, *_below(src)),
            )
