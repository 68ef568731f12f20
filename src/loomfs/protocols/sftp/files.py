"""Open SFTP files (protocol layer): what a handle holds between open and close.

SFTP reads and writes arbitrary ranges of a handle, one request of at most a few tens of
KiB at a time (OpenSSH sends 32 KiB with 64 in flight), while the namespace reads ranges
and writes whole files atomically. So a read handle fetches windows of a few MiB with
ranged namespace reads, pinned to the version it opened, and fetches the next windows
ahead while the client consumes the current one; a write handle spools to a local file
(unlinked at once, so a crash leaves nothing behind) and commits it with one namespace
write when the client closes it, handed on as a local file (a posix volume copies its data
ranges, so holes stay holes). A spool that failed to take a write (its disk full) is never
committed: the file stays as it was.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import tempfile
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

from ...core.streams import BUFFER_SIZE, LocalFile, copy_sparse
from ...core.types import Entry, Principal
from ...errors import LoomError, from_oserror
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
            # a window read ahead and dropped unread may have failed: nobody will ask
            task.add_done_callback(_observe)
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


class Abandoned(Exception):
    """Raised into a streaming write that must not commit."""


def _observe(task: asyncio.Task[bytes]) -> None:
    if not task.cancelled():
        task.exception()


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

    A spool that starts empty and is written front to back (what every client does for a
    put) is also streamed into the namespace write while the client is still sending, so
    that close only waits for the tail; the write becomes visible at close all the same,
    since the namespace commits it only when the stream ends. A write behind what was
    streamed (or a hole left at close) fails that write, which leaves nothing behind,
    and close commits the spool instead.
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
        spool: Path,
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
        self.spool = spool  # the directory of its spool file: named when its disk is full
        self.pending = Pending()
        self._sent = 0  # spool bytes handed to the streaming write
        self._end = 0  # end of what was written front to back
        self._more = asyncio.Event()
        self._eof = False
        self._abandoned = False
        self._stream: asyncio.Task[Entry] | None = None
        #: why a write to the spool failed: it holds part of one, never to be committed
        self._broken: LoomError | None = None

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
                    region = reader.region
                    if region is not None and region.offset == 0:
                        await asyncio.to_thread(copy_sparse, region.fd, fd, region.length)
                    else:
                        async for chunk in reader.chunks():
                            os.write(fd, chunk)
                    await reader.verify()
        except LoomError:
            os.close(fd)
            raise
        except OSError as exc:
            os.close(fd)
            raise from_oserror(exc, path, disk=f"the SFTP spool {spool}") from exc
        except BaseException:
            os.close(fd)
            raise
        # a new file exists once opened and a truncation happens even if nothing is written
        handle = cls(
            ns, who, path, fd, base=existing, dirty=not keep, exclusive=exclusive,
            append=append, mode=mode, spool=spool,
        )  # fmt: skip
        if not keep:
            handle._stream = asyncio.create_task(handle._commit(handle._follow()))
        return handle

    def size(self) -> int:
        return os.fstat(self.fd).st_size

    async def read(self, offset: int, size: int) -> bytes:
        return os.pread(self.fd, size, offset)

    async def write(self, offset: int, data: bytes) -> int:
        if self.append:
            offset = self.size()
        # a page-cache write of at most a few hundred KiB: cheaper inline than a thread hop
        await self._spooled(os.pwrite, self.fd, data, offset)
        self.dirty = True
        if self._stream is not None:
            if self._sent <= offset <= self._end:
                self._end = max(self._end, offset + len(data))
                if self._end - self._sent >= BUFFER_SIZE:
                    self._more.set()
            else:
                await self._abandon()
        return len(data)

    async def truncate(self, size: int) -> None:
        await self._spooled(os.ftruncate, self.fd, size)
        self.dirty = True
        if self._stream is not None and size != self._end:
            await self._abandon()

    async def _spooled(self, change: Callable[..., object], *args: object) -> None:
        """Make a change to the spool; one that fails breaks the handle for good."""
        try:
            change(*args)
        except OSError as exc:
            self._broken = from_oserror(exc, self.path, disk=f"the SFTP spool {self.spool}")
            await self._abandon()
            raise self._broken from exc

    async def _follow(self) -> AsyncIterator[bytes]:
        """The spool front to back, as the client writes it, until close."""
        while True:
            if self._abandoned:
                raise Abandoned("the streaming write gave way to the spool")
            ready = self._end - self._sent
            if ready >= BUFFER_SIZE or (self._eof and ready > 0):
                start = self._sent
                # claimed before the read: a write into this range now abandons the stream
                self._sent += min(ready, BUFFER_SIZE)
                yield await asyncio.to_thread(os.pread, self.fd, self._sent - start, start)
            elif self._eof:
                return
            else:
                self._more.clear()
                await self._more.wait()

    async def _commit(self, data: AsyncIterable[bytes]) -> Entry:
        return await self.ns.write(
            self.who,
            self.path,
            data,
            if_version=self.base.version if self.base is not None else None,
            exclusive=self.exclusive or self.base is None,
            mode=self.mode,
        )

    async def _abandon(self) -> None:
        """Stop the streaming write: nothing of it is committed. It fails from within its
        data rather than by cancellation, so the namespace cleans up what it staged
        whatever step it is at."""
        task, self._stream = self._stream, None
        if task is not None:
            self._abandoned = True
            self._more.set()
            with contextlib.suppress(Abandoned, LoomError):
                await task

    async def discard(self) -> None:
        """Drop everything (the client went away without closing): nothing is committed."""
        await self._abandon()
        os.close(self.fd)
        self.fd = -1

    async def close(self) -> Entry | None:
        """Commit the spool as the file's new content (if anything changed) and the
        attributes set meanwhile; the spool is released either way."""
        if self._stream is not None and self._end != self.size():
            await self._abandon()  # a hole, or bytes past what was written in order
        try:
            if self._broken is not None:
                raise self._broken
            entry = None
            if self._stream is not None:
                self._eof = True
                self._more.set()
                entry = await self._stream
            elif self.dirty:
                entry = await self._commit(LocalFile(self.fd))
            p = self.pending
            if (p.mode, p.uid, p.gid, p.mtime_ns) != (None, None, None, None):
                entry = await self.ns.set_attrs(
                    self.who, self.path, mode=p.mode, uid=p.uid, gid=p.gid, mtime_ns=p.mtime_ns
                )
            return entry
        finally:
            with contextlib.suppress(OSError):
                os.close(self.fd)
            self.fd = -1
