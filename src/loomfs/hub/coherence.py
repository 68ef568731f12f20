"""Read leases and invalidation acknowledgements (hub layer): the coherence contract.

A spoke that follows the change feed holds a time-bounded read lease, renewed by each
poll, and each poll acknowledges the changes it has applied. A commit at the hub is
acknowledged to its writer only once every spoke with a live lease has acknowledged it,
or its lease has expired. A spoke may therefore serve an open from what it knows, with no
round trip, while its lease lasts: any commit finished before the open began has already
been applied there. After a hub restart the leases it granted are forgotten, so if it
granted any within the last lease term (a marker file's mtime says when), commits wait
out the rest of that term (a grace period) before they are acknowledged. Gateways sharing
one catalog database keep the leases there instead (``SharedLeases``, ``SharedWriteLeases``):
a spoke polling one gateway holds its lease at every other.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

from prometheus_client import Gauge, Histogram

from ..core.catalog.base import ReadLeaseRecords, WriteLeaseRecords
from ..core.metrics import HUB
from ..errors import Conflict

LEASES = Gauge("loomfs_hub_read_leases", "Spokes holding a live read lease", registry=HUB)
WRITE_LEASES = Gauge("loomfs_hub_write_leases", "Paths a site holds a write lease on", registry=HUB)
SETTLE = Histogram(
    "loomfs_hub_settle_seconds", "Time commits waited for spoke acknowledgements", registry=HUB
)


@dataclass(slots=True)
class _Lease:
    expires: float
    acked: int


class Leases:
    def __init__(self, ttl: float, marker: Path | None = None) -> None:
        self.ttl = ttl
        self._leases: dict[str, _Lease] = {}
        self._event = asyncio.Event()
        self._marker = marker
        self._marked = 0.0
        self._grace_until = 0.0
        if marker is not None and marker.exists():
            left = marker.stat().st_mtime + ttl - time.time()
            self._grace_until = time.monotonic() + max(0.0, left)

    async def renew(self, site: str, acked: int) -> float:
        """A poll from ``site`` that has applied every change up to ``acked``; returns the
        lease term granted from now."""
        lease = self._leases.get(site)
        expires = time.monotonic() + self.ttl
        if lease is None:
            self._leases[site] = _Lease(expires, acked)
        else:
            lease.expires, lease.acked = expires, max(lease.acked, acked)
        LEASES.set(len(self._leases))
        self._event.set()
        self._event = asyncio.Event()
        if self._marker is not None and time.monotonic() - self._marked > 1.0:
            self._marker.touch()
            self._marked = time.monotonic()
        return self.ttl

    def holders(self) -> dict[str, int]:
        """Live leases: site -> acknowledged sequence number."""
        now = time.monotonic()
        return {site: lease.acked for site, lease in self._leases.items() if lease.expires > now}

    async def settle(self, seq: int) -> None:
        """Return once every live lease has acknowledged ``seq`` (or expired)."""
        if self.ttl <= 0:
            return
        started = time.monotonic()
        while True:
            now = time.monotonic()
            for site in [s for s, lease in self._leases.items() if lease.expires <= now]:
                del self._leases[site]  # expired: the hub no longer waits for it
            LEASES.set(len(self._leases))
            waiting = [lease for lease in self._leases.values() if lease.acked < seq]
            deadlines = [lease.expires for lease in waiting]
            if now < self._grace_until:
                deadlines.append(self._grace_until)
            if not deadlines:
                SETTLE.observe(now - started)
                return
            event = self._event
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(event.wait(), min(deadlines) - now)


class SharedLeases(Leases):
    """Read leases in the catalog's database (``records``), for gateways sharing it: a
    spoke's poll at any gateway renews its lease for all, and a commit at any waits for
    every live holder, woken by each renewal's notification. The leases outlive a
    gateway's restart, so no grace period follows one."""

    def __init__(self, ttl: float, records: ReadLeaseRecords) -> None:
        super().__init__(ttl)
        self.records = records

    async def renew(self, site: str, acked: int) -> float:
        await self.records.renew(site, acked, self.ttl)
        return self.ttl

    async def settle(self, seq: int) -> None:
        if self.ttl <= 0:
            return
        started = time.monotonic()
        while True:
            seen = self.records.acks_seen()  # before the read: a renewal after it wakes
            left = await self.records.behind(seq)
            if not left:
                SETTLE.observe(time.monotonic() - started)
                return
            await self.records.acked(seen, min(left))


def read_leases(ttl: float, marker: Path, records: ReadLeaseRecords | None) -> Leases:
    """In the database where ``records`` are, else in this process's memory (granted
    ones noted by ``marker``'s mtime, for the grace period after a restart)."""
    return Leases(ttl, marker) if records is None else SharedLeases(ttl, records)


class WriteLeases:
    """Which site is writing which path. A spoke takes the lease when a write begins and
    gives it up once the write is committed, so a writer elsewhere (another spoke, or a
    client of the hub itself) hears at once that the file is being written, instead of
    finding out by a failed precondition after its upload. Leases live in memory: after
    a hub restart they are gone, and version preconditions still guard every commit."""

    def __init__(self, ttl: float) -> None:
        self.ttl = ttl
        self._held: dict[str, tuple[str, float]] = {}  # path -> (site, expiry)

    async def acquire(self, path: str, site: str) -> float:
        await self.check(path, site)
        self._held[path] = (site, time.monotonic() + self.ttl)
        WRITE_LEASES.set(len(self._held))
        return self.ttl

    async def release(self, path: str, site: str) -> None:
        if self._held.get(path, ("", 0.0))[0] == site:
            del self._held[path]
        WRITE_LEASES.set(len(self._held))

    async def check(self, path: str, site: str) -> None:
        """``Conflict`` if another site holds a live write lease of ``path``."""
        holder = self._held.get(path)
        if holder is None or holder[0] == site:
            return
        left = holder[1] - time.monotonic()
        if left <= 0:
            del self._held[path]
            WRITE_LEASES.set(len(self._held))
            return
        raise _held_elsewhere(path, holder[0], left)


class SharedWriteLeases(WriteLeases):
    """Write leases in the catalog's database (``records``), for gateways sharing it: a
    lease taken through one is honoured by every other, and outlives a gateway's restart
    (its term on the database's clock)."""

    def __init__(self, ttl: float, records: WriteLeaseRecords) -> None:
        super().__init__(ttl)
        self.records = records

    async def acquire(self, path: str, site: str) -> float:
        holder = await self.records.take(path, site, self.ttl)
        if holder is not None:
            raise _held_elsewhere(path, *holder)
        return self.ttl

    async def release(self, path: str, site: str) -> None:
        await self.records.give_back(path, site)

    async def check(self, path: str, site: str) -> None:
        holder = await self.records.holder(path, site)
        if holder is not None:
            raise _held_elsewhere(path, *holder)


def write_leases(ttl: float, records: WriteLeaseRecords | None) -> WriteLeases:
    """In the database where ``records`` are, else in this process's memory."""
    return WriteLeases(ttl) if records is None else SharedWriteLeases(ttl, records)


def _held_elsewhere(path: str, site: str, left: float) -> Conflict:
    return Conflict(
        f"{path} is being written at site {site!r} (write lease, {left:.0f} s left)", path=path
    )
