"""Batches of frames on the wire (core layer): how many chunk frames travel in one body.

A download body answers a list of chunk ids in their order, one record each:
``varint length | frame``, length 0 where the sender holds no verified copy of that
chunk. An upload body names each chunk, since the receiver did not ask for them:
``id (32 bytes) | varint length | frame``. Lengths are bounded, so a forged or corrupt
length cannot make the reader allocate without limit.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable

from ..errors import CorruptData
from .chunkmap import ID_SIZE, MAX_CHUNK_SIZE, put_varint

# A frame is never much longer than its chunk (a raw frame adds a few header bytes).
MAX_FRAME = MAX_CHUNK_SIZE + 64

ReadExactly = Callable[[int], Awaitable[bytes]]


def record(frame: bytes | None, chunk_id: bytes | None = None) -> bytes:
    out = bytearray(chunk_id or b"")
    put_varint(out, len(frame or b""))
    return bytes(out) + (frame or b"")


async def _varint(read: ReadExactly) -> int:
    value = shift = 0
    while True:
        byte = (await read(1))[0]
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value
        shift += 7
        if shift > 35:
            raise CorruptData("record length varint too long")


async def _frame(read: ReadExactly) -> bytes | None:
    length = await _varint(read)
    if length > MAX_FRAME:
        raise CorruptData(f"a record claims a {length}-byte frame")
    return await read(length) if length else None


async def read_answers(read: ReadExactly, count: int) -> AsyncIterator[bytes | None]:
    """The ``count`` records of a download body, in order (None: not available)."""
    for _ in range(count):
        yield await _frame(read)


async def read_uploads(read: ReadExactly) -> AsyncIterator[tuple[bytes, bytes]]:
    """``(id, frame)`` of each record of an upload body, until the body ends. The end shows
    only as a read past the last record: asked beforehand, the body may not know yet (its
    final empty chunk can arrive after the last record's bytes)."""
    while True:
        try:
            chunk_id = await read(ID_SIZE)
        except asyncio.IncompleteReadError as exc:
            if exc.partial:
                raise  # cut inside a record
            return
        frame = await _frame(read)
        if frame is None:
            raise CorruptData("an upload record carries no frame")
        yield chunk_id, frame
