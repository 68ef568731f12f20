"""The catalog interface (core layer): one async ABC over SQLite and PostgreSQL.

The catalog is a site's metadata: volumes, entries, tags, and the change log whose
sequence numbers spokes follow. Every write is one transaction that either commits whole
or leaves nothing behind; sequence numbers are handed out inside it, so the change log is
gap-free and in commit order.
"""

from __future__ import annotations

import asyncio
import contextlib
from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

from ..types import Change, Entry, EntryKind, Volume, VolumeState, WriteTags


@dataclass(frozen=True, slots=True)
class Put:
    """Create or update one entry.

    The catalog compares it with the stored row: a new path or a change of kind, size,
    mtime or etag is a content change (new version); a change of mode/owner only is a META
    change; anything else changes nothing and takes no sequence number.
    """

    path: str
    kind: EntryKind
    size: int = 0
    mtime_ns: int = 0
    mode: int = 0
    uid: int = 0
    gid: int = 0
    etag: str | None = None
    inode: int | None = None
    link_target: str | None = None
    rdev: int | None = None
    #: a change of the link count is a META change
    nlink: int = 1
    #: a change of these alone is recorded without a change-log entry: reads move atime,
    #: and spokes need not hear of it
    atime_ns: int | None = None
    ctime_ns: int | None = None
    #: fail with Conflict unless the stored version is this one
    expect_version: int | None = None
    #: fail with AlreadyExists if the path exists
    exclusive: bool = False
    #: fail unless the parent exists and is a directory (namespace writes)
    check_parent: bool = False
    #: a content change even if size/mtime/etag happen to match (an explicit write)
    force_version: bool = False
    #: the idempotency key of the write this records (``HubNamespace.write``): the entry
    #: it makes is remembered under it in the same transaction (``written``)
    write_id: str | None = None
    #: tags set in the same transaction, stamped with the version this gives the entry
    tags: WriteTags | None = None


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove an entry; with ``recursive`` everything below it too."""

    path: str
    recursive: bool = False
    expect_version: int | None = None
    #: a vanished path is no error (sweeps racing other sweeps)
    missing_ok: bool = False


Op = Put | Delete

#: how long a write's idempotency key is remembered: a spoke replays a write whose answer
#: was lost when its link comes back, which may be days for a site cut off that long
WRITE_ID_DAYS = 14


@dataclass(frozen=True, slots=True)
class Applied:
    """What one op did: the row's id (existing or new), the entry after it (None when
    deleted), and the change it logged (None when nothing changed)."""

    id: int | None
    entry: Entry | None
    change: Change | None


#: One object as a scan found it, already in catalog form, for ``Catalog.apply_scan``:
#: (parent, name, kind, size, mtime_ns, mode, uid, gid, etag, inode, link_target, rdev,
#: nlink, atime_ns, ctime_ns). A plain tuple, not a ``Put``: a scan makes one per object,
#: and building a frozen dataclass costs several times more than the catalog spends on
#: the row.
ScanRow = tuple[
    str,
    str,
    str,
    int,
    int,
    int,
    int,
    int,
    str | None,
    int | None,
    str | None,
    int | None,
    int,
    int | None,
    int | None,
]


@dataclass(slots=True)
class ScanApplied:
    """What one batch of a scan did: how many rows it created, changed in content (new
    version) and changed in mode/owner only, and the ids of the rows it found existing
    (a sweep deletes the rows that no scan batch saw)."""

    created: int
    modified: int
    meta: int
    seen: list[int]


@dataclass(frozen=True, slots=True)
class VolumeUpdate:
    """Volume bookkeeping committed in the same transaction as a batch of ops, so that a
    killed import resumes exactly after the last batch that committed."""

    volume_id: int
    state: VolumeState | None = None
    checkpoint: str | None = None
    clear_checkpoint: bool = False
    last_scan_ns: int | None = None


class IntentRecords(ABC):
    """Changes under way at a volume, noted in the catalog's database so that any process
    over it can repair those of a process that died (``loomfs.hub.intents``): each record
    is its writer's until that writer is gone, then whoever ``adopt``s it first."""

    @abstractmethod
    async def begin(self, path: str, write_id: str | None, tags: dict[str, object] | None) -> int:
        """Note a change of ``path`` about to reach its volume (durable once returned),
        with the tags a write sets with its content; the record's id."""

    @abstractmethod
    async def end(self, records: Sequence[int]) -> None:
        """Forget records whose changes are recorded or undone."""

    @abstractmethod
    async def adopt(self) -> list[tuple[int, str, str | None, dict[str, object] | None]]:
        """Take over the records of writers that are gone: (id, path, write id, tags), oldest
        first; ``end`` them once repaired (a process that dies meanwhile leaves them to
        the next adopter)."""


class WriteLeaseRecords(ABC):
    """Which site is writing which path (``loomfs.hub.coherence.WriteLeases``), in the
    catalog's database, for several gateways over it: a lease taken through one is
    honoured by all. Terms run on the database's clock."""

    @abstractmethod
    async def take(self, path: str, site: str, ttl: float) -> tuple[str, float] | None:
        """Lease ``path`` to ``site`` for ``ttl`` s from now; None, or the other site
        holding it and its seconds left (nothing taken)."""

    @abstractmethod
    async def give_back(self, path: str, site: str) -> None: ...

    @abstractmethod
    async def holder(self, path: str, site: str) -> tuple[str, float] | None:
        """The site other than ``site`` holding a live lease of ``path``, and its seconds
        left."""


class ReadLeaseRecords(ABC):
    """Spokes' read leases and what each has acknowledged (``loomfs.hub.coherence``), in
    the catalog's database, for several gateways over it: a commit through one waits
    for the spokes that poll another."""

    @abstractmethod
    async def renew(self, site: str, acked: int, ttl: float) -> None:
        """``site`` holds a lease for ``ttl`` s from now and has applied up to ``acked``."""

    @abstractmethod
    async def behind(self, seq: int) -> list[float]:
        """The seconds left of each live lease whose holder has not acknowledged ``seq``."""

    @abstractmethod
    def acks_seen(self) -> int:
        """A mark to pass to ``acked``: moves with each renewal any gateway records."""

    @abstractmethod
    async def acked(self, seen: int, limit: float) -> None:
        """Wait for a renewal after ``seen``, at most ``limit`` seconds."""


class UploadRecords(ABC):
    """S3 multipart uploads under way and lately completed (``loomfs.protocols.s3.multipart``),
    in the catalog's database, so that an upload created through one gateway takes parts
    and completes through any other over the same catalog. A record is the caller's own
    text (the upload as JSON); ``done`` is what its completion answered."""

    @abstractmethod
    async def add(self, upload_id: str, bucket: str, record: str) -> None: ...

    @abstractmethod
    async def get(self, upload_id: str) -> tuple[str, str | None] | None:
        """The upload's record and, once completed, its completion's; None if unknown."""

    @abstractmethod
    async def of_bucket(self, bucket: str) -> list[str]:
        """The records of ``bucket``'s uploads not completed."""

    @abstractmethod
    async def drop(self, upload_id: str) -> None:
        """Forget an upload not completed (aborted, or expired)."""

    @abstractmethod
    async def finish(self, upload_id: str, done: str, forget_before_ns: int) -> None:
        """Record the upload's completion, and forget completions older than
        ``forget_before_ns`` (wall clock)."""


class ExportRecords(ABC):
    """NFS exports and SMB shares added at run time (``loomfs.core.exports``), NFS ones by
    namespace path, SMB ones by share name: each a record the caller makes (its settings
    as JSON)."""

    @abstractmethod
    async def nfs_exports(self) -> dict[str, str]: ...

    @abstractmethod
    async def add_nfs_export(self, path: str, record: str) -> bool:
        """Store an export; False (nothing changed) if ``path`` has one already."""

    @abstractmethod
    async def remove_nfs_export(self, path: str) -> bool:
        """Forget ``path``'s export; False if it had none."""

    @abstractmethod
    async def smb_shares(self) -> dict[str, str]: ...

    @abstractmethod
    async def add_smb_share(self, name: str, record: str) -> bool:
        """Store a share; False (nothing changed) if ``name`` has one already."""

    @abstractmethod
    async def remove_smb_share(self, name: str) -> bool:
        """Forget share ``name``; False if there was none."""


class Notices:
    """Wake-ups of one kind another process sends through the catalog's database: a
    count of those arrived (a mark to wait from) and an event for the next one."""

    def __init__(self) -> None:
        self.seen = 0
        self._next = asyncio.Event()

    def arrived(self) -> None:
        self.seen += 1
        self._next.set()
        self._next = asyncio.Event()

    async def after(self, seen: int, limit: float) -> None:
        """Return once one arrived after the mark ``seen``, or after ``limit`` seconds."""
        if self.seen == seen:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._next.wait(), max(0.0, limit))


class Catalog(ABC):
    """A site's metadata store. Created by ``loomfs.core.registry.open_catalog(url)``."""

    url: str
    #: True: each commit survives power loss once it returns. False (set before ``open``):
    #: a commit survives a crash of the process at once and power loss after ``sync``, as
    #: a local file system's changes do (a mount's choice, ``[fuse] durable_each_change``)
    durable: bool = True

    @abstractmethod
    async def open(self) -> None:
        """Connect and bring the schema to the current version (migrations)."""

    @abstractmethod
    async def sync(self) -> None:
        """Make every commit so far survive power loss (nothing to do when ``durable``)."""

    @abstractmethod
    async def close(self) -> None: ...

    def serialized(self, path: str) -> AbstractAsyncContextManager[None]:
        """Hold ``path`` against writers in other processes over this same catalog, from a
        write's version check through its change on the volume to its commit. Writers in
        one process are the namespace's own (in-process) locks; this adds the database's.
        Here nothing: an engine with one writing process (SQLite) needs nothing more."""
        return contextlib.nullcontext()

    @abstractmethod
    def upload_records(self) -> UploadRecords:
        """The S3 multipart uploads kept in this catalog."""

    @abstractmethod
    def export_records(self) -> ExportRecords:
        """The NFS exports added at run time, kept in this catalog."""

    async def elected(self) -> None:
        """Return once this process is the one, of all sharing this catalog, that runs
        the work done once per cluster (imports resumed, rescans, lifecycle rules). Here
        at once: one process writes this catalog."""
        return

    async def unelected(self) -> None:
        """Return once this process, ``elected``, is no longer (its hold on the election
        lost). Here never."""
        await asyncio.Event().wait()

    def intent_records(self) -> IntentRecords | None:
        """Where the changes under way are noted when several processes share this
        catalog. None here: one process writes it, and keeps its own (local) log."""
        return None

    def read_lease_records(self) -> ReadLeaseRecords | None:
        """Where read leases live when several processes share this catalog. None here:
        in the one process's memory."""
        return None

    def write_lease_records(self) -> WriteLeaseRecords | None:
        """Where write leases live when several processes share this catalog. None here:
        in the one process's memory."""
        return None

    def volume_notices(self) -> Notices | None:
        """Told of each volume any process sharing this catalog adds or removes (at its
        commit). None here: one process writes it, so its volumes change through it alone."""
        return None

    def commits_seen(self) -> int:
        """A mark to pass to ``changed``: moves with each commit this catalog is told of."""
        return 0

    async def changed(self, seen: int, poll: float, limit: float) -> None:
        """Wait for a commit after ``seen`` (a ``commits_seen`` mark) by any process, for
        at most ``limit`` seconds. Here no commit is told of: wait ``poll`` seconds (the
        caller reads again, the one signal that sees every process's commits)."""
        await asyncio.sleep(max(0.0, min(poll, limit)))

    # -- entries ---------------------------------------------------------------------------

    @abstractmethod
    async def get(self, path: str) -> Entry | None: ...

    @abstractmethod
    async def get_by_id(self, entry_id: int) -> Entry | None:
        """The entry whose ``Entry.id`` is ``entry_id``, wherever it is now."""

    @abstractmethod
    async def get_many(self, paths: Sequence[str]) -> dict[str, Entry]: ...

    @abstractmethod
    async def list_dir(
        self, parent: str, start_after: str | None = None, limit: int = 1000
    ) -> list[Entry]:
        """Children of ``parent`` ordered by name (bytewise), after ``start_after``."""

    @abstractmethod
    async def subtree_ids(
        self,
        top: str,
        after: tuple[str, str] | None = None,
        limit: int = 10000,
        max_id: int | None = None,
    ) -> list[tuple[int, str]]:
        """(id, path) of every entry strictly below ``top`` (with ``max_id``: only those
        with id <= max_id), in a stable order, paged by the (parent, name) of the last row
        returned."""

    @abstractmethod
    async def max_id(self) -> int: ...

    @abstractmethod
    async def hard_links(self, inode: int) -> list[Entry]:
        """Entries recorded with ``inode`` and more than one link, in every volume (the
        caller keeps those of its own volume): the names whose rows a change through one
        of them makes stale."""

    @abstractmethod
    async def by_inode(self, inode: int) -> list[Entry]:
        """Every entry recorded with ``inode``, in every volume, whatever link count it
        was last seen with: a hard link made behind loomfs's back may be known under its
        new name before the old name's row is refreshed."""

    @abstractmethod
    async def subdirs(self, path: str) -> int:
        """How many directories ``path`` holds: a directory's link count is 2 more (its
        name, its '.', and each subdirectory's '..')."""

    @abstractmethod
    async def apply(self, ops: Sequence[Op], volume: VolumeUpdate | None = None) -> list[Applied]:
        """Apply ``ops`` in order in one transaction; any failed precondition rolls back
        all of them and raises (Conflict, AlreadyExists, NotFound, DirectoryNotEmpty)."""

    @abstractmethod
    async def apply_scan(
        self, rows: Sequence[ScanRow], volume: VolumeUpdate | None = None
    ) -> ScanApplied:
        """Record a batch of scanned objects (distinct paths) in one transaction, each as a
        ``Put`` of the same facts would: new, content change, META change, or nothing; in
        the order given, so sequence numbers follow the scan. The bulk path of assimilation:
        it returns counts instead of an ``Applied`` per row."""

    @abstractmethod
    async def written(self, write_id: str) -> Entry | None:
        """The entry a ``Put`` with this ``write_id`` made (as it was then), or None: none
        did, or too long ago (keys are kept ``WRITE_ID_DAYS``)."""

    @abstractmethod
    async def remember_write(self, write_id: str, entry: Entry) -> None:
        """Remember ``entry`` under ``write_id`` on its own: for a write whose row a sweep
        recorded first (the ``Put`` carrying the key then had nothing left to do)."""

    @abstractmethod
    async def rename(self, src: str, dst: str) -> Applied:
        """Move an entry and everything below it; ``dst`` must not exist and its parent
        must be a directory. The content version is kept."""

    # -- tags ------------------------------------------------------------------------------

    @abstractmethod
    async def get_tags(self, path: str) -> dict[str, str]: ...

    @abstractmethod
    async def children_tags(self, parent: str) -> dict[str, dict[str, str]]:
        """The tags of the children of ``parent`` that have any, by name, in one query (a
        listing's extended attributes: most names have none)."""

    @abstractmethod
    async def tagged_with(self, prefix: str) -> dict[str, dict[str, str]]:
        """Every path with a tag whose key starts with ``prefix``, with those tags, in one
        query (the directories a hub task such as lifecycle expiration works on)."""

    async def get_with_tags(self, path: str) -> tuple[Entry, dict[str, str]] | None:
        """An entry and its tags, or None; an engine may fetch both in one round trip."""
        entry = await self.get(path)
        if entry is None:
            return None
        try:
            return entry, await self.get_tags(path)
        except FileNotFoundError:  # removed between the two reads
            return None

    @abstractmethod
    async def set_tags(
        self, path: str, set_: Mapping[str, str], remove: Sequence[str] = ()
    ) -> dict[str, str]:
        """Set and remove tags in one transaction (a META change); returns all tags."""

    # -- change log ------------------------------------------------------------------------

    @abstractmethod
    async def changes(self, since: int = 0, limit: int = 1000) -> list[Change]:
        """Changes with seq > ``since``, oldest first."""

    @abstractmethod
    async def head_seq(self) -> int: ...

    # -- volumes ---------------------------------------------------------------------------

    @abstractmethod
    async def add_volume(self, mount: str, url: str) -> Volume:
        """Record a volume being imported at ``mount`` and create its root directory
        entry and any missing ancestors; ``AlreadyExists`` if anything is mounted there."""

    @abstractmethod
    async def volumes(self) -> list[Volume]: ...

    @abstractmethod
    async def update_volume(self, update: VolumeUpdate) -> None: ...

    @abstractmethod
    async def remove_volume(self, mount: str) -> None:
        """Forget a volume and every entry below its mount (data is not touched)."""
