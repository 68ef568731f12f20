"""Open files of a FUSE mount (protocol layer): where a handle's bytes come from and go.

Reads of a version whose bytes sit in a local file (a posix volume) are ``pread`` from the
descriptor the namespace handed back, so no byte passes through a stream; other reads
(S3 volumes, a hub over REST) follow the namespace's stream and reopen it, pinned to the
opened version, when the kernel seeks. Writes go to an anonymous temp file per inode and
reach the namespace as one atomic write, conditional on the version they started from,
handed on as a local file so that a posix volume copies its data ranges and its holes stay
holes. A change that could not be made in full (the spool's disk full) is never committed:
the file keeps its last committed content.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterable, AsyncIterator

from ...core.streams import LocalFile, aiter_bytes, copy_sparse
from ...core.types import Principal
from ...errors import LoomError, from_oserror
from ...namespace.base import Namespace, Reader
from .inodes import Node


class ReadStream:
    """Serves one handle's reads from one version of a file."""

    def __init__(self, reader: Reader) -> None:
        self.reader = reader
        self.version = reader.entry.version
        self._pos = reader.offset
        self._chunks: AsyncIterator[bytes] | None = None
        self._pending = memoryview(b"")
        # the kernel may send several reads of one handle at once; a stream serves them
        # one after another, in the order they arrived
        self._lock = asyncio.Lock()

    async def read(
        self, ns: Namespace, who: Principal, node: Node, offset: int, size: int
    ) -> bytes:
        region = self.reader.region
        if region is not None:
            # a blocking pread on the event loop: it is served from the page cache or a
            # local disk in microseconds, far less than a hop through a thread would cost
            want = max(0, min(size, region.length - offset))
            data = os.pread(region.fd, want, region.offset + offset)
            await self.reader.verify()  # the file was changed in place: fail, never mix
            return data
        async with self._lock:
            if offset != self._pos:
                await self._reopen(ns, who, node, offset)
            out = bytearray()
            while len(out) < size:
                if not self._pending:
                    if self._chunks is None:
                        self._chunks = self.reader.chunks()
                    try:
                        self._pending = memoryview(await anext(self._chunks))
                    except StopAsyncIteration:
                        await self.reader.verify()
                        break
                take = self._pending[: size - len(out)]
                out += take
                self._pending = self._pending[len(take) :]
            self._pos += len(out)
            return bytes(out)

    async def _reopen(self, ns: Namespace, who: Principal, node: Node, offset: int) -> None:
        await self.aclose()
        self.reader = await ns.read(who, node.path, offset, if_version=self.version)
        self._pos = self.reader.offset
        self._pending = memoryview(b"")

    async def aclose(self) -> None:
        if self._chunks is not None:
            await self._chunks.aclose()  # type: ignore[attr-defined]
            self._chunks = None
        await self.reader.aclose()


class WriteBuffer:
    """The content of a file open for writing, in an anonymous temp file (``O_TMPFILE``:
    nothing is left behind by a crash). ``base_version`` is what it replaces."""

    def __init__(self, spool_dir: str, base_version: int) -> None:
        self._spool_dir = spool_dir
        # made at its first use: a file created and closed unwritten (touch, a lock file)
        # never needs one, and making one costs the file system a journal entry; -1: closed
        self._fd: int | None = None
        self.base_version = base_version
        self.mtime_ns = time.time_ns()
        #: bumped by every change; a commit compares it to know whether it took them all
        self.generation = 0
        self.committed_generation = 0
        self.commit_lock = asyncio.Lock()
        #: why a change to it failed: it holds part of one, and must never be committed
        self.broken: LoomError | None = None
        #: attributes set while the file is open for writing (``Namespace.set_attrs``
        #: keywords), saved with the content at the next commit (one change where the
        #: namespace ``writes_attrs``): a create, its owner, mode and times then cost two
        #: changes in all, not one each
        self.pending: dict[str, int] = {}

    @property
    def fd(self) -> int:
        if self._fd is None:
            self._fd = os.open(self._spool_dir, os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, 0o600)
        return self._fd

    @property
    def dirty(self) -> bool:
        return self.generation != self.committed_generation

    @classmethod
    async def load(
        cls, ns: Namespace, who: Principal, path: str, version: int, spool_dir: str
    ) -> WriteBuffer:
        """A buffer holding the current content of ``path`` at ``version``."""
        buffer = cls(spool_dir, version)
        try:
            async with await ns.read(who, path, if_version=version) as reader:
                region = reader.region
                if region is not None and region.offset == 0:
                    await asyncio.to_thread(copy_sparse, region.fd, buffer.fd, region.length)
                else:
                    async for chunk in reader.chunks():
                        await asyncio.to_thread(os.write, buffer.fd, chunk)
                await reader.verify()
        except BaseException:
            buffer.close()
            raise
        return buffer

    def size(self) -> int:
        return 0 if self._fd is None else os.fstat(self._fd).st_size

    def changed(self) -> None:
        self.generation += 1
        self.mtime_ns = time.time_ns()
        self.pending.pop("mtime_ns", None)  # a write after utimens moves it, as on a disk

    @property
    def unsaved(self) -> bool:
        """Something is left for a commit to save: content or attributes."""
        return self.dirty or bool(self.pending)

    def write(self, data: bytes | memoryview, offset: int) -> int:
        try:
            written = os.pwrite(self.fd, data, offset)
        except OSError as exc:
            raise self._broke(exc) from exc
        self.changed()
        return written

    def truncate(self, size: int) -> None:
        try:
            os.ftruncate(self.fd, size)
        except OSError as exc:
            raise self._broke(exc) from exc
        self.changed()

    def _broke(self, exc: OSError) -> LoomError:
        self.broken = from_oserror(exc, disk=f"the FUSE spool {self._spool_dir}")
        return self.broken

    def body(self) -> AsyncIterable[bytes]:
        """The content, for a namespace write."""
        if self.broken is not None:
            raise self.broken
        return aiter_bytes(b"") if self._fd is None else LocalFile(self._fd)

    def close(self) -> None:
        if self._fd is not None and self._fd >= 0:
            os.close(self._fd)
        self._fd = -1
