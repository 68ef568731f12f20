"""Access plans of training jobs and the schedule that merges them (spoke layer, no I/O).

A data loader that knows its sample order (``PlanSampler``) publishes it as a ``Plan``: the
explicit list of sample ids it will read, not a seed, because permutation algorithms change
between library versions. Heartbeats report how far each job got. The ``Schedule`` turns all
active plans into estimated times of next use: eviction asks it which cached key is needed
last, the prefetcher asks it what to fetch next, in deadline order, within a byte budget.
"""

from __future__ import annotations

import heapq
import math
import zlib
from bisect import bisect_left
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass
from typing import Protocol

from ..errors import InvalidArgument
from .policy import Key

_FORMAT = 1


def _put_varint(out: bytearray, value: int) -> None:
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def _get_varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise InvalidArgument("truncated plan")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7


@dataclass(frozen=True, slots=True)
class Plan:
    """The sample ids job ``job_id`` reads from stream position ``start`` on, in order.

    Positions count samples since the job began, so heartbeats and plans published at
    different epochs line up.
    """

    job_id: str
    start: int
    keys: tuple[Key, ...]

    def __post_init__(self) -> None:
        if self.start < 0 or any(key < 0 for key in self.keys):
            raise InvalidArgument("plan positions and sample ids must be non-negative")

    def encode(self) -> bytes:
        """Zigzag varint deltas, then zlib: a shuffled epoch of N ids costs about log2(N)/7
        bytes per id, and sequential or strided runs shrink to almost nothing."""
        out = bytearray([_FORMAT])
        name = self.job_id.encode()
        _put_varint(out, len(name))
        out += name
        _put_varint(out, self.start)
        _put_varint(out, len(self.keys))
        previous = 0
        for key in self.keys:
            delta = key - previous
            _put_varint(out, delta << 1 if delta >= 0 else ((-delta) << 1) - 1)
            previous = key
        return zlib.compress(bytes(out), 6)

    @classmethod
    def decode(cls, blob: bytes) -> Plan:
        try:
            data = zlib.decompress(blob)
        except zlib.error as exc:
            raise InvalidArgument("plan is not zlib data") from exc
        if not data or data[0] != _FORMAT:
            raise InvalidArgument("unknown plan format")
        length, pos = _get_varint(data, 1)
        if pos + length > len(data):
            raise InvalidArgument("truncated plan")
        try:
            job_id = data[pos : pos + length].decode()
        except UnicodeDecodeError as exc:
            raise InvalidArgument("plan job id is not UTF-8") from exc
        start, pos = _get_varint(data, pos + length)
        count, pos = _get_varint(data, pos)
        keys: list[Key] = []
        previous = 0
        for _ in range(count):
            zigzag, pos = _get_varint(data, pos)
            previous += (zigzag >> 1) if not zigzag & 1 else -((zigzag + 1) >> 1)
            keys.append(previous)
        if pos != len(data):
            raise InvalidArgument("trailing bytes after plan")
        return cls(job_id, start, tuple(keys))


class NextUse(Protocol):
    """What eviction needs of a schedule (``PlanPolicy``): next-use estimates, and a version
    that moves whenever they all may have changed."""

    @property
    def version(self) -> int: ...

    @property
    def slack_s(self) -> float: ...

    def next_use(self, key: Key, now: float, *, just_read: bool = False) -> float: ...


@dataclass(slots=True)
class _Job:
    plan: Plan
    positions: dict[Key, list[int]]
    position: float
    at: float
    rate: float
    #: where the rate's current measurement began (position, time)
    since: tuple[float, float] = (0.0, 0.0)
    #: samples the job's sampler has handed out: no read goes past them
    issued: float = math.inf

    def position_at(self, now: float) -> float:
        """Samples read by ``now``: the next one to read has this index. Extrapolated at
        the job's rate, but never past what its sampler handed out: a job stalled on a
        miss would otherwise run ahead on paper, until every file it is about to read
        looked read already and was evicted as soon as it was fetched."""
        return min(self.position + (now - self.at) * self.rate, max(self.position, self.issued))

    def time_of(self, index: int) -> float:
        """When the sample at ``index`` is read: it is the ``index + 1``-th read."""
        return self.at + (index + 1 - self.position) / self.rate


class Schedule:
    """All active plans, merged into deadline order.

    A job's position between heartbeats is extrapolated from its measured step rate. Lookups
    look ``slack_s`` seconds into the past, so a job running a little late does not make the
    schedule skip an occurrence the job is about to read; an estimate older than ``now -
    slack_s`` is stale and its holder should ask again (``PlanPolicy`` does).
    """

    def __init__(
        self,
        *,
        default_rate: float = 1.0,
        slack_s: float = 0.0,
        smoothing: float = 0.2,
        rate_window_s: float = 0.0,
    ):
        """``rate_window_s``: the shortest span a rate is measured over. Reads arrive in
        bursts (a DataLoader worker's batch, read from the cache files in a millisecond,
        moves the position by a batch at once): measured between two heartbeats of one
        burst, a rate would be thousands of samples a second, the position extrapolated
        far past the reads, and the files about to be read taken as read already,
        evicted as soon as fetched (bench/train_stall.py fetched each file up to 12
        times)."""
        if default_rate <= 0 or slack_s < 0 or not 0 < smoothing <= 1 or rate_window_s < 0:
            raise InvalidArgument(
                "rate must be positive, slack and rate window non-negative, smoothing in (0, 1]"
            )
        self.default_rate = default_rate
        self.slack_s = slack_s
        self._smoothing = smoothing
        self._rate_window_s = rate_window_s
        self._jobs: dict[str, _Job] = {}
        self.version = 0
        """Bumped when a plan is published or ended: every next-use estimate may change."""

    def publish(self, plan: Plan, now: float) -> None:
        """Adopt a job's plan (replacing its previous one), starting at ``plan.start``."""
        positions: dict[Key, list[int]] = {}
        for offset, key in enumerate(plan.keys):
            positions.setdefault(key, []).append(plan.start + offset)
        old = self._jobs.get(plan.job_id)
        rate = old.rate if old is not None else self.default_rate
        start = float(plan.start)
        self._jobs[plan.job_id] = _Job(plan, positions, start, now, rate, (start, now))
        self.version += 1

    def heartbeat(self, job_id: str, position: int, now: float) -> None:
        """Record that ``job_id`` has read ``position`` samples by ``now``; unknown jobs are
        ignored (a heartbeat can overtake its plan)."""
        job = self._jobs.get(job_id)
        if job is None:
            return
        began, since = job.since
        if position < began:  # a plan restarted behind: measure afresh from here
            job.since = (float(position), now)
        elif now - since >= self._rate_window_s and now > since and position > began:
            measured = (position - began) / (now - since)
            job.rate += self._smoothing * (measured - job.rate)
            job.since = (float(position), now)
        job.position = float(position)
        job.at = now

    def issued(self, job_id: str, issued: int) -> None:
        """Record that ``job_id``'s sampler has handed out ``issued`` samples (its reads
        run behind that by what the data loader holds in flight)."""
        job = self._jobs.get(job_id)
        if job is not None:
            job.issued = float(issued)

    def end(self, job_id: str) -> None:
        if self._jobs.pop(job_id, None) is not None:
            self.version += 1

    def next_use(self, key: Key, now: float, *, just_read: bool = False) -> float:
        """Estimated time any active job reads ``key`` next; ``math.inf`` if no plan does.

        With ``just_read`` the key was read at ``now``: the planned read whose estimate is
        nearest to ``now`` is the one that happened, so it does not count as a next use.
        """
        # Per job: (its next read of the key, the read after that, its seconds per sample).
        upcoming: list[tuple[float, float, float]] = []
        for job in self._jobs.values():
            occurrences = job.positions.get(key)
            if occurrences is None:
                continue
            # The first read not older than the slack: index + 1 > samples read by then.
            index = bisect_left(occurrences, math.ceil(job.position_at(now - self.slack_s) - 1))
            if index == len(occurrences):
                continue
            later = occurrences[index + 1 : index + 2]
            after = job.time_of(later[0]) if later else math.inf
            upcoming.append((job.time_of(occurrences[index]), after, 1 / job.rate))
        if just_read and upcoming:
            happened = min(range(len(upcoming)), key=lambda at: abs(upcoming[at][0] - now))
            estimate, after, step = upcoming[happened]
            # Off by more than the slack and half a step, it was a read no plan announced.
            if abs(estimate - now) <= self.slack_s + step / 2:
                upcoming[happened] = (after, math.inf, step)
        return min((estimate for estimate, _, _ in upcoming), default=math.inf)

    def upcoming(
        self, now: float, start: Mapping[str, int] | None = None
    ) -> Iterator[tuple[float, Key]]:
        """Every planned read from ``now`` on, as (estimated time, key), earliest first.

        ``start`` overrides where a job's reads begin (a stream position): a caller that
        saw which reads really happened knows better than the extrapolation.
        """

        def reads(job_id: str, job: _Job) -> Iterator[tuple[float, Key]]:
            if start is not None and job_id in start:
                first = max(0, start[job_id] - job.plan.start)
            else:
                first = max(0, math.ceil(job.position_at(now)) - job.plan.start)
            for offset in range(first, len(job.plan.keys)):
                yield job.time_of(job.plan.start + offset), job.plan.keys[offset]

        return heapq.merge(*(reads(job_id, job) for job_id, job in self._jobs.items()))

    def plan(self, job_id: str) -> Plan | None:
        job = self._jobs.get(job_id)
        return None if job is None else job.plan

    def __len__(self) -> int:
        """Active jobs."""
        return len(self._jobs)

    def prefetch(
        self, now: float, budget: int, size_of: Callable[[Key], int], cached: Container[Key]
    ) -> list[Key]:
        """Keys to fetch next, in deadline order, whose sizes add up to at most ``budget``.

        Stops at the first key that does not fit: fetching a later one instead would spend the
        link on a deadline that can wait.
        """
        chosen: list[Key] = []
        seen: set[Key] = set()
        for _, key in self.upcoming(now):
            if key in seen or key in cached:
                continue
            size = size_of(key)
            if size > budget:
                break
            budget -= size
            chosen.append(key)
            seen.add(key)
        return chosen
