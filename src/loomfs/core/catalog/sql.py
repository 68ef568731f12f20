"""The catalog over SQL (core layer): one implementation for SQLite and PostgreSQL.

Both engines are driven through their synchronous DB-API drivers on one dedicated thread
per catalog, so the SQL, the transaction logic and the diffing exist once; an engine only
supplies its connection, its dialect of DDL, and its translation of driver errors. Writers
are serialized (SQLite ``BEGIN IMMEDIATE``; PostgreSQL a row lock on the sequence counter),
which is what makes the change log gap-free and in commit order.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from abc import abstractmethod
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from itertools import chain
from typing import Any, Protocol, TypeVar

from prometheus_client import Histogram

from ... import paths
from ...errors import (
    AlreadyExists,
    Conflict,
    DirectoryNotEmpty,
    InvalidPath,
    NotADirectory,
    NotFound,
)
from ..types import Change, ChangeOp, Entry, EntryKind, Volume, VolumeState, WriteTags
from .base import (
    WRITE_ID_DAYS,
    Applied,
    Catalog,
    Delete,
    ExportRecords,
    Op,
    Put,
    ScanApplied,
    ScanRow,
    UploadRecords,
    VolumeUpdate,
)

T = TypeVar("T")
#: catalog calls by kind (read, write, ...): one label each, however many statements
CATALOG_SECONDS = Histogram(
    "loomfs_catalog_seconds", "Catalog call latency, the wait for its thread included", ["call"]
)

ENTRY_COLUMNS = (
    "id, parent, name, kind, size, mtime_ns, mode, uid, gid, version, etag, inode, link_target, "
    "rdev, nlink, atime_ns, ctime_ns"
)
_BATCH = 400  # rows per IN (...) lookup: far below both engines' parameter limits
_WRITE_ID_NS = WRITE_ID_DAYS * 86400 * 10**9
_PRUNE_EVERY_NS = 3600 * 10**9  # expired write ids are deleted at most this often
_SMALL = 4  # ops of a small write (``_change``): what one namespace call applies


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def execute(self, sql: str, params: Sequence[Any] = ...) -> Any: ...
    def executemany(self, sql: str, params: Sequence[Sequence[Any]]) -> Any: ...
    def fetchone(self) -> Any: ...
    def fetchall(self) -> list[Any]: ...


@dataclass(frozen=True, slots=True)
class Dialect:
    name: str
    param: str  # the driver's placeholder
    id_column: str  # an auto-assigned integer primary key
    text: str  # a text column ordered bytewise
    begin_write: str  # start a transaction that serializes writers
    lock_writers: str | None = None  # run right after begin_write, where begin alone won't
    temp_table_options: str = ""  # ends CREATE TEMP TABLE (PostgreSQL: empty it at commit)
    notify_commit: str | None = None  # run before COMMIT: wakes other processes' feeds
    notify_volumes: str | None = None  # the same, in a commit that adds or removes a volume


def _migrations(d: Dialect) -> list[str]:
    """Schema versions, applied in order; never edit a released one, append a new one."""
    return [
        f"""
        CREATE TABLE counters (name {d.text} PRIMARY KEY, value BIGINT NOT NULL);
        INSERT INTO counters (name, value) VALUES ('seq', 0);
        CREATE TABLE volumes (
            id {d.id_column},
            mount {d.text} NOT NULL UNIQUE,
            url TEXT NOT NULL,
            state TEXT NOT NULL,
            checkpoint {d.text},
            created_ns BIGINT NOT NULL,
            last_scan_ns BIGINT
        );
        CREATE TABLE entries (
            id {d.id_column},
            parent {d.text} NOT NULL,
            name {d.text} NOT NULL,
            kind TEXT NOT NULL,
            size BIGINT NOT NULL,
            mtime_ns BIGINT NOT NULL,
            mode INTEGER NOT NULL,
            uid INTEGER NOT NULL,
            gid INTEGER NOT NULL,
            version BIGINT NOT NULL,
            etag TEXT,
            inode BIGINT,
            link_target TEXT,
            UNIQUE (parent, name)
        );
        CREATE TABLE tags (
            entry_id BIGINT NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
            key {d.text} NOT NULL,
            value TEXT NOT NULL,
            PRIMARY KEY (entry_id, key)
        );
        CREATE TABLE changes (
            seq BIGINT PRIMARY KEY,
            op TEXT NOT NULL,
            path TEXT NOT NULL,
            new_path TEXT,
            kind TEXT NOT NULL,
            version BIGINT NOT NULL,
            size BIGINT NOT NULL,
            time_ns BIGINT NOT NULL
        );
        INSERT INTO entries (parent, name, kind, size, mtime_ns, mode, uid, gid, version)
            VALUES ('', '', 'dir', 0, 0, {0o40755}, 0, 0, 0);
        """,
        # the user registry (loomfs.core.users): identities shared by every protocol
        f"""
        CREATE TABLE users (
            name {d.text} PRIMARY KEY,
            created_ns BIGINT NOT NULL
        );
        CREATE TABLE user_groups (
            user_name {d.text} NOT NULL REFERENCES users(name) ON DELETE CASCADE,
            group_name {d.text} NOT NULL,
            PRIMARY KEY (user_name, group_name)
        );
        CREATE TABLE access_keys (
            access_key {d.text} PRIMARY KEY,
            user_name {d.text} NOT NULL REFERENCES users(name) ON DELETE CASCADE,
            secret TEXT NOT NULL,
            created_ns BIGINT NOT NULL
        );
        CREATE TABLE ssh_keys (
            user_name {d.text} NOT NULL REFERENCES users(name) ON DELETE CASCADE,
            key_type {d.text} NOT NULL,
            key_data {d.text} NOT NULL,
            comment TEXT NOT NULL,
            created_ns BIGINT NOT NULL,
            PRIMARY KEY (key_type, key_data)
        );
        CREATE INDEX access_keys_user ON access_keys (user_name);
        CREATE INDEX ssh_keys_user ON ssh_keys (user_name)
        """,
        # the sites a hub trusts (loomfs.core.sites): pinned certificates and labels
        f"""
        CREATE TABLE sites (
            name {d.text} PRIMARY KEY,
            cert_pem TEXT NOT NULL,
            fingerprint {d.text} NOT NULL UNIQUE,
            labels TEXT NOT NULL,
            added_ns BIGINT NOT NULL,
            revoked_ns BIGINT
        )
        """,
        # chunk maps per file version and the hub's chunk index (loomfs.hub.chunks): where
        # each chunk's bytes sit in the files as they are; ids and maps as hex text, which
        # both engines index and compare alike
        f"""
        CREATE TABLE chunk_maps (
            entry_id BIGINT NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
            version BIGINT NOT NULL,
            chunk_map TEXT NOT NULL,
            PRIMARY KEY (entry_id, version)
        );
        CREATE TABLE chunk_index (
            chunk_id {d.text} NOT NULL,
            entry_id BIGINT NOT NULL REFERENCES entries(id) ON DELETE CASCADE,
            version BIGINT NOT NULL,
            pos BIGINT NOT NULL,
            length BIGINT NOT NULL,
            PRIMARY KEY (chunk_id, entry_id)
        );
        CREATE INDEX chunk_index_entry ON chunk_index (entry_id)
        """,
        # migration 5 (4 is the chunk tables): residency and placement policies
        # (loomfs.core.placement); the 'placement' counter is their generation, which every
        # hub process polls to reload them
        f"""
        CREATE TABLE placement_policies (
            name {d.text} PRIMARY KEY,
            spec TEXT NOT NULL,
            updated_ns BIGINT NOT NULL
        );
        INSERT INTO counters (name, value) VALUES ('placement', 0);
        CREATE INDEX entries_inode ON entries (inode)
        """,
        # migration 6: authorization (loomfs.core.acl): groups, path-prefix rules, private
        # exports; the 'acl' counter grows with every change so running hubs reload them
        f"""
        CREATE TABLE acl_groups (
            name {d.text} PRIMARY KEY,
            created_ns BIGINT NOT NULL
        );
        CREATE TABLE acl_rules (
            path {d.text} NOT NULL,
            subject {d.text} NOT NULL,
            permission {d.text} NOT NULL,
            created_ns BIGINT NOT NULL,
            PRIMARY KEY (path, subject, permission)
        );
        CREATE TABLE acl_private (
            path {d.text} PRIMARY KEY,
            created_ns BIGINT NOT NULL
        );
        INSERT INTO counters (name, value) VALUES ('acl', 0)
        """,
        # migration 7: special files (device number), hard links (link count; the partial
        # index finds the other names of an inode, and only hard-linked rows pay for it:
        # smaller than migration 5's entries_inode, which placement uses), and the access
        # and status-change times where the storage keeps them
        """
        ALTER TABLE entries ADD COLUMN rdev BIGINT;
        ALTER TABLE entries ADD COLUMN nlink INTEGER NOT NULL DEFAULT 1;
        ALTER TABLE entries ADD COLUMN atime_ns BIGINT;
        ALTER TABLE entries ADD COLUMN ctime_ns BIGINT;
        CREATE INDEX entries_hard_links ON entries (inode) WHERE nlink > 1
        """,
        # migration 8: a directory's link count counts its subdirectories, in this
        # partial index (only directory rows pay for it) rather than in a column that
        # every mkdir, rmdir and rename of a directory would have to change
        """
        CREATE INDEX entries_subdirs ON entries (parent) WHERE kind = 'dir'
        """,
        # migration 9: writes' idempotency keys (``Put.write_id``), each with the entry its
        # write made (JSON), aged out by time (``WRITE_ID_DAYS``)
        f"""
        CREATE TABLE write_ids (
            write_id {d.text} PRIMARY KEY,
            entry TEXT NOT NULL,
            time_ns BIGINT NOT NULL
        );
        CREATE INDEX write_ids_time ON write_ids (time_ns)
        """,
        # migration 10: SMB logons (loomfs.core.users): a user's NT hash, never the
        # password, and the local uid Samba runs her sessions as (unique, from a fixed
        # range), which the SMB edge's mount maps back to her
        f"""
        CREATE TABLE smb_passwords (
            user_name {d.text} PRIMARY KEY REFERENCES users(name) ON DELETE CASCADE,
            uid INTEGER NOT NULL UNIQUE,
            nt_hash TEXT NOT NULL,
            changed_ns BIGINT NOT NULL
        )
        """,
        # migration 11: versioned directories and the versions of their files
        # (loomfs.hub.versions): the state each directory was set to, and per path every
        # version S3 (and REST) can name: an old file version (its bytes as chunks in the
        # version store, ``chunks``: hex ids), a delete marker, or the file there now
        # (``current``, at namespace version ``ns_version``); ``seq`` orders them
        f"""
        CREATE TABLE versioning (path {d.text} PRIMARY KEY, state TEXT NOT NULL);
        CREATE TABLE versions (
            path {d.text} NOT NULL,
            vid {d.text} NOT NULL,
            seq BIGINT NOT NULL,
            marker INTEGER NOT NULL,
            current INTEGER NOT NULL,
            ns_version BIGINT NOT NULL,
            size BIGINT NOT NULL,
            mtime_ns BIGINT NOT NULL,
            etag TEXT,
            chunks TEXT NOT NULL,
            tags TEXT NOT NULL,
            PRIMARY KEY (path, vid)
        )
        """,
        # migration 12: bucket policies (loomfs.protocols.s3.policy): each policy's
        # document, and the rules it made (allow or deny, as ``core.acl`` bits), kept apart
        # from the ACL rules so that a new policy replaces only its own
        f"""
        CREATE TABLE acl_policies (
            path {d.text} PRIMARY KEY,
            document TEXT NOT NULL,
            created_ns BIGINT NOT NULL
        );
        CREATE TABLE acl_policy_rules (
            policy {d.text} NOT NULL,
            path {d.text} NOT NULL,
            subject {d.text} NOT NULL,
            deny INTEGER NOT NULL,
            bits INTEGER NOT NULL,
            PRIMARY KEY (policy, path, subject, deny)
        )
        """,
        # migration 13: for several gateways over one database, the changes under way at
        # a volume (core.catalog.base.IntentRecords) by the gateway (``owner``) making
        # them, and sites' write and read leases (WriteLeaseRecords, ReadLeaseRecords),
        # expiring on the database's clock
        f"""
        CREATE TABLE intents (
            id {d.id_column},
            owner TEXT NOT NULL,
            path {d.text} NOT NULL,
            write_id TEXT,
            tags TEXT
        );
        CREATE INDEX intents_owner ON intents (owner);
        CREATE TABLE write_leases (
            path {d.text} PRIMARY KEY,
            site TEXT NOT NULL,
            expires_ns BIGINT NOT NULL
        );
        CREATE TABLE read_leases (
            site TEXT PRIMARY KEY,
            acked BIGINT NOT NULL,
            expires_ns BIGINT NOT NULL
        )
        """,
        # migration 14: public access blocks (loomfs.core.acl.PublicBlock): per path the
        # flags of the block on it and below
        f"CREATE TABLE acl_public_blocks (path {d.text} PRIMARY KEY, flags INTEGER NOT NULL)",
        # migration 15: S3 multipart uploads (core.catalog.base.UploadRecords), so that any
        # gateway over the database serves each upload's parts and completion
        f"""
        CREATE TABLE s3_uploads (
            upload_id TEXT PRIMARY KEY,
            bucket {d.text} NOT NULL,
            record TEXT NOT NULL,
            done TEXT,
            done_ns BIGINT
        );
        CREATE INDEX s3_uploads_bucket ON s3_uploads (bucket)
        """,
        # migration 16: NFS exports added at run time (core.catalog.base.ExportRecords),
        # which every NFS server over the database takes at its next MNT
        f"CREATE TABLE nfs_exports (path {d.text} PRIMARY KEY, record TEXT NOT NULL)",
        # migration 17: SMB shares added at run time, by name as Samba compares them (in
        # lower case), which every SMB server over the database takes within seconds
        f"CREATE TABLE smb_shares (name {d.text} PRIMARY KEY, record TEXT NOT NULL)",
    ]


def _scan_tables(d: Dialect) -> list[str]:
    """Per-connection scratch tables of ``apply_scan``: the batch as scanned (``pos`` keeps
    its order), and what the catalog makes of each row."""
    return [
        f"""
        CREATE TEMP TABLE IF NOT EXISTS scan_batch (
            pos {d.id_column},  -- assigned in the order the rows are loaded: the scan's
            parent {d.text} NOT NULL,
            name {d.text} NOT NULL,
            kind TEXT NOT NULL,
            size BIGINT NOT NULL,
            mtime_ns BIGINT NOT NULL,
            mode INTEGER NOT NULL,
            uid INTEGER NOT NULL,
            gid INTEGER NOT NULL,
            etag TEXT,
            inode BIGINT,
            link_target TEXT,
            rdev BIGINT,
            nlink INTEGER NOT NULL,
            atime_ns BIGINT,
            ctime_ns BIGINT
        ) {d.temp_table_options}
        """,
        f"""
        CREATE TEMP TABLE IF NOT EXISTS scan_diff (
            pos BIGINT PRIMARY KEY,
            id BIGINT,
            op TEXT,
            seq BIGINT,
            version BIGINT
        ) {d.temp_table_options}
        """,
    ]


SCAN_COLUMNS = (
    "parent, name, kind, size, mtime_ns, mode, uid, gid, etag, inode, link_target, rdev, nlink, "
    "atime_ns, ctime_ns"
)
# A scan batch is loaded with multi-row INSERTs of this many rows (15 parameters each: far
# below both engines' limits): the rows are bound in one call and inserted in one step,
# where an executemany binds row by row and (SQLite) releases and takes back the GIL around
# each, waiting behind the scan thread every time.
_SCAN_CHUNK = 500
_SCAN_ROW = "(" + ", ".join("?" * 15) + ")"


# The classification of ``_apply`` (_content_differs, _meta_differs) in SQL: one row per
# scanned object with the id it already has, its change op (NULL: unchanged), and for a
# change the next sequence number in scan order (a running count of changes from the
# counter's value) and the version it gets (a META change keeps the old one).
_SCAN_DIFF = """
INSERT INTO scan_diff (pos, id, op, seq, version)
SELECT pos, id, op, seq, CASE WHEN op = 'meta' THEN old_version ELSE seq END
FROM (
    SELECT pos, id, op, old_version,
           CASE WHEN op IS NOT NULL
                THEN CAST(? AS BIGINT) + count(op) OVER (ORDER BY pos) END AS seq
    FROM (
        SELECT s.pos, e.id, e.version AS old_version,
               CASE WHEN e.id IS NULL THEN 'create'
                    WHEN e.kind <> s.kind OR e.size <> s.size OR e.mtime_ns <> s.mtime_ns
                         OR e.etag IS DISTINCT FROM s.etag
                         OR e.link_target IS DISTINCT FROM s.link_target
                         OR e.rdev IS DISTINCT FROM s.rdev THEN 'modify'
                    WHEN e.mode <> s.mode OR e.uid <> s.uid OR e.gid <> s.gid
                         OR e.inode IS DISTINCT FROM s.inode OR e.nlink <> s.nlink THEN 'meta'
               END AS op
        FROM scan_batch s LEFT JOIN entries e ON e.parent = s.parent AND e.name = s.name
    ) AS classified
) AS numbered
"""
_SCAN_INSERT = """
INSERT INTO entries (parent, name, kind, size, mtime_ns, mode, uid, gid, version, etag, inode,
                     link_target, rdev, nlink, atime_ns, ctime_ns)
SELECT s.parent, s.name, s.kind, s.size, s.mtime_ns, s.mode, s.uid, s.gid, d.version, s.etag,
       s.inode, s.link_target, s.rdev, s.nlink, s.atime_ns, s.ctime_ns
FROM scan_diff d JOIN scan_batch s ON s.pos = d.pos
WHERE d.op = 'create' ORDER BY d.pos
"""
_SCAN_UPDATE = """
UPDATE entries SET kind = u.kind, size = u.size, mtime_ns = u.mtime_ns, mode = u.mode,
       uid = u.uid, gid = u.gid, version = u.version, etag = u.etag, inode = u.inode,
       link_target = u.link_target, rdev = u.rdev, nlink = u.nlink, atime_ns = u.atime_ns,
       ctime_ns = u.ctime_ns
FROM (
    SELECT d.id, s.kind, s.size, s.mtime_ns, s.mode, s.uid, s.gid, d.version, s.etag, s.inode,
           s.link_target, s.rdev, s.nlink, s.atime_ns, s.ctime_ns
    FROM scan_diff d JOIN scan_batch s ON s.pos = d.pos
    WHERE d.op IN ('modify', 'meta')
) AS u
WHERE entries.id = u.id
"""
# scanned rows are never the root, so their parent is never '' (see _join)
_SCAN_LOG = """
INSERT INTO changes (seq, op, path, kind, version, size, time_ns)
SELECT d.seq, d.op,
       CASE WHEN s.parent = '/' THEN '/' || s.name ELSE s.parent || '/' || s.name END,
       s.kind, d.version, s.size, ?
FROM scan_diff d JOIN scan_batch s ON s.pos = d.pos
WHERE d.op IS NOT NULL ORDER BY d.seq
"""


def _split(path: str) -> tuple[str, str]:
    """(parent, name) as stored; the root is ('', '')."""
    return ("", "") if path == paths.ROOT else paths.split(path)


def _join(parent: str, name: str) -> str:
    return paths.ROOT if not parent else paths.join(parent, name)


def _below(top: str) -> tuple[str, str]:
    """Bounds of the ``parent`` column for every entry strictly below ``top``, as a
    half-open byte range (parent = top, or parent starts with top + '/')."""
    if top == paths.ROOT:
        return "/", "0"  # every parent except the root's own ''
    return top + "/", top + "0"  # '0' is the byte after '/'


def _entry(row: Sequence[Any]) -> Entry:
    return Entry(
        path=_join(row[1], row[2]),
        kind=EntryKind(row[3]),
        size=row[4],
        mtime_ns=row[5],
        mode=row[6],
        uid=row[7],
        gid=row[8],
        version=row[9],
        etag=row[10],
        inode=row[11],
        link_target=row[12],
        rdev=row[13],
        nlink=row[14],
        atime_ns=row[15],
        ctime_ns=row[16],
        id=row[0],
    )


def _content_differs(old: Entry, put: Put) -> bool:
    return (old.kind, old.size, old.mtime_ns, old.etag, old.link_target, old.rdev) != (
        put.kind,
        put.size,
        put.mtime_ns,
        put.etag,
        put.link_target,
        put.rdev,
    )


def _meta_differs(old: Entry, put: Put) -> bool:
    return (old.mode, old.uid, old.gid, old.inode, old.nlink) != (
        put.mode,
        put.uid,
        put.gid,
        put.inode,
        put.nlink,
    )


def _times_differ(old: Entry, put: Put) -> bool:
    return (old.atime_ns, old.ctime_ns) != (put.atime_ns, put.ctime_ns)


class SqlCatalog(Catalog):
    """Everything but the connection: subclasses give ``dialect``, ``_connect`` and
    ``_translate`` (driver exception -> loomfs error)."""

    dialect: Dialect

    def __init__(self, url: str) -> None:
        self.url = url
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="loomfs-catalog")
        self._conn: Any = None
        self._pruned_ns = 0  # when expired write ids were last deleted

    def upload_records(self) -> UploadRecords:
        return _Uploads(self)

    def export_records(self) -> ExportRecords:
        return _Exports(self)

    # -- engine hooks ----------------------------------------------------------------------

    @abstractmethod
    def _connect(self) -> Any:
        """Open a DB-API connection (on the catalog thread), not in a transaction."""

    @abstractmethod
    def _translate(self, exc: Exception) -> Exception | None:
        """A loomfs error for a driver error, or None to let it through."""

    # -- plumbing --------------------------------------------------------------------------

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the connection's thread; its time, the wait for the thread
        included (what a caller waits), in ``loomfs_catalog_seconds``."""
        loop, began = asyncio.get_running_loop(), time.perf_counter()
        try:
            return await loop.run_in_executor(self._executor, fn, *args)
        except Exception as exc:
            translated = self._translate(exc)
            if translated is None:
                raise
            raise translated from exc
        finally:
            CATALOG_SECONDS.labels(fn.__name__.lstrip("_")).observe(time.perf_counter() - began)

    def _sql(self, sql: str) -> str:
        return sql if self.dialect.param == "?" else sql.replace("?", self.dialect.param)

    def _cur(self) -> Cursor:
        return self._conn.cursor()  # type: ignore[no-any-return]

    def _q(self, cur: Cursor, sql: str, params: Sequence[Any] = ()) -> Cursor:
        cur.execute(self._sql(sql), params)
        return cur

    def _read(self, fn: Callable[[Cursor], T]) -> T:
        # connections run in autocommit mode: each read statement sees committed data
        return fn(self._cur())

    async def _lookup(self, fn: Callable[[Cursor], T]) -> T:
        """A read of a few rows by key. On the catalog's thread here; an engine that can
        answer one without handing it to a thread (and back) overrides this."""
        return await self._run(self._read, fn)

    def _write(
        self, fn: Callable[[Cursor], T], *, lock: bool = True, cur: Cursor | None = None
    ) -> T:
        """``fn`` in one write transaction, on ``cur`` (default: the catalog thread's)."""
        cur = self._cur() if cur is None else cur
        cur.execute(self.dialect.begin_write)
        try:
            if lock and self.dialect.lock_writers:
                cur.execute(self.dialect.lock_writers)
            result = fn(cur)
            if self.dialect.notify_commit:
                cur.execute(self.dialect.notify_commit)
        except BaseException:
            cur.execute("ROLLBACK")
            raise
        cur.execute("COMMIT")
        return result

    async def _change(self, fn: Callable[[Cursor], T]) -> T:
        """A small write transaction (a few rows by key, no subtree). On the catalog's
        thread here; an engine that can commit one without handing it to a thread (and
        back) overrides this."""
        return await self._run(self._write, fn)

    # -- schema ----------------------------------------------------------------------------

    async def open(self) -> None:
        await self._run(self._open_sync)

    def _open_sync(self) -> None:
        self._conn = self._connect()
        migrations = _migrations(self.dialect)

        def migrate(cur: Cursor) -> None:
            self._q(cur, "CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)")
            row = self._q(cur, "SELECT max(version) FROM schema_version").fetchone()
            current = row[0] or 0
            if current > len(migrations):
                raise RuntimeError(
                    f"catalog {self.url} has schema version {current}, newer than this loomfs "
                    f"({len(migrations)}); upgrade loomfs"
                )
            for version in range(current + 1, len(migrations) + 1):
                for stmt in migrations[version - 1].split(";"):
                    if stmt.strip():
                        cur.execute(stmt)
                self._q(cur, "INSERT INTO schema_version (version) VALUES (?)", (version,))

        self._write(migrate, lock=False)  # the lock's table may not exist yet
        cur = self._cur()
        for stmt in _scan_tables(self.dialect):
            cur.execute(stmt)

    async def close(self) -> None:
        if self._conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, self._conn.close)
            self._conn = None
        self._executor.shutdown(wait=True)

    # -- reads -----------------------------------------------------------------------------

    def _get(self, cur: Cursor, path: str) -> tuple[int, Entry] | None:
        parent, name = _split(path)
        row = self._q(
            cur,
            f"SELECT {ENTRY_COLUMNS} FROM entries WHERE parent = ? AND name = ?",
            (parent, name),
        ).fetchone()
        return None if row is None else (row[0], _entry(row))

    def _get_many(self, cur: Cursor, all_paths: Sequence[str]) -> dict[str, tuple[int, Entry]]:
        # one "parent = ? AND name IN (...)" per directory: both engines walk the
        # (parent, name) index for it, where a row-value IN (VALUES ...) scans the table
        by_parent: dict[str, list[str]] = {}
        for path in all_paths:
            parent, name = _split(path)
            by_parent.setdefault(parent, []).append(name)
        found: dict[str, tuple[int, Entry]] = {}
        for parent, names in by_parent.items():
            for i in range(0, len(names), _BATCH):
                chunk = names[i : i + _BATCH]
                rows = self._q(
                    cur,
                    f"SELECT {ENTRY_COLUMNS} FROM entries "
                    f"WHERE parent = ? AND name IN ({','.join('?' * len(chunk))})",
                    [parent, *chunk],
                ).fetchall()
                for row in rows:
                    entry = _entry(row)
                    found[entry.path] = (row[0], entry)
        return found

    async def get(self, path: str) -> Entry | None:
        hit = await self._lookup(lambda cur: self._get(cur, path))
        return None if hit is None else hit[1]

    async def get_by_id(self, entry_id: int) -> Entry | None:
        def fn(cur: Cursor) -> Entry | None:
            row = self._q(
                cur, f"SELECT {ENTRY_COLUMNS} FROM entries WHERE id = ?", (entry_id,)
            ).fetchone()
            return None if row is None else _entry(row)

        return await self._lookup(fn)

    async def get_many(self, paths_: Sequence[str]) -> dict[str, Entry]:
        if len(paths_) <= _BATCH:
            hits = await self._lookup(lambda cur: self._get_many(cur, paths_))
        else:
            hits = await self._run(self._read, lambda cur: self._get_many(cur, paths_))
        return {path: entry for path, (_, entry) in hits.items()}

    async def list_dir(
        self, parent: str, start_after: str | None = None, limit: int = 1000
    ) -> list[Entry]:
        def fn(cur: Cursor) -> list[Entry]:
            rows = self._q(
                cur,
                f"SELECT {ENTRY_COLUMNS} FROM entries WHERE parent = ? AND name > ? "
                "ORDER BY name LIMIT ?",
                (parent, start_after or "", limit),
            ).fetchall()
            return [_entry(r) for r in rows]

        return await self._run(self._read, fn)

    async def subtree_ids(
        self,
        top: str,
        after: tuple[str, str] | None = None,
        limit: int = 10000,
        max_id: int | None = None,
    ) -> list[tuple[int, str]]:
        lo, hi = _below(top)
        # filtered here rather than by the caller: after an import, every row is newer
        newer = "" if max_id is None else "AND id <= ? "

        def fn(cur: Cursor) -> list[tuple[int, str]]:
            a_parent, a_name = after if after is not None else ("", "")
            rows = self._q(
                cur,
                "SELECT id, parent, name FROM entries "
                "WHERE (parent = ? OR (parent >= ? AND parent < ?)) AND (parent, name) > (?, ?) "
                f"{newer}ORDER BY parent, name LIMIT ?",
                (top, lo, hi, a_parent, a_name, *([] if max_id is None else [max_id]), limit),
            ).fetchall()
            return [(r[0], _join(r[1], r[2])) for r in rows]

        return await self._run(self._read, fn)

    async def hard_links(self, inode: int) -> list[Entry]:
        def fn(cur: Cursor) -> list[Entry]:
            rows = self._q(
                cur,
                f"SELECT {ENTRY_COLUMNS} FROM entries WHERE inode = ? AND nlink > 1",
                (inode,),
            ).fetchall()
            return [_entry(r) for r in rows]

        return await self._run(self._read, fn)

    async def by_inode(self, inode: int) -> list[Entry]:
        def fn(cur: Cursor) -> list[Entry]:
            rows = self._q(
                cur, f"SELECT {ENTRY_COLUMNS} FROM entries WHERE inode = ?", (inode,)
            ).fetchall()
            return [_entry(r) for r in rows]

        return await self._run(self._read, fn)

    async def subdirs(self, path: str) -> int:
        def fn(cur: Cursor) -> int:
            row = self._q(
                cur, "SELECT COUNT(*) FROM entries WHERE parent = ? AND kind = 'dir'", (path,)
            ).fetchone()
            return int(row[0])

        # a walk of the subdirectories' partial index (entries_subdirs), not of every
        # child: a lookup, answered where lookups are (every stat of a directory asks it,
        # and an NFS create or removal stats its directory twice)
        return await self._lookup(fn)

    async def max_id(self) -> int:
        row = await self._run(
            self._read, lambda cur: self._q(cur, "SELECT max(id) FROM entries").fetchone()
        )
        return int(row[0] or 0)

    async def head_seq(self) -> int:
        row = await self._run(
            self._read,
            lambda cur: self._q(cur, "SELECT value FROM counters WHERE name = 'seq'").fetchone(),
        )
        return int(row[0])

    async def changes(self, since: int = 0, limit: int = 1000) -> list[Change]:
        def fn(cur: Cursor) -> list[Change]:
            rows = self._q(
                cur,
                "SELECT seq, op, path, kind, version, time_ns, new_path, size FROM changes "
                "WHERE seq > ? ORDER BY seq LIMIT ?",
                (since, limit),
            ).fetchall()
            return [
                Change(r[0], ChangeOp(r[1]), r[2], EntryKind(r[3]), r[4], r[5], r[6], r[7])
                for r in rows
            ]

        return await self._run(self._read, fn)

    # -- writes ----------------------------------------------------------------------------

    async def apply(self, ops: Sequence[Op], volume: VolumeUpdate | None = None) -> list[Applied]:
        def fn(cur: Cursor) -> list[Applied]:
            return self._apply(cur, ops, volume)

        # one namespace change is small; a batch (a sweep) or a subtree's removal is not
        if len(ops) <= _SMALL and not any(isinstance(op, Delete) and op.recursive for op in ops):
            return await self._change(fn)
        return await self._run(self._write, fn)

    def _apply(self, cur: Cursor, ops: Sequence[Op], volume: VolumeUpdate | None) -> list[Applied]:
        seq = _Sequencer(self, cur)
        existing = self._get_many(cur, [op.path for op in ops])
        inserts: dict[str, tuple[Any, ...]] = {}  # by path, so a later op can amend one
        updates: list[tuple[Any, ...]] = []
        results: list[Applied] = []
        tagged: list[tuple[str, WriteTags, int]] = []
        for op in ops:
            if isinstance(op, Delete):
                self._flush(cur, inserts, updates)  # the delete must see earlier puts
                results.append(self._delete(cur, seq, op, existing.get(op.path)))
                for gone in [p for p in existing if paths.is_within(p, op.path)]:
                    del existing[gone]
                continue
            hit = existing.get(op.path)
            old_id, old = hit if hit is not None else (None, None)
            if old is None:
                if op.expect_version is not None:
                    raise NotFound(f"no such entry: {op.path}", path=op.path)
                if op.check_parent:
                    self._check_parent(cur, op.path, existing)
            elif op.exclusive:
                raise AlreadyExists(f"already exists: {op.path}", path=op.path)
            elif op.expect_version is not None and old.version != op.expect_version:
                raise Conflict(
                    f"{op.path} is at version {old.version}, not {op.expect_version}", path=op.path
                )
            change_op: ChangeOp | None
            if old is None or op.force_version or _content_differs(old, op):
                change_op = ChangeOp.CREATE if old is None else ChangeOp.MODIFY
                version = change_seq = seq.next()
            elif _meta_differs(old, op):
                change_op, version, change_seq = ChangeOp.META, old.version, seq.next()
            elif _times_differ(old, op):
                change_op, version, change_seq = None, old.version, 0  # recorded, not logged
            else:
                results.append(Applied(old_id, old, None))
                if op.write_id is not None:
                    self._remember(cur, op.write_id, old)
                if op.tags is not None:
                    tagged.append((op.path, op.tags, old.version))
                continue
            entry = Entry(
                op.path,
                op.kind,
                op.size,
                op.mtime_ns,
                op.mode,
                op.uid,
                op.gid,
                version,
                op.etag,
                op.inode,
                op.link_target,
                op.rdev,
                op.nlink,
                op.atime_ns,
                op.ctime_ns,
                old_id,  # a new row's number is known only once it is inserted
            )
            row = (
                op.kind.value,
                op.size,
                op.mtime_ns,
                op.mode,
                op.uid,
                op.gid,
                version,
                op.etag,
                op.inode,
                op.link_target,
                op.rdev,
                op.nlink,
                op.atime_ns,
                op.ctime_ns,
            )
            if old_id is None or op.path in inserts:
                inserts[op.path] = (*_split(op.path), *row)
            else:
                updates.append((*row, old_id))
            change = None if change_op is None else seq.log(change_seq, change_op, entry)
            results.append(Applied(old_id, entry, change))
            if op.write_id is not None:
                self._remember(cur, op.write_id, entry)
            existing[op.path] = (old_id if old_id is not None else -1, entry)
            if op.tags is not None:
                tagged.append((op.path, op.tags, version))
        self._flush(cur, inserts, updates)
        for path, tags, version in tagged:  # the rows exist now, new ones too
            self._write_tags(cur, self._entry_id(cur, path)[0], tags, version)
        seq.flush()
        if volume is not None:
            self._update_volume(cur, volume)
        return results

    def _remember(self, cur: Cursor, write_id: str, entry: Entry) -> None:
        """Keep what a write made under its key; now and then forget keys past their days
        (a repeat of a key already kept changes nothing: the first answer stands)."""
        now = time.time_ns()
        self._q(
            cur,
            "INSERT INTO write_ids (write_id, entry, time_ns) VALUES (?, ?, ?) "
            "ON CONFLICT (write_id) DO NOTHING",
            (write_id, json.dumps(dataclasses.asdict(entry)), now),
        )
        if now - self._pruned_ns > _PRUNE_EVERY_NS:
            self._pruned_ns = now
            self._q(cur, "DELETE FROM write_ids WHERE time_ns < ?", (now - _WRITE_ID_NS,))

    async def written(self, write_id: str) -> Entry | None:
        def fn(cur: Cursor) -> Entry | None:
            row = self._q(
                cur, "SELECT entry, time_ns FROM write_ids WHERE write_id = ?", (write_id,)
            ).fetchone()
            if row is None or row[1] < time.time_ns() - _WRITE_ID_NS:
                return None
            data = json.loads(row[0])
            return Entry(**{**data, "kind": EntryKind(data["kind"])})

        return await self._lookup(fn)

    async def remember_write(self, write_id: str, entry: Entry) -> None:
        await self._change(lambda cur: self._remember(cur, write_id, entry))

    async def apply_scan(
        self, rows: Sequence[ScanRow], volume: VolumeUpdate | None = None
    ) -> ScanApplied:
        return await self._run(self._write, lambda cur: self._apply_scan(cur, rows, volume))

    def _apply_scan(
        self, cur: Cursor, rows: Sequence[ScanRow], volume: VolumeUpdate | None
    ) -> ScanApplied:
        # The diff runs in SQL: Python's part is binding the rows as they come,
        # where comparing them here would cost a fetched row, an Entry and a result each.
        self._q(cur, "DELETE FROM scan_batch")
        self._q(cur, "DELETE FROM scan_diff")
        self._load_scan_batch(cur, rows)
        head = int(self._q(cur, "SELECT value FROM counters WHERE name = 'seq'").fetchone()[0])
        self._q(cur, _SCAN_DIFF, (head,))
        counts = dict(
            self._q(
                cur, "SELECT op, count(*) FROM scan_diff WHERE op IS NOT NULL GROUP BY op"
            ).fetchall()
        )
        created = counts.get(ChangeOp.CREATE.value, 0)
        modified = counts.get(ChangeOp.MODIFY.value, 0)
        meta = counts.get(ChangeOp.META.value, 0)
        if created:
            self._q(cur, _SCAN_INSERT)
        if modified or meta:
            self._q(cur, _SCAN_UPDATE)
        if created or modified or meta:
            self._q(cur, _SCAN_LOG, (time.time_ns(),))
            self._q(
                cur,
                "UPDATE counters SET value = ? WHERE name = 'seq'",
                (head + created + modified + meta,),
            )
        seen = self._q(cur, "SELECT id FROM scan_diff WHERE id IS NOT NULL").fetchall()
        if volume is not None:
            self._update_volume(cur, volume)
        return ScanApplied(created, modified, meta, [row[0] for row in seen])

    def _load_scan_batch(self, cur: Cursor, rows: Sequence[ScanRow]) -> None:
        """Insert ``rows`` into ``scan_batch`` in their order; engines may do it faster."""
        for start in range(0, len(rows), _SCAN_CHUNK):
            chunk = rows[start : start + _SCAN_CHUNK]
            self._q(
                cur,
                f"INSERT INTO scan_batch ({SCAN_COLUMNS}) "
                f"VALUES {', '.join([_SCAN_ROW] * len(chunk))}",
                list(chain.from_iterable(chunk)),
            )

    def _flush(
        self, cur: Cursor, inserts: dict[str, tuple[Any, ...]], updates: list[tuple[Any, ...]]
    ) -> None:
        if inserts:
            cur.executemany(
                self._sql(
                    "INSERT INTO entries (parent, name, kind, size, mtime_ns, mode, uid, gid, "
                    "version, etag, inode, link_target, rdev, nlink, atime_ns, ctime_ns) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)"
                ),
                list(inserts.values()),
            )
            inserts.clear()
        if updates:
            cur.executemany(
                self._sql(
                    "UPDATE entries SET kind = ?, size = ?, mtime_ns = ?, mode = ?, uid = ?, "
                    "gid = ?, version = ?, etag = ?, inode = ?, link_target = ?, rdev = ?, "
                    "nlink = ?, atime_ns = ?, ctime_ns = ? WHERE id = ?"
                ),
                updates,
            )
            updates.clear()

    def _check_parent(
        self, cur: Cursor, path: str, pending: Mapping[str, tuple[int, Entry]]
    ) -> None:
        parent = paths.split(path)[0]
        hit = pending.get(parent) or self._get(cur, parent)
        if hit is None:
            raise NotFound(f"parent directory does not exist: {parent}", path=path)
        if not hit[1].is_dir:
            raise NotADirectory(f"parent is not a directory: {parent}", path=path)

    def _delete(
        self, cur: Cursor, seq: _Sequencer, op: Delete, hit: tuple[int, Entry] | None
    ) -> Applied:
        if op.path == paths.ROOT:
            raise InvalidPath("the root cannot be removed", path=op.path)
        if hit is None or hit[0] < 0:
            hit = self._get(cur, op.path)  # created or changed by an earlier op of this batch
        if hit is None:
            if op.missing_ok:
                return Applied(None, None, None)
            raise NotFound(f"no such entry: {op.path}", path=op.path)
        entry_id, entry = hit
        if op.expect_version is not None and entry.version != op.expect_version:
            raise Conflict(
                f"{op.path} is at version {entry.version}, not {op.expect_version}", path=op.path
            )
        if entry.is_dir:
            lo, hi = _below(op.path)
            if (
                not op.recursive
                and self._q(
                    cur, "SELECT 1 FROM entries WHERE parent = ? LIMIT 1", (op.path,)
                ).fetchone()
            ):
                raise DirectoryNotEmpty(f"directory not empty: {op.path}", path=op.path)
            self._q(
                cur,
                "DELETE FROM entries WHERE parent = ? OR (parent >= ? AND parent < ?)",
                (op.path, lo, hi),
            )
        self._q(cur, "DELETE FROM entries WHERE id = ?", (entry_id,))
        return Applied(entry_id, None, seq.log(seq.next(), ChangeOp.DELETE, entry))

    async def rename(self, src: str, dst: str) -> Applied:
        return await self._run(self._write, lambda cur: self._rename(cur, src, dst))

    def _rename(self, cur: Cursor, src: str, dst: str) -> Applied:
        if src == paths.ROOT or paths.is_within(dst, src):
            raise InvalidPath(f"cannot move {src} into itself ({dst})", path=dst)
        hit = self._get(cur, src)
        if hit is None:
            raise NotFound(f"no such entry: {src}", path=src)
        if self._get(cur, dst) is not None:
            raise AlreadyExists(f"already exists: {dst}", path=dst)
        self._check_parent(cur, dst, {})
        entry_id, entry = hit
        parent, name = _split(dst)
        self._q(
            cur, "UPDATE entries SET parent = ?, name = ? WHERE id = ?", (parent, name, entry_id)
        )
        if entry.is_dir:
            lo, hi = _below(src)
            # every descendant's parent starts with src: swap that prefix for dst
            self._q(
                cur,
                "UPDATE entries SET parent = ? || substr(parent, CAST(? AS INTEGER)) "
                "WHERE parent = ? OR (parent >= ? AND parent < ?)",
                (dst, len(src) + 1, src, lo, hi),
            )
        seq = _Sequencer(self, cur)
        moved = replace(entry, path=dst)
        change = seq.log(seq.next(), ChangeOp.RENAME, entry, new_path=dst)
        seq.flush()
        return Applied(entry_id, moved, change)

    # -- tags ------------------------------------------------------------------------------

    def _entry_id(self, cur: Cursor, path: str) -> tuple[int, Entry]:
        hit = self._get(cur, path)
        if hit is None:
            raise NotFound(f"no such entry: {path}", path=path)
        return hit

    def _write_tags(self, cur: Cursor, entry_id: int, tags: WriteTags, version: int) -> None:
        """A write's tags, in its own transaction (``Put.tags``)."""
        values = tags.resolved(version)
        replaces = tags.replace_prefix is not None or tags.drop_prefix is not None
        gone = tags.stale(self._tags(cur, entry_id)) if replaces else []
        cur.executemany(
            self._sql("DELETE FROM tags WHERE entry_id = ? AND key = ?"),
            [(entry_id, k) for k in [*gone, *values]],
        )
        cur.executemany(
            self._sql("INSERT INTO tags (entry_id, key, value) VALUES (?, ?, ?)"),
            [(entry_id, k, v) for k, v in values.items()],
        )

    def _tags(self, cur: Cursor, entry_id: int) -> dict[str, str]:
        rows = self._q(
            cur, "SELECT key, value FROM tags WHERE entry_id = ? ORDER BY key", (entry_id,)
        ).fetchall()
        return {r[0]: r[1] for r in rows}

    async def get_tags(self, path: str) -> dict[str, str]:
        return await self._run(
            self._read, lambda cur: self._tags(cur, self._entry_id(cur, path)[0])
        )

    async def children_tags(self, parent: str) -> dict[str, dict[str, str]]:
        def fn(cur: Cursor) -> dict[str, dict[str, str]]:
            rows = self._q(
                cur,
                "SELECT e.name, t.key, t.value FROM entries e JOIN tags t ON t.entry_id = e.id "
                "WHERE e.parent = ? ORDER BY e.name, t.key",
                (parent,),
            ).fetchall()
            found: dict[str, dict[str, str]] = {}
            for name, key, value in rows:
                found.setdefault(name, {})[key] = value
            return found

        return await self._run(self._read, fn)

    async def tagged_with(self, prefix: str) -> dict[str, dict[str, str]]:
        def fn(cur: Cursor) -> dict[str, dict[str, str]]:
            rows = self._q(
                cur,
                "SELECT e.parent, e.name, t.key, t.value FROM tags t "
                "JOIN entries e ON e.id = t.entry_id WHERE substr(t.key, 1, ?) = ?",
                (len(prefix), prefix),
            ).fetchall()
            found: dict[str, dict[str, str]] = {}
            for parent, name, key, value in rows:
                found.setdefault(paths.join(parent, name), {})[key] = value
            return found

        return await self._run(self._read, fn)

    async def get_with_tags(self, path: str) -> tuple[Entry, dict[str, str]] | None:
        # one trip to the catalog thread, not two: an S3 GET or HEAD needs both
        def fn(cur: Cursor) -> tuple[Entry, dict[str, str]] | None:
            hit = self._get(cur, path)
            return None if hit is None else (hit[1], self._tags(cur, hit[0]))

        return await self._run(self._read, fn)

    async def set_tags(
        self, path: str, set_: Mapping[str, str], remove: Sequence[str] = ()
    ) -> dict[str, str]:
        def fn(cur: Cursor) -> dict[str, str]:
            entry_id, entry = self._entry_id(cur, path)
            cur.executemany(
                self._sql("DELETE FROM tags WHERE entry_id = ? AND key = ?"),
                [(entry_id, k) for k in [*remove, *set_]],
            )
            cur.executemany(
                self._sql("INSERT INTO tags (entry_id, key, value) VALUES (?, ?, ?)"),
                [(entry_id, k, v) for k, v in set_.items()],
            )
            seq = _Sequencer(self, cur)
            seq.log(seq.next(), ChangeOp.META, entry)
            seq.flush()
            return self._tags(cur, entry_id)

        return await self._run(self._write, fn)

    # -- volumes ---------------------------------------------------------------------------

    _VOLUME_COLUMNS = "id, mount, url, state, checkpoint, created_ns, last_scan_ns"

    @staticmethod
    def _volume(row: Sequence[Any]) -> Volume:
        return Volume(row[0], row[1], row[2], VolumeState(row[3]), row[4], row[5], row[6])

    async def add_volume(self, mount: str, url: str) -> Volume:
        def fn(cur: Cursor) -> Volume:
            for vol in self._volumes(cur):
                if paths.is_within(mount, vol.mount) or paths.is_within(vol.mount, mount):
                    raise AlreadyExists(
                        f"{mount} overlaps volume {vol.mount} ({vol.url})", path=mount
                    )
            if self._get(cur, mount) is not None:
                raise AlreadyExists(f"{mount} already exists in the namespace", path=mount)
            now = time.time_ns()
            ops: list[Op] = []
            for ancestor in [*paths.ancestors(mount), mount]:
                if self._get(cur, ancestor) is None:
                    ops.append(Put(ancestor, EntryKind.DIR, mtime_ns=now, mode=0o40755))
            self._apply(cur, ops, None)
            row = self._q(
                cur,
                f"INSERT INTO volumes (mount, url, state, created_ns) VALUES (?, ?, ?, ?) "
                f"RETURNING {self._VOLUME_COLUMNS}",
                (mount, url, VolumeState.IMPORTING.value, now),
            ).fetchone()
            self._volumes_changed(cur)
            return self._volume(row)

        return await self._run(self._write, fn)

    def _volumes_changed(self, cur: Cursor) -> None:
        if self.dialect.notify_volumes:  # other processes sharing the catalog follow
            cur.execute(self.dialect.notify_volumes)

    def _volumes(self, cur: Cursor) -> list[Volume]:
        rows = self._q(cur, f"SELECT {self._VOLUME_COLUMNS} FROM volumes ORDER BY mount").fetchall()
        return [self._volume(r) for r in rows]

    async def volumes(self) -> list[Volume]:
        return await self._run(self._read, self._volumes)

    def _update_volume(self, cur: Cursor, update: VolumeUpdate) -> None:
        sets: list[str] = []
        params: list[Any] = []
        if update.state is not None:
            sets.append("state = ?")
            params.append(update.state.value)
        if update.checkpoint is not None or update.clear_checkpoint:
            sets.append("checkpoint = ?")
            params.append(update.checkpoint)
        if update.last_scan_ns is not None:
            sets.append("last_scan_ns = ?")
            params.append(update.last_scan_ns)
        if sets:
            self._q(
                cur,
                f"UPDATE volumes SET {', '.join(sets)} WHERE id = ?",
                (*params, update.volume_id),
            )

    async def update_volume(self, update: VolumeUpdate) -> None:
        await self._run(self._write, lambda cur: self._update_volume(cur, update))

    async def remove_volume(self, mount: str) -> None:
        def fn(cur: Cursor) -> None:
            if not any(v.mount == mount for v in self._volumes(cur)):
                raise NotFound(f"no volume is mounted at {mount}", path=mount)
            self._apply(cur, [Delete(mount, recursive=True, missing_ok=True)], None)
            self._q(cur, "DELETE FROM volumes WHERE mount = ?", (mount,))
            self._volumes_changed(cur)

        await self._run(self._write, fn)


class _Sequencer:
    """Hands out change-log sequence numbers inside one write transaction and writes the
    change records and the counter once, at the end."""

    def __init__(self, catalog: SqlCatalog, cur: Cursor) -> None:
        self._catalog = catalog
        self._cur = cur
        row = catalog._q(cur, "SELECT value FROM counters WHERE name = 'seq'").fetchone()
        self._start = self._last = int(row[0])
        self._rows: list[tuple[Any, ...]] = []
        self._now = time.time_ns()

    def next(self) -> int:
        self._last += 1
        return self._last

    def log(self, seq: int, op: ChangeOp, entry: Entry, new_path: str | None = None) -> Change:
        change = Change(
            seq, op, entry.path, entry.kind, entry.version, self._now, new_path, entry.size
        )
        self._rows.append(
            (
                seq,
                op.value,
                entry.path,
                new_path,
                entry.kind.value,
                entry.version,
                entry.size,
                self._now,
            )
        )
        return change

    def flush(self) -> None:
        if self._last == self._start:
            return
        self._cur.executemany(
            self._catalog._sql(
                "INSERT INTO changes (seq, op, path, new_path, kind, version, size, time_ns) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)"
            ),
            self._rows,
        )
        self._catalog._q(
            self._cur, "UPDATE counters SET value = ? WHERE name = 'seq'", (self._last,)
        )
        self._start = self._last
        self._rows.clear()


class _Statements:
    """Rows of a table of their own: each call one statement, which commits alone
    (autocommit)."""

    def __init__(self, catalog: SqlCatalog) -> None:
        self._cat = catalog

    async def _one(self, sql: str, args: Sequence[Any], *, rows: bool = False) -> list[Any]:
        def fn(cur: Cursor) -> list[Any]:
            found = self._cat._q(cur, sql, args)
            return list(found.fetchall()) if rows else []

        return await self._cat._run(self._cat._read, fn)

    async def _count(self, sql: str, args: Sequence[Any]) -> int:
        """The rows ``sql`` (an INSERT or DELETE) changed."""

        def fn(cur: Cursor) -> int:
            return self._cat._q(cur, sql, args).rowcount

        return await self._cat._run(self._cat._read, fn)


class _Exports(_Statements, ExportRecords):
    """Rows of ``nfs_exports`` and ``smb_shares``."""

    async def nfs_exports(self) -> dict[str, str]:
        return await self._rows("nfs_exports", "path")

    async def add_nfs_export(self, path: str, record: str) -> bool:
        return await self._add("nfs_exports", "path", path, record)

    async def remove_nfs_export(self, path: str) -> bool:
        return await self._remove("nfs_exports", "path", path)

    async def smb_shares(self) -> dict[str, str]:
        return await self._rows("smb_shares", "name")

    async def add_smb_share(self, name: str, record: str) -> bool:
        return await self._add("smb_shares", "name", name, record)

    async def remove_smb_share(self, name: str) -> bool:
        return await self._remove("smb_shares", "name", name)

    # the table and key names below are this class's own constants, never input
    async def _rows(self, table: str, key: str) -> dict[str, str]:
        rows = await self._one(f"SELECT {key}, record FROM {table}", (), rows=True)
        return {name: record for name, record in rows}

    async def _add(self, table: str, key: str, name: str, record: str) -> bool:
        # one statement: of two adds of a name at once, over any gateways, one wins
        added = await self._count(
            f"INSERT INTO {table} ({key}, record) VALUES (?, ?) ON CONFLICT ({key}) DO NOTHING",
            (name, record),
        )
        return added == 1

    async def _remove(self, table: str, key: str, name: str) -> bool:
        return await self._count(f"DELETE FROM {table} WHERE {key} = ?", (name,)) == 1


class _Uploads(_Statements, UploadRecords):
    """Rows of ``s3_uploads``."""

    async def add(self, upload_id: str, bucket: str, record: str) -> None:
        await self._one(
            "INSERT INTO s3_uploads (upload_id, bucket, record) VALUES (?, ?, ?)",
            (upload_id, bucket, record),
        )

    async def get(self, upload_id: str) -> tuple[str, str | None] | None:
        rows = await self._one(
            "SELECT record, done FROM s3_uploads WHERE upload_id = ?", (upload_id,), rows=True
        )
        return (rows[0][0], rows[0][1]) if rows else None

    async def of_bucket(self, bucket: str) -> list[str]:
        rows = await self._one(
            "SELECT record FROM s3_uploads WHERE bucket = ? AND done IS NULL", (bucket,), rows=True
        )
        return [record for (record,) in rows]

    async def drop(self, upload_id: str) -> None:
        await self._one("DELETE FROM s3_uploads WHERE upload_id = ? AND done IS NULL", (upload_id,))

    async def finish(self, upload_id: str, done: str, forget_before_ns: int) -> None:
        await self._one(
            "UPDATE s3_uploads SET done = ?, done_ns = ? WHERE upload_id = ?",
            (done, time.time_ns(), upload_id),
        )
        await self._one("DELETE FROM s3_uploads WHERE done_ns < ?", (forget_before_ns,))
