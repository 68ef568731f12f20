"""A ``loomfs hub serve`` process for tests, the demo and benchmarks (testing layer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import TracebackType

from .ports import stop_process


class HubProcess:
    """Runs a hub with its data in ``data_dir`` on a free loopback port."""

    def __init__(self, data_dir: Path, env: dict[str, str] | None = None) -> None:
        self.data_dir = data_dir
        self.env = {**os.environ, **(env or {}), "LOOMFS_SITE__DATA_DIR": str(data_dir)}
        self.ready = data_dir / "hub.ready.json"
        self.log_path = data_dir / "hub.log"
        self.url = ""
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 30.0) -> HubProcess:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.ready.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [sys.executable, "-m", "loomfs.cli", "hub", "serve", "--listen", "127.0.0.1:0",
                 "--ready-file", str(self.ready)],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.ready.exists():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"hub did not start: {self.log_path.read_text()[-3000:]}")
            time.sleep(0.05)
        self.url = json.loads(self.ready.read_text())["url"]
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

    def __enter__(self) -> HubProcess:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
