"""The namespace API (namespace layer): the one async file interface every protocol calls.

A hub implements it over its catalog and volumes, a spoke over its cache and the fabric
link, and the REST client over HTTP; FUSE, S3, SFTP and the SDK only translate their wire
protocol into these calls. Every call carries the caller's ``Principal`` so authorization
and audit happen here, once, for all protocols. Errors are ``loomfs.errors`` only.
"""

from __future__ import annotations

import builtins
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType

from ..core.streams import ByteSource, FileRegion, aiter_bytes
from ..core.types import Entry, EntryKind, Feed, Principal, WriteTags
from ..errors import LoomError, NotSupported, PermissionDenied
from .listing import TREE_MAX, ListingDelta, delta, listed_tree, tree_deltas
from .objectlock import Lock

LIST_PAGE = 1000
#: the states a versioned directory can be set to (S3's names); a directory never set is
#: unversioned, and so is everything below it
VERSIONING_STATES = ("Enabled", "Suspended")
#: the id of the version written while versioning was not enabled (S3's "null")
NULL_VERSION = "null"


#: the tags a write sets with its content: given, or asked once its data has ended
WriteTagsArg = WriteTags | Callable[[], WriteTags] | None


def tags_now(tags: WriteTagsArg) -> WriteTags | None:
    """A write's tags (``Namespace.write``), asked of the callable once its data ended."""
    return tags() if callable(tags) else tags


@dataclass(frozen=True, slots=True)
class Version:
    """One version of a file in a versioned directory: an old content, a delete marker,
    or the file as it is now (``latest``). ``vid`` is its id (its namespace version as
    text, or ``NULL_VERSION``); ``seq`` orders a path's versions, newest highest."""

    path: str
    vid: str
    seq: int
    marker: bool
    latest: bool
    size: int = 0
    mtime_ns: int = 0
    etag: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    #: the namespace version the content had when it was the file (0: a marker)
    ns_version: int = 0

    def entry(self) -> Entry:
        """The file this version was, as an entry (for the edges that describe it)."""
        return Entry(
            path=self.path, kind=EntryKind.FILE, size=self.size, mtime_ns=self.mtime_ns,
            mode=0o100644, uid=0, gid=0, version=self.ns_version, etag=self.etag,
        )  # fmt: skip


class Reader(ByteSource):
    """The bytes of one read together with the entry (and so the version) they belong to."""

    def __init__(self, entry: Entry, offset: int, source: ByteSource) -> None:
        self.entry = entry
        self.offset = offset
        self.source = source
        self.length = source.length
        self.region: FileRegion | None = source.region

    def chunks(self) -> AsyncIterator[bytes]:
        return self.source.chunks()

    async def verify(self) -> None:
        await self.source.verify()

    async def aclose(self) -> None:
        await self.source.aclose()

    async def __aenter__(self) -> Reader:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def without_owner(attrs: Mapping[str, int]) -> dict[str, int]:
    """``attrs`` less a change of owner (uid, gid)."""
    return {key: value for key, value in attrs.items() if key not in ("uid", "gid")}


class Namespace(ABC):
    """Paths are absolute namespace paths; implementations normalize and refuse bad ones
    with ``InvalidPath`` before anything else happens."""

    @abstractmethod
    async def stat(self, who: Principal, path: str) -> Entry: ...

    @abstractmethod
    def list(
        self, who: Principal, path: str, *, start_after: str | None = None, limit: int | None = None
    ) -> AsyncIterator[Entry]:
        """Children of a directory by name (bytewise), streamed page by page so memory stays
        flat; ``start_after`` is the name to resume after, ``limit`` caps the count."""

    @abstractmethod
    async def read(
        self,
        who: Principal,
        path: str,
        offset: int = 0,
        length: int | None = None,
        *,
        if_version: int | None = None,
    ) -> Reader:
        """Open [offset, offset+length) of a file; the caller closes the reader (async with).
        With ``if_version``, ``Conflict`` unless the file is at that version."""

    @abstractmethod
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
        """Create or replace a file from a stream, atomically: readers see the old or the new
        content, never a mix. ``if_version``: replace only that version (else Conflict);
        ``exclusive``: create only (else AlreadyExists). The parent must exist.
        ``write_id``: the write's idempotency key (a spoke's journaled write has one): a hub
        remembers the entry a write with a key made, and answers a repeat of it (sent again
        after its answer was lost) with that entry, writing nothing. ``tags``: set in the
        same commit as the new content (so a crash leaves both old or both new); a
        callable is asked once ``data`` has ended (an ETag of the bytes)."""

    @abstractmethod
    async def mkdir(
        self, who: Principal, path: str, *, parents: bool = False, exist_ok: bool = False
    ) -> Entry: ...

    @abstractmethod
    async def symlink(self, who: Principal, path: str, target: str) -> Entry:
        """Create a symlink to ``target`` (any text, kept as given); ``NotSupported``
        where the volume has no symlinks, ``AlreadyExists`` if ``path`` exists."""

    @abstractmethod
    async def mknod(self, who: Principal, path: str, mode: int, rdev: int = 0) -> Entry:
        """Create a special file: ``mode`` holds its type (``stat.S_IFIFO``, ``S_IFCHR``,
        ``S_IFBLK``, ``S_IFSOCK``) and permission bits, ``rdev`` a device's number.
        ``NotSupported`` where the volume has no special files (S3), ``InvalidArgument``
        for another type, ``AlreadyExists`` if ``path`` exists."""

    @abstractmethod
    async def link(self, who: Principal, src: str, dst: str) -> Entry:
        """Give the file (or special file, or symlink) ``src`` a second name ``dst`` in
        the same volume: a hard link. Both names then show one content and one set of
        attributes, and ``nlink`` counts them. ``NotSupported`` where the volume has no
        hard links (S3), ``AlreadyExists`` if ``dst`` exists, ``PermissionDenied`` for a
        directory (as link(2))."""

    @abstractmethod
    async def rename(
        self, who: Principal, src: str, dst: str, *, overwrite: bool = False
    ) -> Entry: ...

    @abstractmethod
    async def remove(
        self, who: Principal, path: str, *, recursive: bool = False, if_version: int | None = None
    ) -> None: ...

    @abstractmethod
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
        """Change permission bits, owner, mtime or atime (None leaves one as it is). Where
        the volume keeps them (posix) they change there too, else in the catalog only. A
        new mtime is a content change (new version): tools such as rsync and make read it
        so. The atime is kept only where the volume keeps it."""

    def writes_attrs(self, path: str) -> bool:
        """Whether ``write_with_attrs`` can write the file at ``path``: in one change."""
        return False

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
        """``write``, then ``set_attrs(**attrs)`` on what it wrote, as one change (where
        ``writes_attrs``): a FUSE close saves the bytes and the mode, times and owner set
        while the file was open. Decided and audited as the two calls. ``owner_optional``:
        where the owner change (uid, gid) is refused, the rest is set, as
        ``set_attrs_owning`` would. ``tags`` and ``exclusive``: as ``write``'s (a file a
        mount creates at its close is made whole in this one change)."""
        raise NotSupported(f"no write with attributes in one change at {path}", path=path)

    async def authorize_create(self, who: Principal, path: str, mode: int) -> None:
        """Refuse ``who`` a ``write(path, exclusive=True, mode=mode)`` as that write would
        be refused for its rights, writing nothing: a mount that makes a file at its close
        decides its create when it is asked for. A namespace that cannot tell without
        writing (one whose rules live elsewhere) raises ``NotSupported``."""
        raise NotSupported(f"this namespace cannot decide a create at {path} beforehand")

    async def visible(self, who: Principal, path: str) -> bool:
        """Whether ``who`` may see ``path`` (listings leave the rest out); a namespace
        that decides nothing itself shows everything."""
        return True

    async def set_attrs_owning(self, who: Principal, path: str, attrs: Mapping[str, int]) -> Entry:
        """``set_attrs(**attrs)``, which may give a new entry to its maker: where that
        change of owner is refused (it needs admin, which a grant of write in a governed
        directory is not), the entry keeps the owner the site gave it and the rest is set.
        A local disk would give it to her; in loomfs only an admin gives files away."""
        try:
            return await self.set_attrs(who, path, **attrs)
        except PermissionDenied:
            rest = without_owner(attrs)
            if rest == attrs:
                raise
            return await self.set_attrs(who, path, **rest)

    @abstractmethod
    async def get_tags(self, who: Principal, path: str) -> dict[str, str]: ...

    async def children_tags(self, who: Principal, path: str) -> dict[str, dict[str, str]] | None:
        """The tags of the children of the directory ``path`` that have any, by name, in
        one call (a FUSE listing's extended attributes: Samba asks each listed name), or
        None where this namespace can't tell in one: ask ``get_tags`` of each."""
        return None

    @abstractmethod
    async def set_tags(
        self,
        who: Principal,
        path: str,
        set_: Mapping[str, str],
        remove: Sequence[str] = (),
    ) -> dict[str, str]: ...

    @abstractmethod
    async def lease_write(self, who: Principal, path: str) -> float:
        """Take (or renew) the write lease of ``path`` for the caller's site: while it
        lasts, writes, renames and removals of the path from any other site fail with
        ``Conflict``. Returns the seconds granted; renew well before they run out."""

    @abstractmethod
    async def release_write(self, who: Principal, path: str) -> None:
        """Give up the caller's site's write lease of ``path`` (none held: nothing)."""

    async def persist(self, who: Principal, path: str) -> None:  # noqa: B027 - see below
        """Make the acknowledged changes of ``path`` (a file's content and name, a
        directory's names) and of the catalog survive power loss: ``fsync`` through a
        mount. Namespaces that make every change durable before acknowledging it (a hub
        by default, one over REST, a spoke's journal) have nothing left to do."""

    async def close(self) -> None:  # noqa: B027 - stateless implementations hold nothing
        """Release what the namespace holds (connections, watchers)."""

    # -- versions: a namespace that keeps none refuses them --------------------------------

    async def set_versioning(self, who: Principal, path: str, state: str) -> None:
        """Set directory ``path`` (and what is below it) to ``VERSIONING_STATES``: from
        then on a file there that is overwritten or removed keeps its old version."""
        raise NotSupported("this namespace keeps no versions", path=path)

    async def versioning(self, who: Principal, path: str) -> str | None:
        """The state directory ``path`` is in (from its nearest set ancestor), None if
        never set."""
        return None

    async def versions(self, who: Principal, path: str) -> builtins.list[Version]:
        """Every version of the files at and below ``path``, by path, newest first."""
        raise NotSupported("this namespace keeps no versions", path=path)

    async def read_version(
        self, who: Principal, path: str, vid: str, offset: int = 0, length: int | None = None
    ) -> Reader:
        """``read`` of version ``vid`` of ``path`` (``NotFound`` if there is none; a
        delete marker is ``NotFound`` too)."""
        raise NotSupported("this namespace keeps no versions", path=path)

    async def remove_version(
        self, who: Principal, path: str, vid: str, *, bypass: bool = False
    ) -> Version | None:
        """Delete version ``vid`` of ``path`` for good (what it was, None if none); if it
        was the latest, the newest remaining one becomes the file again. PermissionDenied
        if its object lock holds it (``bypass``: past a GOVERNANCE retention)."""
        raise NotSupported("this namespace keeps no versions", path=path)

    async def mark_removed(self, who: Principal, path: str) -> str | None:
        """Leave a delete marker at ``path``, which has no file (S3's DELETE of a missing
        key in a versioned bucket): its id; None where no versions are kept there."""
        raise NotSupported("this namespace keeps no versions", path=path)

    async def set_lock(
        self, who: Principal, path: str, vid: str | None, lock: Lock, *, bypass: bool = False
    ) -> None:
        """Make ``lock`` the retention and legal hold of version ``vid`` of ``path`` (None:
        the current one), as ``namespace.objectlock`` allows."""
        raise NotSupported("this namespace keeps no versions", path=path)

    # -- derived helpers, written once for every implementation ----------------------------

    async def read_bytes(
        self, who: Principal, path: str, offset: int = 0, length: int | None = None
    ) -> bytes:
        async with await self.read(who, path, offset, length) as reader:
            return await reader.read_all()

    async def write_bytes(self, who: Principal, path: str, data: bytes, **kwargs: object) -> Entry:
        return await self.write(who, path, aiter_bytes(data), **kwargs)  # type: ignore[arg-type]

    async def read_entry(
        self, who: Principal, entry: Entry, offset: int = 0, length: int | None = None
    ) -> Reader:
        """``read`` of the file ``entry`` describes (from ``stat`` or ``stat_tags``), at that
        version: an implementation may take the entry instead of looking it up again, and
        then checks on open that the file is still that version (``Conflict`` if not)."""
        return await self.read(who, entry.path, offset, length, if_version=entry.version)

    async def followed(self, who: Principal, entry: Entry) -> Entry:
        """What a read of ``entry`` reads: ``entry`` itself, or a symlink's final target's
        entry (its size, version, etag), found and decided the way a read finds it
        (``stat_for_read``: a dangling link is ``NotFound``, a loop ``InvalidPath``, a
        link to a directory that directory). For the edges that report sizes and ETags of
        what they serve (S3 HEAD and listings, fsspec)."""
        if entry.kind is not EntryKind.SYMLINK:
            return entry
        return await self.stat_for_read(who, entry.path)

    async def stat_tags(self, who: Principal, path: str) -> tuple[Entry, dict[str, str]]:
        """``stat`` and ``get_tags`` of one path, for callers that need both (an S3 GET);
        an implementation may answer both from one catalog read."""
        return await self.stat(who, path), await self.get_tags(who, path)

    async def stat_for_read(self, who: Principal, path: str) -> Entry:
        """The entry of what a read of ``path`` reads (a symlink's final target), refused
        as that read would be: what a cache asks before it serves bytes it holds to
        ``who``, since a stat needs only list. This default, for a namespace that follows
        no links itself, answers as ``stat``."""
        return await self.stat(who, path)

    async def locate(self, who: Principal, entry_id: int) -> Entry:
        """The entry whose ``Entry.id`` is ``entry_id``, wherever renames over any protocol
        took it (what a name that outlives renames, an NFS handle, needs); ``NotFound``
        once it is removed. A namespace whose entries carry no ids of its own (a spoke's
        are its hub's) cannot."""
        raise NotSupported("this namespace does not find entries by their id")

    async def exists(self, who: Principal, path: str) -> bool:
        try:
            await self.stat(who, path)
        except FileNotFoundError:
            return False
        return True

    async def walk(self, who: Principal, top: str) -> AsyncIterator[Entry]:
        """Every entry below ``top``, depth first, directories before their children."""
        async for entry in self.list(who, top):
            yield entry
            if entry.is_dir:
                async for child in self.walk(who, entry.path):
                    yield child


class FeedNamespace(Namespace):
    """A namespace whose change feed can be followed: what a spoke needs of its hub."""

    @abstractmethod
    async def changes(
        self, since: int = 0, limit: int = 1000, *, wait: float = 0.0, ack: int = 0
    ) -> Feed:
        """Changes after ``since``, held up to ``wait`` seconds until there is one; ``ack``
        says every change up to it is applied (and renews the caller's read lease)."""

    async def round_trip(self) -> float | None:
        """Seconds one bare request to this namespace takes there and back (the link's
        round trip, for its metrics), or None where there is no link to time (in the
        same process)."""
        return None

    async def list_changed(self, who: Principal, path: str, since: int, held: str) -> ListingDelta:
        """``path``'s listing for the holder of a copy listed at feed position ``since``,
        whose digest is ``held`` (``namespace.listing``): only what changed where the
        implementation can tell, else the whole listing."""
        return delta(path, [entry async for entry in self.list(who, path)], None, held)

    async def list_tree(
        self, who: Principal, top: str, held: Mapping[str, tuple[int, str]]
    ) -> AsyncIterator[tuple[str, ListingDelta | LoomError]]:
        """The listings of ``top`` and the directories below it, in the order a walk
        meets them (``namespace.listing.listed_tree``: an error ends them, and so may a
        budget, short of the end), for the holder of the copies ``held`` (directory ->
        feed position, digest): only what changed where the implementation can tell."""
        listed = listed_tree(lambda d: self.list(who, d), top, TREE_MAX)
        for one in tree_deltas([dir_ async for dir_ in listed], None, held):
            yield one


class ResolvingNamespace(Namespace):
    """A namespace that can say what a call will really touch (a hub's, over its
    catalog): what the governed namespace decides on, rather than the names it is given."""

    @abstractmethod
    async def resolved(self, path: str) -> tuple[Entry, Entry]:
        """(the entry at ``path``, the entry whose bytes a read of it returns): the same
        one for anything but a symlink, whose final target is followed inside the
        namespace. ``NotFound`` if either is absent."""

    @abstractmethod
    async def other_names(self, entry: Entry) -> list[str]:
        """The other paths that name ``entry``'s file (hard links), none if it has one."""
