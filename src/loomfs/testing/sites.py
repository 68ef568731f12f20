"""A hub and a spoke as real processes, joined by an emulated WAN (testing layer): what the
SDK's tests and ``bench/train_stall.py`` read through. The WAN is ``LinkEmulator`` (a
Python proxy: it can be cut) or, with ``kernel``, a ``KernelLink`` (the hub in a network
namespace of its own, the link shaped by the kernel: what benchmarks measure loomfs over).

Synchronous on purpose: its callers are plain code (pytest tests driving a DataLoader,
a benchmark's training loop). The link emulator runs on a loop thread of its own.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import urlsplit

from ..core.registry import open_catalog
from ..core.sites import SiteRegistry
from ..fabric.identity import HTTPS_CERT_FILE, SiteIdentity
from ..rest.client import RestNamespace
from .hubproc import HubProcess, SpokeProcess, hub_cert, site_config, spoke_args
from .kwan import KernelLink
from .loop import LoopThread
from .wan import LinkEmulator

T = TypeVar("T")


@dataclass
class SpokeSite:
    hub: HubProcess
    spoke: SpokeProcess
    link: LinkEmulator | KernelLink
    loop: LoopThread
    root: Path
    #: the hub's namespace path the spokes attach
    attach: str
    #: the hub's fabric URL as the spokes dial it (through the link)
    hub_url: str

    @property
    def address(self) -> str:
        """The spoke as a ``loomfs://`` site: ``host:port``."""
        return self.spoke.url.removeprefix("http://")

    def call(self, url: str, call: Callable[[RestNamespace], Awaitable[T]]) -> T:
        """Run ``call`` with a REST client of ``url`` (the hub's or the spoke's)."""
        https = url.startswith("https:")  # the hub's, off loopback in a KernelLink
        ca_cert = https_cert(self.hub.data_dir) if https else None
        return self.loop.run(with_client(url, call, ca_cert=ca_cert))

    def prefetch_report(self) -> dict[str, Any]:
        return self.call(self.spoke.url, lambda client: client.prefetch_report())

    def spoke_config(self, name: str) -> Path:
        """The config file of the spoke ``name`` (one of ``spoke_site``'s ``others``),
        over the same link, for a process of the caller's own (``loomfs mount`` runs the
        spoke in-process)."""
        spoke = (
            f'[spoke]\nhub = "{self.hub_url}"\n'
            f"hub_cert = {json.dumps(str(hub_cert(self.root / 'hub')))}\n"
            f"attach = [{json.dumps(self.attach)}]\n"
        )
        return site_config(self.root / name / "loomfs.toml", self.root / name, spoke)


async def _pin(hub_dir: Path, spoke: SiteIdentity) -> None:
    catalog = open_catalog(f"sqlite://{(hub_dir / 'catalog.db').resolve()}")
    await catalog.open()
    try:
        await SiteRegistry(catalog).add(spoke.cert_pem, {}, spoke.name)
    finally:
        await catalog.close()


def https_cert(site_dir: Path) -> Path:
    """The self-signed certificate a site serves REST with off loopback (in a namespace)."""
    return site_dir / "identity" / HTTPS_CERT_FILE


async def with_client(
    url: str,
    call: Callable[[RestNamespace], Awaitable[T]],
    credentials: tuple[str, str] | None = None,
    ca_cert: Path | None = None,
) -> T:
    client = RestNamespace(url, credentials=credentials, ca_cert=ca_cert)
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
    others: Sequence[str] = (),
    kernel: bool = False,
) -> Iterator[SpokeSite]:
    """A hub with ``data`` assimilated at ``mount``, and a spoke attaching it through a link
    of ``rate`` bytes/s and ``latency`` seconds each way; all stopped on exit. ``others``:
    more spokes' identities, pinned at the hub, for processes of the caller's own
    (``SpokeSite.spoke_config``). ``kernel``: the link is a ``KernelLink`` (root only),
    the hub runs in its namespace."""
    hub_dir, spoke_dir = tmp / "hub", tmp / name
    SiteIdentity.create(hub_dir / "identity", "hub")
    spoke_id = SiteIdentity.create(spoke_dir / "identity", name)
    with LoopThread() as loop, contextlib.ExitStack() as stack:
        for identity in [spoke_id, *(SiteIdentity.create(tmp / o / "identity", o) for o in others)]:
            loop.run(_pin(hub_dir, identity))
        env = {
            "LOOMFS_FABRIC__LISTEN": "127.0.0.1:0",
            "LOOMFS_HUB__WATCH": "false",
            "LOOMFS_HUB__VOLUME_ROOTS": str(data.resolve()),
        }
        hub = HubProcess(hub_dir, env)
        link: LinkEmulator | KernelLink
        if kernel:
            link = stack.enter_context(KernelLink(rate=rate, latency=latency))
            hub.prefix, hub.listen_host = tuple(link.command([])), link.host_ip
        stack.enter_context(hub)
        volume = f"posix://{data}"
        added = with_client(
            hub.url,
            lambda c: c.add_volume(mount, volume),
            hub.admin,
            https_cert(hub_dir) if kernel else None,
        )
        loop.run(added)
        fabric = urlsplit(hub.urls["fabric"])
        if kernel:
            assert isinstance(link, KernelLink)
            host, port = link.forward(fabric.port or 0)
        else:
            link = loop.run(
                LinkEmulator(fabric.hostname or "", fabric.port or 0, rate=rate, latency=latency)
                .start()
            )  # fmt: skip
            stack.callback(loop.run, link.stop())
            host, port = "127.0.0.1", link.port
        hub_url = f"https://{host}:{port}"
        args = spoke_args(
            hub_dir, hub_url, mount, *(["--write-back"] if write_back else []),
            cache_size=cache_size,
        )  # fmt: skip
        spoke_env = {"LOOMFS_SPOKE__PREFETCH": str(prefetch).lower()}
        spoke = stack.enter_context(SpokeProcess(spoke_dir, spoke_env, args))
        yield SpokeSite(hub, spoke, link, loop, tmp, mount, hub_url)
