"""A hub process serving its S3 gateway over a posix volume, for conformance runs and
benchmarks (testing layer).

The hub's catalog gets the users and access keys first, then ``loomfs hub serve`` starts
with ``[s3]`` on a free port and buckets made by CreateBucket below ``/s3`` (a posix
volume in ``scratch/volume``). Stopped by its own pid, like every LoomfsProcess.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import Iterable
from pathlib import Path
from types import TracebackType
from typing import Self

from ..core.registry import open_catalog
from ..core.users import UserRegistry
from .hubproc import HubProcess

BUCKET_ROOT = "/s3"


async def register_users(catalog_url: str, users: Iterable[tuple[str, str, str]]) -> None:
    """(user id, access key, secret) into the catalog's user registry."""
    catalog = open_catalog(catalog_url)
    await catalog.open()
    try:
        registry = UserRegistry(catalog)
        for user_id, key, secret in users:
            await registry.add_user(user_id)
            await registry.add_access_key(user_id, (key, secret))
    finally:
        await catalog.close()


class S3GatewayHub:
    """A context manager: ``endpoint`` is the gateway's URL, ``pid`` the hub's process.

    ``extra_config`` is appended to the hub's TOML config (a ``[hub]`` or ``[log]``
    section, say).
    """

    def __init__(
        self, scratch: Path, users: Iterable[tuple[str, str, str]], extra_config: str = ""
    ) -> None:
        self.scratch = scratch
        self.users = list(users)
        self.extra_config = extra_config
        self.hub: HubProcess | None = None
        self.endpoint = ""

    def start(self) -> Self:
        data = self.scratch / "hub"
        volume = self.scratch / "volume"
        volume.mkdir(parents=True)
        data.mkdir()
        config = self.scratch / "loomfs.toml"
        config.write_text(
            f'[s3]\nlisten = "127.0.0.1:0"\nbucket_root = "{BUCKET_ROOT}"\n{self.extra_config}'
        )
        asyncio.run(register_users(f"sqlite://{data / 'catalog.db'}", self.users))
        self.hub = HubProcess(data, {"LOOMFS_CONFIG": str(config)}).start()
        subprocess.run(
            [sys.executable, "-m", "loomfs.cli", "--hub", self.hub.url, "volume", "add",
             BUCKET_ROOT, f"posix://{volume}"],
            check=True, capture_output=True,
        )  # fmt: skip
        self.endpoint = self.hub.urls["s3"]
        return self

    @property
    def pid(self) -> int:
        assert self.hub is not None
        return self.hub.pid

    def stop(self) -> None:
        if self.hub is not None:
            self.hub.stop()
            self.hub = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
