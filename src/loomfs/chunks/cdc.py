"""Content-defined chunking (FastCDC) of files and streams, in bounded memory (core layer).

The stream is read in large buffers; each buffer is cut with pyfastcdc, every chunk but the
last is final (its cut point was found with data to spare), and the last one is carried
into the next buffer, because it may have been cut only where the buffer ended. The result
is byte-for-byte the cut of the whole file, while memory stays at a few buffers.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
from pyfastcdc import FastCDC

from .chunkmap import ChunkMap
from .codec import chunk_id

READ_SIZE = 8 << 20


class Readable(Protocol):
    def readinto(self, buffer: memoryview, /) -> int | None: ...


@dataclass(frozen=True, slots=True)
class ChunkWindow:
    """FastCDC's size limits. pyfastcdc skips ``min_size`` bytes before looking for a cut,
    so chunks come out ``avg_size + min_size`` long on average, not ``avg_size``.
    """

    min_size: int
    avg_size: int
    max_size: int

    def chunker(self) -> FastCDC:
        return FastCDC(self.avg_size, min_size=self.min_size, max_size=self.max_size)


# Chosen by bench/chunk_window.py on the dataset and checkpoint corpora: see docs/BENCHMARKS.md.
DEFAULT_WINDOW = ChunkWindow(min_size=32 << 10, avg_size=64 << 10, max_size=512 << 10)


def iter_chunks(
    reader: Readable, window: ChunkWindow = DEFAULT_WINDOW, read_size: int = READ_SIZE
) -> Iterator[memoryview]:
    """Yield the chunks of ``reader`` in order.

    Each view points into a buffer of its own read (buffers are never reused), so a caller
    may hand views to other threads and keep them as long as it likes.
    """
    if read_size < 2 * window.max_size:
        raise ValueError("read_size must hold at least two maximal chunks")
    chunker = window.chunker()
    tail = memoryview(b"")
    eof = False
    while not eof:
        # Not a bytearray: that zeroes its 8 MiB holding the GIL (4-6 ms of page faults
        # and memset on each buffer, stalling a hub's event loop while it maps a file);
        # numpy leaves the pages to fault in during the read, which releases the GIL.
        view = np.empty(len(tail) + read_size, np.uint8).data
        view[: len(tail)] = tail
        filled = len(tail)
        while filled < len(view):
            got = reader.readinto(view[filled:])
            if not got:
                eof = True
                break
            filled += got
        view = view[:filled]
        if not filled:
            return
        pieces = [chunk.data for chunk in chunker.cut_buf(view)]
        if not eof:
            tail = pieces.pop()
        yield from pieces


def chunk_map_of(
    reader: Readable, window: ChunkWindow = DEFAULT_WINDOW, read_size: int = READ_SIZE
) -> ChunkMap:
    """The chunk map of a stream, hashed in the calling thread (see ``pipeline`` for threads)."""
    return ChunkMap.from_lengths(
        [(len(piece), chunk_id(piece)) for piece in iter_chunks(reader, window, read_size)]
    )


def chunk_map_of_file(path: str | Path, window: ChunkWindow = DEFAULT_WINDOW) -> ChunkMap:
    with Path(path).open("rb", buffering=0) as stream:
        return chunk_map_of(stream, window)
