"""A hub and a spoke as real processes, joined by an emulated WAN (testing layer): what the
SDK's tests and ``bench/train_stall.py`` read through.

Synchronous on purpose: its callers are plain code (pytest tests driving a DataLoader,
a benchmark's training loop). The link emulator runs on a loop thread of its own.
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..core.registry import open_catalog
from ..core.sites import SiteRegistry
from ..fabric.identity import SiteIdentity
from ..rest.client import RestNamespace
from .hubproc import HubProcess, SpokeProcess, spoke_args
from .loop import LoopThread
from .wan import LinkEmulator

T = TypeVar("T")


@dataclass
class SpokeSite:
    hub: HubProcess
    spoke: SpokeProcess
    link: LinkEmulator
    loop: LoopThread

    @property
    def address(self) -> str:
        """The spoke as a ``loomfs://`` site: ``host:port``."""
        return self.spoke.url.removeprefix("http://")

    def call(self, url: str, call: Callable[[RestNamespace], Awaitable[T]]) -> T:
        """Run ``call`` with a REST client of ``url`` (the hub's or the spoke's)."""
        return self.loop.run(with_client(url, call))

    def prefetch_report(self) -> dict[str, Any]:
        return self.call(self.spoke.url, lambda client: client.prefetch_report())


async def _pin(hub_dir: Path, spoke: SiteIdentity) -> None:
    catalog = open_catalog(f"sqlite://{(hub_dir / 'catalog.db').resolve()}")
    await catalog.open()
    try:
        await SiteRegistry(catalog).add(spoke.cert_pem, {}, spoke.name)
    finally:
        await catalog.close()


async def with_client(url: str, call: Callable[[RestNamespace], Awaitable[T]]) -> T:
    client = RestNamespace(url)
    try:
        return await call(client)
    finally:
        await client.close()


@contextlib.contextmanager
def spoke_site(
    tmp: Path,
    data: Path,
    mount: str = "/data",
    *,
    rate: float | None = None,
    latency: float = 0.001,
    cache_size: str = "1G",
    write_back: bool = False,
    prefetch: bool = True,
    name: str = "gpu-west",
) -> Iterator[SpokeSite]:
    """A hub with ``data`` assimilated at ``mount``, and a spoke attaching it through a link
    of ``rate`` bytes/s and ``latency`` seconds each way; all stopped on exit."""
    hub_dir, spoke_dir = tmp / "hub", tmp / name
    SiteIdentity.create(hub_dir / "identity", "hub")
    spoke_id = SiteIdentity.create(spoke_dir / "identity", name)
    with LoopThread() as loop:
        loop.run(_pin(hub_dir, spoke_id))
        env = {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0", "LOOMFS_HUB__WATCH": "false"}
        with HubProcess(hub_dir, env) as hub:
            loop.run(with_client(hub.url, lambda c: c.add_volume(mount, f"posix://{data}")))
            fabric = urlsplit(hub.urls["fabric"])
            link = loop.run(
                LinkEmulator(fabric.hostname or "", fabric.port or 0, rate=rate, latency=latency)
                .start()
            )  # fmt: skip
            try:
                args = spoke_args(
                    hub_dir, f"https://127.0.0.1:{link.port}", mount,
                    *(["--write-back"] if write_back else []), cache_size=cache_size,
                )  # fmt: skip
                spoke_env = {"LOOMFS_SPOKE__PREFETCH": str(prefetch).lower()}
                with SpokeProcess(spoke_dir, spoke_env, args) as spoke:
                    yield SpokeSite(hub, spoke, link, loop)
            finally:
                loop.run(link.stop())
