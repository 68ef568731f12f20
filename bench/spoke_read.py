"""Reads at a spoke over an emulated WAN, next to rclone over the same link (bench).

The same files sit in the hub's posix volume and in a SeaweedFS bucket. Each source is
reached through its own copy of the emulated link (same bandwidth and latency):

1. cold sequential read of large files: the spoke (whole-file reads) vs ``rclone copy``
   from SeaweedFS's S3; the goal is >= 90% of the link rate;
2. cold read of many 100 KB-1 MB files, several at once: goal >= 70% of the link rate;
3. warm re-read of the same files at the spoke vs a plain read of the cache's own files
   (the local disk): goal >= 95%.

    python bench/spoke_read.py [--quick] [--json out.json] [--rate 100] [--rtt 20]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from loomfs.core.types import Principal
from loomfs.spoke.namespace import SpokeNamespace
from loomfs.testing.fabric import fabric
from loomfs.testing.seaweedfs import SeaweedFS
from loomfs.testing.wan import LinkEmulator

WHO = Principal(user="bench")
MB = 1_000_000


def make_files(root: Path, big: int, big_size: int, small: int, seed: int = 1) -> dict[str, int]:
    rng = random.Random(seed)
    sizes: dict[str, int] = {}
    (root / "big").mkdir(parents=True)
    (root / "small").mkdir()
    for i in range(big):
        sizes[f"big/f{i}.bin"] = big_size
    for i in range(small):
        sizes[f"small/s{i:04d}.bin"] = rng.randint(100_000, 1_000_000)
    for name, size in sizes.items():
        with (root / name).open("wb") as out:
            out.write(os.urandom(size))
    return sizes


async def spoke_read(spoke: SpokeNamespace, paths: list[str], parallel: int) -> float:
    """Read every file to its end through the spoke, ``parallel`` at a time; seconds."""
    gate = asyncio.Semaphore(parallel)

    async def one(path: str) -> None:
        async with gate, await spoke.read(WHO, path) as reader:
            async for _ in reader.chunks():
                pass
            await reader.verify()

    start = time.perf_counter()
    await asyncio.gather(*(one(p) for p in paths))
    return time.perf_counter() - start


def rclone_copy(
    s3: SeaweedFS, endpoint: str, bucket: str, prefix: str, dest: Path, parallel: int
) -> float:
    env = {
        **os.environ,
        "RCLONE_CONFIG_SRC_TYPE": "s3",
        "RCLONE_CONFIG_SRC_PROVIDER": "SeaweedFS",
        "RCLONE_CONFIG_SRC_ENDPOINT": endpoint,
        "RCLONE_CONFIG_SRC_ACCESS_KEY_ID": s3.access_key,
        "RCLONE_CONFIG_SRC_SECRET_ACCESS_KEY": s3.secret_key,
    }
    rclone = shutil.which("rclone", path=str(Path(sys.executable).parent)) or "rclone"
    start = time.perf_counter()
    subprocess.run(
        [rclone, "copy", f"src:{bucket}/{prefix}", str(dest), "--transfers", str(parallel),
         "--checkers", str(parallel), "--s3-disable-checksum", "--no-check-dest"],
        env=env, check=True, capture_output=True,
    )  # fmt: skip
    return time.perf_counter() - start


def local_read(paths: list[Path]) -> float:
    start = time.perf_counter()
    for path in paths:
        with path.open("rb") as f:
            while f.read(1 << 20):
                pass
    return time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="small sizes, under 30 s")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--rate", type=float, default=100.0, help="link MB/s (default 100)")
    parser.add_argument("--rtt", type=float, default=20.0, help="link round trip ms (default 20)")
    args = parser.parse_args()
    big, big_size, small = (2, 32 * MB, 60) if args.quick else (4, 256 * MB, 400)
    rate, one_way = args.rate * MB, args.rtt / 2000
    work = Path(tempfile.mkdtemp(prefix="loomfs-spoke-bench-"))
    results: dict[str, Any] = {"link_MBps": args.rate, "rtt_ms": args.rtt, "quick": args.quick}
    try:
        async with fabric(
            work / "sites", rate=rate, latency=one_way, lease_ttl=15.0, capacity=16 << 30
        ) as fab:
            sizes = make_files(fab.volume, big, big_size, small)
            await fab.hub.rescan("/vol", lambda _: None)
            with SeaweedFS() as s3:
                s3.create_bucket("bench")
                client = s3.client()
                for name in sizes:
                    client.upload_file(str(fab.volume / name), "bench", name)
                host = urlsplit(s3.endpoint)
                async with LinkEmulator(
                    host.hostname or "127.0.0.1", host.port or 80, rate=rate, latency=one_way
                ) as s3_link:
                    endpoint = f"http://127.0.0.1:{s3_link.port}"
                    for kind, parallel in (("big", 4), ("small", 16)):
                        names = sorted(n for n in sizes if n.startswith(kind + "/"))
                        total = sum(sizes[n] for n in names)
                        spoke_s = await spoke_read(
                            fab.spoke, [f"/vol/{n}" for n in names], parallel
                        )
                        rclone_s = await asyncio.to_thread(
                            rclone_copy,
                            s3,
                            endpoint,
                            "bench",
                            kind,
                            work / f"rclone-{kind}",
                            parallel,
                        )
                        results[f"cold_{kind}"] = {
                            "bytes": total,
                            "spoke_MBps": total / spoke_s / MB,
                            "rclone_MBps": total / rclone_s / MB,
                            "spoke_vs_link": total / spoke_s / rate,
                            "spoke_vs_rclone": rclone_s / spoke_s,
                        }
            names = sorted(sizes)
            total = sum(sizes.values())
            warm_s = await spoke_read(fab.spoke, [f"/vol/{n}" for n in names], 1)
            cache_files = [
                fab.spoke.cache.directory / "data" / f"{f.id}.bin" for f in fab.spoke.cache
            ]
            local_s = await asyncio.to_thread(local_read, cache_files)
            results["warm"] = {
                "bytes": total,
                "spoke_MBps": total / warm_s / MB,
                "local_MBps": total / local_s / MB,
                "spoke_vs_local": local_s / warm_s,
            }
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"link {args.rate:.0f} MB/s, {args.rtt:.0f} ms RTT (emulated, both paths)")
    for kind, goal in (("big", 0.9), ("small", 0.7)):
        r = results[f"cold_{kind}"]
        print(f"cold {kind:<5} spoke {r['spoke_MBps']:7.1f} MB/s = {r['spoke_vs_link']:.2f}x link "
              f"(goal >= {goal}); rclone {r['rclone_MBps']:7.1f} MB/s; spoke/rclone "
              f"{r['spoke_vs_rclone']:.2f}x")  # fmt: skip
    w = results["warm"]
    print(f"warm       spoke {w['spoke_MBps']:7.1f} MB/s; local read of the cache files "
          f"{w['local_MBps']:7.1f} MB/s; {w['spoke_vs_local']:.2f}x (goal >= 0.95)")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
