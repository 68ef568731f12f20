"""What residency checks cost the hub per request, beside the same requests unchecked (bench).

A hub over a posix volume of small files serves stat and 4 KiB reads to a remote site
(a spoke's principal, as the fabric link gives it) directly from its namespace, and
through the placement wrapper with: no policies; a path policy; a path and a tag policy
(each data request then also reads the file's and its directories' tags). The hub's
catalog and volume are the same for all; only the check differs. No network: the ratios
are the checks' own cost, an upper bound on what a spoke sees over a WAN.

    python bench/placement.py [--files 300] [--rounds 8] [--json out.json]
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

from loomfs.config import Config
from loomfs.core.placement import Policy
from loomfs.core.types import Principal
from loomfs.namespace.base import Namespace
from loomfs.namespace.governed import GovernedNamespace
from loomfs.service import HubService

SPOKE = Principal(user="site:gpu-us", site="gpu-us", protocol="fabric")


async def requests(ns: Namespace, paths: list[str]) -> float:
    """A stat and a 4 KiB read of every file; seconds."""
    start = time.perf_counter()
    for path in paths:
        await ns.stat(SPOKE, path)
        async with await ns.read(SPOKE, path, 0, 4096) as reader:
            await reader.read_all()
    return time.perf_counter() - start


async def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=8, help="timed rounds; the best counts")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--quick", action="store_true", help="a short run (make bench-quick)")
    args = parser.parse_args()
    if args.quick:
        args.files, args.rounds = 50, 2
    work = Path(tempfile.mkdtemp(prefix="loomfs-placement-bench-"))
    (work / "vol" / "pub").mkdir(parents=True)
    for i in range(args.files):
        (work / "vol" / "pub" / f"f{i:05d}.bin").write_bytes(os.urandom(16384))
    hub = HubService(
        Config.model_validate(
            {
                "site": {"data_dir": str(work / "hub")},
                "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(work)]},
            }
        )
    )
    best: dict[str, float] = {}
    try:
        await hub.start()
        await hub.add_volume("/vol", f"posix://{work / 'vol'}", lambda _: None)
        paths = [f"/vol/pub/f{i:05d}.bin" for i in range(args.files)]
        placed = GovernedNamespace(hub.namespace, [hub.placement])
        store = hub.placement.store
        setups: list[tuple[str, Namespace, Policy | None]] = [
            ("unchecked", hub.namespace, None),
            ("no_policy", placed, None),
            ("path_policy", placed, Policy.build("eu", ["/vol/eu/**"], ["region=eu"])),
            ("tag_policy", placed, Policy.build("eu", ["/vol/eu/**"], ["region=eu"], "res=eu")),
        ]
        await requests(hub.namespace, paths)  # the page cache and the catalog warm
        for round_ in range(args.rounds):
            turn = round_ % len(setups)  # each setup goes first in some round
            for name, ns, policy in setups[turn:] + setups[:turn]:
                if policy is not None:
                    await store.put(policy)
                await hub.placement.reload(force=True)
                seconds = await requests(ns, paths)
                best[name] = min(best.get(name, seconds), seconds)
                if policy is not None:
                    await store.remove(policy.name)
    finally:
        await hub.stop()
        shutil.rmtree(work, ignore_errors=True)
    per_op = {name: seconds / args.files * 1e6 for name, seconds in best.items()}
    results: dict[str, Any] = {
        "files": args.files,
        "us_per_stat_and_read": per_op,
        "overhead": {n: per_op[n] / per_op["unchecked"] - 1 for n in per_op if n != "unchecked"},
    }
    print(f"stat + 4 KiB read of {args.files} files by a remote site, best of {args.rounds}")
    for name, micros in per_op.items():
        extra = "" if name == "unchecked" else f"   +{results['overhead'][name]:.1%}"
        print(f"{name:<12} {micros:8.0f} us{extra}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    asyncio.run(main())
