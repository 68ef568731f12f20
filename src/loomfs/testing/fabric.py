"""A hub and its spokes on one machine (testing layer), for tests, the demo and benchmarks.

The hub runs in-process with a posix volume at ``/vol`` and serves the fabric link over
mutual TLS; each spoke reaches it through its own emulated WAN link, so a test can shape
or cut one spoke's link and count the bytes that crossed it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from aiohttp import web

from ..config import Config
from ..core.sites import SiteRegistry
from ..fabric.identity import SiteIdentity
from ..fabric.server import FabricServer, TlsSite
from ..rest.client import RestNamespace
from ..service import HubService
from ..spoke.cache import Cache
from ..spoke.namespace import SpokeNamespace
from ..spoke.sealed import KEY_BYTES, BlockCipher
from .wan import LinkEmulator


@dataclass
class Fabric:
    hub: HubService
    hub_id: SiteIdentity
    port: int
    volume: Path
    tmp: Path
    capacity: int
    ids: dict[str, SiteIdentity] = field(default_factory=dict)
    links: dict[str, LinkEmulator] = field(default_factory=dict)
    spokes: dict[str, SpokeNamespace] = field(default_factory=dict)
    ciphers: dict[str, BlockCipher] = field(default_factory=dict)  # spokes sealing their cache
    runner: web.AppRunner | None = None
    server: FabricServer | None = None  # the hub's end of the links, while it serves

    @property
    def first(self) -> str:
        return next(iter(self.ids))

    @property
    def spoke(self) -> SpokeNamespace:
        """The first spoke (the only one, in most tests)."""
        return self.spokes[self.first]

    @property
    def link(self) -> LinkEmulator:
        return self.links[self.first]

    async def caught_up(self) -> None:
        """Until the first spoke has applied every change the hub has made (30 s)."""
        head = await self.hub.catalog.head_seq()
        for _ in range(1500):
            if self.spoke.seq >= head:
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"the spoke applied changes up to {self.spoke.seq}, not {head}")

    def client(self, name: str, *, forward: bool = False) -> RestNamespace:
        """A fabric client as spoke ``name``, through its emulated link; ``forward``:
        sending each call's user along, as a spoke does."""
        return RestNamespace(
            f"https://127.0.0.1:{self.links[name].port}",
            ssl_context=self.ids[name].client_context(self.hub_id.cert_pem),
            forward=forward,
        )

    def new_spoke(self, name: str | None = None, *, capacity: int | None = None) -> SpokeNamespace:
        """A (re)started spoke over its cache directory; the caller starts it."""
        name = name or self.first
        client = self.client(name, forward=True)
        cache = Cache(
            self.tmp / f"{name}-cache",
            capacity or self.capacity,
            link=client,
            cipher=self.ciphers.get(name),  # the same key across restarts
        )
        self.spokes[name] = SpokeNamespace(client, cache, ["/vol"], site=name)
        return self.spokes[name]

    async def serve_hub(self) -> None:
        """Serve the fabric link on ``port`` (0: a free one, remembered), as a hub
        process serves it (placement policies, ACL rules, audit when the hub has a log)."""
        trusted = {n: i.cert_pem for n, i in self.ids.items()}
        self.server = server = self.hub.fabric_server(self.hub_id, trusted)
        self.runner = web.AppRunner(server.app())
        await self.runner.setup()
        site = TlsSite(self.runner, "127.0.0.1", self.port, ssl_context=server.ssl_context())
        await site.start()
        self.port = int(site._server.sockets[0].getsockname()[1])  # type: ignore[union-attr]

    async def stop_hub(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()
            self.runner = None
        await self.hub.stop()

    async def restart_hub(self) -> None:
        """Stop the hub and start a new one over the same catalog, volume and port; the
        spokes' connections drop, as when a hub process dies."""
        await self.stop_hub()
        self.hub = HubService(self.hub.config)
        await self.hub.start()
        await self.serve_hub()

    async def restart_spoke(self, name: str) -> SpokeNamespace:
        """A spoke that dies without an orderly shutdown and starts again over its cache
        and journal. Its journal takes no more writes first, as a dead process writes
        none: here its callers' calls may still be under way."""
        old = self.spokes[name]
        old.journal.close()
        for task in old._tasks:
            task.cancel()
        await old.hub.close()
        spoke = self.new_spoke(name)
        await spoke.start()
        return spoke


@contextlib.asynccontextmanager
async def fabric(
    tmp: Path,
    spokes: Sequence[str] = ("gpu-west",),
    *,
    capacity: int = 1 << 30,
    lease_ttl: float = 3.0,
    rate: float | None = None,
    latency: float = 0.001,
    labels: Mapping[str, Mapping[str, str]] | None = None,
    sealed: Sequence[str] = (),
) -> AsyncIterator[Fabric]:
    """``labels`` gives spokes labels in their certificates; those spokes are pinned in the
    hub's site registry too, which placement policies read. ``sealed`` names the spokes whose
    cache is encrypted at rest, each with a key of its own."""
    volume = tmp / "volume"
    volume.mkdir(parents=True)
    hub = HubService(
        Config.model_validate(
            {
                "site": {"data_dir": str(tmp / "hub")},
                "hub": {
                    "rescan_interval": 0,
                    "watch": False,
                    "lease_ttl": lease_ttl,
                    "volume_roots": [str(tmp)],
                },
            }
        )
    )
    await hub.start()
    made: Fabric | None = None
    try:
        await hub.add_volume("/vol", f"posix://{volume}", lambda _: None)
        hub_id = SiteIdentity.create(tmp / "hub-id", "hub")
        labels = labels or {}
        ids = {
            name: SiteIdentity.create(tmp / f"{name}-id", name, labels=labels.get(name))
            for name in spokes
        }
        for name in labels:  # pinned in the catalog: a restarted hub still knows them
            await SiteRegistry(hub.catalog).add(ids[name].cert_pem)
        made = Fabric(hub, hub_id, 0, volume, tmp, capacity, ids)
        made.ciphers = {n: BlockCipher(os.urandom(KEY_BYTES)) for n in sealed}
        await made.serve_hub()
        for name in spokes:
            made.links[name] = await LinkEmulator(
                "127.0.0.1", made.port, rate=rate, latency=latency
            ).start()
            await made.new_spoke(name).start()
        yield made
    finally:
        if made is not None:
            for spoke in made.spokes.values():
                await spoke.close()
            for link in made.links.values():
                await link.stop()
            await made.stop_hub()
        else:
            await hub.stop()
