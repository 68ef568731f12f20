"""Value types shared by the core layer: entry kinds, object facts, the caller's identity."""

from __future__ import annotations

import enum
import stat
from dataclasses import dataclass, field
from typing import NamedTuple


class EntryKind(enum.StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"
    # special files: a name and attributes only, no content (posix volumes only)
    FIFO = "fifo"
    CHAR_DEVICE = "chardev"
    BLOCK_DEVICE = "blockdev"
    SOCKET = "socket"


#: the file-type bits (``stat.S_IFMT``) of each kind: the one table every protocol uses
KIND_BITS: dict[EntryKind, int] = {
    EntryKind.FILE: stat.S_IFREG,
    EntryKind.DIR: stat.S_IFDIR,
    EntryKind.SYMLINK: stat.S_IFLNK,
    EntryKind.FIFO: stat.S_IFIFO,
    EntryKind.CHAR_DEVICE: stat.S_IFCHR,
    EntryKind.BLOCK_DEVICE: stat.S_IFBLK,
    EntryKind.SOCKET: stat.S_IFSOCK,
}
KIND_OF_BITS = {bits: kind for kind, bits in KIND_BITS.items()}
SPECIAL_KINDS = frozenset(
    {EntryKind.FIFO, EntryKind.CHAR_DEVICE, EntryKind.BLOCK_DEVICE, EntryKind.SOCKET}
)


class ObjectInfo(NamedTuple):
    """What a backend knows of one object, keyed relative to the volume's root.

    ``key`` uses '/' separators and no leading slash; '' is the volume's root. ``etag``
    is whatever tells a changed object from an unchanged one without reading it: the S3
    ETag, or for posix a fingerprint of inode, size and mtime.

    A named tuple rather than a frozen dataclass: a scan builds one per object, and a
    tuple is immutable too at a quarter of the cost.
    """

    key: str
    kind: EntryKind
    size: int = 0
    mtime_ns: int = 0
    etag: str | None = None
    inode: int | None = None
    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    link_target: str | None = None
    #: device number of a character or block device
    rdev: int | None = None
    #: names of this inode in the volume (hard links); 1 where the storage has no links
    nlink: int = 1
    #: access and status-change times where the storage keeps them (posix)
    atime_ns: int | None = None
    ctime_ns: int | None = None

    @property
    def sort_key(self) -> str:
        """The order in which backends scan: directories sort as 'name/'.

        Walking a tree depth-first with children in this order visits keys in plain byte
        order of their full path, which is also the order S3 lists objects in; resumable
        scans rely on it.
        """
        return self.key + "/" if self.kind is EntryKind.DIR and self.key else self.key


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: carried by every namespace call so that authorization and audit
    can be decided in one place for every protocol.

    ``protocol`` is the listener's that the call came in by ("fabric" for whatever a
    spoke sends); ``forwarded`` is the protocol a spoke says its user reached it by, and
    ``asserted`` whether the user is the spoke's word rather than credentials the hub
    checked. Both come from a spoke: ``forwarded`` is recorded for audit and decides
    nothing; ``asserted`` (set by the hub, never by a header) withholds administration."""

    user: str
    groups: frozenset[str] = field(default_factory=frozenset)
    site: str = "local"
    protocol: str = "api"
    forwarded: str | None = None
    asserted: bool = False


SYSTEM = Principal(user="system", groups=frozenset({"admin"}), protocol="internal")


class ChangeOp(enum.StrEnum):
    CREATE = "create"
    MODIFY = "modify"  # content changed: new version
    META = "meta"  # mode, owner, mtime or tags changed; content version unchanged
    DELETE = "delete"  # the path and everything below it is gone
    RENAME = "rename"  # path moved to new_path, with everything below it
    EVICT = "evict"  # a placement policy tightened: sites drop cached data at and below path


@dataclass(frozen=True, slots=True)
class Entry:
    """One file, directory, symlink or special file of the namespace, as the catalog
    records it.

    ``version`` is the change-log sequence number of the last change to the content, so
    it only grows, and a (path, version) pair never names two different contents even
    across delete and re-create. Entries of one volume with the same ``inode`` and
    ``nlink`` > 1 are hard links of one file. ``id`` is the catalog row's number where the
    entry came from a catalog (None where it did not, or not yet: a create's answer): it
    stays the entry's through renames and new versions, so it names the object, not the path.
    """

    path: str
    kind: EntryKind
    size: int
    mtime_ns: int
    mode: int
    uid: int
    gid: int
    version: int
    etag: str | None = None
    inode: int | None = None
    link_target: str | None = None
    rdev: int | None = None
    nlink: int = 1
    #: access and status-change times (None where the storage keeps none: the mtime stands in)
    atime_ns: int | None = None
    ctime_ns: int | None = None
    #: not part of what an entry is (two looks at one file compare equal with or without it)
    id: int | None = field(default=None, compare=False)

    @property
    def name(self) -> str:
        return self.path.rsplit("/", 1)[-1]

    @property
    def is_dir(self) -> bool:
        return self.kind is EntryKind.DIR


@dataclass(frozen=True, slots=True)
class WriteTags:
    """Tags a write sets in the very commit that records its new content (an S3 object's
    ETag, content type and user metadata), so that a crash leaves the old content with
    the old tags or the new content with the new ones, never a mix."""

    set: dict[str, str] = field(default_factory=dict)
    #: set as "<version> <value>", the version the write gives the file: a reader tells
    #: such a tag stale once the file is written again by a road that sets none
    stamped: dict[str, str] = field(default_factory=dict)
    #: the tags under this prefix that neither names are removed (None: none are)
    replace_prefix: str | None = None
    #: a second such prefix: the tags that describe the content itself (its encryption,
    #: ``namespace.sse``), which a write of another protocol's tags must replace too
    drop_prefix: str | None = None

    def resolved(self, version: int) -> dict[str, str]:
        """The tags as the file at ``version`` has them."""
        return {**self.set, **{k: f"{version} {v}" for k, v in self.stamped.items()}}

    def stale(self, tags: dict[str, str]) -> list[str]:
        """The keys of ``tags`` (the file's before) that this removes."""
        prefixes = tuple(p for p in (self.replace_prefix, self.drop_prefix) if p is not None)
        if not prefixes:
            return []
        return [
            k
            for k in tags
            if k.startswith(prefixes) and k not in self.set and k not in self.stamped
        ]

    def as_json(self) -> dict[str, object]:
        data: dict[str, object] = {
            "set": self.set, "stamped": self.stamped, "replace_prefix": self.replace_prefix
        }  # fmt: skip
        if self.drop_prefix is not None:  # else as before it existed (journals, old spokes)
            data["drop_prefix"] = self.drop_prefix
        return data

    @classmethod
    def from_json(cls, data: dict[str, object]) -> WriteTags:
        def pairs(value: object) -> dict[str, str]:
            if not isinstance(value, dict):
                raise ValueError("tags must be an object of strings")
            return {str(k): str(v) for k, v in value.items()}

        prefix, drop = data.get("replace_prefix"), data.get("drop_prefix")
        return cls(
            pairs(data.get("set", {})),
            pairs(data.get("stamped", {})),
            None if prefix is None else str(prefix),
            None if drop is None else str(drop),
        )


@dataclass(frozen=True, slots=True)
class Change:
    """One record of the change log; spokes consume these in ``seq`` order."""

    seq: int
    op: ChangeOp
    path: str
    kind: EntryKind
    version: int
    time_ns: int
    new_path: str | None = None
    size: int = 0


@dataclass(frozen=True, slots=True)
class Feed:
    """A page of the change log, and the read lease granted with it (seconds; None when
    the caller is not a spoke)."""

    changes: list[Change]
    head: int
    lease: float | None = None


class VolumeState(enum.StrEnum):
    IMPORTING = "importing"  # first assimilation under way; checkpoint says how far
    READY = "ready"


@dataclass(frozen=True, slots=True)
class Volume:
    """Existing storage assimilated at ``mount`` (a namespace path)."""

    id: int
    mount: str
    url: str
    state: VolumeState
    checkpoint: str | None
    created_ns: int
    last_scan_ns: int | None


class Action(enum.StrEnum):
    """What a namespace call needs of a path, and what an ACL rule grants.

    Calls need list (stat, list, tags: that a path is there and its metadata), read (its
    content), write (any change) or admin (its owner, its access rules). Grants imply
    some of the others: read includes list, write includes read, admin includes all.
    Put grants write and list but not read (a drop box; an S3 bucket's WRITE)."""

    LIST = "list"
    READ = "read"
    WRITE = "write"
    ADMIN = "admin"
    PUT = "put"
