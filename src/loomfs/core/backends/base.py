"""The storage backend interface (core layer): one async ABC for posix and S3 volumes.

A backend reaches existing storage in place. It never rewrites existing objects into a
format of its own: what loomfs writes is a plain file or a plain object that the tools
which wrote the rest can read. Keys are relative to the volume root, '/'-separated, never
absolute, never containing '.' or '..' (the namespace layer has already refused those; a
backend re-checks containment anyway, since it is the last line before the disk).

Vendor errors (OSError, botocore) are translated into ``loomfs.errors`` here, at the
boundary, with ``__cause__`` kept.
"""

from __future__ import annotations

import contextlib
import enum
from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator, AsyncIterable, Awaitable, Callable, Sequence
from typing import Protocol

from ...errors import LoomError, NotFound, NotSupported
from ..streams import ByteSource
from ..types import EntryKind, ObjectInfo


class Commit(Protocol):
    """The step that makes staged bytes visible at the key. ``first``, if given, is a
    blocking call made where the step runs, just before the volume changes (a hub's
    durable note of the commit: one hand-off to a thread for the note's fsync and the
    commit's own); if it raises, nothing changed."""

    def __call__(self, first: Callable[[], None] | None = None) -> Awaitable[ObjectInfo]: ...


#: what a writer wraps around that step (see ``Backend.write``)
Gate = Callable[[Commit], Awaitable[ObjectInfo]]
#: told of each key a scan could not read, and why (see ``Backend.scan``)
Skipped = Callable[[str, LoomError], None]


async def ungated(commit: Commit) -> ObjectInfo:
    return await commit()


async def _found(info: Awaitable[ObjectInfo]) -> ObjectInfo | None:
    try:
        return await info
    except NotFound:
        return None


class Capability(enum.StrEnum):
    """Abilities a backend declares instead of faking them."""

    ATOMIC_RENAME = "atomic_rename"  # rename of a file or whole directory is one atomic step
    LOCAL_FILES = "local_files"  # reads can hand back a local FileRegion (sendfile)
    SYMLINKS = "symlinks"
    NOTIFY = "notify"  # change notification (inotify) in addition to rescans
    POSIX_MODE = "posix_mode"  # mode/uid/gid are real and settable


class Backend(ABC):
    """One volume's storage. Instances are created by ``loomfs.core.registry``."""

    #: the volume URL without secrets, safe to log and to store in the catalog
    url: str
    capabilities: frozenset[Capability] = frozenset()
    #: False: a write is visible (and survives a crash of the process) when it returns,
    #: and survives power loss after ``sync`` of its key, as on a local file system
    durable: bool = True

    @abstractmethod
    async def check(self) -> None:
        """Verify that the storage exists and the credentials work, or raise a clear error
        (``NotFound``, ``AuthenticationFailed``, ``BackendUnavailable``)."""

    @abstractmethod
    async def stat(self, key: str) -> ObjectInfo:
        """Facts of one object or directory; ``NotFound`` if there is none."""

    async def stat_many(self, keys: Sequence[str]) -> dict[str, ObjectInfo | None]:
        """What ``stat`` answers for each key (None: ``NotFound``), keys it refuses left out;
        one ``stat`` after another here, one trip to the storage where a backend can."""
        found: dict[str, ObjectInfo | None] = {}
        for key in keys:
            with contextlib.suppress(LoomError):
                found[key] = await _found(self.stat(key))
        return found

    @abstractmethod
    def scan(
        self, prefix: str = "", start_after: str | None = None, *, skipped: Skipped | None = None
    ) -> AsyncGenerator[list[ObjectInfo], None]:
        """Every object and directory below directory ``prefix`` (not ``prefix`` itself), in
        batches; nothing if there is no such directory.

        A directory or entry that cannot be read (permissions) is passed to ``skipped`` with
        the error, and the scan goes on without it (and what is below it); without
        ``skipped`` such an error ends the scan. ``skipped`` may be called from a thread.

        Items come in ascending byte order of ``ObjectInfo.sort_key``; with ``start_after``
        only items whose sort key is greater are produced, so a killed scan can resume.
        Directories implied by S3 keys are produced once, before their first child. Reads
        no object's data. A consumer that stops early closes the generator (``aclose``),
        which stops the scan's work.
        """

    @abstractmethod
    def list_dir(self, key: str) -> AsyncGenerator[list[ObjectInfo], None]:
        """The direct children of directory ``key``, in batches, in sort-key order."""

    @abstractmethod
    async def open_read(
        self, key: str, offset: int, length: int, expect: ObjectInfo | None = None
    ) -> ByteSource:
        """The bytes [offset, offset+length) of a file.

        With ``expect``, raise ``Conflict`` if the object is no longer that version (S3:
        If-Match on the ETag; posix: the fingerprint). A range past the end is cut short
        there, so the source's ``length`` may be less than ``length``.
        """

    @abstractmethod
    async def write(
        self,
        key: str,
        data: AsyncIterable[bytes],
        *,
        mode: int | None = None,
        gate: Gate = ungated,
    ) -> ObjectInfo:
        """Create or replace a file atomically: readers see the old or the new bytes, never
        a mix or a partial file (posix: temp file, fsync, rename; S3: one PUT or a
        completed multipart upload). The parent directory must exist.

        The bytes are staged first, then ``gate`` is handed the step that makes them
        visible: it may take a lock, check preconditions and record the result around that
        step, or raise, in which case the staged bytes are dropped and nothing changed
        (posix: even after the step ran, what it replaced is put back; S3 cannot: its PUT
        replaced the object). ``data`` may be a ``LocalFile``: a backend on local disks
        copies it by ranges, keeping its holes."""

    @abstractmethod
    async def mkdir(self, key: str) -> ObjectInfo:
        """Create one directory (the parent must exist); ``AlreadyExists`` if present."""

    @abstractmethod
    async def delete(self, key: str) -> None:
        """Remove a file, a symlink, or an empty directory."""

    @abstractmethod
    async def rename(self, src: str, dst: str) -> None:
        """Move a file or a directory tree to ``dst`` (which must not exist).

        Atomic where ``ATOMIC_RENAME`` is declared; on S3 it copies, then deletes."""

    async def symlink(self, key: str, target: str) -> ObjectInfo:
        """Create a symlink at ``key`` (stored as given, never followed here) where the
        storage has them (``SYMLINKS``)."""
        raise NotSupported(f"{self.url} cannot hold symlinks", path=key)

    async def mknod(self, key: str, kind: EntryKind, mode: int, rdev: int = 0) -> ObjectInfo:
        """Create a special file (fifo, device, socket) with permission bits ``mode``
        where the storage has them (``POSIX_MODE``)."""
        raise NotSupported(f"{self.url} cannot hold special files", path=key)

    async def link(self, src: str, dst: str) -> ObjectInfo:
        """Give the file at ``src`` a second name ``dst`` (a hard link) where the storage
        has them (``POSIX_MODE``); reports the new name."""
        raise NotSupported(f"{self.url} cannot hold hard links", path=dst)

    async def set_attrs(
        self,
        key: str,
        *,
        mode: int | None = None,
        uid: int | None = None,
        gid: int | None = None,
        mtime_ns: int | None = None,
        atime_ns: int | None = None,
    ) -> ObjectInfo:
        """Change mode, owner, mtime or atime where the storage keeps them
        (``POSIX_MODE``); otherwise just report, and the namespace keeps them in its
        catalog."""
        return await self.stat(key)

    async def sync(self, key: str) -> None:  # noqa: B027 - object stores: durable on PUT
        """Make what was written at ``key`` (a file, or a directory's names) survive power
        loss, where ``durable`` is False and the storage defers it."""

    async def close(self) -> None:  # noqa: B027 - backends without connections hold nothing
        """Release connections and threads."""
