"""What governance costs: metadata operations and small reads with authorization and audit
off and on, side by side in one run (bench).

One hub (SQLite catalog, a posix volume of 4 KiB files) is measured four ways:

* namespace API, governance off: the bare ``HubNamespace``;
* namespace API, governance on: ``GovernedNamespace`` with the ACL authorizer (rules on
  the tree, the caller allowed through a group grant under a private export) and the
  real audit log (``core.audit.AuditLog``: hash-chained, batched, fsynced by its writer
  thread) in the run's temporary directory;
* REST, off: the REST API over the bare namespace, no authentication;
* REST, on: HTTP Basic credentials checked, the governed namespace, the same log.

At the end the log is flushed and verified (its record count printed).

Each way runs stat (a file), list (a directory of ``--files`` entries) and a 4 KiB read,
one call at a time, off and on alternating call by call; printed per operation: the mean
time of a call each way, on/off over all calls, and the median of the rounds' on/off
(the goal: overhead <= 5%).

    python bench/authz.py [--rounds 20] [--ops 200] [--files 100] [--rules 200] [--json out]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from aiohttp import web

from loomfs.config import Config
from loomfs.core.acl import AclAuthorizer, AclStore
from loomfs.core.audit import AuditLog, AuditReader
from loomfs.core.types import SYSTEM, Principal
from loomfs.core.users import UserRegistry
from loomfs.namespace.base import Namespace
from loomfs.namespace.governed import GovernedNamespace
from loomfs.rest.client import RestNamespace
from loomfs.rest.server import RestServer
from loomfs.service import HubService

TOP = "/vol/private/proj"


Op = Callable[[Namespace, Principal, int], Awaitable[None]]


async def op_stat(ns: Namespace, who: Principal, i: int) -> None:
    await ns.stat(who, f"{TOP}/f{i:04d}")


async def op_list(ns: Namespace, who: Principal, i: int) -> None:
    async for _ in ns.list(who, TOP):
        pass


async def op_read(ns: Namespace, who: Principal, i: int) -> None:
    await ns.read_bytes(who, f"{TOP}/f{i:04d}")


OPS: dict[str, Op] = {"stat": op_stat, "list": op_list, "read": op_read}


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    return runner, f"http://127.0.0.1:{port}"


async def bench(args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    volume = tmp / "volume"
    (volume / "private" / "proj").mkdir(parents=True)
    for i in range(args.files):
        (volume / "private" / "proj" / f"f{i:04d}").write_bytes(os.urandom(4096))
    hub = HubService(
        Config.model_validate(
            {
                "site": {"data_dir": str(tmp / "hub")},
                "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(tmp)]},
                "audit": {"enabled": False},  # the "on" ways get a log of their own
            }
        )
    )
    await hub.start()
    audit = AuditLog(tmp / "audit", site="bench").start()
    runners: list[web.AppRunner] = []
    clients: list[RestNamespace] = []
    try:
        await hub.add_volume("/vol", f"posix://{volume}", lambda _: None)
        users, acl = UserRegistry(hub.catalog), AclStore(hub.catalog)
        await users.add_user("alice", frozenset({"research"}))
        key = await users.add_access_key("alice")
        await acl.set_private("/vol/private", True)
        await acl.grant("group:research", "read", TOP)
        for i in range(args.rules - 1):  # rules elsewhere in the tree, as a site has them
            await acl.grant(f"user:u{i}", "write", f"/vol/other/d{i}")
        authorizer = AclAuthorizer(hub.catalog)
        governed = GovernedNamespace(hub.namespace, [authorizer], audit=audit)
        alice = (await users.get_user("alice")).principal("api")
        await governed.stat(alice, TOP)  # loads the rules

        off_runner, off_url = await serve(RestServer(hub.namespace, hub).app())
        on_runner, on_url = await serve(
            RestServer(governed, hub, authenticate=hub.authenticator()).app()
        )
        runners += [off_runner, on_runner]
        rest_off = RestNamespace(off_url)
        rest_on = RestNamespace(on_url, credentials=(key.access_key, key.secret))
        clients += [rest_off, rest_on]
        ways: dict[str, tuple[Namespace, Principal]] = {
            "api off": (hub.namespace, SYSTEM),
            "api on": (governed, alice),
            "rest off": (rest_off, SYSTEM),
            "rest on": (rest_on, SYSTEM),
        }
        spent = {(way, op): 0.0 for way in ways for op in OPS}
        for op in OPS.values():  # warm every path once
            for ns, who in ways.values():
                await op(ns, who, 0)
        # off and on alternate call by call (ABBA), so that the noise of a shared machine
        # falls on both alike; the pairs of a round are summed
        pairs = [("api off", "api on"), ("rest off", "rest on")]
        ratios: dict[tuple[str, str], list[float]] = {(p[1], op): [] for p in pairs for op in OPS}
        for _ in range(args.rounds):
            for op_name, op in OPS.items():
                for off, on in pairs:
                    took = {off: 0.0, on: 0.0}
                    for i in range(args.ops):
                        order = (off, on) if i % 2 == 0 else (on, off)
                        for way in order:
                            ns, who = ways[way]
                            start = time.perf_counter()
                            await op(ns, who, i % args.files)
                            took[way] += time.perf_counter() - start
                    for way, seconds in took.items():
                        spent[way, op_name] += seconds
                    ratios[on, op_name].append(took[on] / took[off])
        calls = args.rounds * args.ops
        head = await asyncio.to_thread(audit.flush, 120)
        report = await asyncio.to_thread(AuditReader(audit.directory).verify)
        results: dict[str, Any] = {
            "calls": calls, "audit_records": report.records, "audit_head": head,
            "audit_ok": report.ok,
        }  # fmt: skip
        print(f"{calls} calls per cell; {args.rules} ACL rules; {args.files} files of 4 KiB")
        print(f"audit log: {report.records:,} records, chain ok: {report.ok}\n")
        print(
            f"{'':6} {'operation':9} {'off us/op':>10} {'on us/op':>10} {'on/off':>8} {'median':>8}"
        )
        for api in ("api", "rest"):
            for op_name in OPS:
                off = spent[f"{api} off", op_name] / calls * 1e6
                on = spent[f"{api} on", op_name] / calls * 1e6
                median = statistics.median(ratios[f"{api} on", op_name])
                results[f"{api} {op_name}"] = {
                    "off_us": off,
                    "on_us": on,
                    "ratio": on / off,
                    "median_round_ratio": median,
                }
                print(f"{api:6} {op_name:9} {off:10.1f} {on:10.1f} {on / off:8.3f} {median:8.3f}")
        return results
    finally:
        for client in clients:
            await client.close()
        for runner in runners:
            await runner.cleanup()
        await hub.stop()
        await asyncio.to_thread(audit.close)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--ops", type=int, default=200)
    parser.add_argument("--files", type=int, default=100)
    parser.add_argument("--rules", type=int, default=200)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--quick", action="store_true", help="a short run (make bench-quick)")
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.ops = 3, 50
    with tempfile.TemporaryDirectory(prefix="loomfs-bench-authz-") as tmp:
        results = asyncio.run(bench(args, Path(tmp)))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
