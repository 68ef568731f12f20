"""Eviction by farthest next use across the plans of all active jobs (spoke layer, no I/O).

This is Belady's MIN with a future the data loaders told us: a key no plan reads again goes
first (least recently used among those), then the key whose next read is furthest away.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Generator

from .plan import NextUse
from .policy import EvictionPolicy, Key


class PlanPolicy(EvictionPolicy):
    """Evicts the cached key whose next planned read is latest.

    Estimates are cached in two lazy heaps: ``_far`` orders victims, ``_due`` finds estimates
    whose time has passed (the read happened, or the job is late) so they are asked again.
    A new or ended plan invalidates every estimate, so they are all recomputed then.
    """

    def __init__(self, schedule: NextUse, clock: Callable[[], float]):
        super().__init__()
        self._schedule = schedule
        self._clock = clock
        self._version = schedule.version
        self._next: dict[Key, float] = {}
        self._last: dict[Key, int] = {}
        self._tick = 0
        # (-next use, last access tick, key): the smallest is the best victim.
        self._far: list[tuple[float, int, Key]] = []
        self._due: list[tuple[float, Key]] = []

    def _estimate(self, key: Key, now: float, just_read: bool = False) -> None:
        estimate = self._schedule.next_use(key, now, just_read=just_read)
        self._next[key] = estimate
        heapq.heappush(self._far, (-estimate, self._last[key], key))
        if estimate != math.inf:
            heapq.heappush(self._due, (estimate, key))

    def _touch(self, key: Key, just_read: bool) -> None:
        self._tick += 1
        self._last[key] = self._tick
        self._estimate(key, self._clock(), just_read)

    def _on_insert(self, key: Key, prefetched: bool) -> None:
        self._touch(key, just_read=not prefetched)

    def _on_access(self, key: Key) -> None:
        self._touch(key, just_read=True)

    def _on_remove(self, key: Key) -> None:
        del self._next[key], self._last[key]

    def _refresh(self, now: float) -> None:
        if self._version != self._schedule.version or len(self._far) > 4 * len(self._next) + 64:
            self._version = self._schedule.version
            self._far.clear()
            self._due.clear()
            for key in self._next:
                self._estimate(key, now)
            return
        stale_before = now - self._schedule.slack_s
        stale: list[Key] = []
        while self._due and self._due[0][0] < stale_before:
            estimate, key = heapq.heappop(self._due)
            if self._next.get(key) == estimate:
                stale.append(key)
        for key in stale:
            self._estimate(key, now)

    def _victim_order(self) -> Generator[Key, None, None]:
        now = self._clock()
        self._refresh(now)
        held: list[tuple[float, int, Key]] = []
        # A key estimated twice to the same time has two live entries: hand it out once.
        taken: set[Key] = set()
        try:
            while self._far:
                entry = heapq.heappop(self._far)
                negated, tick, key = entry
                if key in taken or self._last.get(key) != tick or self._next[key] != -negated:
                    continue
                if key in self._pinned:
                    held.append(entry)
                    continue
                taken.add(key)
                yield key
        finally:
            for entry in held:
                heapq.heappush(self._far, entry)
