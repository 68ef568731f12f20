"""A ``loomfs mount`` process for tests and benchmarks (testing layer).

It mounts in its own process so that the caller can use ordinary file APIs on the mount
without deadlocking on itself, is stopped by its own pid (SIGTERM, which unmounts), and
is always unmounted by its mount point afterwards, even when it crashed.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Self

from ..config import load_config
from ..service import HubService
from .hubproc import LoomfsProcess, site_config

FUSE_MISSING = (
    "/dev/fuse is missing: install FUSE 3 (apt-get install -y fuse3 libfuse3-dev) and give "
    "this machine or container the device (modprobe fuse; docker run --device /dev/fuse)"
)


def unmount(mountpoint: Path) -> None:
    """Take down a mount we made (also a stale one), by its mount point."""
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False, capture_output=True)


class MountProcess(LoomfsProcess):
    what = "mount"

    def __init__(
        self, config: Path, mountpoint: Path, *args: str, env: dict[str, str] | None = None
    ) -> None:
        environment = {**os.environ, **(env or {})}
        environment.pop("LOOMFS_HUB", None)
        super().__init__(
            environment,
            mountpoint.parent / f".{mountpoint.name}.ready.json",
            mountpoint.parent / f"{mountpoint.name}.mount.log",
        )
        self.config = config
        self.mountpoint = mountpoint
        self.args = args

    def argv(self) -> list[str]:
        return ["--config", str(self.config), "mount", str(self.mountpoint),
                "--ready-file", str(self.ready), *self.args]  # fmt: skip

    def is_ready(self) -> bool:
        return self.ready.exists() and os.path.ismount(self.mountpoint)

    def start(self, timeout: float = 60.0) -> Self:
        if not os.path.exists("/dev/fuse"):
            raise RuntimeError(FUSE_MISSING)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        return super().start(timeout)

    def stop(self, how: int = signal.SIGTERM) -> int | None:
        """SIGTERM or ``how`` (SIGINT: as Ctrl-C; both unmount), then make sure nothing is
        left mounted; the exit code. After ``kill`` (kill -9, as in a crash) the mount is
        left behind, stale, until this."""
        code = super().stop(how)
        if os.path.ismount(self.mountpoint) or _stale(self.mountpoint):
            unmount(self.mountpoint)
        return code

    def log(self) -> str:
        return self.log_path.read_text()


def _stale(mountpoint: Path) -> bool:
    try:
        os.stat(mountpoint)
    except OSError:
        return True
    return False


def prepare_site(root: Path, volumes: Mapping[str, Path]) -> Path:
    """A site in ``root`` (config and data directory) with posix ``volumes`` (namespace
    mount -> directory) imported; returns the config path for ``loomfs --config``."""
    config = site_config(root / "loomfs.toml", root / "data", "[hub]\nrescan_interval = 0\n")

    async def add() -> None:
        service = HubService(load_config(config))
        await service.start()
        try:
            for mount, directory in volumes.items():
                await service.namespace.add_volume(mount, f"posix://{directory}")
        finally:
            await service.stop()

    asyncio.run(add())
    return config
