"""Chunk, hash and encode files on a thread pool, so every core stays busy (core layer).

pyfastcdc, blake3 and zstandard all release the GIL on large buffers, so threads scale:
the calling thread reads and cuts (sequential by nature: each cut depends on the previous),
and batches of chunks are hashed or compressed by the workers. Results come back in file
order, and at most ``2 x workers`` batches are in flight, which bounds memory.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import nullcontext
from functools import partial
from pathlib import Path
from types import TracebackType
from typing import TypeVar

from ..errors import Conflict
from .cdc import DEFAULT_WINDOW, READ_SIZE, ChunkWindow, Readable, iter_chunks
from .chunkmap import ChunkMap
from .codec import (
    DEFAULT_SETTINGS,
    CodecSettings,
    FileReference,
    chunk_id,
    encode_chunk,
    encode_delta,
)
from .plan import ChunkToSend

T = TypeVar("T")

# Big enough that scheduling a batch costs little next to hashing it, small enough that
# both workers get work from one read buffer.
BATCH_BYTES = 2 << 20


class ChunkPipeline:
    """A pool of worker threads for mapping and encoding files; use as a context manager."""

    def __init__(
        self,
        workers: int | None = None,
        window: ChunkWindow = DEFAULT_WINDOW,
        settings: CodecSettings = DEFAULT_SETTINGS,
        read_size: int = READ_SIZE,
    ) -> None:
        self.workers = workers or os.cpu_count() or 1
        self.window = window
        self.settings = settings
        self.read_size = read_size
        self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="loomfs-chunks")

    def __enter__(self) -> ChunkPipeline:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def map_stream(self, reader: Readable) -> ChunkMap:
        """The chunk map of a stream: cut here, hashed by the workers."""
        batches = _batches(iter_chunks(reader, self.window, self.read_size), len)
        tasks = (partial(_hash_all, batch) for batch in batches)
        return ChunkMap.from_lengths([pair for done in self._ordered(tasks) for pair in done])

    def map_file(self, path: str | Path) -> ChunkMap:
        with Path(path).open("rb", buffering=0) as stream:
            return self.map_stream(stream)

    def encode_file(
        self,
        path: str | Path,
        plan: Sequence[ChunkToSend],
        reference: str | Path | None = None,
    ) -> Generator[bytes, None, None]:
        """The frames of the planned chunks of ``path``, in plan order.

        Chunks the plan gives a delta estimate are encoded against ``reference``, the older
        version the receiver holds. Each chunk is re-hashed as it is read: if the file
        changed since it was mapped, this raises ``Conflict`` instead of sending bytes
        under a wrong id.
        """
        fd = os.open(path, os.O_RDONLY)
        try:
            with FileReference(reference) if reference is not None else nullcontext() as ref:
                batches = _batches(plan, lambda send: send.entry.length)
                tasks = (
                    partial(_encode_all, fd, ref, batch, self.settings, str(path))
                    for batch in batches
                )
                for frames in self._ordered(tasks):
                    yield from frames
        finally:
            os.close(fd)

    def _ordered(self, tasks: Iterable[Callable[[], T]]) -> Iterator[T]:
        pending: deque[Future[T]] = deque()
        try:
            for task in tasks:
                pending.append(self._pool.submit(task))
                if len(pending) >= 2 * self.workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            # A consumer that stops early must not return while workers still read from
            # descriptors the caller is about to close.
            for future in pending:
                future.cancel()
            wait(pending)


def _batches(items: Iterable[T], size: Callable[[T], int]) -> Iterator[list[T]]:
    batch: list[T] = []
    total = 0
    for item in items:
        batch.append(item)
        total += size(item)
        if total >= BATCH_BYTES:
            yield batch
            batch, total = [], 0
    if batch:
        yield batch


def _hash_all(pieces: list[memoryview]) -> list[tuple[int, bytes]]:
    return [(len(piece), chunk_id(piece)) for piece in pieces]


def _encode_all(
    fd: int,
    reference: FileReference | None,
    sends: list[ChunkToSend],
    settings: CodecSettings,
    path: str,
) -> list[bytes]:
    frames = []
    for send in sends:
        entry = send.entry
        data = os.pread(fd, entry.length, entry.offset)
        if len(data) != entry.length or chunk_id(data) != entry.id:
            raise Conflict(f"{path} changed since it was chunked", path=path)
        if send.delta_from is not None and reference is not None:
            frames.append(encode_delta(data, reference, send.delta_from, settings))
        else:
            frames.append(encode_chunk(data, settings))
    return frames
