"""The loomfs S3 gateway next to SeaweedFS's S3, same load, same machine (bench).

Both servers start here: SeaweedFS (`weed server -s3`) and a loomfs hub serving its
gateway over a posix volume. One load generator drives both: an aiohttp client in this
process with presigned URLs (boto3 would be the bottleneck for small objects), so the
client's cost is the same for both and is reported beside each figure, with the
server's CPU (from /proc/<pid>/stat) in cores used over the phase.

1. large objects: PUT then GET of ``--large`` objects of ``--large-mb`` MB each, a few
   at once, MB/s;
2. small objects: 4 KiB GETs of ``--small`` objects with ``--concurrency`` requests in
   flight for ``--seconds`` s, ops/s.

    PYTHONPATH=src python bench/s3.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import secrets
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp
import boto3
from botocore.config import Config

from loomfs.testing.s3gateway import S3GatewayHub
from loomfs.testing.seaweedfs import SeaweedFS

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

MB = 1_000_000
SMALL = 4096
TICKS = os.sysconf("SC_CLK_TCK")
USER = ("bench", "BENCHACCESSKEY000000", "bench-secret-" + "x" * 27)


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process (all its threads) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime, stime


def own_cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


@dataclass
class Figure:
    server: str
    phase: str
    rate: float  # MB/s or ops/s
    unit: str
    seconds: float
    server_cores: float
    client_cores: float


async def measured(
    server: str, phase: str, unit: str, pid: int, work: Callable[[], Awaitable[float]]
) -> Figure:
    """Run ``work`` (which returns the amount done: MB or ops) and time it, with CPU."""
    server_before, client_before = cpu_seconds(pid), own_cpu_seconds()
    start = time.perf_counter()
    amount = await work()
    wall = time.perf_counter() - start
    return Figure(
        server,
        phase,
        amount / wall,
        unit,
        wall,
        (cpu_seconds(pid) - server_before) / wall,
        (own_cpu_seconds() - client_before) / wall,
    )


def signer(endpoint: str, key: str, secret: str) -> S3Client:
    """A boto3 client for setup and for presigning with SigV4 (its default for presigned
    URLs to a custom endpoint is the old V2 query signature)."""
    return boto3.client(
        "s3",
        endpoint_url=endpoint,
        region_name="us-east-1",
        aws_access_key_id=key,
        aws_secret_access_key=secret,
        config=Config(signature_version="s3v4", s3={"addressing_style": "path"}),
    )


class Target:
    """One S3 server: a boto3 client to sign URLs and set up, and its pid for CPU."""

    def __init__(self, name: str, client: S3Client, pid: int) -> None:
        self.name = name
        self.s3 = client
        self.pid = pid
        self.bucket = "bench-" + secrets.token_hex(4)
        self.s3.create_bucket(Bucket=self.bucket)

    def url(self, method: str, key: str) -> str:
        op = {"GET": "get_object", "PUT": "put_object"}[method]
        return self.s3.generate_presigned_url(
            op, Params={"Bucket": self.bucket, "Key": key}, ExpiresIn=3600
        )


async def put_all(
    session: aiohttp.ClientSession, urls: list[str], body: bytes, at_once: int
) -> None:
    gate = asyncio.Semaphore(at_once)

    async def one(url: str) -> None:
        async with gate, session.put(url, data=body) as response:
            if response.status != 200:
                raise RuntimeError(f"PUT {response.status}: {await response.text()}")

    await asyncio.gather(*(one(u) for u in urls))


async def get_all(session: aiohttp.ClientSession, urls: list[str], at_once: int) -> int:
    """GET every URL to its end, ``at_once`` at a time; the bytes read."""
    gate = asyncio.Semaphore(at_once)

    async def one(url: str) -> int:
        got = 0
        async with gate, session.get(url) as response:
            if response.status != 200:
                raise RuntimeError(f"GET {response.status}: {await response.text()}")
            async for chunk in response.content.iter_chunked(1 << 20):
                got += len(chunk)
        return got

    return sum(await asyncio.gather(*(one(u) for u in urls)))


async def get_loop(
    session: aiohttp.ClientSession, urls: list[str], concurrency: int, seconds: float
) -> int:
    """``concurrency`` workers GET small objects round robin for ``seconds``; ops done."""
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker(first: int) -> None:
        nonlocal done
        i = first
        while time.perf_counter() < deadline:
            async with session.get(urls[i % len(urls)]) as response:
                body = await response.read()
                if response.status != 200 or len(body) != SMALL:
                    raise RuntimeError(f"GET {response.status}, {len(body)} bytes")
            done += 1
            i += concurrency

    await asyncio.gather(*(worker(i) for i in range(concurrency)))
    return done


async def run_target(target: Target, args: argparse.Namespace) -> list[Figure]:
    large = os.urandom(16 << 20) * max(1, args.large_mb * MB // (16 << 20))
    large = large[: args.large_mb * MB]
    small = os.urandom(SMALL)
    big_keys = [f"large/{i}" for i in range(args.large)]
    small_keys = [f"small/{i:05d}" for i in range(args.small)]
    connector = aiohttp.TCPConnector(limit=max(args.concurrency, 4))
    timeout = aiohttp.ClientTimeout(total=600)
    figures = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        puts = [target.url("PUT", k) for k in big_keys]
        gets = [target.url("GET", k) for k in big_keys]

        async def put_large() -> float:
            await put_all(session, puts, large, 2)
            return len(puts) * len(large) / MB

        async def get_large() -> float:
            return await get_all(session, gets, 2) / MB

        figures.append(await measured(target.name, "large PUT", "MB/s", target.pid, put_large))
        figures.append(await measured(target.name, "large GET", "MB/s", target.pid, get_large))
        await put_all(session, [target.url("PUT", k) for k in small_keys], small, 16)
        small_gets = [target.url("GET", k) for k in small_keys]
        await get_loop(session, small_gets, args.concurrency, 1.0)  # warm connections

        async def get_small() -> float:
            return await get_loop(session, small_gets, args.concurrency, args.seconds)

        figures.append(await measured(target.name, "4 KiB GET", "ops/s", target.pid, get_small))
    return figures


def print_table(figures: list[Figure]) -> None:
    print(f"{'phase':<10} {'server':<10} {'rate':>10} {'server cores':>13} {'client cores':>13}")
    for f in figures:
        print(
            f"{f.phase:<10} {f.server:<10} {f.rate:>8.1f} {f.unit:<5} "
            f"{f.server_cores:>8.2f} {f.client_cores:>13.2f}"
        )
    by = {(f.server, f.phase): f for f in figures}
    for phase in ("large PUT", "large GET", "4 KiB GET"):
        ratio = by["loomfs", phase].rate / by["seaweedfs", phase].rate
        print(f"{phase}: loomfs / seaweedfs = {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", type=int, default=4, help="large objects")
    parser.add_argument("--large-mb", type=int, default=256, help="MB per large object")
    parser.add_argument("--small", type=int, default=1000, help="4 KiB objects")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=15.0, help="of small GETs")
    parser.add_argument("--quick", action="store_true", help="2 x 64 MB, 200 small, 5 s")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    if args.quick:
        args.large, args.large_mb, args.small, args.seconds = 2, 64, 200, 5.0
    figures: list[Figure] = []
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-s3-") as scratch:
        config = '[hub]\nrescan_interval = 0\nwatch = false\n[log]\nlevel = "WARNING"\n'
        with S3GatewayHub(Path(scratch), [USER], config) as hub:
            client = signer(hub.endpoint, USER[1], USER[2])
            figures += asyncio.run(run_target(Target("loomfs", client, hub.pid), args))
        with SeaweedFS() as weed:
            client = signer(weed.endpoint, weed.access_key, weed.secret_key)
            figures += asyncio.run(run_target(Target("seaweedfs", client, weed.pid), args))
    print_table(figures)
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=1))


if __name__ == "__main__":
    main()
