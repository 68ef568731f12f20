"""NFS file handles (protocol layer): stable, authenticated names of namespace objects.

A handle is ``magic | export id | object id | MAC``: the export id is the first bytes of a
hash of the export's path, the object id a number this server gave the object's path in
its handle table (SQLite, under the data directory), and the MAC an HMAC of both with a key
kept beside it. So a handle survives a restart (the table and key are on disk), a forged or
altered one is NFS3ERR_BADHANDLE before anything is looked up, and one naming a removed
object is NFS3ERR_STALE: removal through NFS retires its id (a new file of the same name
gets a new one), and a path that is gone is stale whichever protocol removed it. Inode
numbers cannot serve: a namespace write replaces a posix file atomically, under a new inode.

Renames through NFS move the ids of everything below the old name to the new one, so open
handles keep working; a rename made over another protocol leaves the old handles stale.
The object id doubles as NFS's ``fileid`` and READDIR's cookie, both stable across restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import sqlite3
from pathlib import Path
from typing import NamedTuple

from .errors import NFS3ERR_BADHANDLE, NfsError

MAGIC = b"L\x01"
HANDLE_SIZE = len(MAGIC) + 4 + 8 + 16
KEY_FILE = "handle.key"
DB_FILE = "handles.db"


def export_id(path: str) -> int:
    return int.from_bytes(hashlib.sha256(path.encode()).digest()[:4], "big")


class Known(NamedTuple):
    path: str
    live: bool


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
    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.key = _load_key(directory / KEY_FILE)
        self.db = sqlite3.connect(directory / DB_FILE, isolation_level=None)
        self.db.execute("PRAGMA journal_mode = WAL")
        # WAL with NORMAL: a commit survives the process being killed (not power loss,
        # which a client's handles would not survive either)
        self.db.execute("PRAGMA synchronous = NORMAL")
        self.db.execute(
            "CREATE TABLE IF NOT EXISTS handles (id INTEGER PRIMARY KEY AUTOINCREMENT, "
            "path TEXT NOT NULL, live INTEGER NOT NULL DEFAULT 1)"
        )
        self.db.execute(
            "CREATE UNIQUE INDEX IF NOT EXISTS handles_live ON handles (path) WHERE live = 1"
        )
        self.db.execute("CREATE INDEX IF NOT EXISTS handles_path ON handles (path)")

    def close(self) -> None:
        self.db.close()

    # -- handles ---------------------------------------------------------------------------

    def mac(self, body: bytes) -> bytes:
        """The server's HMAC of ``body`` (16 bytes): what no client can make up."""
        return hmac.new(self.key, body, hashlib.sha256).digest()[:16]

    def encode(self, export: int, object_id: int) -> bytes:
        body = MAGIC + export.to_bytes(4, "big") + object_id.to_bytes(8, "big")
        return body + self.mac(body)

    def decode(self, handle: bytes) -> tuple[int, int]:
        """(export id, object id) of a handle this server made; BADHANDLE otherwise."""
        body, mac = handle[:-16], handle[-16:]
        if (
            len(handle) != HANDLE_SIZE
            or not handle.startswith(MAGIC)
            or not hmac.compare_digest(mac, self.mac(body))
        ):
            raise NfsError(NFS3ERR_BADHANDLE, "not a handle of this server")
        return int.from_bytes(body[2:6], "big"), int.from_bytes(body[6:14], "big")

    # -- the table -------------------------------------------------------------------------

    def known(self, object_id: int) -> Known | None:
        row = self.db.execute("SELECT path, live FROM handles WHERE id = ?", (object_id,))
        found = row.fetchone()
        return None if found is None else Known(found[0], bool(found[1]))

    def find(self, path: str) -> int | None:
        """The object id of ``path``, if it has one."""
        row = self.db.execute("SELECT id FROM handles WHERE path = ? AND live = 1", (path,))
        found = row.fetchone()
        return None if found is None else int(found[0])

    def id(self, path: str) -> int:
        """The object id of ``path``, made if it has none."""
        found = self.find(path)
        if found is not None:
            return found
        cur = self.db.execute("INSERT INTO handles (path) VALUES (?)", (path,))
        assert cur.lastrowid is not None
        return cur.lastrowid

    def removed(self, path: str) -> None:
        """``path`` and everything below it are gone: their handles are stale."""
        self.db.execute(
            "UPDATE handles SET live = 0 WHERE live = 1 AND (path = ? OR (path >= ? AND path < ?))",
            (path, *_below(path)),
        )

    def renamed(self, src: str, dst: str) -> None:
        """``src`` (and everything below it) is now ``dst``; what ``dst`` was is gone."""
        self.db.execute("BEGIN")
        try:
            self.removed(dst)
            self.db.execute(
                "UPDATE handles SET path = ? || substr(path, ?) "
                "WHERE live = 1 AND (path = ? OR (path >= ? AND path < ?))",
                (dst, len(src) + 1, src, *_below(src)),
            )
            self.db.execute("COMMIT")
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
