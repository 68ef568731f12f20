"""A site with a directory only one user may read (testing layer): what the tests of
credentials in every client (SDK, dataset, mount, HTTPS) read through.

The site is prepared in-process (volume, user, rules) and then served by a ``loomfs hub
serve`` process of the caller's (``HubProcess(site.data_dir, site.env)``), so the rules are
in force from the first request on, with no wait for a running hub to follow them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from ..config import load_config
from ..core.acl import AclStore
from ..core.users import UserRegistry
from ..service import HubService
from .hubproc import site_config

PRIVATE = "/vol/private"


@dataclass(frozen=True)
class PrivateSite:
    config: Path
    data_dir: Path
    #: the access key id and secret of the one user who may read ``PRIVATE``
    key: str
    secret: str

    @property
    def env(self) -> dict[str, str]:
        """The environment of the site's hub process."""
        return {"LOOMFS_CONFIG": str(self.config)}

    @property
    def credentials(self) -> dict[str, str]:
        """The reader's credentials as a client's environment gives them."""
        return {"LOOMFS_ACCESS_KEY": self.key, "LOOMFS_SECRET_KEY": self.secret}


def private_site(
    root: Path, files: Mapping[str, bytes], *, reader: str = "alice", sections: str = ""
) -> PrivateSite:
    """A site in ``root``: a posix volume at /vol holding ``files`` (paths relative to
    ``PRIVATE``), ``PRIVATE`` a private export that only user ``reader`` may read;
    ``sections`` (TOML) are added to its config."""
    volume = root / "volume"
    for name, data in files.items():
        target = volume / "private" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    config = site_config(
        root / "loomfs.toml", root / "data", f"[hub]\nrescan_interval = 0\n{sections}"
    )

    async def prepare() -> tuple[str, str]:
        service = HubService(load_config(config))
        await service.start()
        try:
            await service.namespace.add_volume("/vol", f"posix://{volume}")
            users, rules = UserRegistry(service.catalog), AclStore(service.catalog)
            await users.add_user(reader)
            made = await users.add_access_key(reader)
            await rules.set_private(PRIVATE, True)
            await rules.grant(f"user:{reader}", "read", PRIVATE)
            return made.access_key, made.secret
        finally:
            await service.stop()

    key, secret = asyncio.run(prepare())
    return PrivateSite(config, root / "data", key, secret)
