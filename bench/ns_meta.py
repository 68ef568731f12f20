"""Metadata operations on the hub namespace a local mount runs, next to the local disk
(bench, issue 7).

``loomfs mount`` over a local configuration runs its site's hub in its own process
(``HubService(durable=[fuse] durable_each_change)``, false by default) and hands every
FUSE create, lookup and unlink to ``service.governed``: ACLs, audit, the hub namespace,
its SQLite catalog and the posix volume, with the volume's inotify watcher running. This
bench builds exactly that, in-process and without FUSE, and times N of each, one after
the other as the kernel sends them:

- create: ``write(path, b"", exclusive=True, mode=0o644)`` (a FUSE create);
- stat: ``stat(path)`` (a lookup or getattr);
- remove: ``remove(path)`` (an unlink);

and beside them, in alternating rounds of 500, the same N ``os.open(O_CREAT|O_EXCL)``
and ``close``, ``os.stat`` and ``os.unlink`` on the local disk the volume is on,
printing ops/s and the ratio loomfs/local (a ceiling: the namespace does that disk work
and records it too).

Run: ``PYTHONPATH=src python bench/ns_meta.py [--files N] [--dir DIR] [--json out.json]
[--profile out.prof]`` (``--profile``: cProfile of the loomfs runs only; ``--dir
/dev/shm``: both on tmpfs, so that what is measured is loomfs's own cost, not a shared
disk's journal).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from loomfs.config import load_config
from loomfs.core.acl import ADMIN_GROUP
from loomfs.core.streams import aiter_bytes
from loomfs.core.types import Principal
from loomfs.namespace.governed import GovernedNamespace
from loomfs.service import HubService
from loomfs.testing.fuse import prepare_site

OPS = ("create", "stat", "remove")
#: whom a FUSE mount run as root acts as
WHO = Principal(user="root", protocol="fuse")
#: whom an NFS client's root (not squashed) acts as
NFS_WHO = Principal(user="root", groups=frozenset({ADMIN_GROUP}), protocol="nfs")
#: files per round: loomfs and the local disk take turns
ROUND = 500


async def measure(
    config: Path,
    disk: Path,
    files: int,
    profile: cProfile.Profile | None,
    *,
    durable: bool = False,
    nfs: bool = False,
) -> dict[str, dict[str, float]]:
    """ops/s of each operation on the namespace a local mount serves and on the local
    disk, in alternating rounds, so that a burst of load on the machine hits both alike."""
    cfg = load_config(config)
    service = HubService(cfg, durable=durable or cfg.fuse.durable_each_change)
    await service.start()
    ns = service.governed
    ours = [f"/vol/d/f{i:06d}" for i in range(files)]
    theirs = [str(disk / f"f{i:06d}") for i in range(files)]
    flags = os.O_CREAT | os.O_WRONLY | os.O_EXCL | os.O_CLOEXEC
    who = NFS_WHO if nfs else WHO
    hub_calls: dict[str, Callable[[str], Awaitable[object]]] = {
        "create": lambda n: ns.write(who, n, aiter_bytes(b""), exclusive=True, mode=0o644),
        "stat": lambda n: ns.stat(who, n),
        "remove": lambda n: ns.remove(who, n),
    }
    if nfs:
        hub_calls = {op: _as_nfs(ns, who, op, call) for op, call in hub_calls.items()}
    local_calls: dict[str, Callable[[str], object]] = {
        "create": lambda n: os.close(os.open(n, flags, 0o644)),
        "stat": os.stat,
        "remove": os.unlink,
    }
    seconds = {side: dict.fromkeys(OPS, 0.0) for side in ("loomfs", "local")}
    try:
        await ns.mkdir(WHO, "/vol/d")
        for op in OPS:
            for at in range(0, files, ROUND):
                start = time.perf_counter()
                for name in theirs[at : at + ROUND]:
                    local_calls[op](name)
                seconds["local"][op] += time.perf_counter() - start
                if profile is not None:
                    profile.enable()
                start = time.perf_counter()
                for name in ours[at : at + ROUND]:
                    await hub_calls[op](name)
                seconds["loomfs"][op] += time.perf_counter() - start
                if profile is not None:
                    profile.disable()
        assert not [e async for e in ns.list(WHO, "/vol/d")], "every file was removed"
    finally:
        await service.stop()
    return {side: {op: files / s for op, s in by_op.items()} for side, by_op in seconds.items()}


def _as_nfs(
    ns: GovernedNamespace, who: Principal, op: str, call: Callable[[str], Awaitable[object]]
) -> Callable[[str], Awaitable[object]]:
    """``call`` with the namespace calls an NFS server makes around it
    (``protocols.nfs.server``): a CREATE stats the directory before and after (its
    wcc_data), a REMOVE the name too."""

    async def procedure(name: str) -> None:
        directory = name.rpartition("/")[0]
        if op == "create":
            await ns.stat(who, directory)
            await call(name)
            await ns.stat(who, directory)
        elif op == "remove":
            await ns.stat(who, directory)
            await ns.stat(who, name)
            await call(name)
            await ns.stat(who, directory)
        else:
            await call(name)

    return procedure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=10_000)
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--profile", type=Path, help="write a cProfile of the loomfs runs")
    parser.add_argument(
        "--durable", action="store_true", help="as `loomfs hub serve` (each change fsynced)"
    )
    parser.add_argument(
        "--nfs", action="store_true", help="each call with the stats an NFS server adds"
    )
    parser.add_argument(
        "--dir", help="where the site and the disk's files go (/dev/shm: no disk's noise)"
    )
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile else None
    with tempfile.TemporaryDirectory(prefix="loomfs-ns-meta-", dir=args.dir) as tmp:
        root = Path(tmp)
        (root / "vol").mkdir()
        (root / "disk").mkdir()
        config = prepare_site(root, {"/vol": root / "vol"})
        rates = asyncio.run(
            measure(config, root / "disk", args.files, profile, durable=args.durable, nfs=args.nfs)
        )
    if profile is not None:
        profile.dump_stats(args.profile)
    where = args.dir or tempfile.gettempdir()
    print(f"{args.files} empty files in {where}, one after another (load {os.getloadavg()[0]:.2f})")
    print(f"{'op':8} {'loomfs ops/s':>14} {'local ops/s':>14} {'ratio':>7}")
    ours, theirs = rates["loomfs"], rates["local"]
    for op in OPS:
        print(f"{op:8} {ours[op]:14,.0f} {theirs[op]:14,.0f} {ours[op] / theirs[op]:7.3f}")
    if args.json:
        args.json.write_text(json.dumps({"files": args.files, **rates}))


if __name__ == "__main__":
    main()
