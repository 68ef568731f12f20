"""What to fetch when no plan says (spoke layer): demand reads feed predictors, and the
prefetcher fetches what the trusted ones expect.

The predictors and their trust are ``prefetch.adaptive.Forecast``, the code the simulator
runs too. They see units the spoke can fetch, numbered so that "next" means something:
a key is ``group << GROUP_BITS | position`` where a group is

- a directory, and the position a file's place in its listing (name order): the next key is
  the sibling file, a stride is every n-th file;
- a large file, and the position a block of it: the next key is the next block (read-ahead).

History of earlier runs over the same data follows the same keys. A read of a file from its
start counts as a read of its place in the directory; a large file's reads count block by
block. Reads a plan covers are not observed: the plan already says what comes next.

A listing the hub refuses (or of a directory gone) is not asked for again until the change
feed changes that directory; one that failed for a moment (the link) is asked again with
backoff (``core.retry``).
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from .. import paths
from ..core.retry import Backoff, retryable
from ..core.types import SYSTEM, Entry, EntryKind
from ..errors import LoomError
from ..prefetch.adaptive import (
    Forecast,
    HistoryPredictor,
    Predictor,
    SequentialPredictor,
    StridePredictor,
)
from ..prefetch.policy import Key
from .cache import BLOCK
from .namespace import SpokeNamespace

GROUP_BITS = 32
POSITION = (1 << GROUP_BITS) - 1
LARGE = 2 * BLOCK  # files above this are read ahead block by block, and fetched so as siblings
LISTING_MAX = 1 << 16  # files of a directory listed for sibling prediction; beyond that none
DIRECTORIES = 64  # listings kept (least recently read first out): memory stays bounded
RELIST_S = 1.0  # a read of a file the listing lacks lists again, at most this often
RELIST_MAX_S = 60.0  # a listing that failed for a moment: asked again at most this late
RECENT = 16  # a unit seen again within this many observations is the same read (FUSE pieces)


@dataclass(frozen=True, slots=True)
class Target:
    """A predicted unit: the range of a file version to fetch."""

    key: Key
    path: str
    version: int
    offset: int
    length: int


class _Within(Predictor):
    """A predictor's guesses that name a file or block that exists: one past a
    directory's last file or a file's end cannot be read, and must not cost it trust."""

    def __init__(self, inner: Predictor, exists: Callable[[Key], bool]) -> None:
        self._inner = inner
        self._exists = exists

    def observe(self, key: Key) -> list[Key]:
        return [guess for guess in self._inner.observe(key) if self._exists(guess)]


@dataclass(slots=True)
class _Directory:
    files: list[Entry]
    position: dict[str, int]
    listed_at: float
    refused_at: int | None = None  # the feed position where the hub refused the listing


class Predictions:
    """Observes demand reads in order; ``targets`` is what to fetch, soonest expected first."""

    def __init__(self, spoke: SpokeNamespace) -> None:
        self.spoke = spoke
        self._relist: Backoff[str] = Backoff(RELIST_S, RELIST_MAX_S)
        predictors = (
            SequentialPredictor(),
            StridePredictor(lambda key: key >> GROUP_BITS),
            HistoryPredictor(),
        )
        self.forecast = Forecast([_Within(predictor, self._exists) for predictor in predictors])
        self._groups: dict[tuple[bool, str], int] = {}  # (is a directory, path) -> group
        self._named: list[tuple[bool, str]] = []  # group -> (is a directory, path)
        self._directories: OrderedDict[int, _Directory] = OrderedDict()
        self._files: dict[int, tuple[int, int]] = {}  # large file's group -> (version, size)
        self._recent: OrderedDict[Key, None] = OrderedDict()
        self._reads: deque[tuple[str, int, int, range]] = deque()

    def note(self, path: str, version: int, size: int, blocks: range) -> None:
        """A demand read of ``blocks`` of a file version, to observe in the next ``observe``
        (the cache tells synchronously; listing a directory takes a round trip)."""
        self._reads.append((path, version, size, blocks))

    async def observe(self) -> None:
        """Feed the reads noted so far to the predictors, in the order they happened."""
        while self._reads:
            path, version, size, blocks = self._reads.popleft()
            if blocks.start == 0:
                await self._observe_sibling(path)
            if size > LARGE:
                group = self._group(False, path)
                self._files[group] = (version, size)
                for block in blocks:
                    self._see(group << GROUP_BITS | block)

    def targets(self) -> Iterator[Target]:
        """Ranges the trusted predictors expect, soonest expected first."""
        for key in self.forecast.predictions():
            group, position = key >> GROUP_BITS, key & POSITION
            is_directory, path = self._named[group]
            if is_directory:
                directory = self._directories.get(group)
                if directory is None or position >= len(directory.files):
                    continue
                entry = directory.files[position]
                yield Target(key, entry.path, entry.version, 0, min(entry.size, LARGE))
            else:
                version, size = self._files[group]
                if position * BLOCK < size:
                    offset = position * BLOCK
                    yield Target(key, path, version, offset, min(BLOCK, size - offset))

    def _exists(self, key: Key) -> bool:
        group, position = key >> GROUP_BITS, key & POSITION
        if group >= len(self._named):
            return False
        if self._named[group][0]:
            directory = self._directories.get(group)
            return directory is not None and position < len(directory.files)
        return position * BLOCK < self._files[group][1]

    def _group(self, is_directory: bool, path: str) -> int:
        group = self._groups.get((is_directory, path))
        if group is None:
            group = self._groups[is_directory, path] = len(self._named)
            self._named.append((is_directory, path))
        return group

    def _see(self, key: Key) -> None:
        if key in self._recent:
            return
        self._recent[key] = None
        if len(self._recent) > RECENT:
            self._recent.popitem(last=False)
        self.forecast.observe(key)

    async def _observe_sibling(self, path: str) -> None:
        parent, name = paths.split(path)
        group = self._group(True, parent)
        directory = self._directories.get(group)
        if directory is None or (name not in directory.position and self._stale(parent, directory)):
            directory = self._directories[group] = await self._list(parent)
            if len(self._directories) > DIRECTORIES:
                self._directories.popitem(last=False)
        self._directories.move_to_end(group)
        position = directory.position.get(name)
        if position is not None:
            self._see(group << GROUP_BITS | position)

    def _stale(self, parent: str, directory: _Directory) -> bool:
        """Whether a listing that lacks a file just read may be asked for again."""
        if directory.refused_at is not None:
            return self.spoke.changed_since(parent, directory.refused_at)
        return time.monotonic() - directory.listed_at > RELIST_S and self._relist.ready(parent)

    async def _list(self, parent: str) -> _Directory:
        files: list[Entry] = []
        asked_at = self.spoke.seq
        try:
            async for entry in self.spoke.list(SYSTEM, parent, limit=LISTING_MAX + 1):
                if entry.kind is EntryKind.FILE:
                    files.append(entry)
        except LoomError as exc:  # link down, not attached: no siblings now
            self._relist.failed(parent, exc)
            refused = None if retryable(exc) else asked_at  # until the directory changes
            return _Directory([], {}, time.monotonic(), refused)
        self._relist.succeeded(parent)
        listed_at = time.monotonic()
        if len(files) > LISTING_MAX:
            # too many to keep for one guess: no sibling prediction, and no listing again
            # while this one is kept
            files, listed_at = [], math.inf
        position = {paths.split(entry.path)[1]: at for at, entry in enumerate(files)}
        return _Directory(files, position, listed_at)
