"""The loomfs S3 gateway next to SeaweedFS's S3, same load, same machine (bench).

Both servers start here: SeaweedFS (`weed server -s3`) and a loomfs hub serving its
gateway over a posix volume. One load generator drives both: an aiohttp client in this
process with presigned URLs (boto3 would be the bottleneck for small objects), so the
client's cost is the same for both and is reported beside each figure, with the
server's CPU (from /proc/<pid>/stat) in cores used over the phase.

1. large objects: PUT then GET of ``--large`` objects of ``--large-mb`` MB each, two
   at once, MB/s;
2. small objects: 4 KiB GETs of ``--small`` objects with ``--concurrency`` requests in
   flight for ``--seconds`` s, ops/s.

Both servers run at once and each round measures one after the other, ``--rounds``
times; the median round is reported (the machine is shared and its load drifts).

``--versioned`` measures instead what versioning costs loomfs (issue 17): a ``--large-mb``
object PUT, then overwritten twice with 1% of it (one run of bytes) changed each time,
into an unversioned and a versioned bucket in turn, ``--rounds`` times; per overwrite its
MB/s and the bytes the version store grew by. The first overwrite keeps an old version
none of whose chunks are stored yet, the second one that shares all but the edit with it.

    PYTHONPATH=src python bench/s3.py [--quick] [--json out.json]
    PYTHONPATH=src python bench/s3.py --versioned [--rounds 3]
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

from loomfs.testing.s3gateway import s3_gateway_hub
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


class Load:
    """One server's objects and presigned URLs, made once; ``phases`` measures them."""

    def __init__(self, target: Target, args: argparse.Namespace) -> None:
        self.target = target
        self.args = args
        self.big_keys = [f"large/{i}" for i in range(args.large)]
        self.small_keys = [f"small/{i:05d}" for i in range(args.small)]
        self.puts = [target.url("PUT", k) for k in self.big_keys]
        self.gets = [target.url("GET", k) for k in self.big_keys]
        self.small_gets = [target.url("GET", k) for k in self.small_keys]

    async def setup(self, session: aiohttp.ClientSession) -> None:
        urls = [self.target.url("PUT", k) for k in self.small_keys]
        await put_all(session, urls, os.urandom(SMALL), 16)

    async def phases(self, session: aiohttp.ClientSession, large: bytes) -> list[Figure]:
        t, args = self.target, self.args

        async def put_large() -> float:
            await put_all(session, self.puts, large, 2)
            return len(self.puts) * len(large) / MB

        async def get_large() -> float:
            return await get_all(session, self.gets, 2) / MB

        async def get_small() -> float:
            return await get_loop(session, self.small_gets, args.concurrency, args.seconds)

        await get_loop(session, self.small_gets, args.concurrency, 0.5)  # warm connections
        return [
            await measured(t.name, "large PUT", "MB/s", t.pid, put_large),
            await measured(t.name, "large GET", "MB/s", t.pid, get_large),
            await measured(t.name, "4 KiB GET", "ops/s", t.pid, get_small),
        ]


async def run(targets: list[Target], args: argparse.Namespace) -> list[Figure]:
    """``args.rounds`` rounds, each measuring every server in turn, so that a shared
    machine's changing load falls on both alike."""
    block = os.urandom(16 << 20)
    large = (block * (args.large_mb * MB // len(block) + 1))[: args.large_mb * MB]
    loads = [Load(t, args) for t in targets]
    connector = aiohttp.TCPConnector(limit=max(args.concurrency, 4))
    timeout = aiohttp.ClientTimeout(total=600)
    figures: list[Figure] = []
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        for load in loads:
            await load.setup(session)
        for _ in range(args.rounds):
            for load in loads:
                figures += await load.phases(session, large)
    return figures


@dataclass
class Overwrite:
    figure: Figure
    round: int
    changed: int  # bytes of the object this overwrite changed
    stored: int  # bytes the version store grew by


def stored_bytes(root: Path) -> int:
    return sum(f.stat().st_size for f in root.rglob("*") if f.is_file())


async def overwrite_rounds(
    plain: Target, versioned: Target, versions: Path, args: argparse.Namespace
) -> list[Overwrite]:
    """Per round and bucket: PUT a random object, then two overwrites with a different
    1% changed each; each overwrite's MB/s and the version store's growth."""
    size = args.large_mb * MB
    edit = size // 100
    rows: list[Overwrite] = []
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        for n in range(args.rounds):
            body = bytearray(os.urandom(size))
            bodies = [bytes(body)]
            for at in (size // 3, 2 * size // 3):
                body[at : at + edit] = os.urandom(edit)
                bodies.append(bytes(body))
            for target in (plain, versioned):
                url = target.url("PUT", f"overwrite/{n}")
                await put_all(session, [url], bodies[0], 1)
                for which, data in enumerate(bodies[1:], 1):
                    before = stored_bytes(versions)

                    async def put(data: bytes = data, url: str = url) -> float:
                        await put_all(session, [url], data, 1)
                        return len(data) / MB

                    state = "versioned" if target is versioned else "unversioned"
                    figure = await measured(state, f"overwrite {which}", "MB/s", target.pid, put)
                    rows.append(Overwrite(figure, n, edit, stored_bytes(versions) - before))
    return rows


def print_overwrites(rows: list[Overwrite]) -> None:
    for which in ("overwrite 1", "overwrite 2"):
        for state in ("unversioned", "versioned"):
            got = sorted(
                (r for r in rows if (r.figure.phase, r.figure.server) == (which, state)),
                key=lambda r: r.figure.rate,
            )
            mid = got[len(got) // 2]
            print(
                f"{which} {state:<12} median {mid.figure.rate:7.1f} MB/s, server cores "
                f"{mid.figure.server_cores:.2f}, stored {mid.stored / MB:7.2f} MB "
                f"({mid.stored / mid.changed:.2f}x the changed bytes); rounds: "
                + ", ".join(f"{r.figure.rate:.0f} MB/s {r.stored / MB:.1f} MB" for r in got)
            )


def medians(figures: list[Figure]) -> dict[tuple[str, str], Figure]:
    """Per (server, phase), the round with the median rate."""
    groups: dict[tuple[str, str], list[Figure]] = {}
    for f in figures:
        groups.setdefault((f.server, f.phase), []).append(f)
    return {k: sorted(v, key=lambda f: f.rate)[len(v) // 2] for k, v in groups.items()}


def print_table(figures: list[Figure]) -> None:
    by = medians(figures)
    head = ("phase", "server", "median rate", "server cores", "client cores")
    print("{:<10} {:<10} {:>16} {:>13} {:>13}".format(*head))
    for (server, phase), f in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        rounds = [g.rate for g in figures if (g.server, g.phase) == (server, phase)]
        print(
            f"{phase:<10} {server:<10} {f.rate:>10.1f} {f.unit:<5} "
            f"{f.server_cores:>13.2f} {f.client_cores:>13.2f}   rounds: "
            + ", ".join(f"{r:.0f}" for r in rounds)
        )
    for phase in ("large PUT", "large GET", "4 KiB GET"):
        ratio = by["loomfs", phase].rate / by["seaweedfs", phase].rate
        print(f"{phase}: loomfs / seaweedfs = {ratio:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--large", type=int, default=4, help="large objects")
    parser.add_argument("--large-mb", type=int, default=256, help="MB per large object")
    parser.add_argument("--small", type=int, default=1000, help="4 KiB objects")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--seconds", type=float, default=10.0, help="of small GETs")
    parser.add_argument("--rounds", type=int, default=3, help="medians are reported")
    parser.add_argument("--quick", action="store_true", help="2 x 64 MB, 200 small, 5 s, 1 round")
    parser.add_argument("--json", type=Path, help="write every round's figures here")
    parser.add_argument(
        "--versioned", action="store_true", help="loomfs only: overwrites, versioned or not"
    )
    args = parser.parse_args()
    if args.versioned:
        versioned_main(args)
        return
    if args.quick:
        args.large, args.large_mb, args.small, args.seconds, args.rounds = 2, 64, 200, 5.0, 1
    config = '[hub]\nrescan_interval = 0\nwatch = false\n[log]\nlevel = "WARNING"\n'
    with (
        tempfile.TemporaryDirectory(prefix="loomfs-bench-s3-") as scratch,
        s3_gateway_hub(Path(scratch), [USER], config) as hub,
        SeaweedFS() as weed,
    ):
        targets = [
            Target("loomfs", signer(hub.urls["s3"], USER[1], USER[2]), hub.pid),
            Target("seaweedfs", signer(weed.endpoint, weed.access_key, weed.secret_key), weed.pid),
        ]
        figures = asyncio.run(run(targets, args))
    print_table(figures)
    if args.json:
        args.json.write_text(json.dumps([asdict(f) for f in figures], indent=1))


def versioned_main(args: argparse.Namespace) -> None:
    config = '[hub]\nrescan_interval = 0\nwatch = false\n[log]\nlevel = "WARNING"\n'
    with (
        tempfile.TemporaryDirectory(prefix="loomfs-bench-s3-") as scratch,
        s3_gateway_hub(Path(scratch), [USER], config) as hub,
    ):
        client = signer(hub.urls["s3"], USER[1], USER[2])
        plain, versioned = Target("loomfs", client, hub.pid), Target("loomfs", client, hub.pid)
        client.put_bucket_versioning(
            Bucket=versioned.bucket, VersioningConfiguration={"Status": "Enabled"}
        )
        versions = Path(scratch) / "hub" / "versions"
        rows = asyncio.run(overwrite_rounds(plain, versioned, versions, args))
    print_overwrites(rows)
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=1))


if __name__ == "__main__":
    main()
