"""Eviction policies, plans and the schedule of the spoke prefetcher (loomfs.prefetch)."""

from __future__ import annotations

import heapq
import random
from collections.abc import Sequence
from functools import cache

import libcachesim as lcs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.errors import InvalidArgument
from loomfs.prefetch import (
    AdaptivePolicy,
    EvictionPolicy,
    Forecast,
    HistoryPredictor,
    LRUPolicy,
    Plan,
    PlanPolicy,
    Schedule,
    SequentialPredictor,
    StridePredictor,
)
from loomfs.prefetch.window import GAIN, Window


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def replay(
    policy: EvictionPolicy,
    reads: Sequence[tuple[float, str, int, int]],
    capacity: int,
    clock: Clock,
    schedule: Schedule | None = None,
) -> int:
    """Demand caching of unit-size (time, job, position, key) reads; returns the hits."""
    hits = 0
    for now, job, position, key in reads:
        clock.now = now
        if key in policy:
            policy.access(key)
            hits += 1
        else:
            policy.evict(policy.used_bytes + 1 - capacity)
            policy.insert(key, 1)
        if schedule is not None:
            schedule.heartbeat(job, position + 1, now)
    return hits


def planned_hits(jobs: dict[str, list[int]], capacity: int) -> tuple[int, list[int]]:
    """Hits of PlanPolicy when every job publishes its whole order and reads one sample a
    second, job i offset by i/len(jobs) seconds; also returns the interleaved key sequence."""
    clock = Clock()
    schedule = Schedule(slack_s=0.0)
    reads = []
    for offset, (job, keys) in enumerate(jobs.items()):
        start = offset / len(jobs)
        schedule.publish(Plan(job, 0, tuple(keys)), start - 1)
        reads += [(start + i, job, i, key) for i, key in enumerate(keys)]
    reads.sort()
    hits = replay(PlanPolicy(schedule, clock), reads, capacity, clock, schedule)
    return hits, [key for *_, key in reads]


def optimal_misses(trace: Sequence[int], capacity: int) -> int:
    """Fewest misses of any demand cache of ``capacity`` unit-size keys (exhaustive search)."""

    @cache
    def best(at: int, held: frozenset[int]) -> int:
        if at == len(trace):
            return 0
        key = trace[at]
        if key in held:
            return best(at + 1, held)
        if len(held) < capacity:
            return 1 + best(at + 1, held | {key})
        return 1 + min(best(at + 1, (held - {victim}) | {key}) for victim in held)

    return best(0, frozenset())


@settings(max_examples=150, deadline=None)
@given(
    trace=st.lists(st.integers(0, 5), min_size=1, max_size=11),
    capacity=st.integers(1, 3),
)
def test_plan_policy_is_optimal_on_small_traces(trace: list[int], capacity: int) -> None:
    hits, _ = planned_hits({"job": trace}, capacity)
    assert len(trace) - hits == optimal_misses(trace, capacity)


def libcachesim_belady_hits(trace: Sequence[int], capacity: int) -> int:
    never = 2**63 - 1
    following = [never] * len(trace)
    seen: dict[int, int] = {}
    for index in range(len(trace) - 1, -1, -1):
        following[index] = seen.get(trace[index], never)
        seen[trace[index]] = index
    belady = lcs.Belady(capacity, hashpower=12)
    return sum(
        belady.get(
            lcs.Request(obj_size=1, op=lcs.ReqOp.OP_GET, obj_id=key, next_access_vtime=following[i])
        )
        for i, key in enumerate(trace)
    )


@pytest.mark.parametrize("jobs", [1, 3])
def test_plan_policy_matches_libcachesim_belady(jobs: int) -> None:
    rng = random.Random(jobs)
    orders = {}
    for job in range(jobs):
        orders[f"job{job}"] = [key for _ in range(3) for key in rng.sample(range(300), 300)]
    hits, trace = planned_hits(orders, 40)
    assert hits == libcachesim_belady_hits(trace, 40)
    assert hits > 0


def test_plan_policy_without_plans_is_lru() -> None:
    rng = random.Random(5)
    reads = [(float(i), "job", i, rng.randrange(100)) for i in range(5000)]
    plan_clock, lru_clock = Clock(), Clock()
    planned = replay(PlanPolicy(Schedule(), plan_clock), reads, 30, plan_clock)
    assert planned == replay(LRUPolicy(), reads, 30, lru_clock)


def test_keys_no_plan_reads_go_first_least_recent_first() -> None:
    clock = Clock()
    schedule = Schedule()
    schedule.publish(Plan("job", 0, (7, 8)), 0.0)
    policy = PlanPolicy(schedule, clock)
    for key in (8, 1, 7, 2, 3):
        policy.insert(key, 10)
    policy.access(1)
    assert policy.evict(25) == [2, 3, 1]
    assert policy.evict(1) == [8]


def test_prefetched_keys_keep_their_planned_read() -> None:
    clock = Clock()
    clock.now = 0.5
    schedule = Schedule()
    schedule.publish(Plan("job", 0, (1, 2, 3)), 0.0)
    policy = PlanPolicy(schedule, clock)
    policy.insert(1, 10, prefetched=True)  # read at t=1: a prefetch is not that read
    policy.insert(3, 10, prefetched=True)  # read at t=3
    assert policy.evict(1) == [3]


@given(
    job=st.text(max_size=40),
    start=st.integers(0, 2**40),
    keys=st.lists(st.integers(0, 2**48), max_size=300),
)
def test_plan_serialization_round_trips(job: str, start: int, keys: list[int]) -> None:
    plan = Plan(job, start, tuple(keys))
    assert Plan.decode(plan.encode()) == plan


def test_plan_encoding_is_compact() -> None:
    shuffled = random.Random(1).sample(range(100_000), 100_000)
    assert len(Plan("job", 0, tuple(shuffled)).encode()) < 3 * 100_000
    assert len(Plan("job", 0, tuple(range(100_000))).encode()) < 1_000


@pytest.mark.parametrize(
    "blob", [b"", b"not zlib", Plan("job", 0, (1, 2, 3)).encode()[:-3], b"x\x9c\x03\x00"]
)
def test_plan_decode_rejects_garbage(blob: bytes) -> None:
    with pytest.raises(InvalidArgument):
        Plan.decode(blob)


def test_plan_rejects_negative_ids() -> None:
    with pytest.raises(InvalidArgument):
        Plan("job", 0, (1, -2))


def two_job_schedule() -> Schedule:
    """Job a reads one sample a second from t=0; job b two a second, at sample 2 at t=1."""
    schedule = Schedule(smoothing=1.0)
    schedule.publish(Plan("a", 0, (1, 2, 3)), 0.0)
    schedule.publish(Plan("b", 0, (4, 5, 6, 7, 3)), 0.0)
    schedule.heartbeat("b", 2, 1.0)
    return schedule


def test_schedule_merges_plans_in_deadline_order() -> None:
    upcoming = list(two_job_schedule().upcoming(1.0))
    assert [key for _, key in upcoming] == [6, 2, 7, 3, 3]
    assert [when for when, _ in upcoming] == sorted(when for when, _ in upcoming)


def test_schedule_next_use_takes_the_earliest_job() -> None:
    schedule = two_job_schedule()
    assert schedule.next_use(3, 1.0) == 2.5  # b reads it at 2.5, before a at 3.0
    assert schedule.next_use(9, 1.0) == float("inf")
    version = schedule.version
    schedule.end("b")
    assert schedule.version > version
    assert schedule.next_use(3, 1.0) == 3.0


def test_schedule_prefetches_within_budget_skipping_cached() -> None:
    schedule = two_job_schedule()
    sizes = {2: 10, 3: 10, 6: 5, 7: 100}
    chosen = schedule.prefetch(1.0, 30, sizes.__getitem__, cached={6})
    assert chosen == [2]  # 7 does not fit, so nothing later is fetched before it


@settings(max_examples=60, deadline=None)
@given(
    rate=st.floats(5, 2000),
    batch=st.integers(1, 64),
    bursts=st.integers(8, 40),
    within=st.floats(1e-5, 1e-3),
)
def test_a_bursty_reader_is_measured_at_its_average_rate(
    rate: float, batch: int, bursts: int, within: float
) -> None:
    """Reads that come a batch at once (a DataLoader worker reading cached files) are
    heartbeats microseconds apart: the schedule still takes the job for its average rate,
    not the rate inside a burst."""
    schedule = Schedule(default_rate=rate, smoothing=0.5, rate_window_s=0.25)
    schedule.publish(Plan("job", 0, tuple(range(batch * bursts))), 0.0)
    for burst in range(bursts):
        at = (burst + 1) * batch / rate
        for read in range(1, batch + 1):
            schedule.heartbeat("job", burst * batch + read, at + read * within)
    measured = schedule._jobs["job"].rate
    assert rate / 2 <= measured <= rate * 2


@settings(max_examples=60, deadline=None)
@given(
    reads=st.integers(0, 50),
    lead=st.integers(0, 40),
    stalled_s=st.floats(0, 100),
    rate=st.floats(1, 5000),
)
def test_a_stalled_job_is_never_taken_past_what_its_sampler_handed_out(
    reads: int, lead: int, stalled_s: float, rate: float
) -> None:
    """However long a job waits on a miss, the files its sampler has not handed out yet
    keep a finite next use: eviction never takes them for read already (before the
    bound, a job stalled long enough looked done with its whole plan)."""
    keys = tuple(range(200))
    schedule = Schedule(default_rate=rate, slack_s=1.0)
    schedule.publish(Plan("job", 0, keys), 0.0)
    schedule.issued("job", reads + lead)
    if reads:
        schedule.heartbeat("job", reads, 1.0)
    now = 1.0 + stalled_s
    for key in keys[reads + lead :]:
        assert schedule.next_use(key, now) < float("inf")


POLICIES = ["lru", "plan", "adaptive"]
OPERATIONS = ["insert", "access", "pin", "unpin", "evict"]


def make_policy(name: str, clock: Clock) -> EvictionPolicy:
    if name == "plan":
        schedule = Schedule()
        schedule.publish(Plan("job", 0, tuple(range(50)) * 2), 0.0)
        return PlanPolicy(schedule, clock)
    if name == "adaptive":
        return AdaptivePolicy([StridePredictor(lambda key: key // 8), HistoryPredictor()])
    return LRUPolicy()


@pytest.mark.parametrize("name", POLICIES)
@settings(max_examples=200, deadline=None)
@given(
    operations=st.lists(
        st.tuples(st.sampled_from(OPERATIONS), st.integers(0, 15)),
        max_size=120,
    )
)
def test_pinned_keys_are_never_evicted(name: str, operations: list[tuple[str, int]]) -> None:
    clock = Clock()
    policy = make_policy(name, clock)
    pinned: set[int] = set()
    for step, (operation, key) in enumerate(operations):
        clock.now = float(step)
        if operation == "insert":
            policy.insert(key, 1 + key % 7)
        elif operation == "access" and key in policy:
            policy.access(key)
        elif operation == "pin" and key in policy:
            policy.pin(key)
            pinned.add(key)
        elif operation == "unpin":
            policy.unpin(key)
            pinned.discard(key)
        elif operation == "evict":
            evictable = policy.used_bytes - sum(policy.size_of(k) for k in pinned)
            victims = policy.evict(key)
            assert not pinned & set(victims)
            assert len(set(victims)) == len(victims)
            freed = sum(1 + victim % 7 for victim in victims)
            assert freed >= min(key, evictable)
            assert all(victim not in policy for victim in victims)
        assert policy.used_bytes == sum(policy.size_of(k) for k in range(16) if k in policy)
    rest = policy.evict(10**9)
    assert not pinned & set(rest)
    assert {key for key in range(16) if key in policy} == pinned


def hit_ratio(policy: EvictionPolicy, trace: Sequence[int], capacity: int) -> float:
    clock = Clock()
    reads = [(float(i), "job", i, key) for i, key in enumerate(trace)]
    return replay(policy, reads, capacity, clock) / len(trace)


def traces() -> dict[str, list[int]]:
    rng = random.Random(3)
    phases = [rng.randrange(1000) for _ in range(20)]
    return {
        "uniform": [rng.randrange(400) for _ in range(20_000)],
        "loop": list(range(150)) * 100,
        "zipf": [int(rng.paretovariate(1.0)) % 2000 for _ in range(20_000)],
        # A working set that moves: recency is what pays, the case LRU is made for.
        "phases": [base + rng.randrange(60) for base in phases for _ in range(1000)],
        "shuffled epochs": [key for _ in range(10) for key in rng.sample(range(500), 500)],
    }


@pytest.mark.parametrize("name", list(traces()))
def test_adaptive_is_not_meaningfully_below_lru(name: str) -> None:
    trace = traces()[name]
    lru = hit_ratio(LRUPolicy(), trace, 100)
    adaptive = hit_ratio(AdaptivePolicy([HistoryPredictor()]), trace, 100)
    assert adaptive >= lru - 0.02


def test_adaptive_beats_lru_on_loops() -> None:
    trace = list(range(150)) * 100
    assert hit_ratio(AdaptivePolicy(), trace, 100) > 0.3 > hit_ratio(LRUPolicy(), trace, 100)


def test_stride_predictor_follows_a_stride_within_a_group() -> None:
    predictor = StridePredictor(lambda key: key // 1000, depth=3)
    assert predictor.observe(10) == []
    assert predictor.observe(12) == []
    assert predictor.observe(5000) == []  # another file: its own history
    assert predictor.observe(14) == [16, 18, 20]


def test_history_predictor_expects_what_followed_last_time() -> None:
    predictor = HistoryPredictor(depth=2)
    for key in (1, 2, 3, 4):
        assert predictor.observe(key) == []
    assert predictor.observe(2) == [3, 4]


def test_trusted_predictions_are_offered_for_prefetch() -> None:
    policy = AdaptivePolicy([StridePredictor(lambda key: 0, depth=3)])
    for key in range(0, 200, 2):
        policy.insert(key, 1)
    assert policy.predictions()[-3:] == [200, 202, 204]


def test_untrusted_predictions_are_not_offered() -> None:
    policy = AdaptivePolicy([HistoryPredictor(depth=3)])
    rng = random.Random(2)
    for key in [key for _ in range(5) for key in rng.sample(range(300), 300)]:
        policy.insert(key, 1)
    assert policy.predictions() == []


def test_sequential_predictor_expects_the_next_keys() -> None:
    assert SequentialPredictor(depth=3).observe(10) == [11, 12, 13]


def test_forecast_trusts_a_predictor_while_its_guesses_are_read() -> None:
    forecast = Forecast([SequentialPredictor(depth=2)])
    for key in range(40):
        forecast.observe(key)
    assert forecast.predictions() == [40, 41]
    forecast.refute(41)  # fetched and dropped unread: no longer expected
    assert not forecast.expected(41) and forecast.expected(40)
    rng = random.Random(3)
    for key in rng.sample(range(1000, 100_000), 400):  # random reads: its guesses miss
        forecast.observe(key)
    assert forecast.predictions() == []


# -- the prefetch window -------------------------------------------------------------------


def fill(window: Window, rate: float, rtt: float, size: int, fetches: int) -> None:
    """The prefetcher over a link of ``rate`` bytes/s and round trip ``rtt``, until the
    window's startup ends (or ``fetches`` were sent): it keeps the window's bytes in flight
    in fetches of ``size``; each crosses the link (one at a time, at the rate) after half
    the round trip and is complete half a round trip later."""
    clock, free = 0.0, 0.0
    flight: list[tuple[float, float]] = []  # (complete at, sent at)
    for _ in range(fetches):
        if not window.startup:
            return
        while flight and len(flight) * size >= window.size():
            done, sent = heapq.heappop(flight)
            window.record(sent, done, size)
            clock = done
        free = max(free, clock + rtt / 2) + size / rate
        heapq.heappush(flight, (free + rtt / 2, clock))


@settings(max_examples=40, deadline=None)
@given(
    rate=st.floats(1e6, 2e9),
    rtt=st.floats(0.001, 0.2),
    size=st.sampled_from([64 << 10, 512 << 10, 1 << 20, 4 << 20]),
)
def test_the_window_grows_to_the_bandwidth_delay_product_not_its_own_throughput(
    rate: float, rtt: float, size: int
) -> None:
    floor, cap = 4 << 20, 1 << 40
    window = Window(floor=floor, cap=cap)
    bdp = rate * rtt
    size = max(size, int(bdp / 256))  # a few hundred fetches in flight at most: quick
    fill(window, rate, rtt, size, 48 * int(max(bdp, floor) / size) + 1000)
    assert not window.startup  # the probe ended: the rate stopped growing
    # enough in flight to fill the link (a fetch's worth of granularity aside)...
    assert window.size() >= min(bdp, cap) * 0.9 - size
    # ...and not much more than twice that (a floor above it aside)
    assert window.size() <= GAIN * max(floor, 1.6 * bdp + 2 * size)


@settings(max_examples=200, deadline=None)
@given(
    floor=st.integers(1, 1 << 30),
    cap=st.integers(1, 1 << 30),
    fetches=st.lists(
        st.tuples(st.floats(0, 100), st.floats(0, 5), st.integers(1, 1 << 30)), max_size=60
    ),
)
def test_the_window_never_exceeds_the_cache_budget(
    floor: int, cap: int, fetches: list[tuple[float, float, int]]
) -> None:
    window = Window(floor=floor, cap=cap)
    for start, took, size in sorted(fetches):
        window.record(start, start + took, size)
        assert min(floor, cap) <= window.size() <= cap


def test_a_window_needs_a_positive_floor_and_cap() -> None:
    with pytest.raises(InvalidArgument, match="positive"):
        Window(floor=0, cap=1)
