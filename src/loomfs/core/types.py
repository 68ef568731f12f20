"""Value types shared by the core layer: entry kinds, object facts, the caller's identity."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class EntryKind(enum.StrEnum):
    FILE = "file"
    DIR = "dir"
    SYMLINK = "symlink"


@dataclass(frozen=True, slots=True)
class ObjectInfo:
    """What a backend knows of one object, keyed relative to the volume's root.

    ``key`` uses '/' separators and no leading slash; '' is the volume's root. ``etag``
    is whatever tells a changed object from an unchanged one without reading it: the S3
    ETag, or for posix a fingerprint of inode, size and mtime.
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
    can be decided in one place for every protocol."""

    user: str
    groups: frozenset[str] = field(default_factory=frozenset)
    site: str = "local"
    protocol: str = "api"


SYSTEM = Principal(user="system", groups=frozenset({"admin"}), protocol="internal")
