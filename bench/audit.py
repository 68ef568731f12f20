"""Audit log throughput next to a naive JSON-lines logger (bench layer, issue 5).

Both write the same records (time, site, protocol, user, op, path, bytes, result, detail)
to a file in the same directory, one run after the other, from one caller thread:

- loomfs: ``AuditLog.record`` for every record, then ``close`` (everything hashed,
  chained, written and fsynced in batches by the writer thread);
- naive: ``json.dumps`` + ``write`` of each line to a buffered file, no hash, one fsync at
  the end (what a plain JSON logger does), and the same with an fsync per 1,000 records
  (the durability the audit log gives).

It prints the caller's cost per record (what a namespace call pays) and records/s until
everything is durable, with the ratios loomfs/naive, then how fast ``verify`` and
``query`` read the log back.

Run: ``PYTHONPATH=src python bench/audit.py [--records N] [--dir DIR]``.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from loomfs.core.audit import AuditLog, AuditReader
from loomfs.core.types import Principal

WHO = Principal("alice", frozenset({"research"}), site="gpu-west", protocol="s3")
BATCH = 1000


def paths(n: int) -> list[str]:
    return [f"/datasets/imagenet/train/n{i % 1000:08d}/img_{i:09d}.JPEG" for i in range(n)]


def run_loomfs(directory: Path, names: list[str]) -> tuple[float, float]:
    """(caller seconds, seconds until durable)."""
    log = AuditLog(directory, site="hub", batch_size=BATCH).start()
    start = time.perf_counter()
    for i, path in enumerate(names):
        log.record(WHO, "read", path, "ok", nbytes=i)
    caller = time.perf_counter() - start
    log.close()
    total = time.perf_counter() - start
    assert AuditReader(directory).head()[0] == len(names)
    return caller, total


def run_naive(directory: Path, names: list[str], fsync_every: int | None) -> tuple[float, float]:
    directory.mkdir(parents=True)
    start = time.perf_counter()
    with (directory / "audit.jsonl").open("w") as out:
        for i, path in enumerate(names):
            line = {"time_ns": time.time_ns(), "site": WHO.site, "protocol": WHO.protocol,
                    "user": WHO.user, "op": "read", "path": path, "nbytes": i,
                    "result": "ok", "detail": ""}  # fmt: skip
            out.write(json.dumps(line) + "\n")
            if fsync_every and (i + 1) % fsync_every == 0:
                out.flush()
                os.fsync(out.fileno())
        out.flush()
        os.fsync(out.fileno())
        caller = time.perf_counter() - start
    return caller, time.perf_counter() - start


def interleaved(
    runs: dict[str, Callable[[Path], tuple[float, float]]], root: Path, rounds: int
) -> dict[str, tuple[float, float]]:
    """The median of ``rounds`` runs of each, taking turns (a shared machine's load then
    falls on all alike), each into a fresh directory."""
    results: dict[str, list[tuple[float, float]]] = {name: [] for name in runs}
    for i in range(rounds):
        for name, fn in runs.items():
            results[name].append(fn(root / name / f"run{i}"))
    return {name: sorted(r, key=lambda x: x[1])[len(r) // 2] for name, r in results.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--dir", type=Path, help="where the logs go (default: a temp dir)")
    parser.add_argument("--quick", action="store_true", help="a short run (make bench-quick)")
    args = parser.parse_args()
    if args.quick:
        args.records, args.rounds = 20_000, 2
    names = paths(args.records)
    with tempfile.TemporaryDirectory(prefix="loomfs-audit-", dir=args.dir) as tmp:
        root = Path(tmp)
        runs = interleaved(
            {
                "loomfs": lambda d: run_loomfs(d, names),
                "naive": lambda d: run_naive(d, names, None),
                "synced": lambda d: run_naive(d, names, BATCH),
            },
            root,
            args.rounds,
        )
        loomfs, naive, synced = runs["loomfs"], runs["naive"], runs["synced"]
        reader = AuditReader(root / "loomfs" / "run0")
        start = time.perf_counter()
        assert reader.verify().ok
        verify = time.perf_counter() - start
        start = time.perf_counter()
        matched = sum(1 for _ in reader.query(user="alice", path_prefix="/datasets/imagenet"))
        query = time.perf_counter() - start
        assert matched == len(names)
    n = args.records
    print(f"{n:,} records, median of {args.rounds} interleaved rounds\n")
    print("| | caller us/record | records/s until durable | loomfs / peer (records/s) |")
    print("|---|---:|---:|---:|")
    for label, (caller, total) in [
        ("loomfs AuditLog (hash chain, fsync per batch)", loomfs),
        ("naive JSON lines, one fsync at the end", naive),
        (f"naive JSON lines, fsync per {BATCH:,}", synced),
    ]:
        ratio = (n / loomfs[1]) / (n / total)
        print(f"| {label} | {caller / n * 1e6:.2f} | {n / total:,.0f} | {ratio:.2f} |")
    print(f"\ncaller cost loomfs / naive: {loomfs[0] / naive[0]:.2f}")
    print(f"verify: {n / verify:,.0f} records/s; query: {n / query:,.0f} records/s")


if __name__ == "__main__":
    main()
