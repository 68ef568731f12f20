"""Assimilation speed next to its peers, in one run (bench).

1. A posix tree of small files: GNU ``find -printf`` (the same facts: inode, size, mtime)
   against the posix backend's scan alone and against a full import into a SQLite catalog
   (and PostgreSQL with ``--postgres``); then a rescan with 1% of the files changed.
2. A bucket in a real SeaweedFS: a plain paginated ListObjectsV2 (boto3) against the import.
3. Listing one directory of many entries through the REST API of a hub process: rate, and
   the server's peak memory for a 10% listing and a full one (flat = streamed).

Goals (issue 2): import >= 0.5x find and >= 100,000 files/s; rescan of 1% <= 0.3x the
import; listing memory flat in the number of entries.

    python bench/assimilate.py [--quick] [--json out.json] [--files N] [--objects N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import aiohttp

from loomfs.core.backends.posix import PosixBackend
from loomfs.core.catalog.base import Put
from loomfs.core.registry import open_catalog
from loomfs.core.types import EntryKind
from loomfs.hub.namespace import HubNamespace
from loomfs.testing.hubproc import HubProcess
from loomfs.testing.postgres import PostgresServer
from loomfs.testing.seaweedfs import SeaweedFS

PER_DIR = 1000


def build_tree(root: Path, files: int) -> None:
    for n in range(files):
        if n % PER_DIR == 0:
            directory = root / f"d{n // PER_DIR:05}"
            directory.mkdir(parents=True)
        (directory / f"f{n:07}.bin").write_bytes(b"x" * (n % 97))


def timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


async def atimed(fn: Callable[[], Awaitable[object]]) -> float:
    start = time.perf_counter()
    await fn()
    return time.perf_counter() - start


def median_of(runs: int, fn: Callable[[], float]) -> float:
    return statistics.median(fn() for _ in range(runs))


def find_walk(root: Path) -> int:
    out = subprocess.run(
        ["find", str(root), "-mindepth", "1", "-printf", "%i %s %T@\n"],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    return out.count(b"\n")


async def scan_only(root: Path) -> int:
    backend = PosixBackend.from_url(f"posix://{root}")
    return sum([len(batch) async for batch in backend.scan()])


async def import_into(
    catalog_url: str, volume_url: str, mount: str = "/v"
) -> tuple[float, HubNamespace]:
    catalog = open_catalog(catalog_url)
    await catalog.open()
    hub = HubNamespace(catalog)
    elapsed = await atimed(lambda: hub.add_volume(mount, volume_url))
    return elapsed, hub


async def close_hub(hub: HubNamespace) -> None:
    await hub.close()
    await hub.catalog.close()


async def posix_section(
    work: Path, files: int, repeat: int, pg: PostgresServer | None
) -> dict[str, Any]:
    root = work / "tree"
    print(f"building a tree of {files:,} files ...", flush=True)
    build_tree(root, files)
    entries = find_walk(root)  # also warms the page cache for every contender alike
    find_s = median_of(repeat, lambda: timed(lambda: find_walk(root)))
    scan_times = [await atimed(lambda: scan_only(root)) for _ in range(repeat)]
    scan_s = statistics.median(scan_times)
    import_times: list[float] = []
    rescan_s = 0.0
    for run in range(repeat):
        elapsed, hub = await import_into(f"sqlite://{work / f'catalog{run}.db'}", f"posix://{root}")
        import_times.append(elapsed)
        if run == repeat - 1:
            rng = random.Random(1)
            for n in rng.sample(range(files), max(1, files // 100)):
                path = root / f"d{n // PER_DIR:05}" / f"f{n:07}.bin"
                path.write_bytes(b"changed" * 3)
            began = time.perf_counter()
            await hub.sync_volume("/v")
            rescan_s = time.perf_counter() - began
        await close_hub(hub)
    import_s = statistics.median(import_times)
    result: dict[str, Any] = {
        "entries": entries,
        "find_s": find_s,
        "find_rate": entries / find_s,
        "scan_rate": entries / scan_s,
        "import_sqlite_s": import_s,
        "import_sqlite_rate": entries / import_s,
        "import_vs_find": find_s / import_s,
        "rescan_1pct_s": rescan_s,
        "rescan_vs_import": rescan_s / import_s,
    }
    if pg is not None:
        elapsed, hub = await import_into(pg.create_database(), f"posix://{root}")
        await close_hub(hub)
        result["import_postgres_rate"] = entries / elapsed
    shutil.rmtree(root)
    return result


async def s3_section(work: Path, objects: int, s3: SeaweedFS) -> dict[str, Any]:
    bucket = "bench-assimilate"
    s3.create_bucket(bucket)
    client = s3.client()
    print(f"filling a bucket with {objects:,} objects ...", flush=True)

    def put(n: int) -> None:
        client.put_object(Bucket=bucket, Key=f"p{n // PER_DIR:04}/o{n:07}", Body=b"x" * (n % 53))

    with ThreadPoolExecutor(16) as pool:
        list(pool.map(put, range(objects)))

    def plain_list() -> int:
        count = 0
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            count += len(page.get("Contents", []))
        return count

    list_s = timed(plain_list)
    os.environ.update(
        AWS_ACCESS_KEY_ID=s3.access_key,
        AWS_SECRET_ACCESS_KEY=s3.secret_key,
        AWS_DEFAULT_REGION=s3.region,
    )
    elapsed, hub = await import_into(
        f"sqlite://{work / 's3catalog.db'}", f"s3://{bucket}?endpoint={s3.endpoint}"
    )
    await close_hub(hub)
    return {
        "objects": objects,
        "boto3_list_rate": objects / list_s,
        "import_rate": objects / elapsed,
        "import_vs_list": list_s / elapsed,
    }


def peak_rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return 0


def reset_peak(pid: int) -> None:
    # writing 5 to clear_refs resets the peak resident set size (VmHWM)
    Path(f"/proc/{pid}/clear_refs").write_text("5")


async def listing_section(work: Path, entries: int) -> dict[str, Any]:
    site = work / "list-site"
    catalog = open_catalog(f"sqlite://{site / 'catalog.db'}")
    await catalog.open()
    print(f"recording a directory of {entries:,} entries ...", flush=True)
    await catalog.apply([Put("/big", EntryKind.DIR, mode=0o40755)])
    for start in range(0, entries, 20000):
        await catalog.apply(
            [Put(f"/big/e{n:08}", EntryKind.FILE, size=n, mtime_ns=n, etag=str(n), mode=0o100644)
             for n in range(start, min(entries, start + 20000))]
        )  # fmt: skip
    await catalog.close()
    result: dict[str, Any] = {"entries": entries}
    with HubProcess(site, {"LOOMFS_HUB__RESCAN_INTERVAL": "0"}) as hub:
        async with aiohttp.ClientSession() as session:

            async def count(limit: int) -> int:
                got = 0
                params = {"limit": str(limit)}
                async with session.get(f"{hub.url}/v1/list/big", params=params) as response:
                    async for _ in response.content:
                        got += 1
                return got

            await count(1000)  # warm up
            for share, limit in (("10pct", entries // 10), ("full", entries)):
                reset_peak(hub.pid)
                before = peak_rss_kib(hub.pid)
                began = time.perf_counter()
                got = await count(limit)
                elapsed = time.perf_counter() - began
                assert got == limit, (got, limit)
                result[f"rate_{share}"] = got / elapsed
                result[f"peak_rss_growth_kib_{share}"] = peak_rss_kib(hub.pid) - before
    return result


def report(results: dict[str, Any]) -> None:
    p, s, listing = results["posix"], results.get("s3"), results["listing"]
    print()
    print(f"posix tree, {p['entries']:,} entries (medians of {results['repeat']})")
    print(f"  find -printf           {p['find_rate']:>12,.0f} entries/s")
    print(f"  loomfs scan only       {p['scan_rate']:>12,.0f} entries/s")
    print(f"  loomfs import (sqlite) {p['import_sqlite_rate']:>12,.0f} entries/s   "
          f"{p['import_vs_find']:.2f}x find (goal >= 0.5x, >= 100,000/s)")  # fmt: skip
    if "import_postgres_rate" in p:
        print(f"  loomfs import (pg)     {p['import_postgres_rate']:>12,.0f} entries/s")
    print(f"  rescan, 1% changed     {p['rescan_1pct_s']:>12.2f} s   "
          f"{p['rescan_vs_import']:.2f}x the import (goal <= 0.3x)")  # fmt: skip
    if s is not None:
        print(f"S3 bucket in SeaweedFS, {s['objects']:,} objects")
        print(f"  boto3 ListObjectsV2    {s['boto3_list_rate']:>12,.0f} objects/s")
        print(f"  loomfs import          {s['import_rate']:>12,.0f} objects/s   "
              f"{s['import_vs_list']:.2f}x the plain listing")  # fmt: skip
    print(f"REST listing of one directory of {listing['entries']:,} entries")
    print(f"  10%: {listing['rate_10pct']:>10,.0f} entries/s, server peak RSS "
          f"+{listing['peak_rss_growth_kib_10pct']:,} KiB")  # fmt: skip
    print(f"  all: {listing['rate_full']:>10,.0f} entries/s, server peak RSS "
          f"+{listing['peak_rss_growth_kib_full']:,} KiB")  # fmt: skip


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, under 30 s")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--files", type=int, help="posix tree size (default 1,000,000)")
    parser.add_argument("--objects", type=int, help="bucket size (default 100,000; 0 skips S3)")
    parser.add_argument("--entries", type=int, help="listed directory size (default 1,000,000)")
    parser.add_argument("--postgres", action="store_true", help="also import into PostgreSQL")
    parser.add_argument("--dir", type=Path, help="work directory (default: a temp dir)")
    args = parser.parse_args()
    files = args.files or (20_000 if args.quick else 1_000_000)
    objects = args.objects if args.objects is not None else (1_000 if args.quick else 100_000)
    entries = args.entries or (20_000 if args.quick else 1_000_000)
    repeat = 1 if args.quick else 3
    work = Path(tempfile.mkdtemp(prefix="loomfs-bench-", dir=args.dir))
    results: dict[str, Any] = {"repeat": repeat, "cpus": os.cpu_count(), "quick": args.quick}
    try:
        with PostgresServer() if args.postgres else contextlib.nullcontext() as pg:
            results["posix"] = await posix_section(work, files, repeat, pg)
        if objects:
            with SeaweedFS() as s3:
                results["s3"] = await s3_section(work, objects, s3)
        results["listing"] = await listing_section(work, entries)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    report(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
