"""A ``loomfs hub serve`` process inside a QEMU guest's network namespace, serving a posix
volume over NFS (and SMB, and REST on the namespace's loopback) to the guest's kernel
clients (testing layer).

``GuestHub`` makes the site (the volume at ``/x``, the users given), writes its config
(NFS on the namespace's host address with one port for NFS and MOUNT, the volume exported
to the guest's subnet with root unsquashed; SMB when asked), starts the hub there and
stops it by its pid. ``export`` is what the guest mounts without a portmapper; ``rest``
runs a REST client against the hub from a thread in the namespace. With ``spoke_dir``, the
hub also serves the fabric link on the namespace's loopback and trusts that spoke, which
``spoke`` starts there, attaching /x and serving it over NFS on a port of its own.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Self, TypeVar

from ..core.registry import open_catalog
from ..core.sites import SiteRegistry
from ..core.users import UserRegistry
from ..fabric.identity import SiteIdentity
from ..hub.namespace import HubNamespace
from ..rest.client import RestNamespace
from .guest import SEED_NFS_OPTIONS, Guest, NfsExport, SmbShare
from .hubproc import HubProcess, LoomfsProcess, SpokeProcess, cli_ok, spoke_args

T = TypeVar("T")
L = TypeVar("L", bound=LoomfsProcess)
VOLUME = "/x"


def nfs_options(port: int) -> str:
    """The Kubernetes recipe's mount options with the port named (no portmapper)."""
    return f"{SEED_NFS_OPTIONS},port={port},mountport={port}"


class GuestHub:
    """The hub of ``site`` with ``volume`` at /x, in ``guest``'s namespace; a context
    manager. ``smb_users`` (name -> password) get SMB passwords, as ``loomfs user
    passwd`` sets them, and turn the share ``x`` (all of /x) on."""

    def __init__(
        self,
        guest: Guest,
        site: Path,
        volume: Path,
        *,
        nfs_port: int = 2049,
        smb_users: dict[str, str] | None = None,
        spoke_dir: Path | None = None,
    ) -> None:
        self.guest = guest
        self.site = site
        self.volume = volume
        self.nfs_port = nfs_port
        self.smb_users = smb_users or {}
        self.spoke_dir = spoke_dir
        self._hub: HubProcess | None = None

    def __enter__(self) -> Self:
        self.site.mkdir(parents=True, exist_ok=True)
        asyncio.run(self._prepare())
        for name, password in self.smb_users.items():
            cli_ok(self.site, "user", "passwd", name, "--stdin", "--offline",
                   stdin=f"{password}\n".encode())  # fmt: skip
        fabric = {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0"} if self.spoke_dir else {}
        self._hub = self._in_netns(HubProcess(self.site, self._env(self.site, fabric))).start()
        return self

    def _env(self, site: Path, env: dict[str, str], nfs_port: int | None = None) -> dict[str, str]:
        config = site.parent / f"{site.name}.toml"
        config.write_text(self._config(nfs_port or self.nfs_port, site == self.site))
        # nsenter starts it in /: the same loomfs as this process's, by an absolute path
        code = str(Path(__file__).resolve().parents[2])  # the directory loomfs/ is in
        return {**env, "LOOMFS_CONFIG": str(config), "PYTHONPATH": code}

    def _in_netns(self, process: L) -> L:
        process.prefix = tuple(self.guest.command([]))
        return process

    def spoke(self, nfs_port: int) -> SpokeProcess:
        """The spoke of ``spoke_dir``, to start in the namespace (a context manager),
        attaching /x (a cache of 1 GiB), NFS on ``nfs_port``."""
        assert self.spoke_dir is not None, "GuestHub(spoke_dir=...) registers the spoke"
        args = spoke_args(self.site, self.hub.urls["fabric"], VOLUME)
        return self._in_netns(SpokeProcess(self.spoke_dir, self._env(self.spoke_dir, {}, nfs_port),
                                           args=args))  # fmt: skip

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._hub is not None:
            self._hub.stop()
            self._hub = None

    async def _prepare(self) -> None:
        catalog = open_catalog(f"sqlite://{self.site / 'catalog.db'}")
        await catalog.open()
        try:
            await HubNamespace(catalog).add_volume(VOLUME, f"posix://{self.volume}")
            users = UserRegistry(catalog)
            for name in self.smb_users:
                await users.add_user(name)
            if self.spoke_dir is not None:
                SiteIdentity.create(self.site / "identity", "hub")
                spoke = SiteIdentity.create(self.spoke_dir / "identity", "spoke")
                await SiteRegistry(catalog).add(spoke.cert_pem)
        finally:
            await catalog.close()

    def _config(self, nfs_port: int, hub: bool) -> str:
        subnet = self.guest.guest_ip.rpartition(".")[0] + ".0/24"
        smb = (
            f'[smb]\nlisten = "{self.guest.host_ip}:445"\n'
            f'[smb.shares]\nx = {{ path = "{VOLUME}" }}\n'
            if self.smb_users and hub
            else ""
        )
        return f"""[site]
name = "west"
[hub]
rescan_interval = 0
[log]
format = "text"
[nfs]
listen = "{self.guest.host_ip}:{nfs_port}"
[nfs.exports."{VOLUME}"]
clients = ["{subnet}"]
squash = "none"
{smb}"""

    @property
    def hub(self) -> HubProcess:
        assert self._hub is not None, "use the hub as a context manager"
        return self._hub

    def export(self, path: str = VOLUME, port: int | None = None) -> NfsExport:
        """``path`` (the volume or a directory in it) as the guest mounts it, from the
        hub (or the NFS server on ``port``: a spoke's)."""
        return NfsExport(self.guest.host_ip, path, nfs_options(port or self.nfs_port))

    def share(self, user: str) -> SmbShare:
        return SmbShare(self.guest.host_ip, "x", user, self.smb_users[user])

    def rest(self, call: Callable[[RestNamespace], Awaitable[T]]) -> T:
        """``call`` with a REST client of the hub's administrator; the hub's REST listens
        on the namespace's loopback, so it runs on a thread in the namespace."""

        async def session() -> T:
            client = RestNamespace(self.hub.url, credentials=self.hub.admin)
            try:
                return await call(client)
            finally:
                await client.close()

        return self.guest.in_netns(lambda: asyncio.run(session()))
