"""What a read hands back (core layer): a local file region or an async byte stream.

Servers that can let the kernel copy (sendfile, FUSE page cache) look at ``region``; every
other consumer iterates the source. Either way the consumer calls ``verify()`` after the
last byte: a posix file changed in place while it was read raises ``Conflict`` there, so
a reader gets a clear error instead of a mix of two versions.
"""

from __future__ import annotations

import asyncio
import errno
import os
from abc import ABC, abstractmethod
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from ..errors import Conflict, InvalidArgument

BUFFER_SIZE = 1 << 20


@dataclass(frozen=True, slots=True)
class FileRegion:
    """Bytes that already sit in a local file: hand the descriptor to sendfile/splice."""

    fd: int
    offset: int
    length: int
    #: the bytes of the region never change while the descriptor is open (a verified cache
    #: file: a new version is a new file, eviction unlinks): the descriptor itself may be
    #: handed to another process to read them (``rest.local``)
    fixed: bool = False


class ByteSource(ABC):
    """The bytes of one ranged read; an async context manager that releases them."""

    length: int
    region: FileRegion | None = None

    @abstractmethod
    def chunks(self) -> AsyncIterator[bytes]:
        """Yield the bytes in order, in buffers of at most ``BUFFER_SIZE``."""

    async def verify(self) -> None:  # noqa: B027 - streams that can't change mid-read need nothing
        """Raise ``Conflict`` if the object changed while it was being read."""

    @abstractmethod
    async def aclose(self) -> None: ...

    async def read_all(self) -> bytes:
        """Collect the whole range; for small reads and tests, never for whole large files."""
        parts = [chunk async for chunk in self.chunks()]
        await self.verify()
        return b"".join(parts)

    async def __aenter__(self) -> ByteSource:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def file_fingerprint(st: os.stat_result) -> tuple[int, int, int]:
    """What changes when a file's bytes change (inode, size, mtime).

    Not ctime: a chmod, chown or rename changes it too, and must not look like new content.
    """
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def fsync_dir(directory: Path) -> None:
    """Make the names in ``directory`` durable (a rename or create is not, until then)."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalFileSource(ByteSource):
    """A range of an open local file; owns the descriptor and closes it."""

    def __init__(
        self, fd: int, offset: int, length: int, path: str, *, fixed: bool = False
    ) -> None:
        self._fd = fd
        self._path = path
        self._fingerprint = file_fingerprint(os.fstat(fd))
        self.length = length
        self.region = FileRegion(fd, offset, length, fixed)

    async def chunks(self) -> AsyncIterator[bytes]:
        assert self.region is not None
        pos, end = self.region.offset, self.region.offset + self.length
        while pos < end:
            want = min(BUFFER_SIZE, end - pos)
            data = await asyncio.to_thread(os.pread, self._fd, want, pos)
            if not data:
                raise Conflict(f"file shrank while it was read: {self._path}", path=self._path)
            pos += len(data)
            yield data

    async def verify(self) -> None:
        if file_fingerprint(os.fstat(self._fd)) != self._fingerprint:
            raise Conflict(f"file changed while it was read: {self._path}", path=self._path)

    async def aclose(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class StreamSource(ByteSource):
    """A range delivered by an async iterator (a network body, a decompressor)."""

    def __init__(
        self,
        stream: AsyncIterable[bytes],
        length: int,
        close: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self._stream = stream
        self._close = close
        self.length = length

    async def chunks(self) -> AsyncIterator[bytes]:
        got = 0
        async for chunk in self._stream:
            got += len(chunk)
            yield chunk
        if got != self.length:
            raise Conflict(f"stream ended after {got} of {self.length} bytes")

    async def aclose(self) -> None:
        if self._close is not None:
            close, self._close = self._close, None
            await close()


class BytesSource(ByteSource):
    """Bytes already in memory (small objects, tests)."""

    def __init__(self, data: bytes) -> None:
        self._data = data
        self.length = len(data)

    async def chunks(self) -> AsyncIterator[bytes]:
        view = memoryview(self._data)
        for pos in range(0, len(view), BUFFER_SIZE):
            yield bytes(view[pos : pos + BUFFER_SIZE])

    async def aclose(self) -> None:
        return None


class LocalFile:
    """A whole local file as the body of a write (a FUSE or SFTP spool). A backend on a
    local file system copies it by ranges inside the kernel, data only, so that its holes
    stay holes (a file truncated up to gigabytes is not gigabytes of zeros written); any
    other consumer iterates it as a stream of its bytes, holes read as zeros."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    @property
    def size(self) -> int:
        return os.fstat(self.fd).st_size

    def __aiter__(self) -> AsyncIterator[bytes]:
        return self._chunks()

    async def _chunks(self) -> AsyncIterator[bytes]:
        pos = 0
        while data := await asyncio.to_thread(os.pread, self.fd, BUFFER_SIZE, pos):
            pos += len(data)
            yield data


#: copy_file_range's refusals that mean "not between these two files", not a failure
_NO_COPY_RANGE = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})


def copy_sparse(src: int, dst: int, size: int) -> None:
    """Make the empty file ``dst`` the first ``size`` bytes of ``src``: the size set by
    ftruncate, then only the data extents (SEEK_DATA/SEEK_HOLE) copied to the same
    offsets, so holes stay holes. copy_file_range shares blocks where the file system can
    (reflink on XFS, btrfs) and never passes the bytes through this process; between file
    systems that refuse it, sendfile copies."""
    os.ftruncate(dst, size)
    pos = 0
    while pos < size:
        try:
            start = os.lseek(src, pos, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                return  # nothing but a hole from here on
            raise
        if start >= size:
            return
        end = min(os.lseek(src, start, os.SEEK_HOLE), size)
        _copy_range(src, dst, start, end - start)
        pos = end


def _copy_range(src: int, dst: int, offset: int, count: int) -> None:
    end = offset + count
    pos = offset
    try:
        while pos < end:
            copied = os.copy_file_range(src, dst, end - pos, pos, pos)
            if copied == 0:
                return  # src ended early: it shrank meanwhile
            pos += copied
        return
    except OSError as exc:
        if exc.errno not in _NO_COPY_RANGE:
            raise
    os.lseek(dst, pos, os.SEEK_SET)  # sendfile writes at dst's position
    while pos < end:
        sent = os.sendfile(dst, src, pos, end - pos)
        if sent == 0:
            return
        pos += sent


def clamp_range(size: int, offset: int, length: int | None) -> tuple[int, int]:
    """Resolve (offset, length) against an object's size; reading past the end is empty."""
    if offset < 0 or (length is not None and length < 0):
        raise InvalidArgument(f"invalid range: offset={offset} length={length}")
    start = min(offset, size)
    end = size if length is None else min(size, offset + length)
    return start, end - start


async def chained(first: bytes, rest: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """``first``, then the rest of the stream it was taken from."""
    yield first
    async for chunk in rest:
        yield chunk


async def aiter_bytes(data: bytes) -> AsyncIterator[bytes]:
    """An async stream over bytes in memory, for writes of small payloads."""
    view = memoryview(data)
    if not view:
        return
    for pos in range(0, len(view), BUFFER_SIZE):
        yield bytes(view[pos : pos + BUFFER_SIZE])
