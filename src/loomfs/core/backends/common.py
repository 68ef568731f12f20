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
from collections import deque
from collections.abc import AsyncGenerator, Callable, Iterator
from concurrent.futures import Executor, Future

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


def descends(info: ObjectInfo, start_after: str | None) -> bool:
    """Whether a walk resuming after ``start_after`` enters directory ``info``: it lies
    after the resume point, or on the path to it."""
    return info.kind is EntryKind.DIR and (
        start_after is None or info.sort_key > start_after or start_after.startswith(info.sort_key)
    )


class PrefetchingLister:
    """``list_children`` that lists the directories a walk will enter next ahead of it, on a
    thread pool: where one listing is a round trip (S3), a walk would otherwise wait for
    each directory in turn.

    A depth-first walk enters directories in the order of a frontier where a directory's
    subdirectories go in front of what was there; listings are started from the front of
    that frontier, at most ``window`` at a time and ``hold`` finished or not.
    """

    def __init__(
        self,
        list_children: Callable[[str], list[ObjectInfo]],
        pool: Executor,
        start_after: str | None,
        window: int = 16,
        hold: int = 64,
    ) -> None:
        self._list = list_children
        self._pool = pool
        self._start_after = start_after
        self._window = window
        self._hold = hold
        self._frontier: deque[str] = deque()
        self._ahead: dict[str, Future[list[ObjectInfo]]] = {}

    def __call__(self, dir_key: str) -> list[ObjectInfo]:
        pending = self._ahead.pop(dir_key, None)
        if pending is None:
            # Not started yet: it is the front of the frontier (or the walk's top).
            if self._frontier and self._frontier[0] == dir_key:
                self._frontier.popleft()
            items = self._list(dir_key)
        else:
            items = pending.result()
        self._frontier.extendleft(
            reversed([info.key for info in items if descends(info, self._start_after)])
        )
        running = sum(not future.done() for future in self._ahead.values())
        while self._frontier and running < self._window and len(self._ahead) < self._hold:
            key = self._frontier.popleft()
            self._ahead[key] = self._pool.submit(self._list, key)
            running += 1
        return items


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
            if start_after is None or info.sort_key > start_after:
                batch.append(info)
                if len(batch) >= batch_size:
                    yield batch
                    batch = []
            if descends(info, start_after):
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
