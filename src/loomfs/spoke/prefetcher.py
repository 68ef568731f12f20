"""The spoke's plan-driven prefetcher (spoke layer): fetch what training reads next, before
it asks, without getting in the way of what it asks for now.

Data loaders publish their plans (``PlanSampler`` in ``loomfs.torch``): the files of their
dataset and the explicit order they will read them in. Files are interned to keys shared by
every job, so jobs over the same data share a schedule (``prefetch.plan.Schedule``). A loop
then walks the merged plans in deadline order from where each job's reads really are and
fetches files that are not cached, as long as

- the bytes in flight stay in the window (``prefetch.window.Window``: probed up like
  TCP's slow start, then twice the link's bandwidth-delay product), enough to keep the
  link full and few enough that a demand read queues behind about two round trips;
- the data it looks ahead over fits in ``WINDOW`` of the cache, so a prefetch never evicts
  something needed sooner than itself.

Without a plan (for the files being read) demand reads feed predictors instead
(``spoke.predict``: sibling files, read-ahead within large files, history), and what the
predictors that earned trust expect is fetched in the room the plans leave, within the
same in-flight budget and in at most ``PREDICT_WINDOW`` of the cache. A predictor earns
trust by guesses that are read; a prefetch dropped unread refutes its guess, so a random
order soon stops predictive prefetch.

Eviction follows the plans too: with a plan active the cache's policy is ``PlanPolicy``
(farthest next use across all jobs, Belady with a known future), otherwise
``AdaptivePolicy``, with predicted files not yet read kept while still expected (else a
prefetch would evict the one before it, unread: LFU drops the newest once-read first).
Metrics: demand hit ratio, bytes fetched, prefetched bytes evicted unread (wasted), time
demand reads stalled; prefetch bytes, hits and waste labelled by source (plan, predict).

A prefetch the hub refuses (a placement policy, an ACL) or finds nothing for (the file was
deleted) is not asked again until the change feed changes the path or a demand read of it
succeeds: a plan or a guess that names it would otherwise ask for it at every turn of the
loop. One that failed for a moment (the link) is asked again with backoff (``core.retry``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import zlib
from collections.abc import Callable, Collection, Generator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client import Counter, Gauge

from .. import paths
from ..core.metrics import SPOKE
from ..core.retry import Backoff, retryable
from ..core.types import SYSTEM, Entry, Principal
from ..errors import InvalidArgument, LoomError
from ..prefetch.adaptive import AdaptivePolicy, HistoryPredictor
from ..prefetch.plan import Plan, Schedule
from ..prefetch.planned import PlanPolicy
from ..prefetch.policy import EvictionPolicy, Key
from ..prefetch.window import Window
from .cache import PREFETCHING, Cache, CachedFile, block_span
from .namespace import LEASE_MARGIN, SpokeNamespace
from .predict import Predictions, Target

log = logging.getLogger(__name__)

DEMAND_READS = Counter(
    "loomfs_prefetch_demand_reads_total", "Demand reads at the spoke", ["hit"], registry=SPOKE
)
PREFETCHED = Counter(
    "loomfs_prefetch_bytes_total",
    "Bytes fetched ahead of reads",
    ["source"],
    registry=SPOKE,
)  # source: plan | predict
WASTED = Counter(
    "loomfs_prefetch_wasted_bytes_total",
    "Prefetched bytes evicted unread",
    ["source"],
    registry=SPOKE,
)
PREFETCH_HITS = Counter(
    "loomfs_prefetch_hits_total",
    "Demand reads that found prefetched, unread data",
    ["source"],
    registry=SPOKE,
)
STALL = Counter(
    "loomfs_prefetch_stall_seconds_total",
    "Seconds demand reads waited for the link",
    registry=SPOKE,
)
JOBS = Gauge("loomfs_prefetch_jobs", "Jobs with an active plan", registry=SPOKE)

MIN_IN_FLIGHT = 4 << 20  # the window's floor, and where its startup begins
WINDOW = 0.8  # of the cache's capacity, the most a plan's look-ahead spans
TICK_S = 0.05  # longest the loop sleeps when nothing wakes it
SLACK_S = 1.0  # how late a job may run before eviction stops counting on a read
RATE_WINDOW_S = 0.25  # a job's read rate is measured over this much time at least
PREDICT_WINDOW = 0.25  # of the cache's capacity, the most predicted bytes held unread
ADMITTING = 64  # hub questions "may the reader read this cached file" in flight, at most
RETRY_S = 1.0  # a prefetch that failed for a moment waits this long, then longer...
RETRY_MAX_S = 60.0  # ...up to this


@dataclass(slots=True)
class _JobState:
    start: int
    keys: frozenset[Key]  # what the plan reads
    read_to: int  # first position of the plan not yet read (seen at the cache)
    issued: int = 0  # what the sampler reported handing out
    # Reads of each key since the plan came, and how many of its positions the pointer
    # passed: a key read more often than passed was read ahead of the pointer (workers
    # read out of order), so fetching it again waits until the pointer passes that read.
    reads: collections.Counter[Key] = field(default_factory=collections.Counter)
    passed: collections.Counter[Key] = field(default_factory=collections.Counter)


@dataclass(slots=True)
class Stats:
    demand_reads: int = 0
    hits: int = 0
    fetched_bytes: int = 0  # by prefetch
    wasted_bytes: int = 0
    stall_s: float = 0.0
    prefetched_files: int = 0
    jobs: int = 0
    policy: str = "adaptive"
    bandwidth: float = 0.0  # the highest rate the window measured lately
    window: int = 0  # bytes the prefetcher may have in flight
    rtt: float | None = None  # the lowest round trip it saw lately
    # the part of the prefetching above that predictions (no plan) did
    predicted_bytes: int = 0
    predicted_files: int = 0  # ranges fetched: whole small files, blocks of large ones
    predicted_hits: int = 0
    predicted_wasted_bytes: int = 0

    def as_dict(self) -> dict[str, Any]:
        hit_ratio = self.hits / self.demand_reads if self.demand_reads else None
        return {
            "demand_reads": self.demand_reads,
            "hits": self.hits,
            "hit_ratio": hit_ratio,
            "prefetched_bytes": self.fetched_bytes,
            "prefetched_files": self.prefetched_files,
            "wasted_bytes": self.wasted_bytes,
            "stall_s": self.stall_s,
            "jobs": self.jobs,
            "policy": self.policy,
            "bandwidth": self.bandwidth,
            "window": self.window,
            "rtt": self.rtt,
            "predicted_bytes": self.predicted_bytes,
            "predicted_files": self.predicted_files,
            "predicted_hits": self.predicted_hits,
            "predicted_wasted_bytes": self.predicted_wasted_bytes,
        }


class SpokePolicy(EvictionPolicy):
    """The cache's policy: ``PlanPolicy`` while any plan is active, ``AdaptivePolicy``
    otherwise, which offers the ``protected`` keys (predicted, unread) last. A switch replays
    the cached keys (oldest first) into a fresh policy."""

    def __init__(
        self,
        make: Callable[[bool], EvictionPolicy],
        planned: Callable[[], bool],
        protected: Callable[[], Collection[Key]],
    ):
        super().__init__()
        self._make = make
        self._planned = planned
        self._protected = protected
        self.mode = planned()
        self.inner = make(self.mode)

    def _follow(self) -> None:
        mode = self._planned()
        if mode == self.mode:
            return
        self.mode, self.inner = mode, self._make(mode)
        for key, size in self._sizes.items():
            self.inner.insert(key, size, prefetched=True)  # no access: it predicts nothing
        for key in self._pinned:
            self.inner.pin(key)

    def insert(self, key: Key, size: int, *, prefetched: bool = False) -> None:
        self._follow()
        super().insert(key, size, prefetched=prefetched)
        self.inner.insert(key, size, prefetched=prefetched)

    def access(self, key: Key) -> None:
        self._follow()
        self.inner.access(key)

    def pin(self, key: Key) -> None:
        super().pin(key)
        self.inner.pin(key)

    def unpin(self, key: Key) -> None:
        super().unpin(key)
        self.inner.unpin(key)

    # The inner policy gets every event whole from the public methods above.
    def _on_insert(self, key: Key, prefetched: bool) -> None:
        return None

    def _on_access(self, key: Key) -> None:
        return None

    def _on_remove(self, key: Key) -> None:
        self.inner.remove(key)

    def _victim_order(self) -> Generator[Key, None, None]:
        self._follow()
        order = self.inner._victim_order()
        protected = () if self.mode else self._protected()
        return self._last(order, protected) if protected else order

    @staticmethod
    def _last(
        order: Generator[Key, None, None], protected: Collection[Key]
    ) -> Generator[Key, None, None]:
        held: list[Key] = []
        try:
            for key in order:
                if key in protected:
                    held.append(key)
                else:
                    yield key
            yield from held
        finally:
            order.close()


class _FileSchedule:
    """The schedule as eviction sees it: keyed by cache file id rather than by path key."""

    def __init__(self, prefetcher: Prefetcher) -> None:
        self._prefetcher = prefetcher

    @property
    def version(self) -> int:
        return self._prefetcher.schedule.version

    @property
    def slack_s(self) -> float:
        return self._prefetcher.schedule.slack_s

    def next_use(self, key: Key, now: float, *, just_read: bool = False) -> float:
        entry = self._prefetcher.cache.by_id(key)
        path_key = None if entry is None else self._prefetcher.key_of.get(entry.path)
        if path_key is None:
            return float("inf")
        return self._prefetcher.schedule.next_use(path_key, now, just_read=just_read)


class Prefetcher:
    """Plans in, prefetches out; the cache observer that measures how well it went."""

    def __init__(self, spoke: SpokeNamespace, *, clock: Callable[[], float] = time.monotonic):
        self.spoke = spoke
        self.cache: Cache = spoke.cache
        self.clock = clock
        self.schedule = Schedule(default_rate=100.0, slack_s=SLACK_S, rate_window_s=RATE_WINDOW_S)
        self.paths: list[str] = []
        self.key_of: dict[str, Key] = {}
        self.sizes: dict[Key, int] = {}
        self.versions: dict[Key, int] = {}  # the file version last read or fetched
        self._reader: dict[Key, Principal] = {}  # who a key is fetched as: its plan's publisher
        self.jobs: dict[str, _JobState] = {}
        self.window = Window(floor=MIN_IN_FLIGHT, cap=int(self.cache.capacity * WINDOW))
        self.stats = Stats()
        # cache file id -> blocks prefetched, not yet read (a large file is read ahead, and
        # read, a few blocks at a time)
        self._unread: dict[int, set[int]] = {}
        # path -> for each prefetch of it in flight, the blocks demand reads took meanwhile
        # (such a read waited for the prefetch: those blocks were read, not left unread)
        self._watched: dict[str, list[set[int]]] = {}
        self._in_flight: dict[Key, tuple[asyncio.Task[None], int]] = {}  # -> bytes booked
        self.predict = Predictions(spoke)
        self._predicting: dict[Key, tuple[asyncio.Task[None], int]] = {}  # unit keys, as above
        self._admitting: dict[Key, asyncio.Task[None]] = {}  # see _readmit
        self._predicted: dict[int, Key] = {}  # cache file id -> unit fetched for it, unread
        # path -> the feed position its prefetch was refused at (or found it gone)
        self._refused: dict[str, int] = {}
        self._retry: Backoff[str] = Backoff(RETRY_S, RETRY_MAX_S, clock=clock)  # by path
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.policy = SpokePolicy(
            self._make_policy, lambda: len(self.schedule) > 0, self._expected_unread
        )

    def _make_policy(self, planned: bool) -> EvictionPolicy:
        if planned:
            return PlanPolicy(_FileSchedule(self), self.clock)
        return AdaptivePolicy([HistoryPredictor()])

    # -- lifecycle -------------------------------------------------------------------------

    def start(self) -> None:
        """Take over the cache's eviction (with what it holds) and start the loop."""
        for entry in self.cache:
            if entry.hashes:
                self.policy.insert(entry.id, entry.cached_bytes, prefetched=True)
                if entry.pinned:
                    self.policy.pin(entry.id)
        self.cache.policy = self.policy
        self.cache.observer = self
        self._task = asyncio.create_task(self._run())

    async def close(self) -> None:
        tasks = [t for t, _ in (*self._in_flight.values(), *self._predicting.values())]
        tasks += self._admitting.values()
        if self._task is not None:
            tasks.append(self._task)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- plans -----------------------------------------------------------------------------

    def _intern(self, path: str) -> Key:
        key = self.key_of.get(path)
        if key is None:
            key = self.key_of[path] = len(self.paths)
            self.paths.append(path)
        return key

    def publish(
        self,
        blob: bytes,
        files: bytes,
        sizes: list[int] | None = None,
        who: Principal = SYSTEM,
    ) -> Plan:
        """Adopt a plan: ``blob`` is ``Plan.encode()`` over the dataset's sample ids,
        ``files`` the dataset's paths (zlib of newline-joined), ``sizes`` their sizes;
        ``who`` published it, and its files are fetched as that user (see ``_fetch``)."""
        plan = Plan.decode(blob)
        try:
            names = zlib.decompress(files).decode().split("\n") if files else []
        except (zlib.error, UnicodeDecodeError) as exc:
            raise InvalidArgument("plan files must be zlib-compressed UTF-8 lines") from exc
        if sizes is not None and len(sizes) != len(names):
            raise InvalidArgument(f"{len(sizes)} sizes for {len(names)} files")
        if any(key >= len(names) for key in plan.keys):
            raise InvalidArgument(f"the plan reads sample ids beyond its {len(names)} files")
        keys = [self._intern(paths.normalize(name)) for name in names]
        for key, size in zip(keys, sizes or (), strict=False):
            self.sizes[key] = size
        if who is not SYSTEM:  # the spoke's own plans (tests) are read by no one in particular
            for key in keys:
                self._reader[key] = who
        translated = Plan(plan.job_id, plan.start, tuple(keys[k] for k in plan.keys))
        self.schedule.publish(translated, self.clock())
        self.jobs[plan.job_id] = _JobState(plan.start, frozenset(translated.keys), plan.start)
        JOBS.set(len(self.jobs))
        log.info(
            "plan published",
            extra={"job": plan.job_id, "start": plan.start, "reads": len(plan.keys)},
        )
        self._wake.set()
        return translated

    def heartbeat(self, job_id: str, position: int) -> None:
        """A sampler's count of samples handed out. It runs ahead of the reads by all that
        the DataLoader holds in flight (workers x prefetch factor x batch), so the schedule's
        position follows the reads this spoke serves; a heartbeat only takes its place for a
        job whose reads this spoke does not see."""
        job = self.jobs.get(job_id)
        if job is None:
            return
        job.issued = position
        self.schedule.issued(job_id, position)
        if job.read_to == job.start:
            self.schedule.heartbeat(job_id, position, self.clock())
        self._wake.set()

    def end(self, job_id: str) -> None:
        self.schedule.end(job_id)
        self.jobs.pop(job_id, None)
        JOBS.set(len(self.jobs))

    def report(self) -> dict[str, Any]:
        self.stats.jobs = len(self.jobs)
        self.stats.policy = "plan" if self.policy.mode else "adaptive"
        self.stats.bandwidth = self.window.rate
        self.stats.window = self.window.size()
        self.stats.rtt = self.window.rtt
        return self.stats.as_dict() | {"job_ids": sorted(self.jobs)}

    # -- the cache observer ----------------------------------------------------------------

    def on_read(self, entry: CachedFile, hit: bool, stall_s: float, blocks: range) -> None:
        self.stats.demand_reads += 1
        self.stats.hits += hit
        self.stats.stall_s += stall_s
        DEMAND_READS.labels(str(hit).lower()).inc()
        STALL.inc(stall_s)
        for watch in self._watched.get(entry.path, ()):
            watch.update(blocks)
        self._refused.pop(entry.path, None)  # read by someone: the hub lets it come here
        self._retry.succeeded(entry.path)
        unread = self._unread.get(entry.id)
        if unread is not None and not unread.isdisjoint(blocks):
            unread.difference_update(blocks)
            predicted = entry.id in self._predicted
            if hit:
                self.stats.predicted_hits += predicted
                PREFETCH_HITS.labels("predict" if predicted else "plan").inc()
            if not unread:
                del self._unread[entry.id]
                self._predicted.pop(entry.id, None)
        key = self.key_of.get(entry.path)
        if key is None or not any(key in job.keys for job in self.jobs.values()):
            # no plan says what follows this read: the predictors learn from it
            self.predict.note(entry.path, entry.version, entry.size, blocks)
            self._wake.set()
        if key is not None:
            self.versions[key] = entry.version
            now = self.clock()
            for job_id, job in self.jobs.items():
                if key not in job.keys:
                    continue
                job.reads[key] += 1
                before = job.read_to
                if self._advance(job_id, job) != before:
                    self.schedule.heartbeat(job_id, job.read_to, now)
            self._wake.set()

    def on_drop(self, entry: CachedFile) -> None:
        wasted = sum(entry.block_len(block) for block in self._unread.pop(entry.id, ()))
        unit = self._predicted.pop(entry.id, None)
        if unit is not None:
            self.predict.forecast.refute(unit)  # counts against the predictor that guessed
        if wasted:
            self.stats.wasted_bytes += wasted
            WASTED.labels("plan" if unit is None else "predict").inc(wasted)
            if unit is not None:
                self.stats.predicted_wasted_bytes += wasted

    # -- the loop --------------------------------------------------------------------------

    def _advance(self, job_id: str, job: _JobState) -> int:
        """Move a job's read pointer past the positions whose reads happened."""
        plan = self.schedule.plan(job_id)
        assert plan is not None
        while job.read_to - plan.start < len(plan.keys):
            key = plan.keys[job.read_to - plan.start]
            if job.reads[key] <= job.passed[key]:
                break
            job.passed[key] += 1
            job.read_to += 1
        return job.read_to

    def _cached(self, key: Key) -> bool:
        """Whether the version last seen of the key's file is whole in the cache (a new
        version at the hub drops the old one, and the key reads as uncached again)."""
        version = self.versions.get(key)
        entry = None if version is None else self.cache.get(self.paths[key], version)
        return entry is not None and entry.complete()

    def _choose(self) -> tuple[list[Key], list[Key]]:
        """Files to fetch now: uncached ones in deadline order from where the jobs' reads
        are, while the look-ahead fits in the cache and the bytes in flight in the link;
        and cached ones to re-admit for their reader (``_readmit``)."""
        budget = self._budget()
        if budget <= 0 and self._busy():
            # the link's lead is in flight: nothing goes out until a fetch ends, so the
            # walk over the look-ahead (which every demand read wakes) can wait for that
            return [], []
        now = self.clock()
        start = {job_id: job.read_to for job_id, job in self.jobs.items()}
        window = int(self.cache.capacity * WINDOW)
        chosen: list[Key] = []
        readmit: list[Key] = []
        seen: set[Key] = set()
        for when, key in self.schedule.upcoming(now, start):
            if key in seen:
                continue
            seen.add(key)
            size = self.sizes.get(key, 0)
            window -= size
            if window < 0:
                break
            done = any(job.reads[key] > job.passed[key] for job in self.jobs.values())
            if key in self._in_flight or done or self._held(self.paths[key]):
                continue
            if self._cached(key):
                if self._lapses_before(key, when):
                    readmit.append(key)
                continue
            if size > budget and (chosen or self._busy()):
                break
            budget -= size
            chosen.append(key)
        return chosen, readmit[: max(0, ADMITTING - len(self._admitting))]

    def _lapses_before(self, key: Key, when: float) -> bool:
        """Whether the hub's word that the key's reader may read it ends before the read
        planned at ``when``, and a word asked now would last until then (the current lease
        covers it): the hub is then asked ahead of the read, not by it."""
        who = self._reader.get(key)
        if who is None or key in self._admitting:
            return False
        path = self.paths[key]
        return self.spoke.admitted_until(who, path) < when < self.spoke.lease_until - LEASE_MARGIN

    def _budget(self) -> int:
        """Bytes that may go in flight now: the window, less what plans and predictions
        have in flight."""
        booked = (*self._in_flight.values(), *self._predicting.values())
        return self.window.size() - sum(size for _, size in booked)

    def _busy(self) -> bool:
        return bool(self._in_flight or self._predicting)

    def _expected_unread(self) -> set[int]:
        """Cache files fetched for a guess still outstanding and not yet read (trusted or
        not now: a dip in trust must not hand what was fetched to eviction first)."""
        outstanding = self.predict.forecast.outstanding
        return {file_id for file_id, unit in self._predicted.items() if outstanding(unit)}

    def _unread_bytes(self, file_id: int) -> int:
        entry = self.cache.by_id(file_id)
        blocks = self._unread.get(file_id, ())
        return 0 if entry is None else sum(entry.block_len(block) for block in blocks)

    def _choose_predicted(self) -> list[Target]:
        """Ranges trusted predictors expect and the cache lacks, soonest first, in the
        budget the plans left, while predicted bytes not yet read stay in ``PREDICT_WINDOW``
        of the cache (they are kept from eviction, so this bounds what they can displace)."""
        budget = self._budget()
        held = sum(self._unread_bytes(file_id) for file_id in self._expected_unread())
        room = int(self.cache.capacity * PREDICT_WINDOW) - held
        room -= sum(booked for _, booked in self._predicting.values())
        chosen: list[Target] = []
        for target in self.predict.targets():
            if target.key in self._predicting or self._holds(target) or self._held(target.path):
                continue
            if target.length > room or (target.length > budget and (chosen or self._busy())):
                break
            budget -= target.length
            room -= target.length
            chosen.append(target)
        return chosen

    def _holds(self, target: Target) -> bool:
        entry = self.cache.get(target.path, target.version)
        blocks = block_span(target.offset, target.length)
        return entry is not None and all(block in entry.hashes for block in blocks)

    def _held(self, path: str) -> bool:
        """Whether a prefetch of ``path`` waits: refused (or gone) with no change since, or
        failed a moment ago."""
        asked_at = self._refused.get(path)
        if asked_at is not None:
            if not self.spoke.changed_since(path, asked_at):
                return True
            del self._refused[path]
        return not self._retry.ready(path)

    def _failed(self, path: str, asked_at: int, exc: LoomError) -> None:
        if retryable(exc):
            self._retry.failed(path, exc)
        else:
            self._refused[path] = asked_at

    async def _run(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(TICK_S):
                    await self._wake.wait()
            self._wake.clear()
            try:
                await self.predict.observe()
                if self.jobs:
                    chosen, readmit = self._choose()
                    for key in chosen:
                        task = asyncio.create_task(self._fetch(key))
                        self._in_flight[key] = (task, self.sizes.get(key, 0))
                    for key in readmit:
                        self._admitting[key] = asyncio.create_task(self._readmit(key))
                # after the plans: predictions take the room they leave
                for target in self._choose_predicted():
                    task = asyncio.create_task(self._fetch_predicted(target))
                    self._predicting[target.key] = (task, target.length)
            except Exception as exc:
                log.exception("prefetch planning failed")
                await asyncio.sleep(self._retry.failed("", exc))  # "": the planning itself
            else:
                self._retry.succeeded("")

    async def _read_ahead(
        self, path: str, offset: int = 0, length: int | None = None, who: Principal = SYSTEM
    ) -> tuple[Entry, CachedFile | None, int]:
        """Read a range as the prefetcher (filling the cache, no demand read): the file's
        entry, its cache file, and the bytes of the range this read brought there (counted
        unread; blocks other reads of the file brought meanwhile are theirs)."""
        began = self.clock()
        before = {held.id: set(held.hashes) for held in self.cache.versions(path)}
        demanded: set[int] = set()
        watches = self._watched.setdefault(path, [])
        watches.append(demanded)
        token = PREFETCHING.set(True)
        try:
            async with await self.spoke.read(who, path, offset, length) as reader:
                entry = reader.entry
                cached = self.cache.get(path, entry.version)
                blocks = block_span(reader.offset, reader.length)
        finally:
            PREFETCHING.reset(token)
            watches[:] = [watch for watch in watches if watch is not demanded]  # not by value
            if not watches:
                del self._watched[path]
        fetched = 0
        if cached is not None:
            had = before.get(cached.id, set())
            brought = {i for i in blocks if i in cached.hashes and i not in had}
            fetched = sum(cached.block_len(i) for i in brought)
            if brought - demanded:
                self._unread.setdefault(cached.id, set()).update(brought - demanded)
        self.stats.fetched_bytes += fetched
        if fetched:  # a read the cache answered says nothing of the link
            self.window.record(began, self.clock(), fetched)
        return entry, cached, fetched

    async def _fetch(self, key: Key) -> None:
        """Fetch a planned file as its plan's publisher: the hub decides (and audits) for
        the user whose loader will read it, and its answer admits that user at this spoke
        for the lease (``SpokeNamespace._admit``), so the loader's read of the cached file
        asks the hub nothing. Fetched as the spoke itself, each such read cost a round
        trip for the hub's word that this user may read it: one RTT per file per worker,
        what kept ``bench/train_stall.py``'s plan mode at 4x all-local with a full cache.
        A plan can't bring into the cache what its publisher may not read, either."""
        path = self.paths[key]
        asked_at = self.spoke.seq
        try:
            entry, _, fetched = await self._read_ahead(path, who=self._reader.get(key, SYSTEM))
            self.sizes[key] = entry.size
            self.versions[key] = entry.version
            self.stats.prefetched_files += 1
            PREFETCHED.labels("plan").inc(fetched)
            self._retry.succeeded(path)
        except LoomError as exc:  # the demand read will say what is wrong, if it matters
            log.info("prefetch failed", extra={"path": path, "error": str(exc)})
            self._failed(path, asked_at, exc)
        finally:
            self._in_flight.pop(key, None)
            self._wake.set()

    async def _readmit(self, key: Key) -> None:
        """Ask the hub, as the reader, for a cached planned file whose admission lapses
        before its read: the hub's word holds for one lease term (so that a revoked right
        stops cached reads within one), and a cache that holds more than a lease term of
        reading would otherwise cost the reader that round trip again for every file read
        later than that. A question of a few hundred bytes, off the reader's path."""
        path = self.paths[key]
        asked_at = self.spoke.seq
        try:
            await self.spoke.stat_for_read(self._reader[key], path)
        except LoomError as exc:  # the read will hear it; meanwhile it is not asked again
            self._failed(path, asked_at, exc)
        finally:
            self._admitting.pop(key, None)

    async def _fetch_predicted(self, target: Target) -> None:
        asked_at = self.spoke.seq
        try:
            _, cached, fetched = await self._read_ahead(target.path, target.offset, target.length)
            self._retry.succeeded(target.path)
            self.stats.predicted_files += 1
            self.stats.predicted_bytes += fetched
            PREFETCHED.labels("predict").inc(fetched)
            if cached is not None and cached.id in self._unread:  # not all read meanwhile
                self._predicted[cached.id] = target.key
        except LoomError as exc:
            log.info("predicted prefetch failed", extra={"path": target.path, "error": str(exc)})
            self._failed(target.path, asked_at, exc)
        finally:
            self._predicting.pop(target.key, None)
            self._wake.set()
