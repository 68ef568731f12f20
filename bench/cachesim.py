"""Cache policy simulator (bench): loomfs's eviction policies against libCacheSim's.

Replays training workloads through the policy code the spoke runs (``loomfs.prefetch``) and
through libCacheSim's LRU, ARC, LIRS, LeCaR, Cacheus, S3-FIFO, Belady and BeladySize, on the
same traces and cache sizes, and prints hit ratios, byte hit ratios, and loomfs's ratios to
Belady and LRU.

Workloads (samples of 100 KB-1 MB; cache = 10/25/50% of the data set's bytes):
  W1  one job reshuffling each epoch, plan published
  W2  3/5/8 jobs on the same data, own seeds, staggered starts, different and jittery speeds
  W3  3 jobs each reading a 30% subset, overlap between subsets 0-100%
  W4  no plan: random sampler, shuffle buffer over shards, mid-epoch resume from a checkpoint

Every miss inserts (demand caching), as libCacheSim does, so the numbers compare eviction
decisions only. Prefetching is not simulated here.

    PYTHONPATH=src python bench/cachesim.py [--quick] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import libcachesim as lcs

from loomfs.prefetch import (
    AdaptivePolicy,
    EvictionPolicy,
    HistoryPredictor,
    LRUPolicy,
    Plan,
    PlanPolicy,
    Schedule,
    StridePredictor,
)

CACHE_FRACTIONS = (0.10, 0.25, 0.50)
LIBCACHESIM = ("LRU", "ARC", "LIRS", "LeCaR", "Cacheus", "S3FIFO", "Belady", "BeladySize")
LOOMFS = ("loomfs-LRU", "loomfs-Plan", "loomfs-Adaptive")
SHARD = 64  # samples per shard file: the stride predictor's group
BATCH = 32  # samples per step: a heartbeat after each
NEVER = 2**63 - 1  # libCacheSim's "no next access"

PUBLISH, READ, END = 0, 1, 2  # at equal times a plan lands before the read it covers


@dataclass(frozen=True, slots=True)
class Event:
    time: float
    kind: int
    job: str
    position: int = 0
    key: int = 0
    plan: Plan | None = None


@dataclass(frozen=True, slots=True)
class Job:
    job_id: str
    epochs: list[list[int]]  # sample order of each epoch, as read
    start: float
    step_s: float  # mean seconds per sample
    publishes: bool


@dataclass(frozen=True, slots=True)
class Workload:
    family: str
    name: str
    sizes: list[int]
    events: list[Event]

    def reads(self) -> Iterator[Event]:
        return (event for event in self.events if event.kind == READ)


def build(
    family: str, name: str, sizes: list[int], jobs: list[Job], rng: random.Random
) -> Workload:
    """Interleave the jobs' reads by time; each step takes its mean time +-10%."""
    events: list[Event] = []
    for job in jobs:
        now, position = job.start, 0
        for epoch, order in enumerate(job.epochs):
            if job.publishes:
                # A sampler knows this epoch and, from seed and epoch number, the next one.
                ahead = job.epochs[epoch + 1] if epoch + 1 < len(job.epochs) else []
                plan = Plan(job.job_id, position, tuple(order + ahead))
                events.append(Event(now, PUBLISH, job.job_id, plan=plan))
            for key in order:
                events.append(Event(now, READ, job.job_id, position, key))
                position += 1
                now += job.step_s * rng.uniform(0.9, 1.1)
        events.append(Event(now, END, job.job_id))
    events.sort(key=lambda event: (event.time, event.kind))
    return Workload(family, name, sizes, events)


def shuffled(keys: list[int], rng: random.Random) -> list[int]:
    order = list(keys)
    rng.shuffle(order)
    return order


def shuffle_buffer(keys: list[int], buffer: int, rng: random.Random) -> list[int]:
    """A streaming loader: shards in random order, samples drawn from a bounded buffer."""
    shards = [keys[at : at + SHARD] for at in range(0, len(keys), SHARD)]
    rng.shuffle(shards)
    pool: list[int] = []
    order: list[int] = []
    for key in (key for shard in shards for key in shard):
        pool.append(key)
        if len(pool) >= buffer:
            order.append(pool.pop(rng.randrange(len(pool))))
    rng.shuffle(pool)
    return order + pool


def workloads(samples: int, epochs: int, w2_jobs: tuple[int, ...], seed: int) -> list[Workload]:
    rng = random.Random(seed)
    sizes = [rng.randint(100_000, 1_000_000) for _ in range(samples)]
    everything = list(range(samples))

    def job(index: int, keys: list[int], start: float = 0.0, step_s: float = 1.0) -> Job:
        """A job with a plan-publishing sampler that reshuffles ``keys`` every epoch."""
        orders = [shuffled(keys, rng) for _ in range(epochs)]
        return Job(f"job{index}", orders, start, step_s, publishes=True)

    result = [build("W1", "1 job", sizes, [job(0, everything)], rng)]
    for count in w2_jobs:
        # Staggered evenly over one epoch, each at its own speed (0.8-1.2 samples a second).
        jobs = [
            job(i, everything, i * samples / count, 1 / rng.uniform(0.8, 1.2)) for i in range(count)
        ]
        result.append(build("W2", f"{count} jobs", sizes, jobs, rng))
    subset = int(0.3 * samples)
    for overlap in (0.0, 0.25, 0.5, 0.75, 1.0):
        shared = int(overlap * subset)
        private = subset - shared
        jobs = [
            job(i, everything[:shared] + everything[shared + i * private :][:private])
            for i in range(3)
        ]
        result.append(build("W3", f"overlap {overlap:.0%}", sizes, jobs, rng))
    random_epochs = [shuffled(everything, rng) for _ in range(epochs)]
    buffered = [shuffle_buffer(everything, 512, rng) for _ in range(epochs)]
    # Crash 60% into the second epoch, resume from the checkpoint taken at 40%.
    crash, checkpoint = int(0.6 * samples), int(0.4 * samples)
    resumed = [*random_epochs[:1], random_epochs[1][:crash] + random_epochs[1][checkpoint:]]
    resumed += random_epochs[2:]
    for name, orders in (
        ("random", random_epochs),
        ("shuffle buffer", buffered),
        ("resume", resumed),
    ):
        result.append(build("W4", name, sizes, [Job("job0", orders, 0.0, 1.0, False)], rng))
    return result


@dataclass(frozen=True, slots=True)
class Result:
    hits: int
    reads: int
    hit_bytes: int
    read_bytes: int

    @property
    def hit_ratio(self) -> float:
        return self.hits / self.reads

    @property
    def byte_hit_ratio(self) -> float:
        return self.hit_bytes / self.read_bytes


def tally(workload: Workload, outcomes: Iterator[bool]) -> Result:
    hits = reads = hit_bytes = read_bytes = 0
    for event, hit in zip(workload.reads(), outcomes, strict=True):
        size = workload.sizes[event.key]
        reads += 1
        read_bytes += size
        if hit:
            hits += 1
            hit_bytes += size
    return Result(hits, reads, hit_bytes, read_bytes)


def make_loomfs(name: str, schedule: Schedule, clock: Callable[[], float]) -> EvictionPolicy:
    if name == "loomfs-Plan":
        return PlanPolicy(schedule, clock)
    if name == "loomfs-Adaptive":
        return AdaptivePolicy([StridePredictor(lambda key: key // SHARD), HistoryPredictor()])
    return LRUPolicy()


def replay_loomfs(workload: Workload, name: str, capacity: int) -> Iterator[bool]:
    """Drive a loomfs policy the way the spoke cache will: plans, heartbeats, reads."""
    # Steps jitter by 10%: a slack of a few steps keeps a late job's next read in view.
    schedule = Schedule(default_rate=1.0, slack_s=4.0)
    now = 0.0
    policy = make_loomfs(name, schedule, lambda: now)
    for event in workload.events:
        now = event.time
        if event.kind == PUBLISH and event.plan is not None:
            schedule.publish(event.plan, now)
        elif event.kind == END:
            schedule.end(event.job)
        elif event.kind == READ:
            if event.key in policy:
                policy.access(event.key)
                yield True
            else:
                size = workload.sizes[event.key]
                policy.evict(policy.used_bytes + size - capacity)
                policy.insert(event.key, size)
                yield False
            if (event.position + 1) % BATCH == 0:
                schedule.heartbeat(event.job, event.position + 1, now)


def replay_libcachesim(workload: Workload, name: str, capacity: int) -> Iterator[bool]:
    reads = list(workload.reads())
    following: list[int] = [NEVER] * len(reads)
    seen: dict[int, int] = {}
    for index in range(len(reads) - 1, -1, -1):
        following[index] = seen.get(reads[index].key, NEVER)
        seen[reads[index].key] = index
    cache = getattr(lcs, name)(capacity, hashpower=20)
    for index, event in enumerate(reads):
        yield cache.get(
            lcs.Request(
                obj_size=workload.sizes[event.key],
                op=lcs.ReqOp.OP_GET,
                obj_id=event.key,
                clock_time=int(event.time),
                next_access_vtime=following[index],
            )
        )


def simulate(workload: Workload, fraction: float) -> dict[str, Result]:
    capacity = int(fraction * sum(workload.sizes))
    results = {
        name: tally(workload, replay_libcachesim(workload, name, capacity)) for name in LIBCACHESIM
    }
    for name in LOOMFS:
        results[name] = tally(workload, replay_loomfs(workload, name, capacity))
    return results


def table(rows: list[tuple[Workload, float, dict[str, Result]]], by_bytes: bool) -> str:
    names = [*LIBCACHESIM, *LOOMFS]
    # lf- marks loomfs's own policies; the ratios compare them with libCacheSim's Belady and
    # with loomfs's LRU (identical to libCacheSim's, which checks the replay itself).
    short = [name.replace("loomfs-", "lf-").replace("Adaptive", "Adapt") for name in names]
    header = ["workload", "cache", *short, "Plan/Belady", "Adapt/Belady", "Adapt/LRU"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for workload, fraction, results in rows:

        def ratio(name: str, results: dict[str, Result] = results) -> float:
            result = results[name]
            return result.byte_hit_ratio if by_bytes else result.hit_ratio

        def relative(name: str, base: str, ratio: Callable[[str], float] = ratio) -> str:
            return f"{ratio(name) / ratio(base):.2f}" if ratio(base) > 0 else "-"

        relatives = [
            "-" if workload.family == "W4" else relative("loomfs-Plan", "Belady"),
            relative("loomfs-Adaptive", "Belady"),
            relative("loomfs-Adaptive", "loomfs-LRU"),
        ]
        cells = [f"{workload.family} {workload.name}", f"{fraction:.0%}"]
        cells += [f"{ratio(name):.3f}" for name in names] + relatives
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data set, 3 jobs in W2")
    parser.add_argument("--json", type=Path, help="write every result here")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    w2_jobs: tuple[int, ...]
    if args.quick:
        samples, epochs, w2_jobs = 1000, 3, (3,)
    else:
        samples, epochs, w2_jobs = 20_000, 3, (3, 5, 8)
    started = time.perf_counter()
    rows = [
        (workload, fraction, simulate(workload, fraction))
        for workload in workloads(samples, epochs, w2_jobs, args.seed)
        for fraction in CACHE_FRACTIONS
    ]
    print(f"{samples} samples of 100 KB-1 MB, {epochs} epochs per job, seed {args.seed}")
    print("\nHit ratio (share of reads served from cache):\n")
    print(table(rows, by_bytes=False))
    print("\nByte hit ratio (share of bytes served from cache):\n")
    print(table(rows, by_bytes=True))
    print(f"\n{time.perf_counter() - started:.0f} s")
    if args.json is not None:
        records = [
            {
                "workload": f"{workload.family} {workload.name}",
                "cache_fraction": fraction,
                "policy": name,
                "hit_ratio": result.hit_ratio,
                "byte_hit_ratio": result.byte_hit_ratio,
                "reads": result.reads,
            }
            for workload, fraction, results in rows
            for name, result in results.items()
        ]
        args.json.write_text(json.dumps(records, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
