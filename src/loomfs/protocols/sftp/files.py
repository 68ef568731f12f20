"""Open SFTP files (protocol layer): what a handle holds between open and close.

SFTP reads and writes arbitrary ranges of a handle, one request of at most a few tens of
KiB at a time (OpenSSH sends 32 KiB with 64 in flight), while the namespace reads ranges
and writes whole files atomically. So a read handle fetches windows of a few MiB with
ranged namespace reads, pinned to the version it opened, and fetches the next windows
ahead while the client consumes the current one; a write handle spools to a local file
(unlinked at once, so a crash leaves nothing behind) and commits it with one namespace
write when the client closes it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from ...core.streams import LocalFileSource
from ...core.types import Entry, Principal
from ...errors import from_oserror
from ...namespace.base import Namespace

WINDOW = 4 << 20
READAHEAD = 2  # windows fetched ahead of a sequential reader


class ReadHandle:
    """A file opened for reading only: windows of one version, fetched ahead."""

    def __init__(self, ns: Namespace, who: Principal, entry: Entry) -> None:
        self.ns = ns
        self.who = who
        self.entry = entry
        self._windows: dict[int, asyncio.Task[bytes]] = {}
        self._next = 0  # where a sequential reader asks next

    async def _fetch(self, index: int) -> bytes:
        start = index * WINDOW
        length = min(WINDOW, self.entry.size - start)
        path, version = self.entry.path, self.entry.version
        async with await self.ns.read(self.who, path, start, length, if_version=version) as r:
            return await r.read_all()

    def _window(self, index: int) -> asyncio.Task[bytes]:
        task = self._windows.get(index)
        if task is None:
            task = self._windows[index] = asyncio.create_task(self._fetch(index))
        return task

    async def read(self, offset: int, size: int) -> bytes:
        end = min(offset + size, self.entry.size)
        sequential = offset == self._next
        parts: list[bytes] = []
        pos = offset
        while pos < end:
            index = pos // WINDOW
            data = await self._window(index)
            lo = pos - index * WINDOW
            part = data[lo : lo + end - pos]
            parts.append(part)
            pos += len(part)
        self._next = max(pos, offset)
        # keep the window being read and, for a sequential reader, the next ones in flight;
        # a random reader gets no readahead it would throw away
        here = offset // WINDOW
        keep = range(here, here + 1 + (READAHEAD if sequential else 0))
        last = (self.entry.size - 1) // WINDOW
        for index in keep:
            if index <= last:
                self._window(index)
        for index in [i for i in self._windows if i not in keep]:
            self._windows.pop(index).cancel()
        return b"".join(parts)

    def size(self) -> int:
        return self.entry.size

    async def close(self) -> None:
        tasks = list(self._windows.values())
        self._windows.clear()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@dataclass(slots=True)
class Pending:
    """Attributes set on an open write handle: applied once the content is committed."""

    mode: int | None = None
    uid: int | None = None
    gid: int | None = None
    mtime_ns: int | None = None


class WriteHandle:
    """A file opened for writing (and maybe reading): a spool committed on close.

    ``base`` is the version whose content the spool started from (kept unless truncated),
    and the commit replaces only that version, so a concurrent change through another
    protocol is a conflict rather than lost.
    """

    def __init__(
        self,
        ns: Namespace,
        who: Principal,
        path: str,
        fd: int,
        *,
        base: Entry | None,
        dirty: bool,
        exclusive: bool,
        append: bool,
        mode: int | None,
    ) -> None:
        self.ns = ns
        self.who = who
        self.path = path
        self.fd = fd
        self.base = base
        self.dirty = dirty
        self.exclusive = exclusive
        self.append = append
        self.mode = mode
        self.pending = Pending()

    @classmethod
    async def open(
        cls,
        ns: Namespace,
        who: Principal,
        path: str,
        spool: Path,
        *,
        existing: Entry | None,
        truncate: bool,
        exclusive: bool,
        append: bool,
        mode: int | None,
    ) -> WriteHandle:
        """A spool for ``path``: empty when the file is new or truncated, else a copy of
        ``existing`` to change in place."""
        try:
            spool.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(prefix="sftp-", dir=spool)
            os.unlink(name)
        except OSError as exc:
            raise from_oserror(exc, str(spool)) from exc
        keep = existing is not None and not truncate
        try:
            if keep and existing is not None and existing.size:
                async with await ns.read(who, path, if_version=existing.version) as reader:
                    async for chunk in reader.chunks():
                        os.write(fd, chunk)
                    await reader.verify()
        except BaseException:
            os.close(fd)
            raise
        # a new file exists once opened and a truncation happens even if nothing is written
        dirty = existing is None or truncate
        return cls(
            ns, who, path, fd, base=existing, dirty=dirty, exclusive=exclusive,
            append=append, mode=mode,
        )  # fmt: skip

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    async def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    async def write(self, offset: int, data: bytes) -> int:
        # a page-cache write of at most a few tens of KiB: cheaper inline than a thread hop
        if self.append:
            offset = self.size()
        os.pwrite(self.fd, data, offset)
        self.dirty = True
        return len(data)

    def truncate(self, size: int) -> None:
        os.ftruncate(self.fd, size)
        self.dirty = True

    async def close(self) -> Entry | None:
        """Commit the spool as the file's new content (if anything changed) and the
        attributes set meanwhile; the spool is released either way."""
        source = LocalFileSource(self.fd, 0, self.size(), self.path)
        try:
            entry = None
            if self.dirty:
                entry = await self.ns.write(
                    self.who,
                    self.path,
                    source.chunks(),
                    if_version=self.base.version if self.base is not None else None,
                    exclusive=self.exclusive or self.base is None,
                    mode=self.mode,
                )
            p = self.pending
            if (p.mode, p.uid, p.gid, p.mtime_ns) != (None, None, None, None):
                entry = await self.ns.set_attrs(
                    self.who, self.path, mode=p.mode, uid=p.uid, gid=p.gid, mtime_ns=p.mtime_ns
                )
            return entry
        finally:
            self.fd = -1
            with contextlib.suppress(OSError):
                await source.aclose()
