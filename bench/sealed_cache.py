"""Warm reads from a spoke cache sealed with AES-GCM, next to a plain one (bench).

Two spokes of one hub hold the same files in their caches, one plain and one sealed
(``[spoke] cache_key_file``). Warm reads (nothing crosses the link) are timed side by side:

1. through the namespace API (what FUSE and the SDK call): the plain cache hands back file
   regions read with pread, the sealed one decrypts each 1 MiB block;
2. over HTTP from each spoke's REST server: the plain cache goes out with sendfile, the
   sealed one through memory (the shortcut encryption costs);
3. a plain read of the plain cache's own files (the local disk) as the peer of both.

    python bench/sealed_cache.py [--quick] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from loomfs.core.types import Principal
from loomfs.rest.server import RestServer
from loomfs.rest.wire import API
from loomfs.spoke.namespace import SpokeNamespace
from loomfs.testing.fabric import fabric
from spoke_read import local_read

WHO = Principal(user="bench")
MB = 1_000_000
PLAIN, SEALED = "plain", "sealed"


async def namespace_read(spoke: SpokeNamespace, paths: list[str]) -> float:
    start = time.perf_counter()
    for path in paths:
        async with await spoke.read(WHO, path) as reader:
            async for _ in reader.chunks():
                pass
    return time.perf_counter() - start


async def http_read(spoke: SpokeNamespace, paths: list[str]) -> float:
    runner = web.AppRunner(RestServer(spoke, spoke=spoke).app(), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            start = time.perf_counter()
            for path in paths:
                async with session.get(f"http://127.0.0.1:{port}{API}/files{path}") as response:
                    response.raise_for_status()
                    async for _ in response.content.iter_chunked(1 << 20):
                        pass
            return time.perf_counter() - start
    finally:
        await runner.cleanup()


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="4 x 16 MB instead of 8 x 64 MB")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds; the best counts")
    parser.add_argument("--json", type=Path, help="write the figures here")
    args = parser.parse_args()
    count, size = (4, 16 * MB) if args.quick else (8, 64 * MB)
    total = count * size
    work = Path(tempfile.mkdtemp(prefix="loomfs-sealed-bench-"))
    best: dict[str, float] = {}
    try:
        async with fabric(
            work / "sites", (PLAIN, SEALED), sealed=(SEALED,), capacity=8 << 30
        ) as fab:
            for i in range(count):
                (fab.volume / f"f{i}.bin").write_bytes(os.urandom(size))
            await fab.hub.rescan("/vol", lambda _: None)
            paths = [f"/vol/f{i}.bin" for i in range(count)]
            plain, sealed = fab.spokes[PLAIN], fab.spokes[SEALED]
            for spoke in (plain, sealed):  # fill both caches; the timed reads are warm
                await namespace_read(spoke, paths)
            cache_files = [plain.cache.directory / "data" / f"{f.id}.bin" for f in plain.cache]
            for _ in range(args.rounds):
                timings = {
                    "local": await asyncio.to_thread(local_read, cache_files),
                    "ns_plain": await namespace_read(plain, paths),
                    "ns_sealed": await namespace_read(sealed, paths),
                    "http_plain": await http_read(plain, paths),
                    "http_sealed": await http_read(sealed, paths),
                }
                for name, seconds in timings.items():
                    best[name] = min(best.get(name, seconds), seconds)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rates = {name: total / seconds / MB for name, seconds in best.items()}
    results: dict[str, Any] = {
        "bytes": total,
        "MBps": rates,
        "ns_sealed_vs_plain": rates["ns_sealed"] / rates["ns_plain"],
        "http_sealed_vs_plain": rates["http_sealed"] / rates["http_plain"],
        "ns_sealed_vs_local": rates["ns_sealed"] / rates["local"],
    }
    print(f"warm reads of {count} x {size / MB:.0f} MB, best of {args.rounds}")
    print(f"local read of the cache files  {rates['local']:8.0f} MB/s")
    print(f"namespace  plain {rates['ns_plain']:8.0f} MB/s   sealed {rates['ns_sealed']:8.0f} MB/s"
          f"   sealed/plain {results['ns_sealed_vs_plain']:.2f}x"
          f"   sealed/local {results['ns_sealed_vs_local']:.2f}x")  # fmt: skip
    print(f"http       plain {rates['http_plain']:8.0f} MB/s   sealed {rates['http_sealed']:8.0f}"
          f" MB/s   sealed/plain {results['http_sealed_vs_plain']:.2f}x")  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
