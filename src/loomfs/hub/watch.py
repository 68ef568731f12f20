"""inotify on posix volumes (hub layer): changes behind loomfs's back, noticed at once.

The event loop reads inotify events for every directory of the volume and hands the
affected keys on in small debounced batches; the hub re-stats each one and records what
changed. New directories get watches as they appear. When the kernel drops events
(queue overflow) or the watch limit is reached, the watcher says so and the periodic
rescan remains the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from inotify_simple import Event, INotify, flags

log = logging.getLogger(__name__)

_MASK = (
    flags.CLOSE_WRITE
    | flags.MODIFY
    | flags.CREATE
    | flags.DELETE
    | flags.MOVED_FROM
    | flags.MOVED_TO
    | flags.ATTRIB
    | flags.DELETE_SELF
    | flags.ONLYDIR
)
#: after the first event of a batch, how long the rest of a burst may gather
_BATCH_DELAY = 0.05

#: None asks for a rescan of the whole volume (events were lost)
OnChange = Callable[[set[str] | None], Coroutine[Any, Any, None]]


class PosixWatcher:
    """Follows a volume's inotify events on the event loop: the descriptor is read when it
    is ready, ``_BATCH_DELAY`` after the first event of a batch, and the batch is handed to
    ``on_change`` before the next is read. (A thread of its own cost each of the loop's
    requests a wait for the interpreter lock while the thread parsed events: a FUSE
    create storm makes two events per create.)"""

    def __init__(self, root: Path, on_change: OnChange, ignore_prefix: str) -> None:
        self.root = root
        self._on_change = on_change
        self._ignore_prefix = ignore_prefix
        self._inotify = INotify()
        self._dirs: dict[int, str] = {}  # watch descriptor -> key of the directory
        self._loop: asyncio.AbstractEventLoop | None = None
        self._batch: asyncio.TimerHandle | asyncio.Task[None] | None = None
        self._following = False
        self._limit_warned = False

    async def start(self) -> None:
        """Watch every directory, then follow events; returns once the watches are in place,
        so that no change made after it returns can be missed."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._watch_tree, "")
        self._following = True
        self._loop.add_reader(self._inotify.fileno(), self._readable)

    async def stop(self) -> None:
        assert self._loop is not None
        self._following = False
        self._loop.remove_reader(self._inotify.fileno())
        if self._batch is not None:
            self._batch.cancel()
            if isinstance(self._batch, asyncio.Task):
                with contextlib.suppress(asyncio.CancelledError):
                    await self._batch
        self._inotify.close()

    def _readable(self) -> None:
        assert self._loop is not None
        self._loop.remove_reader(self._inotify.fileno())
        self._batch = self._loop.call_later(_BATCH_DELAY, self._take)

    def _take(self) -> None:
        assert self._loop is not None
        self._batch = self._loop.create_task(self._handle(self._inotify.read(timeout=0)))

    async def _handle(self, events: list[Event]) -> None:
        try:
            keys, new_dirs, overflow = self._keys(events)
            if new_dirs:
                # before they are reported: a change inside one made after it is imported
                # must not be missed
                await asyncio.to_thread(self._watch_trees, new_dirs)
            if overflow:
                log.warning("inotify queue overflowed; rescanning", extra={"root": str(self.root)})
            if overflow or keys:
                await self._on_change(None if overflow else keys)
        except Exception:
            log.exception(
                "could not take a batch of inotify events", extra={"root": str(self.root)}
            )
        finally:
            self._batch = None
            if self._following:
                assert self._loop is not None
                self._loop.add_reader(self._inotify.fileno(), self._readable)

    def _keys(self, events: list[Event]) -> tuple[set[str], list[str], bool]:
        """(keys the events name, new directories to watch, whether events were lost)."""
        keys: set[str] = set()
        new_dirs: list[str] = []
        for event in events:
            if event.mask & flags.Q_OVERFLOW:
                return keys, new_dirs, True
            parent = self._dirs.get(event.wd)
            if parent is None:
                continue
            if event.mask & flags.IGNORED:
                self._dirs.pop(event.wd, None)
                continue
            if event.name.startswith(self._ignore_prefix):
                continue
            key = f"{parent}/{event.name}" if parent and event.name else event.name or parent
            keys.add(key)
            if event.mask & (flags.CREATE | flags.DELETE | flags.MOVED_FROM | flags.MOVED_TO):
                keys.add(parent)  # the directory's own mtime moved with its listing
            if event.mask & flags.ISDIR and event.mask & (flags.CREATE | flags.MOVED_TO):
                new_dirs.append(key)
        return keys, new_dirs, False

    def _watch_trees(self, keys: list[str]) -> None:
        for key in keys:
            self._watch_tree(key)

    def _watch_tree(self, key: str) -> None:
        top = self.root / key if key else self.root
        for dirpath, dirnames, _ in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if not self._watch(dirpath, "" if rel == "." else rel):
                return
            # islink answers False where lstat fails (a path longer than PATH_MAX): the
            # watch is then refused, and the walk goes on (rescans cover that subtree)
            dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]

    def _watch(self, dirpath: str, key: str) -> bool:
        try:
            wd = self._inotify.add_watch(dirpath, _MASK)
        except OSError as exc:
            if exc.errno == errno.ENOSPC:
                if not self._limit_warned:
                    log.warning(
                        "inotify watch limit reached (fs.inotify.max_user_watches); "
                        "the rest of this volume relies on rescans",
                        extra={"root": str(self.root)},
                    )
                    self._limit_warned = True
                return False
            return True  # vanished meanwhile: its parent's event reports that
        self._dirs[wd] = key
        return True
