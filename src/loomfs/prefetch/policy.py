"""Eviction policy interface and the LRU baseline (spoke layer, pure Python, no I/O).

The spoke cache owns the bytes; a policy only tracks which keys are cached, how big they are,
which are pinned, and in what order they should go. Keeping it free of I/O lets
``bench/cachesim.py`` replay the very code the spoke runs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Generator

Key = int
"""A cached item: a sample id as the data loader numbers it (see ``Plan``)."""


class EvictionPolicy(ABC):
    """Decides which cached keys to drop when the cache needs room.

    The cache calls ``insert`` after it stored a key, ``access`` on every hit, ``remove`` when it
    dropped a key for its own reasons (invalidation), and ``evict(need)`` before an insert that
    does not fit. Pinned keys are never offered as victims.
    """

    def __init__(self) -> None:
        self._sizes: dict[Key, int] = {}
        self._pinned: set[Key] = set()
        self._used = 0

    @property
    def used_bytes(self) -> int:
        return self._used

    def __contains__(self, key: object) -> bool:
        return key in self._sizes

    def __len__(self) -> int:
        return len(self._sizes)

    def size_of(self, key: Key) -> int:
        return self._sizes[key]

    def insert(self, key: Key, size: int, *, prefetched: bool = False) -> None:
        """Record a key the cache just stored: after a read missed it, or ahead of any read
        when ``prefetched``. Storing a cached key again updates its size."""
        if key in self._sizes:
            self._used += size - self._sizes[key]
            self._sizes[key] = size
            if not prefetched:
                self._on_access(key)
            return
        self._sizes[key] = size
        self._used += size
        self._on_insert(key, prefetched)

    def access(self, key: Key) -> None:
        """Record a hit on a cached key."""
        self._on_access(key)

    def remove(self, key: Key) -> None:
        """Forget a key the cache dropped itself; unknown keys are ignored."""
        if key in self._sizes:
            self._forget(key)

    def pin(self, key: Key) -> None:
        self._pinned.add(key)

    def unpin(self, key: Key) -> None:
        self._pinned.discard(key)

    def evict(self, need: int) -> list[Key]:
        """Choose and forget victims until ``need`` bytes are freed, best victim first.

        Returns fewer bytes than asked only when every unpinned key is already chosen; the cache
        then has to refuse the insert.
        """
        victims: list[Key] = []
        freed = 0
        order = self._victim_order()
        try:
            # Ask for the next victim only while short: a yielded key counts as evicted.
            while freed < need:
                key = next(order, None)
                if key is None:
                    break
                victims.append(key)
                freed += self._sizes[key]
        finally:
            # Closing first lets a lazy order put back what it looked at but did not hand out.
            order.close()
        for key in victims:
            self._forget(key)
        return victims

    def _forget(self, key: Key) -> None:
        self._used -= self._sizes.pop(key)
        self._pinned.discard(key)
        self._on_remove(key)

    @abstractmethod
    def _on_insert(self, key: Key, prefetched: bool) -> None: ...

    @abstractmethod
    def _on_access(self, key: Key) -> None: ...

    @abstractmethod
    def _on_remove(self, key: Key) -> None: ...

    @abstractmethod
    def _victim_order(self) -> Generator[Key, None, None]:
        """Yield unpinned cached keys, best victim first; the base stops when it has enough.

        Keys yielded are evicted; anything the generator set aside must be restored when it is
        closed (``finally``), because the base removes victims only after closing it.
        """


class LRUPolicy(EvictionPolicy):
    """Least recently used: the baseline every other policy is measured against."""

    def __init__(self) -> None:
        super().__init__()
        self._order: OrderedDict[Key, None] = OrderedDict()

    def _on_insert(self, key: Key, prefetched: bool) -> None:
        self._order[key] = None

    def _on_access(self, key: Key) -> None:
        self._order.move_to_end(key)

    def _on_remove(self, key: Key) -> None:
        del self._order[key]

    def _victim_order(self) -> Generator[Key, None, None]:
        pinned = self._pinned
        return (key for key in self._order if key not in pinned)
