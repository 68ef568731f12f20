"""Cache encryption at rest (spoke layer): AES-GCM per cached block, with a key of this site.

For spokes in places the data's owner does not control: each block of the cache, and each
1 MiB frame of a write waiting in the journal, is sealed with a fresh random nonce, and
its place (the cached file's id, version and the block's index; the journaled write and
the frame's index) is its associated data, so a block can't be moved to another place or
version unnoticed. Opening authenticates: a tampered or swapped block is ``CorruptData``
(the cache refetches it).
The key is 32 random bytes in a file only its owner may read (``[spoke] cache_key_file``).
"""

from __future__ import annotations

import asyncio
import os
import stat
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import blake3
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..core.streams import BUFFER_SIZE, ByteSource
from ..errors import ConfigError, CorruptData

KEY_BYTES = 32
NONCE = 12
OVERHEAD = NONCE + 16  # the nonce and the GCM tag beside each block
FRAME = BUFFER_SIZE  # plaintext bytes per sealed frame: the cache's block, the stream buffer
SLOT = FRAME + OVERHEAD


def load_key(path: Path, *, create: bool = False) -> bytes:
    """The cache key at ``path``; with ``create``, a new one (mode 0600) if there is none."""
    if create:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        except FileExistsError:
            pass
        except OSError as exc:
            raise ConfigError(f"cannot create the cache key {path}: {exc.strerror}") from None
        else:
            with os.fdopen(fd, "wb") as out:
                out.write(os.urandom(KEY_BYTES))
                out.flush()
                os.fsync(out.fileno())
    try:
        st = path.stat()
        key = path.read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read the cache key {path}: {exc.strerror}") from None
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(f"the cache key {path} is readable by others; chmod 600 it")
    if len(key) != KEY_BYTES:
        raise ConfigError(f"the cache key {path} must hold {KEY_BYTES} bytes, not {len(key)}")
    return key


def cache_context(file_id: int, version: int, idx: int) -> bytes:
    """What binds a cache block to its place: the cached file, its version, the index."""
    return b"cache" + struct.pack(">QQQ", file_id, version, idx)


def journal_context(seq: int, idx: int) -> bytes:
    """What binds a frame of a journaled write to its place: the write, the index."""
    return b"journal" + struct.pack(">QQ", seq, idx)


class BlockCipher:
    def __init__(self, key: bytes) -> None:
        self._aead = AESGCM(key)
        #: names the key without revealing it: a cache sealed with another key is dropped
        self.key_id = blake3.blake3(b"loomfs cache key id" + key).hexdigest()[:32]

    def seal(self, context: bytes, plain: bytes | memoryview) -> bytes:
        nonce = os.urandom(NONCE)
        return nonce + self._aead.encrypt(nonce, plain, context)

    def open(self, context: bytes, sealed: bytes) -> bytes:
        try:
            return self._aead.decrypt(sealed[:NONCE], sealed[NONCE:], context)
        except (InvalidTag, ValueError):
            raise CorruptData("a sealed block failed authentication") from None


class SealedWriter:
    """Writes a stream as sealed frames of ``FRAME`` plaintext bytes (the last shorter),
    each at ``idx * SLOT``; synchronous, for a worker thread."""

    def __init__(self, path: Path, cipher: BlockCipher, context: Callable[[int], bytes]) -> None:
        self._file = path.open("wb")
        self._cipher = cipher
        self._context = context
        self._buffer = bytearray()
        self._idx = 0

    def write(self, data: bytes) -> None:
        self._buffer += data
        while len(self._buffer) >= FRAME:
            self._emit(memoryview(self._buffer)[:FRAME])
            del self._buffer[:FRAME]

    def close(self) -> None:
        if self._buffer:
            self._emit(memoryview(self._buffer))
            self._buffer.clear()
        self._file.close()

    def _emit(self, plain: memoryview) -> None:
        sealed = self._cipher.seal(self._context(self._idx), plain)
        plain.release()
        self._file.write(sealed)
        self._idx += 1


def sealed_size(disk_size: int) -> int:
    """The plaintext size of a file of sealed frames."""
    full, rest = divmod(disk_size, SLOT)
    return full * FRAME + max(rest - OVERHEAD, 0)


def read_frame(fd: int, cipher: BlockCipher, context: bytes, idx: int) -> bytes:
    """Frame ``idx`` of a file of sealed frames, opened (the last one may be shorter)."""
    return cipher.open(context, os.pread(fd, SLOT, idx * SLOT))


class SealedFile:
    """A file of sealed frames read as its plaintext, sequentially (``readinto``) or at
    any offset (``pread``); one opened frame is kept. Synchronous, for a worker thread."""

    def __init__(self, path: Path, cipher: BlockCipher, context: Callable[[int], bytes]) -> None:
        self._fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        self._cipher = cipher
        self._context = context
        self.size = sealed_size(os.fstat(self._fd).st_size)
        self._pos = 0
        self._frame: tuple[int, bytes] = (-1, b"")

    def _open(self, idx: int) -> bytes:
        if self._frame[0] != idx:
            self._frame = (idx, read_frame(self._fd, self._cipher, self._context(idx), idx))
        return self._frame[1]

    def pread(self, length: int, offset: int, /) -> bytes:
        end = min(offset + length, self.size)
        parts: list[bytes] = []
        at = offset
        while at < end:
            idx, skip = divmod(at, FRAME)
            piece = self._open(idx)[skip : skip + end - at]
            if not piece:
                raise CorruptData("a sealed file ended early")
            parts.append(piece)
            at += len(piece)
        return b"".join(parts)

    def readinto(self, buffer: memoryview, /) -> int | None:
        data = self.pread(len(buffer), self._pos)
        buffer[: len(data)] = data
        self._pos += len(data)
        return len(data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SealedSource(ByteSource):
    """A range of a sealed file, opened a frame at a time as it is read: no ``region``,
    so no sendfile. ``frame(idx)`` returns the plaintext of frame ``idx``."""

    def __init__(
        self,
        fd: int,
        offset: int,
        length: int,
        frame: Callable[[int], bytes],
        release: Callable[[], None] = lambda: None,
    ) -> None:
        self._fd = fd
        self._offset = offset
        self.length = length
        self._frame = frame
        self._release = release

    async def chunks(self) -> AsyncIterator[bytes]:
        start, end = self._offset, self._offset + self.length
        if self.length <= 0:
            return
        for idx in range(start // FRAME, (end - 1) // FRAME + 1):
            plain = await asyncio.to_thread(self._frame, idx)
            base = idx * FRAME
            yield plain[max(start - base, 0) : min(end - base, len(plain))]

    async def aclose(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
            self._release()
