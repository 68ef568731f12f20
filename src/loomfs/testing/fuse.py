"""A ``loomfs mount`` process for tests and benchmarks (testing layer).

It mounts in its own process so that the caller can use ordinary file APIs on the mount
without deadlocking on itself, is stopped by its own pid (SIGTERM, which unmounts), and
is always unmounted by its mount point afterwards, even when it crashed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from ..config import load_config
from ..service import HubService
from .ports import stop_process

FUSE_MISSING = (
    "/dev/fuse is missing: install FUSE 3 (apt-get install -y fuse3 libfuse3-dev) and give "
    "this machine or container the device (modprobe fuse; docker run --device /dev/fuse)"
)


def unmount(mountpoint: Path) -> None:
    """Take down a mount we made (also a stale one), by its mount point."""
    subprocess.run(["fusermount3", "-u", "-z", str(mountpoint)], check=False, capture_output=True)


class MountProcess:
    def __init__(
        self, config: Path, mountpoint: Path, *args: str, env: dict[str, str] | None = None
    ) -> None:
        self.config = config
        self.mountpoint = mountpoint
        self.args = args
        self.env = {**os.environ, **(env or {})}
        self.env.pop("LOOMFS_HUB", None)
        self.ready = mountpoint.parent / f".{mountpoint.name}.ready.json"
        self.log_path = mountpoint.parent / f"{mountpoint.name}.mount.log"
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 60.0) -> MountProcess:
        if not os.path.exists("/dev/fuse"):
            raise RuntimeError(FUSE_MISSING)
        self.mountpoint.mkdir(parents=True, exist_ok=True)
        self.ready.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "loomfs.cli", "--config", str(self.config), "mount",
                 str(self.mountpoint), "--ready-file", str(self.ready), *self.args],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not (self.ready.exists() and os.path.ismount(self.mountpoint)):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"mount did not start: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def kill(self) -> None:
        """kill -9, as in a crash: the mount is left behind, stale."""
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            self._proc = None

    def stop(self) -> int | None:
        """SIGTERM (which unmounts), then make sure nothing is left mounted; the exit code."""
        code = None
        if self._proc is not None:
            stop_process(self._proc, timeout=30)
            code = self._proc.returncode
            self._proc = None
        if os.path.ismount(self.mountpoint) or _stale(self.mountpoint):
            unmount(self.mountpoint)
        return code

    def log(self) -> str:
        return self.log_path.read_text()

    def __enter__(self) -> MountProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stale(mountpoint: Path) -> bool:
    try:
        os.stat(mountpoint)
    except OSError:
        return True
    return False


def prepare_site(root: Path, volumes: Mapping[str, Path]) -> Path:
    """A site in ``root`` (config and data directory) with posix ``volumes`` (namespace
    mount -> directory) imported; returns the config path for ``loomfs --config``."""
    config = root / "loomfs.toml"
    config.write_text(
        f'[site]\ndata_dir = {json.dumps(str(root / "data"))}\n[log]\nformat = "text"\n'
        "[hub]\nrescan_interval = 0\n"
    )

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
