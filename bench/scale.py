"""Hub gateways over one PostgreSQL catalog and one volume: throughput with 1, 2 and 3
gateways, and what the per-path lock and the intent record cost each write (bench,
issue 20).

For each N it starts N ``loomfs hub serve`` processes over a fresh database of one
throwaway PostgreSQL, on one volume (a SeaweedFS bucket with ``--volume s3``, the
default; a shared directory with ``--volume posix``), and drives them with ``--clients``
REST clients spread evenly over the gateways, each doing in turn:

- create: a 4 KiB file written, exclusive (a new name each);
- stat: a stat of one of those files;
- read: a GET of one of those files, whole;

printing ops/s and the gateways' CPU per op (user+system of their processes, from
/proc), so that a gateway's cost per op can be compared across N.

Then the lock's cost, on the same PostgreSQL, two ways:

- the database round trips themselves, timed one after the other: a path lock's
  ``pg_try_advisory_lock`` + ``pg_advisory_unlock``, and an intent record's insert and
  delete (what ``PostgresCatalog.serialized`` and ``SharedIntentLog`` add to a write);
- sequential creates through one in-process hub as it runs, without the path lock, and
  without the intent record either (the local, fsynced intent log instead).

The clients run in this process, on the same machine: on a small machine they take CPU
from the gateways, so ops/s flatten early; CPU per op is the figure to compare.

Run: ``PYTHONPATH=src python bench/scale.py [--gateways 1,2,3] [--ops 600] [--clients 12]
[--volume s3|posix] [--json out.json]``; ``--quick``: 1 and 2 gateways, 200 ops.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg

from loomfs.config import Config
from loomfs.core.catalog.base import Catalog
from loomfs.core.catalog.postgres import PostgresCatalog
from loomfs.core.types import SYSTEM
from loomfs.rest.client import RestNamespace
from loomfs.service import HubService
from loomfs.testing.hubproc import HubProcess, cli_ok
from loomfs.testing.postgres import PostgresServer
from loomfs.testing.seaweedfs import SeaweedFS

PAYLOAD = os.urandom(4096)


async def _body(data: bytes) -> AsyncIterator[bytes]:
    yield data


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process so far, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def _phase(
    clients: list[RestNamespace], ops: int, op: Callable[[RestNamespace, int], Awaitable[Any]]
) -> float:
    """``ops`` calls of ``op`` spread over ``clients`` (each one call at a time); seconds."""
    counter = iter(range(ops))

    async def worker(client: RestNamespace) -> None:
        for n in counter:
            await op(client, n)

    started = time.perf_counter()
    await asyncio.gather(*(worker(client) for client in clients))
    return time.perf_counter() - started


async def _read(client: RestNamespace, n: int) -> None:
    async with await client.read(SYSTEM, f"/v/f{n}") as reader:
        async for _ in reader.chunks():
            pass


@contextlib.contextmanager
def _gateways(
    n: int, tmp: Path, catalog: str, volume: str, roots: Path
) -> Iterator[list[HubProcess]]:
    env = {
        "LOOMFS_HUB__VOLUME_ROOTS": str(roots),
        "LOOMFS_CATALOG__URL": catalog,
        "LOOMFS_HUB__RESCAN_INTERVAL": "0",
        "LOOMFS_HUB__WATCH": "false",  # a shared volume's events would reach each gateway
        "LOOMFS_AUDIT__ENABLED": "false",
        "LOOMFS_LOG__LEVEL": "WARNING",
    }
    with contextlib.ExitStack() as stack:
        first = stack.enter_context(HubProcess(tmp / "g0", env))
        cli_ok(first.data_dir, "--hub", first.url, "volume", "add", "/v", volume)
        rest = [stack.enter_context(HubProcess(tmp / f"g{i}", env)) for i in range(1, n)]
        yield [first, *rest]


async def _create(client: RestNamespace, n: int) -> None:
    await client.write(SYSTEM, f"/v/f{n}", _body(PAYLOAD), exclusive=True)


async def _stat(client: RestNamespace, n: int) -> None:
    await client.stat(SYSTEM, f"/v/f{n}")


PHASES: dict[str, Callable[[RestNamespace, int], Awaitable[None]]] = {
    "create": _create,
    "stat": _stat,
    "read": _read,
}


async def _drive(
    urls: list[str], admin: tuple[str, str], ops: int, per: int, pids: list[int]
) -> dict[str, int]:
    """Each phase timed, and its gateways' CPU counted, on its own."""
    clients = [RestNamespace(urls[i % len(urls)], credentials=admin) for i in range(per)]
    result: dict[str, int] = {}
    try:
        for name, op in PHASES.items():
            cpu = sum(cpu_seconds(pid) for pid in pids)
            took = await _phase(clients, ops, op)
            cpu = sum(cpu_seconds(pid) for pid in pids) - cpu
            result[f"{name}_ops_s"] = round(ops / took)
            result[f"{name}_cpu_us_op"] = round(cpu / ops * 1e6)
    finally:
        for client in clients:
            await client.close()
    return result


def throughput(
    pg: PostgresServer, n: int, ops: int, per: int, volume: Callable[[], str], roots: Path
) -> dict[str, Any]:
    with (
        tempfile.TemporaryDirectory(prefix="loomfs-scale-") as tmp,
        _gateways(n, Path(tmp), pg.create_database(), volume(), roots) as gateways,
    ):
        pids = [g.pid for g in gateways]
        urls = [g.url for g in gateways]
        return {"gateways": n} | asyncio.run(_drive(urls, gateways[0].admin, ops, per, pids))


def round_trips(pg: PostgresServer, n: int = 2000) -> dict[str, int]:
    """Microseconds per pair of statements, one after the other on one session."""
    url = pg.create_database()
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE intents (id BIGSERIAL PRIMARY KEY, owner TEXT, path TEXT)")
        started = time.perf_counter()
        for key in range(n):
            conn.execute("SELECT pg_try_advisory_lock(%s)", (key,)).fetchone()
            conn.execute("SELECT pg_advisory_unlock(%s)", (key,)).fetchone()
        lock = (time.perf_counter() - started) / n * 1e6
        started = time.perf_counter()
        for key in range(n):
            row = conn.execute(
                "INSERT INTO intents (owner, path) VALUES ('g', %s) RETURNING id", (str(key),)
            ).fetchone()
            assert row is not None
            conn.execute("DELETE FROM intents WHERE id = %s", (row[0],))
        intent = (time.perf_counter() - started) / n * 1e6
    return {"path_lock_us": round(lock), "intent_record_us": round(intent)}


async def _sequential_creates(config: Config, n: int) -> float:
    hub = HubService(config)
    await hub.start()
    try:
        volume = Path(config.site.data_dir).parent / "volume"
        volume.mkdir(exist_ok=True)
        await hub.add_volume("/v", f"posix://{volume}", lambda _: None)
        started = time.perf_counter()
        for i in range(n):
            await hub.namespace.write(SYSTEM, f"/v/f{i}", _body(PAYLOAD), exclusive=True)
        return (time.perf_counter() - started) / n * 1e6
    finally:
        await hub.stop()


@contextlib.contextmanager
def _without(*names: str) -> Iterator[None]:
    """``PostgresCatalog`` with the methods ``names`` as a single-process catalog's."""
    saved = {name: getattr(PostgresCatalog, name) for name in names}
    try:
        for name in names:
            setattr(PostgresCatalog, name, getattr(Catalog, name))
        yield
    finally:
        for name, method in saved.items():
            setattr(PostgresCatalog, name, method)


def lock_cost(pg: PostgresServer, n: int, rounds: int = 3) -> dict[str, int]:
    """Microseconds per sequential create through one in-process hub on PostgreSQL: as
    it runs (the path lock and the intent record in the database), without the path
    lock, and without either (the local intent log, fsynced); the best of ``rounds``
    alternating runs of each."""

    def config(tmp: Path) -> Config:
        return Config.model_validate(
            {"site": {"data_dir": str(tmp / "hub")}, "audit": {"enabled": False},
             "catalog": {"url": pg.create_database()},
             "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(tmp)]}}
        )  # fmt: skip

    variants: dict[str, tuple[str, ...]] = {
        "shared": (),
        "no_path_lock": ("serialized",),
        "single_process": ("serialized", "intent_records"),
    }
    best: dict[str, float] = {}
    for _ in range(rounds):
        for name, names in variants.items():
            with _without(*names), tempfile.TemporaryDirectory(prefix="loomfs-scale-") as tmp:
                took = asyncio.run(_sequential_creates(config(Path(tmp)), n))
            best[name] = min(best.get(name, took), took)
    return {f"create_us_{name}": round(us) for name, us in best.items()} | {
        "path_lock_us_per_write": round(best["shared"] - best["no_path_lock"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateways", default="1,2,3")
    parser.add_argument("--ops", type=int, default=600)
    parser.add_argument("--clients", type=int, default=12)
    parser.add_argument("--volume", choices=["s3", "posix"], default="s3")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.quick:
        args.gateways, args.ops = "1,2", 200
    results: dict[str, Any] = {"volume": args.volume, "ops": args.ops, "clients": args.clients}
    with contextlib.ExitStack() as stack:
        pg = stack.enter_context(PostgresServer())
        shared = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="loomfs-vol-")))
        count = iter(range(100))
        if args.volume == "s3":
            weed = stack.enter_context(SeaweedFS())
            os.environ["AWS_ACCESS_KEY_ID"] = weed.access_key  # the gateways' S3 backend
            os.environ["AWS_SECRET_ACCESS_KEY"] = weed.secret_key

            def volume() -> str:
                bucket = weed.create_bucket(f"scale-{next(count)}")
                return f"s3://{bucket}?endpoint={weed.endpoint}"
        else:

            def volume() -> str:
                path = shared / f"v{next(count)}"
                path.mkdir()
                return f"posix://{path}"

        rows = []
        for n in [int(x) for x in args.gateways.split(",")]:
            row = throughput(pg, n, args.ops, args.clients, volume, shared)
            print(json.dumps(row), flush=True)
            rows.append(row)
        results["throughput"] = rows
        results["round_trips"] = round_trips(pg)
        print(json.dumps(results["round_trips"]), flush=True)
        results["lock_cost"] = lock_cost(pg, min(args.ops, 200))
        print(json.dumps(results["lock_cost"]), flush=True)
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
