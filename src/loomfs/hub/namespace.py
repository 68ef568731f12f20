"""The hub's namespace (hub layer): the namespace API over a catalog and its volumes.

Reads go to the volume in place, by range; a read through a symlink reads its target,
found by following links in the catalog as the kernel would on disk. Writes land in the
volume atomically (the backend's job) and are then committed to the catalog with a new
version; a write is acknowledged only after that commit, and one that fails at any step
leaves the volume as it was (the backend puts back what it replaced). A write with an
idempotency key (a spoke's journaled write) has the entry it made kept under the key in
the same transaction, and a repeat of the key is answered with that entry, writing
nothing. A write's tags (an S3 object's metadata) are committed with its content, and a
new name, a removal or a move records its directories' new times with it. Changes made
behind loomfs's back are noticed three ways: rescans, inotify on posix volumes, and
lazily, when a read finds the object is no longer the version the catalog holds (it
records the new version, then serves it).
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import logging
import os
import stat
import time
import weakref
from collections import OrderedDict, deque
from collections.abc import (
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Mapping,
    Sequence,
)
from dataclasses import dataclass, replace

from .. import paths
from ..core.backends.base import Backend, Capability, Commit
from ..core.backends.posix import PosixBackend
from ..core.catalog.base import Applied, Catalog, Delete, Put
from ..core.placement import PlacementAuthorizer
from ..core.registry import open_backend
from ..core.streams import BytesSource, LocalFile, aiter_bytes, chained, clamp_range
from ..core.types import (
    KIND_OF_BITS,
    SPECIAL_KINDS,
    Entry,
    EntryKind,
    ObjectInfo,
    Principal,
    Volume,
    WriteTags,
)
from ..errors import (
    AlreadyExists,
    Conflict,
    CrossesVolume,
    DirectoryNotEmpty,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    LoomError,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from ..namespace import objectlock, sse
from ..namespace.base import (
    LIST_PAGE,
    NULL_VERSION,
    Reader,
    ResolvingNamespace,
    Version,
    WriteTagsArg,
    tags_now,
)
from .assimilate import Assimilator, Progress, ScanStats, path_of, put_for
from .coherence import Leases, write_leases
from .intents import IntentLog, Note
from .versions import RegionFile, Row, VersionStore, no_store

log = logging.getLogger(__name__)

#: room for a prefix before a key of another system's own limit (S3 tags: 128)
MAX_TAG_KEY = 256
#: as Linux (MAXSYMLINKS): the most symlinks one path is followed through
_MAX_HOPS = 40
MAX_TAG_VALUE = 1024
#: how many of its own writes the hub remembers to recognise their inotify echo: far more
#: than one debounced batch of events holds
_OWN_NOTES = 16384
#: the note of a path this namespace removed
_GONE: tuple[object, ...] = ()


@dataclass(slots=True)
class Mounted:
    volume: Volume
    backend: Backend


def _expect(key: str, entry: Entry) -> ObjectInfo | None:
    """The object the catalog believes is there, for the backend to check on open. A
    symlink is read through (the backend keeps it inside the volume), and its target's
    version is not the link's, so there is nothing to check it against."""
    if entry.kind is EntryKind.SYMLINK:
        return None
    return ObjectInfo(key, entry.kind, entry.size, entry.mtime_ns, entry.etag, entry.inode)


def _as_dir(path: str, entry: Entry | None) -> Entry:
    if entry is None:
        raise NotFound(f"no such file or directory: {path}", path=path)
    if not entry.is_dir:
        raise NotADirectory(f"not a directory: {path}", path=path)
    return entry


def _facts(row: Entry | Put) -> tuple[object, ...]:
    """What a catalog row records of an object (its version and tags aside)."""
    return (
        row.kind, row.size, row.mtime_ns, row.mode, row.uid, row.gid, row.etag,
        row.inode, row.link_target, row.rdev, row.nlink, row.atime_ns, row.ctime_ns,
    )  # fmt: skip


def _recorded(entry: Entry, put: Put) -> bool:
    """Whether the catalog's ``entry`` already holds every fact ``put`` would record."""
    return _facts(entry) == _facts(put)


class _Repeated(Exception):
    """Drops the staged bytes of a write found, under the path's lock, already made."""


def _check_tag(key: str, value: str | None = None) -> None:
    if not key or len(key) > MAX_TAG_KEY or any(ord(c) < 32 for c in key):
        raise InvalidArgument(f"invalid tag key {key!r}: 1-{MAX_TAG_KEY} printable characters")
    if value is not None and (len(value) > MAX_TAG_VALUE or "\x00" in value):
        raise InvalidArgument(f"tag value for {key!r} is longer than {MAX_TAG_VALUE} or has NUL")


class HubNamespace(ResolvingNamespace):
    def __init__(
        self,
        catalog: Catalog,
        leases: Leases | None = None,
        placement: PlacementAuthorizer | None = None,
        write_lease: float = 60.0,
        intents: IntentLog | None = None,
        versions: VersionStore | None = None,
    ) -> None:
        self.catalog = catalog
        #: old versions of files in versioned directories (none: versioning refused)
        self.version_store = versions
        #: paths being removed or restored for good: no version is kept of that change
        self._unversioned: set[str] = set()
        #: writes renamed into place and not yet recorded: ``recover`` settles a crash's
        self.intents = intents
        #: the catalog's durability is the namespace's: volumes follow it (``sync``)
        self.durable = catalog.durable
        #: residency policies: a re-tag that restricts a file evicts it from spokes
        self.placement = placement
        #: spokes' read leases: a commit is acknowledged once they have applied it
        self.leases = leases or Leases(0)
        #: paths a site is writing: other sites' changes to them are refused meanwhile
        self.write_leases = write_leases(write_lease, catalog.write_lease_records())
        self.assimilator = Assimilator(catalog)
        self._mounts: dict[str, Mounted] = {}
        # between a volume's commit in the catalog and its (un)mounting here: what
        # ``follow_volumes`` reads of the catalog then matches the mounts
        self._volumes_lock = asyncio.Lock()
        # one writer per path in this process: the precondition check, the volume write and
        # the catalog commit happen under it, and so do refreshes prompted by inotify
        self._locks: weakref.WeakValueDictionary[str, asyncio.Lock] = weakref.WeakValueDictionary()
        self._sync_locks: dict[str, asyncio.Lock] = {}
        # the facts this namespace last recorded of the objects it wrote itself, newest
        # last: the watcher's report of such a write (its echo) needs no catalog read
        self._own: OrderedDict[str, tuple[object, ...]] = OrderedDict()

    # -- volumes ---------------------------------------------------------------------------

    async def load_volumes(self) -> list[Volume]:
        """Attach every volume the catalog knows (no I/O to the storage yet)."""
        if self.version_store is not None:
            await self.version_store.load()
        volumes = await self.catalog.volumes()
        for volume in volumes:
            if volume.mount not in self._mounts:
                self._mounts[volume.mount] = Mounted(volume, self._open_backend(volume.url))
        return volumes

    async def follow_volumes(self) -> tuple[list[Volume], list[str]]:
        """Mount the volumes another process sharing the catalog added since, unmount
        those it removed: what was mounted, and the mounts dropped."""
        async with self._volumes_lock:
            volumes = {volume.mount: volume for volume in await self.catalog.volumes()}
            # a mount whose volume is another one now was removed and added again since
            gone = [
                mount
                for mount, mounted in self._mounts.items()
                if mount not in volumes or volumes[mount].id != mounted.volume.id
            ]
            for mount in gone:
                await self._mounts.pop(mount).backend.close()
            added = [volume for mount, volume in volumes.items() if mount not in self._mounts]
            for volume in added:
                self._mounts[volume.mount] = Mounted(volume, self._open_backend(volume.url))
        return added, gone

    @property
    def mounts(self) -> dict[str, Mounted]:
        return dict(self._mounts)

    async def add_volume(self, mount: str, url: str, progress: Progress | None = None) -> ScanStats:
        """Assimilate existing storage at ``mount``: metadata only, no data read or copied."""
        mount = paths.normalize(mount)
        if mount == paths.ROOT:
            raise InvalidArgument("a volume cannot be mounted at the root")
        backend = self._open_backend(url)
        async with self._volumes_lock:
            try:
                await backend.check()
                volume = await self.catalog.add_volume(mount, backend.url)
            except BaseException:
                await backend.close()
                raise
            self._mounts[mount] = Mounted(volume, backend)
        return await self.sync_volume(mount, progress)

    def _open_backend(self, url: str) -> Backend:
        backend = open_backend(url)
        backend.durable = self.durable
        return backend

    async def sync_volume(
        self, mount: str, progress: Progress | None = None, *, prefix: str = ""
    ) -> ScanStats:
        """Import (or resume importing) or rescan a volume, or a subtree of it."""
        mount = paths.normalize(mount)
        mounted = self._mounts.get(mount)
        if mounted is None:
            raise NotFound(f"no volume is mounted at {mount}", path=mount)
        lock = self._sync_locks.setdefault(mount, asyncio.Lock())
        async with lock:
            # the catalog holds the checkpoint of an import in progress
            current = {v.mount: v for v in await self.catalog.volumes()}[mount]
            mounted.volume = current
            return await self.assimilator.sync(
                current, mounted.backend, prefix=prefix, progress=progress
            )

    async def remove_volume(self, mount: str) -> None:
        """Forget a volume's metadata; its data stays untouched where it is."""
        mount = paths.normalize(mount)
        async with self._volumes_lock:
            await self.catalog.remove_volume(mount)
            mounted = self._mounts.pop(mount, None)
        if mounted is not None:
            await mounted.backend.close()

    async def refresh(self, path: str) -> Entry | None:
        """Re-read one object's facts from its volume and record any change (None: gone)."""
        async with self._serialized(path):
            entry, fresh_dir = await self._refresh(path)
        if fresh_dir:
            await self._sync_dir(path)
        return entry

    async def _sync_dir(self, path: str) -> None:
        mounted, key = self._in_volume(path)
        await self.sync_volume(mounted.volume.mount, prefix=key)

    async def _refresh(self, path: str) -> tuple[Entry | None, bool]:
        """``refresh`` with ``path`` held, but for the sweep of a directory new there
        (True: it is due, outside the hold)."""
        mounted, key = self._in_volume(path)
        try:
            info = await mounted.backend.stat(key)
        except NotFound:
            await self.catalog.apply([Delete(path, recursive=True, missing_ok=True)])
            return None, False
        before = await self.catalog.get(path)
        put = put_for(mounted.volume.mount, info)
        if before is not None and _recorded(before, put):
            # most often the echo (inotify) of a write this namespace just recorded
            return before, False
        if key and before is None:
            parent = paths.split(path)[0]
            if await self.catalog.get(parent) is None:
                # its directory is new as well: import the nearest new ancestor's subtree
                await self.refresh(parent)
        [applied] = await self.catalog.apply([put])
        # Only a directory new at this path (created, moved in, or another one swapped in)
        # has contents the catalog lacks. A known directory whose mtime moved had its
        # children reported one by one; sweeping it on each change made filling a large
        # directory quadratic.
        fresh_dir = before is None or before.kind is not EntryKind.DIR or before.inode != info.inode
        return applied.entry, bool(
            info.kind is EntryKind.DIR and applied.change is not None and key and fresh_dir
        )

    async def refresh_all(self, changed: Iterable[str]) -> None:
        """``refresh`` each path a volume's watcher reported, in order (parents first),
        passing over those whose object is exactly as this namespace last wrote and
        recorded it: the echo of its own writes. The objects are read once, before, in one
        trip per volume; one changed again after that read reports itself anew."""
        ordered = sorted(changed)
        by_mount: dict[str, tuple[Mounted, list[str]]] = {}
        for path in ordered:
            hit = self._resolve(path)
            if hit is not None and path in self._own:
                by_mount.setdefault(hit[0].volume.mount, (hit[0], []))[1].append(hit[1])
        echoes: set[str] = set()
        for mount, (mounted, keys) in by_mount.items():
            for key, info in (await mounted.backend.stat_many(keys)).items():
                path = path_of(mount, key)
                if self._own.get(path) == (_GONE if info is None else _facts(put_for(mount, info))):
                    echoes.add(path)
        for path in ordered:
            if path not in echoes:
                await self.refresh(path)

    def _noted(self, entry: Entry) -> Entry:
        self._note(entry.path, _facts(entry))
        return entry

    def _note(self, path: str, facts: tuple[object, ...]) -> None:
        self._own[path] = facts
        self._own.move_to_end(path)
        if len(self._own) > _OWN_NOTES:
            self._own.popitem(last=False)  # its echo, if it ever comes, is refreshed

    def _resolve(self, path: str) -> tuple[Mounted, str] | None:
        for mount, mounted in self._mounts.items():
            if paths.is_within(path, mount):
                return mounted, paths.relative(path, mount)
        return None

    def _in_volume(self, path: str) -> tuple[Mounted, str]:
        hit = self._resolve(path)
        if hit is None:
            raise PermissionDenied(
                f"{path} is not inside a volume; add storage with 'loomfs volume add'", path=path
            )
        return hit

    def _below_mount(self, path: str) -> tuple[Mounted, str]:
        """Like ``_in_volume`` but refusing the volume's root itself."""
        mounted, key = self._in_volume(path)
        if not key:
            raise PermissionDenied(
                f"{path} is a volume's root; use 'loomfs volume remove' to detach it", path=path
            )
        return mounted, key

    def _lock(self, path: str) -> asyncio.Lock:
        lock = self._locks.get(path)
        if lock is None:
            lock = self._locks[path] = asyncio.Lock()
        return lock

    @contextlib.asynccontextmanager
    async def _serialized(self, *held: str) -> AsyncIterator[None]:
        """Hold ``held`` (in sorted order, as every caller takes them) against every other
        writer: this process's by an in-process lock (the fast path, so that at most one
        task per path waits on the database), other gateways' over the same catalog by
        the catalog's own."""
        async with contextlib.AsyncExitStack() as stack:
            for path in held:
                await stack.enter_async_context(self._lock(path))
            for path in held:
                await stack.enter_async_context(self.catalog.serialized(path))
            yield

    async def _entry(self, path: str) -> Entry:
        entry = await self.catalog.get(path)
        if entry is None:
            raise NotFound(f"no such file or directory: {path}", path=path)
        return entry

    async def _dir(self, path: str) -> Entry:
        return _as_dir(path, await self.catalog.get(path))

    # -- the namespace API -----------------------------------------------------------------

    async def stat(self, who: Principal, path: str) -> Entry:
        entry = await self._entry(paths.normalize(path))
        if entry.is_dir:
            # the link count is asked of the catalog, which knows the subdirectories now:
            # a row records it only as its last scan saw it
            entry = replace(entry, nlink=2 + await self.catalog.subdirs(entry.path))
        return entry

    async def locate(self, who: Principal, entry_id: int) -> Entry:
        found = await self.catalog.get_by_id(entry_id)
        if found is None:
            raise NotFound(f"no entry has the id {entry_id}")
        return await self.stat(who, found.path)

    async def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        path = paths.normalize(path)
        await self._dir(path)
        remaining = limit
        while remaining is None or remaining > 0:
            page_size = LIST_PAGE if remaining is None else min(LIST_PAGE, remaining)
            page = await self.catalog.list_dir(path, start_after, page_size)
            for entry in page:
                yield entry
            if len(page) < page_size:
                return
            start_after = page[-1].name
            if remaining is not None:
                remaining -= len(page)

    async def read(
        self,
        who: Principal,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        if_version: int | None = None,
    ) -> Reader:
        # POSIX: a read through a symlink reads its target, whose entry (size, version)
        # the reader carries
        path, entry = await self._follow(paths.normalize(path))
        if entry.is_dir:
            raise IsADirectory(f"is a directory: {path}", path=path)
        if if_version is not None and entry.version != if_version:
            raise Conflict(f"{path} is at version {entry.version}, not {if_version}", path=path)
        try:
            return await self._open(path, entry, offset, length)
        except Conflict:
            # changed behind loomfs's back: record the new version, then serve it, since
            # this read began after the change
            fresh = await self.refresh(path)
            if fresh is None:
                raise NotFound(f"no such file or directory: {path}", path=path) from None
            if if_version is not None or fresh.is_dir:
                raise Conflict(f"{path} changed (now version {fresh.version})", path=path) from None
            return await self._open(path, fresh, offset, length)

    async def read_entry(
        self, who: Principal, entry: Entry, offset: int = 0, length: int | None = None
    ) -> Reader:
        # the caller's entry saves a catalog read; the open checks the file against it
        # (an S3 GET stats, then reads: two trips to the catalog thread were one too many)
        if entry.kind is EntryKind.SYMLINK:
            # its target is read, which is not at the link's version
            return await self.read(who, entry.path, offset, length)
        if entry.kind is not EntryKind.FILE:  # read refuses it, as it should be refused
            return await self.read(who, entry.path, offset, length, if_version=entry.version)
        path = paths.normalize(entry.path)
        try:
            return await self._open(path, entry, offset, length)
        except Conflict:
            # changed since the caller's stat: refused as read refuses it (and a change
            # made behind loomfs's back recorded on the way)
            return await self.read(who, path, offset, length, if_version=entry.version)

    async def _open(self, path: str, entry: Entry, offset: int, length: int | None) -> Reader:
        """The file at ``path`` opened for the range, if it still is ``entry`` (else
        ``Conflict``)."""
        mounted, key = self._in_volume(path)
        start, count = clamp_range(entry.size, offset, length)
        source = await mounted.backend.open_read(key, start, count, _expect(key, entry))
        return Reader(entry, start, source)

    async def write(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        tags: WriteTagsArg = None,
    ) -> Entry:
        return await self._write(
            who, path, data, if_version=if_version, exclusive=exclusive, mode=mode,
            write_id=write_id, tags=tags,
        )  # fmt: skip

    def writes_attrs(self, path: str) -> bool:
        # where the volume keeps them on the file itself: set before the catalog records it
        hit = self._resolve(paths.normalize(path))
        return hit is not None and bool(hit[1]) and self._keeps_attrs(hit[0])

    @staticmethod
    def _keeps_attrs(mounted: Mounted) -> bool:
        return Capability.POSIX_MODE in mounted.backend.capabilities

    async def write_with_attrs(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None,
        attrs: Mapping[str, int],
        owner_optional: bool = False,
        tags: WriteTagsArg = None,
        exclusive: bool = False,
    ) -> Entry:
        # no owner is optional here: the hub is told what to set (the governed namespace
        # above decides what may be)
        if not self.writes_attrs(path):
            raise NotSupported(f"{path}: its volume keeps no attributes of its own", path=path)
        return await self._write(
            who, path, data, if_version=if_version, exclusive=exclusive, attrs=attrs, tags=tags
        )

    async def _write(
        self,
        who: Principal,
        path: str,
        data: AsyncIterable[bytes],
        *,
        if_version: int | None = None,
        exclusive: bool = False,
        mode: int | None = None,
        write_id: str | None = None,
        tags: WriteTagsArg = None,
        attrs: Mapping[str, int] | None = None,
    ) -> Entry:
        """``write``; ``attrs``: set on the volume's new file before the catalog records
        it, so that the bytes and the attributes are one change (one version)."""
        path = paths.normalize(path)
        mounted, key = self._below_mount(path)
        # a key is the caller site's own: another site can't learn or spoil its answers
        remembered = None if write_id is None else f"{who.site}:{write_id}"
        if remembered is not None and (done := await self.catalog.written(remembered)):
            return done  # a repeat (its answer was lost): the first answer, nothing written
        body: AsyncIterable[bytes]
        if isinstance(data, LocalFile):
            # handed on whole: a posix volume copies it by ranges, keeping its holes
            body, empty = data, data.size == 0
        else:
            chunks = aiter(data)
            first = await anext(chunks, None)
            body = aiter_bytes(b"") if first is None else chained(first, chunks)
            empty = first is None
        if not empty:
            # checked before the body streams in (a doomed write fails fast), and again
            # under the path's lock, where the staged bytes become visible and are
            # recorded: the lock is never held while a client streams, however slowly. An
            # empty file (a FUSE create) has nothing to stream: only the second check.
            await self.write_leases.check(path, who.site)
            await self._writable(path, if_version, exclusive)
        committed: list[Applied] = []
        repeated: list[Entry] = []
        retagged: list[dict[str, str]] = []  # the tags before, where the write sets some
        locking: list[str] = []  # the lock tags the write gives its new version
        cancelled = False
        note: Note | None = None
        state = self._versioned(path)

        async def gate(commit: Commit) -> ObjectInfo:
            nonlocal cancelled, note
            async with self._serialized(path):
                if remembered is not None and (done := await self.catalog.written(remembered)):
                    # the same write, sent again while this one streamed: it stands
                    repeated.append(done)
                    raise _Repeated
                await self.write_leases.check(path, who.site)
                current = await self._writable(path, if_version, exclusive)
                made = tags_now(tags)  # the data has ended: its tags can be known
                if made is not None:
                    for tag, value in made.resolved(0).items():
                        _check_tag(tag, value)
                    if objectlock.touches(made.stamped):
                        raise InvalidArgument("a lock's tags are set, not stamped", path=path)
                    if path not in self._unversioned:  # a restored version keeps its own
                        objectlock.check_new(path, made.set, state)
                    locking.extend(k for k in made.set if k in objectlock.VERSION_KEYS)
                    if self.placement is not None and (made.set or made.stamped):
                        before = {} if current is None else await self.catalog.get_tags(path)
                        retagged.append(before)
                if state is not None and current is not None:
                    await self._keep(state, current)
                if self.intents is not None:
                    # noted where the volume commits (its thread): one hand-off for both
                    # fsyncs (a shared log's record is made here, before it)
                    note = await self.intents.note(
                        path, remembered, None if made is None else made.as_json()
                    )
                info = await commit(note)
                if attrs:
                    info = await mounted.backend.set_attrs(key, **attrs)
                # The volume's write fails (and is undone) if this gate does; once the
                # catalog is recording it, a cancel (its client gone) waits for that, so
                # that a write the catalog holds is never undone on the volume.
                recording = asyncio.ensure_future(
                    self._apply_record(
                        mounted,
                        info,
                        remembered,
                        made,
                        force_version=True,
                        exclusive=current is None,
                        expect_version=current.version if current else None,
                    )
                )
                while True:
                    try:
                        committed.append(await asyncio.shield(recording))
                        return info
                    except asyncio.CancelledError:
                        if recording.done():
                            raise
                        cancelled = True

        try:
            with self.intents.staging(path) if self.intents else contextlib.nullcontext():
                await mounted.backend.write(key, body, mode=mode, gate=gate)
        except _Repeated:
            return repeated[0]
        finally:  # recorded, or undone on the volume: either way whole
            if note is not None:
                note.end()
        if cancelled:
            raise asyncio.CancelledError
        # acknowledged once the spokes have applied it: waited for outside the path's
        # lock and after the volume's write is final
        entry = self._noted(await self._settled(committed[0]))
        if retagged:
            await self._tightened(path, retagged[0], await self.catalog.get_tags(path))
        if state is not None and self.version_store is not None:
            await self.version_store.written(state, entry)
            # the old version keeps its lock (in its kept tags); the new one starts with
            # the lock its write gave it (committed with its content), or none
            locked = [
                k
                for k in await self.catalog.get_tags(path)
                if k in objectlock.VERSION_KEYS and k not in locking
            ]
            if locked:
                await self._set_tags(path, {}, locked)
        await self._links_changed(mounted, entry, path)
        return entry

    async def _writable(self, path: str, if_version: int | None, exclusive: bool) -> Entry | None:
        """The entry a write would replace (None: a new file), or why it may not."""
        parent = paths.split(path)[0]
        # one catalog call for the entry and the directory a new file would go in
        found = await self.catalog.get_many([path, parent])
        current = found.get(path)
        if current is None:
            if if_version is not None:
                raise NotFound(f"no such file: {path}", path=path)
            _as_dir(parent, found.get(parent))
        elif current.is_dir:
            raise IsADirectory(f"is a directory: {path}", path=path)
        elif exclusive:
            raise AlreadyExists(f"already exists: {path}", path=path)
        elif if_version is not None and current.version != if_version:
            raise Conflict(f"{path} is at version {current.version}, not {if_version}", path=path)
        return current

    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry:
        path = paths.normalize(path)
        existing = await self.catalog.get(path)
        if existing is not None:
            if exist_ok and existing.is_dir:
                return existing
            raise AlreadyExists(f"already exists: {path}", path=path)
        mounted, key = self._below_mount(path)
        parent = paths.split(path)[0]
        if parents and await self.catalog.get(parent) is None:
            await self.mkdir(who, parent, parents=True, exist_ok=True)
        async with self._serialized(path):
            made = await self.catalog.get(path)
            if exist_ok and made is not None and made.is_dir:
                return made  # by a concurrent mkdir while this one waited for the lock
            await self._dir(parent)
            async with self._intended(path):
                info = await mounted.backend.mkdir(key)
                return await self._record(mounted, info, exclusive=True, check_parent=True)

    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        path = paths.normalize(path)
        if not target or "\x00" in target or len(target.encode()) > paths.PATH_MAX:
            raise InvalidArgument(f"invalid symlink target {target!r}", path=path)
        mounted, key = self._below_mount(path)
        return await self._create_new(
            who, mounted, path, lambda: mounted.backend.symlink(key, target)
        )

    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        path = paths.normalize(path)
        kind = KIND_OF_BITS.get(stat.S_IFMT(mode))
        if kind not in SPECIAL_KINDS or mode & ~(stat.S_IFMT(mode) | 0o7777):
            raise InvalidArgument(
                f"mknod makes fifos, devices and sockets, not mode {mode:#o}", path=path
            )
        if rdev < 0:
            raise InvalidArgument(f"invalid device number {rdev}", path=path)
        mounted, key = self._below_mount(path)
        return await self._create_new(
            who, mounted, path, lambda: mounted.backend.mknod(key, kind, stat.S_IMODE(mode), rdev)
        )

    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        src, dst = paths.normalize(src), paths.normalize(dst)
        mounted, src_key = self._below_mount(src)
        dst_mounted, dst_key = self._below_mount(dst)
        if dst_mounted is not mounted:
            raise CrossesVolume(f"{src} and {dst} are on different volumes", path=dst)
        if (await self._entry(src)).is_dir:
            raise PermissionDenied(f"a directory cannot have hard links: {src}", path=src)
        # a file another site is writing gets no second name to be written through
        await self.write_leases.check(src, who.site)
        async with self._intended(src):
            entry = await self._create_new(
                who, mounted, dst, lambda: mounted.backend.link(src_key, dst_key)
            )
            # the source's link count (and ctime) moved with the new name
            await self.refresh(src)
        await self.leases.settle(await self.catalog.head_seq())
        await self._links_changed(mounted, entry, src, dst)
        return entry

    async def _create_new(
        self,
        who: Principal,
        mounted: Mounted,
        path: str,
        make: Callable[[], Awaitable[ObjectInfo]],
    ) -> Entry:
        """Make a new name that must not exist yet, in an existing directory, and record
        it: symlinks, special files and hard links."""
        async with self._serialized(path):
            await self.write_leases.check(path, who.site)  # another site's lease on the new name
            if await self.catalog.get(path) is not None:
                raise AlreadyExists(f"already exists: {path}", path=path)
            await self._dir(paths.split(path)[0])
            async with self._intended(path):
                return await self._record(mounted, await make(), exclusive=True, check_parent=True)

    async def _links_changed(self, mounted: Mounted, entry: Entry | None, *done: str) -> None:
        """A change through one name of a hard-linked file shows through all of them:
        re-read the others' rows (link count, mode, owner, content) from the volume."""
        if entry is None or entry.nlink <= 1 or entry.inode is None:
            return
        others = [
            other.path
            for other in await self.catalog.hard_links(entry.inode)
            if other.path not in done and paths.is_within(other.path, mounted.volume.mount)
        ]
        for path in others:
            await self.refresh(path)
        if others:
            await self.leases.settle(await self.catalog.head_seq())

    async def _record(
        self, mounted: Mounted, info: ObjectInfo, **preconditions: bool | int | None
    ) -> Entry:
        """Commit what this namespace just wrote to the volume (``_apply_record``), and
        acknowledge it once the spokes have applied it."""
        applied = await self._apply_record(mounted, info, None, None, **preconditions)
        return self._noted(await self._settled(applied))

    async def _apply_record(
        self,
        mounted: Mounted,
        info: ObjectInfo,
        write_id: str | None,
        tags: WriteTags | None,
        /,
        **preconditions: bool | int | None,
    ) -> Applied:
        """Commit what this namespace just wrote to the volume, with the preconditions
        checked before the write (and the write's idempotency key and tags, in the same
        transaction). A sweep (inotify or a rescan) may have recorded this very object
        between the volume write and now, which fails the preconditions although nothing
        else changed; that is told apart by the object's etag and inode."""
        put = put_for(mounted.volume.mount, info, **preconditions)
        # A new name: its directory is as it stays. A write over a file changes no name
        # (POSIX leaves its directory's times alone); what the volume's swap leaves beside
        # it is removed after this commit, and recording the directory again for that
        # would cost each overwrite (an NFS or SMB create's content) a second commit.
        parents = await self._parents(mounted, info.key) if preconditions.get("exclusive") else []
        try:
            applied, *_ = await self.catalog.apply(
                [replace(put, write_id=write_id, tags=tags), *parents]
            )
        except (AlreadyExists, Conflict):
            seen = await self.catalog.get(put.path)
            if seen is None or (seen.kind, seen.etag, seen.inode) != (
                put.kind,
                put.etag,
                put.inode,
            ):
                raise
            if write_id is not None:
                await self.catalog.remember_write(write_id, seen)
            if tags is not None:  # the sweep's row has none of them: set them on it
                stale = tags.stale(await self.catalog.get_tags(put.path))
                await self.catalog.set_tags(put.path, tags.resolved(seen.version), stale)
            return Applied(None, seen, None)
        return applied

    async def _parents(self, mounted: Mounted, *keys: str) -> builtins.list[Put]:
        """The rows of the directories holding ``keys`` as the volume has them just after
        a change of their names (their mtime and ctime moved), for the commit recording
        that change: the catalog's directory times follow the disk's at once, not at the
        next rescan. Only where the volume keeps them (posix)."""
        if Capability.POSIX_MODE not in mounted.backend.capabilities:
            return []
        puts = []
        for parent in dict.fromkeys(key.rpartition("/")[0] for key in keys if key):
            with contextlib.suppress(NotFound):
                puts.append(put_for(mounted.volume.mount, await mounted.backend.stat(parent)))
        return puts

    async def _settled(self, applied: Applied) -> Entry:
        """Acknowledge a commit only once the spokes holding leases have applied it."""
        if applied.change is not None:
            await self.leases.settle(applied.change.seq)
        assert applied.entry is not None
        return applied.entry

    async def rename(self, who: Principal, src: str, dst: str, *, overwrite: bool = False) -> Entry:
        src, dst = paths.normalize(src), paths.normalize(dst)
        if src == dst:
            return await self._entry(src)  # as rename(2): moving a thing onto itself is a no-op
        if paths.is_within(dst, src):
            raise InvalidPath(f"cannot move {src} into itself ({dst})", path=dst)
        src_mounted, src_key = self._below_mount(src)
        dst_mounted, dst_key = self._below_mount(dst)
        if src_mounted is not dst_mounted:
            raise CrossesVolume(f"{src} and {dst} are on different volumes", path=dst)
        first, second = sorted((src, dst))
        # residency: a move under a policy the source was not under evicts it from the
        # spokes that policy refuses (they may keep the old name's data as chunk sources)
        before = await self.placement.covering(src) if self.placement is not None else set()
        async with self._serialized(first, second):
            await self.write_leases.check(src, who.site)
            await self.write_leases.check(dst, who.site)
            entry = await self._entry(src)
            target = await self.catalog.get(dst)
            if target is not None and (not overwrite or target.is_dir or entry.is_dir):
                raise AlreadyExists(f"already exists: {dst}", path=dst)
            await self._dir(paths.split(dst)[0])
            async with self._intended(src, dst):
                if target is not None:
                    await src_mounted.backend.delete(dst_key)
                    await self.catalog.apply([Delete(dst)])
                await src_mounted.backend.rename(src_key, dst_key)
                applied = await self.catalog.rename(src, dst)
                if parents := await self._parents(src_mounted, src_key, dst_key):
                    await self.catalog.apply(parents)
            self._note(src, _GONE)
        moved = await self._settled(applied)
        if self.placement is not None and await self.placement.covering(dst) - before:
            await self.leases.settle(await self.placement.store.evict([dst]))
        if Capability.POSIX_MODE in src_mounted.backend.capabilities:
            # a rename is a change of the inode's status: its ctime moved
            moved = self._noted(await self.refresh(dst) or moved)
        await self._links_changed(src_mounted, target, dst)
        await self._links_changed(src_mounted, moved, dst)
        return moved

    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None:
        path = paths.normalize(path)
        mounted, key = self._below_mount(path)
        async with self._serialized(path):
            await self.write_leases.check(path, who.site)
            entry = await self._entry(path)
            if if_version is not None and entry.version != if_version:
                raise Conflict(f"{path} is at version {entry.version}, not {if_version}", path=path)
            if entry.is_dir and not recursive and await self.catalog.list_dir(path, limit=1):
                # refused before the volume is touched: a child whose file is already gone
                # (its removal is between the volume and the catalog) would otherwise let
                # the directory go from the volume and stay in the catalog
                raise DirectoryNotEmpty(f"directory not empty: {path}", path=path)
            state = None if entry.is_dir else self._versioned(path)
            if state is not None:
                await self._keep(state, entry)
            kept = await self._kept_below(path) if entry.is_dir and recursive else False
            async with self._intended(path):
                if entry.is_dir and recursive:
                    # deepest first, so each directory is empty when its turn comes
                    below = [e async for e in self.walk(who, path)]
                    for child in reversed(below):
                        with contextlib.suppress(NotFound):
                            await mounted.backend.delete(
                                paths.relative(child.path, mounted.volume.mount)
                            )
                await mounted.backend.delete(key)
                parents = await self._parents(mounted, key)
                applied, *_ = await self.catalog.apply(
                    [Delete(path, recursive=recursive), *parents]
                )
            self._note(path, _GONE)
            if state is not None and self.version_store is not None:
                seq = applied.change.seq if applied.change is not None else entry.version
                await self.version_store.marked(state, path, seq)
            elif entry.is_dir and self.version_store is not None:
                await self.version_store.forget_state(path)
                if kept:  # a tree removed whole takes its versions along
                    await self.version_store.forget_rows(path)
        if applied.change is not None:
            await self.leases.settle(applied.change.seq)
        await self._links_changed(mounted, entry, path)

    async def set_attrs(
        self,
        who: Principal,
        path: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> Entry:
        path = paths.normalize(path)
        hit = self._resolve(path)
        async with self._serialized(path):
            await self.write_leases.check(path, who.site)
            entry = await self._entry(path)
            if hit is not None and hit[1] and self._keeps_attrs(hit[0]):
                mounted, key = hit
                async with self._intended(path):
                    info = await mounted.backend.set_attrs(
                        key, mode=mode, uid=uid, gid=gid, mtime_ns=mtime_ns, atime_ns=atime_ns
                    )
                    [applied] = await self.catalog.apply([put_for(mounted.volume.mount, info)])
            else:
                # the storage has no such attributes (S3), or this is a directory that
                # exists only in the catalog (above or at a mount): the catalog keeps them
                put = Put(
                    path=path,
                    kind=entry.kind,
                    size=entry.size,
                    mtime_ns=entry.mtime_ns if mtime_ns is None else mtime_ns,
                    mode=entry.mode if mode is None else stat.S_IFMT(entry.mode) | mode,
                    uid=entry.uid if uid is None else uid,
                    gid=entry.gid if gid is None else gid,
                    etag=entry.etag,
                    inode=entry.inode,
                    link_target=entry.link_target,
                    rdev=entry.rdev,
                    nlink=entry.nlink,
                    atime_ns=entry.atime_ns if atime_ns is None else atime_ns,
                    ctime_ns=entry.ctime_ns,
                )
                [applied] = await self.catalog.apply([put])
        changed = await self._settled(applied)
        if hit is not None:
            await self._links_changed(hit[0], changed, path)
        return changed

    async def persist(self, who: Principal, path: str) -> None:
        if self.durable:
            return  # each change was durable before it was acknowledged
        hit = self._resolve(paths.normalize(path))
        if hit is not None:
            await hit[0].backend.sync(hit[1])
        await self.catalog.sync()

    async def get_tags(self, who: Principal, path: str) -> dict[str, str]:
        return await self.catalog.get_tags(paths.normalize(path))

    async def children_tags(self, who: Principal, path: str) -> dict[str, dict[str, str]]:
        return await self.catalog.children_tags(paths.normalize(path))

    async def stat_tags(self, who: Principal, path: str) -> tuple[Entry, dict[str, str]]:
        path = paths.normalize(path)
        hit = await self.catalog.get_with_tags(path)
        if hit is None:
            raise NotFound(f"no such file or directory: {path}", path=path)
        return hit

    async def set_tags(
        self,
        who: Principal,
        path: str,
        set_: Mapping[str, str],
        remove: Sequence[str] = (),
    ) -> dict[str, str]:
        for key, value in set_.items():
            _check_tag(key, value)
        for key in remove:
            _check_tag(key)
        if objectlock.touches([*set_, *remove]) or objectlock.ENABLED in remove:
            raise PermissionDenied(
                "a version's object lock changes only through set_lock, and a directory's "
                "object lock is never disabled",
                path=path,
            )
        return await self._set_tags(paths.normalize(path), set_, remove)

    async def _set_tags(
        self, path: str, set_: Mapping[str, str], remove: Sequence[str] = ()
    ) -> dict[str, str]:
        before = await self.catalog.get_tags(path) if self.placement is not None else {}
        tags = await self.catalog.set_tags(path, set_, remove)
        await self._tightened(path, before, tags)
        await self.leases.settle(await self.catalog.head_seq())
        return tags

    async def _tightened(self, path: str, before: dict[str, str], after: dict[str, str]) -> None:
        """Re-tagged into a policy: spokes drop what they hold of it before this returns."""
        if self.placement is not None and await self.placement.tightened(path, before, after):
            await self.leases.settle(await self.placement.store.evict([path]))

    # -- versions (hub.versions) -----------------------------------------------------------

    def _versioned(self, path: str) -> str | None:
        if self.version_store is None or path in self._unversioned:
            return None
        return self.version_store.state_of(path)

    async def _kept_below(self, path: str) -> bool:
        """Whether versions are kept at or below the directory ``path``, which a removal
        of the whole tree takes along (an empty directory's removal, such as S3's prune
        of a key's parents, keeps them: they are the keys', not the directory's);
        PermissionDenied if one of them, or a file there, is locked."""
        store = self.version_store
        if store is None or not store.versioned_near(path):
            return False  # no state here, above or below: no version can be kept
        rows = await store.rows(path)
        now = time.time()
        for row in rows:
            tags = await self.catalog.get_tags(row.path) if row.current else row.tags
            objectlock.check_removal(row.path, tags, bypass=False, now=now)
        return bool(rows)

    def _store(self, path: str) -> VersionStore:
        if self.version_store is None:
            raise no_store(path)
        return self.version_store

    async def _keep(self, state: str, entry: Entry) -> None:
        """Keep the file ``entry`` as an old version (called under its path's lock,
        before it is replaced or removed)."""
        if entry.kind is not EntryKind.FILE:
            return
        tags = await self.catalog.get_tags(entry.path)
        reader = await self._open(entry.path, entry, 0, None)
        async with reader:
            # a local file is chunked straight from its descriptor, in the store's thread:
            # a big file's old version is never held in memory whole
            region = reader.region
            body = RegionFile(region) if region is not None else await reader.read_all()
            await self._store(entry.path).keep(state, entry, tags, body)

    async def set_versioning(self, who: Principal, path: str, state: str) -> None:
        path = paths.normalize(path)
        await self._dir(path)
        if state != "Enabled" and objectlock.ENABLED in await self.catalog.get_tags(path):
            raise InvalidArgument(
                f"{path} has object lock enabled: its versioning cannot be suspended", path=path
            )
        await self._store(path).set_state(path, state)

    async def versioning(self, who: Principal, path: str) -> str | None:
        return self._versioned(paths.normalize(path))

    async def versions(self, who: Principal, path: str) -> builtins.list[Version]:
        path = paths.normalize(path)
        rows = await self._store(path).rows(path)
        found = await self.catalog.get_many(sorted({r.path for r in rows}))
        out: builtins.list[Version] = []
        for row in rows:
            entry = found.get(row.path)
            if row.current:
                if entry is None or entry.version != row.ns_version:
                    continue  # the file it named is gone or changed behind loomfs's back
                tags = await self.catalog.get_tags(row.path)
                out.append(
                    Version(
                        row.path, row.vid, row.seq, False, True, entry.size, entry.mtime_ns,
                        entry.etag, tags, entry.version,
                    )
                )  # fmt: skip
            else:
                newest = next(r for r in rows if r.path == row.path)
                latest = entry is None and row is newest
                out.append(row.version(latest))
        return out

    async def _version_row(
        self, path: str, vid: str
    ) -> tuple[Row | None, Entry | None, Row | None]:
        """(the row of ``vid``, the file now at ``path``, the row naming that file)."""
        rows = await self._store(path).path_rows(path)
        entry = await self.catalog.get(path)
        now = VersionStore.current_of(rows, entry)
        return next((r for r in rows if r.vid == vid and not r.current), None), entry, now

    async def read_version(
        self, who: Principal, path: str, vid: str, offset: int = 0, length: int | None = None
    ) -> Reader:
        path = paths.normalize(path)
        row, entry, now = await self._version_row(path, vid)
        if entry is not None and (now.vid if now else NULL_VERSION) == vid:
            return await self.read(who, path, offset, length, if_version=entry.version)
        if row is None:
            raise NotFound(f"{path} has no version {vid}", path=path)
        data = await self._store(path).content(row)
        start, count = clamp_range(row.size, offset, length)
        old = row.version(False).entry()
        return Reader(old, start, BytesSource(data[start : start + count]))

    async def remove_version(
        self, who: Principal, path: str, vid: str, *, bypass: bool = False
    ) -> Version | None:
        path = paths.normalize(path)
        store = self._store(path)
        row, entry, now = await self._version_row(path, vid)
        current = (
            entry is not None
            and entry.kind is EntryKind.FILE
            and ((now.vid if now else NULL_VERSION) == vid)
        )
        if current or row is not None:
            tags = await self.catalog.get_tags(path) if current or row is None else row.tags
            objectlock.check_removal(path, tags, bypass=bypass, now=time.time())
        if current:
            assert entry is not None
            gone = Version(path, vid, now.seq if now else entry.version, False, True)
            self._unversioned.add(path)  # no marker: it goes for good
            try:
                await self.remove(who, path)
            finally:
                self._unversioned.discard(path)
            await store.drop(path, current=True)
        elif row is not None:
            gone = row.version(False)
            await store.drop(path, vid)
        else:
            return None
        if await self.catalog.get(path) is None:
            await self._restore(who, path)
        return gone

    async def mark_removed(self, who: Principal, path: str) -> str | None:
        path = paths.normalize(path)
        state = self._versioned(path)
        if state is None or self.version_store is None:
            return None
        async with self._serialized(path):
            if await self.catalog.get(path) is not None:
                raise AlreadyExists(f"{path} is there: remove it instead", path=path)
            rows = await self.version_store.path_rows(path)
            if rows and rows[0].marker:
                return rows[0].vid  # hidden already: one marker says so
            # No change is made, so none is numbered (the change log has no gaps): the
            # marker is as new as the newest change, newer than every version of a path
            # that has no file, unless that change is one of them (then it says enough).
            seq = await self.catalog.head_seq()
            if any(r.seq == seq or r.vid == str(seq) for r in rows):
                return None
            return await self.version_store.marked(state, path, seq)

    async def set_lock(
        self,
        who: Principal,
        path: str,
        vid: str | None,
        lock: objectlock.Lock,
        *,
        bypass: bool = False,
    ) -> None:
        path = paths.normalize(path)
        if self._versioned(path) != "Enabled":
            raise InvalidArgument(f"object lock needs {path} to be versioned (Enabled)", path=path)
        store = self._store(path)
        row, entry, now = await self._version_row(path, vid or "")
        current = vid is None or (entry is not None and (now.vid if now else NULL_VERSION) == vid)
        if current:
            if entry is None or entry.kind is not EntryKind.FILE:
                raise NotFound(f"no such file: {path}", path=path)
            tags = await self.catalog.get_tags(path)
        elif row is not None and not row.marker:
            tags = row.tags
        else:
            raise NotFound(f"{path} has no version {vid}", path=path)
        old = objectlock.Lock.of(tags)
        objectlock.check_change(path, old, lock, bypass=bypass, now=time.time())
        new = lock.as_tags()
        stale = [k for k in objectlock.VERSION_KEYS if k in tags and k not in new]
        if current:
            await self._set_tags(path, new, stale)
        else:
            assert row is not None
            kept = {k: v for k, v in tags.items() if k not in stale} | new
            await store.set_row_tags(path, row.vid, kept)

    async def _restore(self, who: Principal, path: str) -> None:
        """Make the newest remaining version of ``path`` its file again, if it is one
        (not a delete marker): the file gets a new namespace version, named by the old id."""
        store = self._store(path)
        rows = [r for r in await store.path_rows(path) if not r.current]
        if not rows or rows[0].marker:
            return
        newest = rows[0]
        data = await store.content(newest)
        self._unversioned.add(path)  # written back, not a new version
        try:
            await self.mkdir(who, paths.split(path)[0], parents=True, exist_ok=True)
            # its own encryption's tags (or none), not those of the version it replaces
            kept = WriteTags(dict(newest.tags), drop_prefix=sse.PREFIX)
            entry = await self.write(who, path, aiter_bytes(data), tags=kept)
        finally:
            self._unversioned.discard(path)
        await store.drop(path, newest.vid)
        await store.written("Enabled", entry, vid=newest.vid, seq=newest.seq)

    async def lease_write(self, who: Principal, path: str) -> float:
        path = paths.normalize(path)
        self._below_mount(path)  # only paths of a volume can be written
        return await self.write_leases.acquire(path, who.site)

    async def release_write(self, who: Principal, path: str) -> None:
        await self.write_leases.release(paths.normalize(path), who.site)

    async def resolve(self, path: str) -> str:
        """The namespace path whose bytes a read of ``path`` returns: a symlink's final
        target (relative, absolute or through linked directories); ``path`` itself for
        anything else, or where nothing is there. A loop or a link out of every volume
        raises, as a read of it would."""
        try:
            return (await self._follow(paths.normalize(path)))[0]
        except NotFound:
            return paths.normalize(path)

    async def _follow(self, path: str) -> tuple[str, Entry]:
        """The path and entry a read of ``path`` reaches, following symlinks in the
        namespace as the kernel follows them on disk: relative targets from the link's
        directory, absolute ones inside a volume's root, chains and linked directories on
        the way. A loop, or a target outside every volume, is an error, not a guess."""
        entry = await self.catalog.get(path)
        if entry is not None and entry.kind is not EntryKind.SYMLINK:
            return path, entry  # the common case: one catalog read, as without links
        if entry is None:
            # a linked directory on the way? The catalog holds nothing below a symlink,
            # so it is the deepest ancestor it holds.
            found = await self.catalog.get_many(paths.ancestors(path))
            held = [p for p in paths.ancestors(path) if p in found]
            link = found[held[-1]] if held else None
            if link is None or link.kind is not EntryKind.SYMLINK:
                raise NotFound(f"no such file or directory: {path}", path=path)
            pending = deque(paths.relative(path, link.path).split("/"))
        else:
            link, pending = entry, deque()
        hops = 0
        while True:
            hops += 1
            if hops > _MAX_HOPS:
                raise InvalidPath(f"too many levels of symbolic links: {path}", path=path)
            current, steps = self._target_of(link)
            pending.extendleft(reversed(steps))
            reached: Entry | None = None
            while pending:
                step = pending.popleft()
                if step in ("", "."):
                    continue
                if step == ".." and current in self._mounts:
                    # up out of a volume's root: on to wherever that leads on the host,
                    # which may be inside a volume again (``../vol/f`` from its root)
                    backend = self._mounts[current].backend
                    if not isinstance(backend, PosixBackend):
                        raise PermissionDenied(f"{link.path} leads out of its volume", path=path)
                    host = os.path.join(os.path.dirname(backend.root), *pending)
                    current, steps = self._on_host(host, link)
                    pending = deque(steps)
                    reached = None
                    continue
                if step == "..":
                    current, reached = paths.split(current)[0], None
                    continue
                current = paths.join(current, step)
                reached = await self.catalog.get(current)
                if reached is None:
                    raise NotFound(f"no such file or directory: {current} ({path})", path=path)
                if reached.kind is EntryKind.SYMLINK:
                    link = reached
                    break
                if pending and not reached.is_dir:
                    raise NotADirectory(f"not a directory: {current} ({path})", path=path)
            else:
                return current, reached or await self._entry(current)

    def _target_of(self, link: Entry) -> tuple[str, Sequence[str]]:
        """Where the symlink ``link`` points: a directory in the namespace to start from and
        the steps to take from it."""
        target = link.link_target or ""
        if not target.startswith("/"):
            return paths.split(link.path)[0], target.split("/")
        return self._on_host(target, link)

    def _on_host(self, target: str, link: Entry) -> tuple[str, Sequence[str]]:
        """An absolute path on the host's file system that ``link`` leads to, as a volume's
        mount and the steps below it: only a volume's root holds what a link may reach."""
        target = os.path.normpath(target)
        for mount, mounted in self._mounts.items():
            backend = mounted.backend
            if isinstance(backend, PosixBackend) and paths.is_within(target, backend.root):
                return mount, target[len(backend.root) :].split("/")
        raise PermissionDenied(
            f"the symlink {link.path} points outside every volume ({link.link_target})",
            path=link.path,
        )

    async def resolved(self, path: str) -> tuple[Entry, Entry]:
        path = paths.normalize(path)
        entry = await self.catalog.get(path)
        if entry is not None and entry.kind is not EntryKind.SYMLINK:
            return entry, entry  # the common case: one catalog read
        target = (await self._follow(path))[1]
        # a linked directory on the way: no row of its own, the target's by its name
        return entry or replace(target, path=path), target

    async def stat_for_read(self, who: Principal, path: str) -> Entry:
        return (await self._follow(paths.normalize(path)))[1]

    async def other_names(self, entry: Entry) -> builtins.list[str]:
        if entry.nlink < 2 or entry.inode is None:
            return []
        hit = self._resolve(entry.path)
        if hit is None:
            return []
        mount = hit[0].volume.mount  # inode numbers are per file system: only its own
        return [
            other.path
            for other in await self.catalog.by_inode(entry.inode)
            if other.path != entry.path and paths.is_within(other.path, mount)
        ]

    @contextlib.asynccontextmanager
    async def _intended(self, *changed: str) -> AsyncIterator[None]:
        """A change of the volume at ``changed`` and then of the catalog, noted between
        (``recover``)."""
        if self.intents is None:
            yield
            return
        begun: list[str] = []
        try:
            for path in changed:
                await self.intents.begin(path)
                begun.append(path)
            yield
        finally:
            for path in begun:
                self.intents.end(path)

    async def recover(self) -> None:
        """Record what the volumes hold at each path a stopped hub changed there without
        recording it (a write renamed into place, a move, a removal part way, a new
        directory or link, a chmod): the old state or the new, and the volume and the
        catalog agree again; remove the temp files of the writes it was staging. Then
        start a new intent log. After ``load_volumes``."""
        if self.intents is None:
            return
        # first: a hard-linked file a write stopped in (torn) gets its old bytes back
        # here, before its name is re-read by the repair below
        swept = 0
        for path in self.intents.staged():
            hit = self._resolve(path)
            if hit is not None and isinstance(hit[0].backend, PosixBackend):
                try:
                    removed = await hit[0].backend.sweep(hit[1])
                    if removed:
                        swept += len(removed)
                        await self.refresh(paths.split(path)[0])  # its mtime moved
                except LoomError as exc:
                    log.warning("could not sweep", extra={"path": path, "error": str(exc)})
        unfinished = await self.repair()
        if unfinished or swept:
            log.info(
                "recovered unfinished writes",
                extra={"paths": unfinished, "temp_files_removed": swept},
            )
        self.intents.open()

    async def repair(self) -> int:
        """Record what the volumes hold at each path a writer that stopped (this hub
        before its start, or another gateway over the same database, gone) changed there
        without recording it; how many paths. Each is held meanwhile, as a writer would."""
        if self.intents is None:
            return 0
        unfinished = await self.intents.orphans()
        for path, (write_id, tagged) in unfinished.items():
            try:
                async with self._serialized(path):
                    before = await self.catalog.get(path)
                    after, fresh_dir = await self._refresh(path)
                    if after is not None and (before is None or after.version != before.version):
                        # the write's bytes are at its name (nothing else wrote there under
                        # its lock): its retry is answered with this, not landed again, and
                        # its tags go with them, as its record would have held them
                        if write_id is not None:
                            await self.catalog.remember_write(write_id, after)
                        if tagged is not None:
                            tags = WriteTags.from_json(tagged)
                            stale = tags.stale(await self.catalog.get_tags(path))
                            made = tags.resolved(after.version)
                            if made or stale:  # else no change of tags to record
                                await self.catalog.set_tags(path, made, stale)
                # a directory's removal below it may have stopped part way
                stayed_dir = before is not None and before.is_dir and after is not None
                if fresh_dir or (stayed_dir and after is not None and after.is_dir):
                    await self._sync_dir(path)
            except LoomError as exc:  # say its volume is gone: nothing to agree with
                log.warning("could not recover a write", extra={"path": path, "error": str(exc)})
        await self.intents.repaired()
        return len(unfinished)

    async def close(self) -> None:
        for mounted in self._mounts.values():
            await mounted.backend.close()
        self._mounts.clear()
        if self.intents is not None:
            await self.intents.drain()
            self.intents.close()
