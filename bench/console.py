"""The console's cost, next to its peers, in one run (bench).

1. A page of a directory of ``--files`` entries (1,000,000 by default) through a hub
   process's console: its first page, one deep inside (``?after=``) and the charts, median
   of ``--rounds`` loads each, against ``ls`` of the same directory on the local disk (the
   peer: what a person at the machine would type).
2. The data path with a console open: REST writes and reads of ``--objects`` files of 1 MiB
   through the same hub, in rounds alternating a console that reloads its charts and a
   listing every ``--refresh`` seconds with none; MB/s medians of each and their ratio.

Goals (issue 19): a page in < 1 s at 1M files; the data path within 5% (>= 0.95x) with a
console open.

    python bench/console.py [--quick] [--files N] [--objects N] [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp

from loomfs.core.types import Principal
from loomfs.rest.client import RestNamespace
from loomfs.testing.hubproc import HubProcess, cli_ok

WHO = Principal(user="admin")
MIB = 1 << 20


def make_files(directory: Path, count: int) -> None:
    directory.mkdir(parents=True)
    for n in range(count):
        os.close(os.open(directory / f"f{n:07}", os.O_CREAT | os.O_WRONLY, 0o644))


def ls_seconds(directory: Path, rounds: int) -> float:
    """The median time of ``ls`` of ``directory`` (after one that warms the page cache,
    as the console's first load warms the catalog's)."""
    took = []
    for _ in range(rounds + 1):
        began = time.perf_counter()
        subprocess.run(["ls", str(directory)], check=True, stdout=subprocess.DEVNULL)
        took.append(time.perf_counter() - began)
    return statistics.median(took[1:])


async def login(http: aiohttp.ClientSession, key: str, secret: str) -> None:
    form = await (await http.get("/ui/login")).text()
    found = re.search(r'name="csrf" value="([^"]+)"', form)
    assert found is not None, form
    data = {"csrf": found.group(1), "access_key": key, "secret": secret}
    answer = await http.post("/ui/login", data=data, allow_redirects=False)
    assert answer.status == 303, await answer.text()


async def load(http: aiohttp.ClientSession, url: str) -> float:
    began = time.perf_counter()
    async with http.get(url) as answer:
        body = await answer.read()
        assert answer.status == 200, body[:500]
    return time.perf_counter() - began


@contextlib.asynccontextmanager
async def console(url: str, admin: tuple[str, str]) -> AsyncIterator[aiohttp.ClientSession]:
    # unsafe: keep the session cookie of a site at an IP address (127.0.0.1)
    async with aiohttp.ClientSession(url, cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        await login(http, *admin)
        yield http


async def pages(hub: HubProcess, files: int, rounds: int, directory: Path) -> None:
    async with console(hub.url, hub.admin) as http:
        urls = {
            "first page": "/ui/browse/vol/big",
            "a page half way": f"/ui/browse/vol/big?after=f{files // 2:07}",
            "charts (24h)": "/ui/charts?span=24h",
        }
        ls_median = await asyncio.to_thread(ls_seconds, directory, rounds)
        print(f"\n{files:,} entries in one directory; median of {rounds} loads")
        print(f"{'page':<18}{'loomfs s':>10}{'ls s':>9}{'ratio':>8}")
        for name, url in urls.items():
            await load(http, url)  # a first load warms the catalog's pages
            took = statistics.median([await load(http, url) for _ in range(rounds)])
            print(f"{name:<18}{took:>10.3f}{ls_median:>9.3f}{took / ls_median:>7.2f}x")


async def data_path(hub: HubProcess, objects: int, rounds: int, refresh: float) -> None:
    client = RestNamespace(hub.url, credentials=hub.admin)
    body = os.urandom(MIB)

    async def one_round(n: int) -> float:
        began = time.perf_counter()
        for i in range(objects):
            await client.write_bytes(WHO, f"/vol/load/r{n}-{i}", body)
        for i in range(objects):
            assert len(await client.read_bytes(WHO, f"/vol/load/r{n}-{i}")) == MIB
        return 2 * objects / (time.perf_counter() - began)

    async def refreshing(http: aiohttp.ClientSession) -> None:
        while True:
            await load(http, "/ui/charts")
            await load(http, "/ui/browse/vol/load")
            await asyncio.sleep(refresh)

    rates: dict[bool, list[float]] = {False: [], True: []}
    try:
        async with console(hub.url, hub.admin) as http:
            for n in range(2 * rounds):
                with_console = n % 2 == 1
                task = asyncio.create_task(refreshing(http)) if with_console else None
                try:
                    rates[with_console].append(await one_round(n))
                finally:
                    if task is not None:
                        task.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await task
    finally:
        await client.close()
    off, on = statistics.median(rates[False]), statistics.median(rates[True])
    print(f"\nREST 1 MiB writes+reads, {objects} each, {rounds} rounds each, alternated")
    print(f"  no console      {off:8.1f} MB/s")
    print(f"  console open    {on:8.1f} MB/s  (refreshing every {refresh:g} s)")
    print(f"  ratio           {on / off:8.2f}x  (goal >= 0.95x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="20,000 files, 30 objects")
    parser.add_argument("--files", type=int, default=1_000_000)
    parser.add_argument("--objects", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--refresh", type=float, default=1.0, help="seconds between reloads")
    args = parser.parse_args()
    if args.quick:
        args.files, args.objects, args.rounds = 20_000, 30, 3
    scratch = Path(tempfile.mkdtemp(prefix="loomfs-bench-console-"))
    try:
        volume = scratch / "data"
        began = time.perf_counter()
        make_files(volume / "big", args.files)
        (volume / "load").mkdir()
        print(f"made {args.files:,} files in {time.perf_counter() - began:.1f} s")
        with HubProcess(scratch / "hub") as hub:
            began = time.perf_counter()
            cli_ok(scratch / "hub", "--hub", hub.url, "volume", "add", "/vol", f"posix://{volume}")
            print(f"imported them in {time.perf_counter() - began:.1f} s")
            asyncio.run(pages(hub, args.files, args.rounds, volume / "big"))
            asyncio.run(data_path(hub, args.objects, args.rounds, args.refresh))
        print(f"load average: {os.getloadavg()[0]:.1f}")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
