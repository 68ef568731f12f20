"""Audit log throughput next to a naive JSON-lines logger (bench layer, issue 5).

Both write the same records (time, site, protocol, user, op, path, bytes, result, detail)
to a file in the same directory, one run after the other, from one caller thread:

- loomfs: ``AuditLog.record`` for every record, then ``close`` (everything hashed,
  chained, written and fsynced in batches by the writer thread);
- naive: ``json.dumps`` + ``write`` of each line to a buffered file, no hash, one fsync at
  the end (what a plain JSON logger does), and the same with an fsync per 1,000 records
  (the durability the audit log gives).

It prints the caller's cost per record (what a namespace call pays) and records/s until
everything is durable, with the ratios loomfs/naive.

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


def best(fn: Callable[[Path], tuple[float, float]], root: Path, rounds: int) -> tuple[float, float]:
    """The fastest of ``rounds`` runs, each into a fresh directory (warm-up included)."""
    results = [fn(root / f"run{i}") for i in range(rounds)]
    return min(results, key=lambda r: r[1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", type=Path, help="where the logs go (default: a temp dir)")
    args = parser.parse_args()
    names = paths(args.records)
    with tempfile.TemporaryDirectory(prefix="loomfs-audit-", dir=args.dir) as tmp:
        root = Path(tmp)
        loomfs = best(lambda d: run_loomfs(d, names), root / "loomfs", args.rounds)
        naive = best(lambda d: run_naive(d, names, None), root / "naive", args.rounds)
        synced = best(lambda d: run_naive(d, names, BATCH), root / "synced", args.rounds)
    n = args.records
    print(f"{n:,} records, best of {args.rounds}\n")
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


if __name__ == "__main__":
    main()
