"""NFS per-call round trips: loomfs's NFSv3 server against nfs-ganesha, one RPC at a time.

What a stat-heavy client (``ls -l``, ``find``, a training job's file checks) waits for
per call, without the kernel client's caches: the RPC client of ``loomfs.testing.nfs``,
on the host in the namespace of a ``loomfs.testing.guest`` guest (which only lends its
network namespace: nothing runs in the guest), sends NULL, GETATTR, LOOKUP and ACCESS
one at a time to nfs-ganesha (VFS FSAL) exporting a plain directory and to a loomfs hub
(``loomfs.testing.guesthub``) exporting a posix volume beside it, after creating the
same ``--files`` files over NFS on each; READDIRPLUS of that directory is given per
entry. Rounds alternate which server goes first; a row is the median over every call of
the rounds. Prints each row with the loomfs/ganesha ratio of the times (goal: <= 1.25,
that is >= 0.8x ganesha's rate) and the load average. Needs root, qemu-system-x86,
nfs-ganesha, rpcbind.

    sudo env PYTHONPATH=src python bench/nfs_ops.py [--calls 2000] [--files 50] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from loomfs.protocols.nfs.xdr import Packer
from loomfs.testing.guest import Ganesha, Guest
from loomfs.testing.guesthub import GuestHub
from loomfs.testing.nfs import RpcClient, diropargs, handle_args, sattr

OPS = ("null", "getattr", "lookup", "access", "readdirplus/entry")
GETATTR, LOOKUP, ACCESS, CREATE, MKDIR, READDIRPLUS = 1, 3, 4, 8, 9, 17


async def _calls(host: str, port: int, mount_port: int, export: str, calls: int, files: int,
                 tag: str) -> dict[str, list[float]]:  # fmt: skip
    async with RpcClient(mount_port, uid=0, gid=0, host=host) as m:
        root = await m.mount(export)
    times: dict[str, list[float]] = {op: [] for op in OPS}
    async with RpcClient(port, uid=0, gid=0, host=host) as c:
        body = await c.nfs(MKDIR, diropargs(root, f"ops-{tag}") + sattr(mode=0o755))
        assert body.uint() == 0, "MKDIR failed"
        body.boolean()
        directory = body.opaque(64)
        handles = []
        for i in range(files):
            args = diropargs(directory, f"f{i}") + (0).to_bytes(4, "big") + sattr(mode=0o644)
            body = await c.nfs(CREATE, args)
            assert body.uint() == 0, "CREATE failed"
            body.boolean()
            handles.append(body.opaque(64))
        listing = Packer()
        listing.opaque(directory)
        listing.uhyper(0)
        listing.fixed(b"\0" * 8)
        listing.uint(files * 200)  # dircount and maxcount: all of it in one reply
        listing.uint(files * 400)
        for i in range(calls):
            handle, name = handles[i % files], f"f{i % files}"
            began = time.perf_counter()
            await c.call(100003, 3, 0)
            t1 = time.perf_counter()
            await c.nfs(GETATTR, handle_args(handle))
            t2 = time.perf_counter()
            status, _ = await c.lookup(directory, name)
            t3 = time.perf_counter()
            await c.nfs(ACCESS, handle_args(handle, (0x3F).to_bytes(4, "big")))
            t4 = time.perf_counter()
            assert status == 0, "LOOKUP failed"
            for op, seconds in zip(OPS[:4], (t1 - began, t2 - t1, t3 - t2, t4 - t3), strict=True):
                times[op].append(seconds)
            if i % 20 == 0:
                await c.nfs(READDIRPLUS, listing.value())
                times["readdirplus/entry"].append((time.perf_counter() - t4) / files)
    return times


def _client(argv: list[str]) -> None:
    host, port, mount_port, export, calls, files, tag = argv
    times = asyncio.run(_calls(host, int(port), int(mount_port), export, int(calls),
                               int(files), tag))  # fmt: skip
    print(json.dumps(times))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls of each procedure a round")
    ap.add_argument("--files", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--client", nargs=7, help=argparse.SUPPRESS)  # the netns's half
    args = ap.parse_args()
    if args.client:
        _client(args.client)
        return
    totals: dict[str, dict[str, list[float]]] = {"ganesha": {}, "loomfs": {}}
    with tempfile.TemporaryDirectory(prefix="loomfs-nfsops-") as tmp:
        scratch = Path(tmp)
        plain, vol = scratch / "ganesha", scratch / "vol"
        plain.mkdir()
        vol.mkdir()
        with (
            Guest(memory_mb=256, timeout=3600) as guest,
            Ganesha(guest, plain) as ganesha,
            GuestHub(guest, scratch / "site", vol, nfs_port=2050),
        ):
            servers = {"ganesha": ("2049", "20048", ganesha.export.path),
                       "loomfs": ("2050", "2050", "/x")}  # fmt: skip
            for r in range(args.rounds):
                for name in list(servers)[:: 1 if r % 2 == 0 else -1]:
                    argv = [sys.executable, __file__, "--client", guest.host_ip,
                            *servers[name], str(args.calls), str(args.files), f"r{r}"]  # fmt: skip
                    done = subprocess.run(guest.command(argv), capture_output=True, text=True,
                                          check=False, env=os.environ)  # fmt: skip
                    if done.returncode != 0:
                        raise SystemExit(f"{name}: {done.stderr[-2000:]}")
                    for op, seconds in json.loads(done.stdout).items():
                        totals[name].setdefault(op, []).extend(seconds)
    print(f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"{'op':20} {'ganesha ms':>11} {'loomfs ms':>10} {'ratio':>6}")
    for op in OPS:
        g = statistics.median(totals["ganesha"][op]) * 1000
        lo = statistics.median(totals["loomfs"][op]) * 1000
        print(f"{op:20} {g:11.3f} {lo:10.3f} {lo / g:6.2f}")


if __name__ == "__main__":
    main()
