"""``loomfs hub serve`` and ``loomfs spoke serve`` processes for tests, the demo and
benchmarks (testing layer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from .ports import stop_process


class SiteProcess:
    """Runs ``loomfs <command>`` with its data in ``data_dir``, listening on free loopback
    ports; ``urls`` are what it reports once ready (``url``, and ``s3``/``fabric`` where
    those are on)."""

    command: tuple[str, ...] = ("hub", "serve")

    def __init__(
        self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, **(env or {}), "LOOMFS_SITE__DATA_DIR": str(data_dir)}
        self.args = args
        self.ready = data_dir / "ready.json"
        self.log_path = data_dir / "service.log"
        self.urls: dict[str, str] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return self.urls.get("url", "")

    def start(self, timeout: float = 30.0) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ready.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "loomfs.cli", *self.command, *self.args,
                 "--listen", "127.0.0.1:0", "--ready-file", str(self.ready)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"{' '.join(self.command)} did not start: {tail}")
            time.sleep(0.05)
        self.urls = json.loads(self.ready.read_text())
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def kill(self) -> None:
        """kill -9: no chance to clean up, as in a crash."""
        if self._proc is not None:
            os.killpg(self._proc.pid, signal.SIGKILL)
            self._proc.wait()
            self._proc = None

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class HubProcess(SiteProcess):
    command = ("hub", "serve")


class SpokeProcess(SiteProcess):
    command = ("spoke", "serve")
