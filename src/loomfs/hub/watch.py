"""inotify on posix volumes (hub layer): changes behind loomfs's back, noticed at once.

A thread reads inotify events for every directory of the volume and hands the affected
keys to the event loop in small debounced batches; the hub re-stats each one and records
what changed. New directories get watches as they appear. When the kernel drops events
(queue overflow) or the watch limit is reached, the watcher says so and the periodic
rescan remains the safety net.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from inotify_simple import INotify, flags

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
_DEBOUNCE_MS = 200

#: None asks for a rescan of the whole volume (events were lost)
OnChange = Callable[[set[str] | None], Coroutine[Any, Any, None]]


class PosixWatcher:
    def __init__(self, root: Path, on_change: OnChange, ignore_prefix: str) -> None:
        self.root = root
        self._on_change = on_change
        self._ignore_prefix = ignore_prefix
        self._inotify = INotify()
        self._dirs: dict[int, str] = {}  # watch descriptor -> key of the directory
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limit_warned = False

    async def start(self) -> None:
        """Watch every directory, then follow events; returns once the watches are in place,
        so that no change made after it returns can be missed."""
        self._loop = asyncio.get_running_loop()
        await asyncio.to_thread(self._watch_tree, "")
        self._thread = threading.Thread(target=self._run, name=f"inotify:{self.root}", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join)
        self._inotify.close()

    def _watch_tree(self, key: str) -> None:
        top = self.root / key if key else self.root
        for dirpath, dirnames, _ in os.walk(top):
            rel = os.path.relpath(dirpath, self.root)
            if not self._watch(dirpath, "" if rel == "." else rel):
                return
            # islink answers False where lstat fails (a path longer than PATH_MAX): the
            # watch is then refused, and the thread goes on (rescans cover that subtree)
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

    def _run(self) -> None:
        while not self._stop.is_set():
            events = self._inotify.read(timeout=_DEBOUNCE_MS, read_delay=_DEBOUNCE_MS // 4)
            if not events:
                continue
            keys: set[str] = set()
            overflow = False
            for event in events:
                if event.mask & flags.Q_OVERFLOW:
                    overflow = True
                    break
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
                    self._watch_tree(key)
            if overflow:
                log.warning("inotify queue overflowed; rescanning", extra={"root": str(self.root)})
            if overflow or keys:
                assert self._loop is not None
                with contextlib.suppress(RuntimeError):  # the loop closed during shutdown
                    asyncio.run_coroutine_threadsafe(
                        self._on_change(None if overflow else keys), self._loop
                    )
