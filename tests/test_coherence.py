"""Coherence under faults: a hub and two spokes, random concurrent reads and writes, link
cuts and restores; every operation is recorded and the history is checked against the
contract (no stale read while the link is up, no lost acknowledged write). Many seeds."""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from aiohttp import web

from loomfs.config import Config
from loomfs.core.types import Principal
from loomfs.errors import LoomError
from loomfs.fabric.identity import SiteIdentity
from loomfs.fabric.server import FabricServer
from loomfs.namespace.base import Namespace
from loomfs.rest.client import RestNamespace
from loomfs.service import HubService
from loomfs.spoke.cache import Cache
from loomfs.spoke.namespace import SpokeNamespace
from loomfs.testing.wan import LinkEmulator

WHO = Principal(user="history")
SHARED = [f"/vol/shared{i}" for i in range(3)]


@dataclass
class Op:
    client: str
    kind: str  # "write" | "read"
    path: str
    start: float
    end: float
    value: bytes | None
    version: int | None  # 0: acknowledged but not yet committed at the hub
    link_up: bool  # the client's link stayed up for the whole operation


@dataclass
class Cluster:
    hub: HubService
    spokes: dict[str, SpokeNamespace]
    links: dict[str, LinkEmulator]
    up: dict[str, bool]

    def clients(self) -> dict[str, Namespace]:
        return {"hub": self.hub.namespace, **self.spokes}


@contextlib.asynccontextmanager
async def cluster(tmp: Path) -> AsyncIterator[Cluster]:
    (tmp / "volume").mkdir()
    hub = HubService(
        Config.model_validate(
            {
                "site": {"data_dir": str(tmp / "hub")},
                "hub": {"rescan_interval": 0, "watch": False, "lease_ttl": 2.0},
            }
        )
    )
    await hub.start()
    await hub.add_volume("/vol", f"posix://{tmp / 'volume'}", lambda _: None)
    hub_id = SiteIdentity.create(tmp / "hub-id", "hub")
    ids = {name: SiteIdentity.create(tmp / f"{name}-id", name) for name in ("east", "west")}
    server = FabricServer(hub.namespace, hub, hub_id, {n: i.cert_pem for n, i in ids.items()})
    runner = web.AppRunner(server.app())
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0, ssl_context=server.ssl_context())
    await site.start()
    port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]
    links: dict[str, LinkEmulator] = {}
    spokes: dict[str, SpokeNamespace] = {}
    for name, ident in ids.items():
        links[name] = await LinkEmulator("127.0.0.1", port, latency=0.002).start()
        client = RestNamespace(
            f"https://127.0.0.1:{links[name].port}",
            ssl_context=ident.client_context(hub_id.cert_pem),
        )
        spokes[name] = SpokeNamespace(
            client, Cache(tmp / f"{name}-cache", 1 << 30), ["/vol"], site=name
        )
        await spokes[name].start()
    try:
        yield Cluster(hub, spokes, links, {name: True for name in ids})
    finally:
        for spoke in spokes.values():
            await spoke.close()
        for link in links.values():
            await link.stop()
        await runner.cleanup()
        await hub.stop()


async def run_history(c: Cluster, rng: random.Random, steps: int) -> list[Op]:
    history: list[Op] = []
    counter = 0
    cuts: dict[str, int] = dict.fromkeys(c.links, 0)  # bumps each time a link goes down

    async def client_loop(name: str, ns: Namespace) -> None:
        nonlocal counter
        private = 0
        for _ in range(steps):
            roll = rng.random()
            cut_before = cuts.get(name, 0)
            up_before = c.up.get(name, True)
            start = time.monotonic()
            if roll < 0.4:
                counter += 1
                path = rng.choice(SHARED)
                value = f"{name}:{counter}".encode()
            elif roll < 0.55:
                private += 1
                path, value = f"/vol/private-{name}", f"{name}:private:{private}".encode()
            else:
                path, value = rng.choice(SHARED), None
            try:
                if value is not None:
                    version: int | None = (await ns.write_bytes(WHO, path, value)).version
                    got = value
                else:
                    async with await ns.read(WHO, path) as reader:
                        got = await reader.read_all()
                        version = reader.entry.version
            except LoomError:
                got, version = None, None  # refused (link down, file absent): no claim made
            end = time.monotonic()
            link_up = up_before and c.up.get(name, True) and cuts.get(name, 0) == cut_before
            kind = "read" if value is None else "write"
            history.append(Op(name, kind, path, start, end, got, version, link_up))
            await asyncio.sleep(rng.random() * 0.01)

    async def chaos() -> None:
        for _ in range(steps // 4):
            await asyncio.sleep(rng.random() * 0.1)
            name = rng.choice(list(c.links))
            if c.up[name]:
                c.up[name] = False
                cuts[name] += 1
                c.links[name].cut()
            else:
                c.links[name].restore()
                c.up[name] = True
        for name, link in c.links.items():
            link.restore()
            c.up[name] = True

    await asyncio.gather(*(client_loop(n, ns) for n, ns in c.clients().items()), chaos())
    for spoke in c.spokes.values():
        async with asyncio.timeout(60):
            await spoke.sync()
    return history


def check_no_stale_reads(history: list[Op]) -> int:
    """A read that began after a committed write of its path had returned, on a client
    whose link was up throughout, sees that version or a later one, with its content."""
    committed = [op for op in history if op.kind == "write" and op.version]
    content = {(op.path, op.version): op.value for op in committed}
    checked = 0
    for read in history:
        if read.kind != "read" or not read.version or not read.link_up:
            continue
        floor = max(
            (w.version or 0 for w in committed if w.path == read.path and w.end < read.start),
            default=0,
        )
        assert read.version >= floor, f"stale read: {read} saw v{read.version} < v{floor}"
        if (read.path, read.version) in content:
            assert read.value == content[(read.path, read.version)], f"mixed content: {read}"
        checked += 1
    return checked


async def check_no_lost_writes(c: Cluster, history: list[Op]) -> None:
    """Each client's last acknowledged write to its private file is what the hub holds."""
    for name in c.clients():
        writes = [
            op for op in history
            if op.client == name and op.path == f"/vol/private-{name}" and op.version is not None
        ]  # fmt: skip
        if writes:
            final = await c.hub.namespace.read_bytes(WHO, f"/vol/private-{name}")
            assert final == writes[-1].value, f"{name} lost an acknowledged write"


@pytest.mark.parametrize("seed", range(6))
async def test_history_under_faults(tmp_path: Path, seed: int) -> None:
    async with cluster(tmp_path) as c:
        for path in SHARED:
            await c.hub.namespace.write_bytes(WHO, path, b"initial")
        history = await run_history(c, random.Random(seed), steps=40)
        assert check_no_stale_reads(history) > 10
        await check_no_lost_writes(c, history)
        assert any(not op.link_up for op in history), "the faults never hit an operation"
