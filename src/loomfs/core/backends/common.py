"""Helpers shared by the storage backends (core layer): key checks and the ordered scan.

Both backends scan the same way: a depth-first walk whose children are listed one
directory at a time and sorted by ``ObjectInfo.sort_key``, so the output is in byte order
of sort keys whatever order the storage lists in (SeaweedFS, for one, lists its filer tree
by name, which puts 'a/b' before 'a-b'). The walk is synchronous and runs in a worker
thread, handing batches to the event loop with backpressure: no await per entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncGenerator, Callable, Iterator

from ... import paths
from ...errors import InvalidPath
from ..types import EntryKind, ObjectInfo

SCAN_BATCH = 2000
# Batches handed over but not yet consumed; bounds a scan's memory when the consumer is slow.
QUEUE_BATCHES = 4


def check_key(key: str) -> str:
    """Return ``key`` if it is a canonical volume key, or raise ``InvalidPath``.

    A backend is the last line before the disk, so it refuses '..', '.', empty components
    and absolute keys again even though the namespace layer has already done so.
    """
    if key == "":
        return key
    if paths.normalize("/" + key) != "/" + key:
        raise InvalidPath(f"not a canonical key: {key!r}", path=key)
    return key


def child_key(parent: str, name: str) -> str:
    return f"{parent}/{name}" if parent else name


def parent_key(key: str) -> str:
    return key.rpartition("/")[0]


def ordered_walk(
    list_children: Callable[[str], list[ObjectInfo]],
    top: str,
    start_after: str | None,
    batch_size: int = SCAN_BATCH,
) -> Iterator[list[ObjectInfo]]:
    """Everything below directory ``top`` in sort-key order, in batches.

    ``list_children(dir_key)`` returns one directory's children sorted by sort key. With
    ``start_after`` a subtree that lies wholly at or before it is never listed, and a
    directory on the path to it is descended without being produced again.
    """
    batch: list[ObjectInfo] = []
    stack = [iter(list_children(top))]
    while stack:
        for info in stack[-1]:
            if start_after is not None and info.sort_key <= start_after:
                if info.kind is EntryKind.DIR and start_after.startswith(info.sort_key):
                    stack.append(iter(list_children(info.key)))
                    break
                continue
            batch.append(info)
            if len(batch) >= batch_size:
                yield batch
                batch = []
            if info.kind is EntryKind.DIR:
                stack.append(iter(list_children(info.key)))
                break
        else:
            stack.pop()
    if batch:
        yield batch


async def batches_from_thread(
    produce: Callable[[], Iterator[list[ObjectInfo]]], name: str
) -> AsyncGenerator[list[ObjectInfo], None]:
    """Run a blocking batch producer in its own thread and yield its batches here.

    The thread blocks once ``QUEUE_BATCHES`` batches wait unconsumed, and gives up when
    the consumer goes away (the generator is closed or cancelled). Errors raised in the
    thread are raised here.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[list[ObjectInfo] | BaseException | None] = asyncio.Queue()
    slots = threading.Semaphore(QUEUE_BATCHES)
    stop = threading.Event()

    def hand_over(item: list[ObjectInfo] | BaseException | None) -> None:
        # The loop may already be closed when an abandoned producer finishes.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(queue.put_nowait, item)

    def run() -> None:
        try:
            for batch in produce():
                while not slots.acquire(timeout=0.1):
                    if stop.is_set():
                        return
                if stop.is_set():
                    return
                hand_over(batch)
        except BaseException as exc:  # re-raised in the consumer
            hand_over(exc)
        else:
            hand_over(None)

    threading.Thread(target=run, name=name, daemon=True).start()
    try:
        while (item := await queue.get()) is not None:
            if isinstance(item, BaseException):
                raise item
            slots.release()
            yield item
    finally:
        stop.set()
