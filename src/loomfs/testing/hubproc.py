"""``loomfs hub serve`` and ``loomfs spoke serve`` processes for tests, the demo and
benchmarks (testing layer)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from abc import ABC, abstractmethod
from pathlib import Path
from types import TracebackType
from typing import Self

from ..core.admin import LocalAdmin
from ..fabric.identity import CERT_FILE
from .ports import stop_process


def run_cli(
    data_dir: Path, *args: str, stdin: bytes | None = None
) -> subprocess.CompletedProcess[bytes]:
    """``loomfs ARGS`` as a site with its data in ``data_dir``, as a user would type it."""
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(data_dir)}
    return subprocess.run(
        [sys.executable, "-m", "loomfs.cli", *args],
        input=stdin, capture_output=True, check=False, timeout=120, env=env,
    )  # fmt: skip


def cli_ok(data_dir: Path, *args: str, stdin: bytes | None = None) -> str:
    """``run_cli`` that must succeed; its standard output."""
    result = run_cli(data_dir, *args, stdin=stdin)
    assert result.returncode == 0, result.stderr.decode()
    return result.stdout.decode()


def site_config(path: Path, data_dir: Path, sections: str = "") -> Path:
    """Write a config file at ``path`` for a site with its data in ``data_dir``, logging
    text, with ``sections`` (TOML) added; returns ``path`` for ``loomfs --config``."""
    path.write_text(
        f'[site]\ndata_dir = {json.dumps(str(data_dir))}\n[log]\nformat = "text"\n{sections}'
    )
    return path


def hub_cert(hub_dir: Path) -> Path:
    """The certificate of the hub whose site data is in ``hub_dir``, as a spoke pins it."""
    return hub_dir / "identity" / CERT_FILE


def spoke_args(
    hub_dir: Path, hub_url: str, attach: str, *extra: str, cache_size: str = "1G"
) -> tuple[str, ...]:
    """``spoke serve`` options attaching ``attach`` of the hub whose site data is in
    ``hub_dir`` (its certificate is pinned), reached at ``hub_url`` (its fabric URL, or a
    link emulator in front of it)."""
    return (
        "--hub", hub_url, "--hub-cert", str(hub_cert(hub_dir)),
        "--attach", attach, "--cache-size", cache_size, *extra,
    )  # fmt: skip


class LoomfsProcess(ABC):
    """A ``loomfs`` command in a process group of its own, started and awaited until it
    says it is ready, stopped by its own pid. Subclasses say which command and when it is
    ready."""

    what = "loomfs"
    #: put before the command line: ``Guest.command([])`` starts it in a guest's namespace
    prefix: tuple[str, ...] = ()

    def __init__(self, env: dict[str, str], ready: Path, log_path: Path) -> None:
        self.env = env
        self.ready = ready
        self.log_path = log_path
        self._proc: subprocess.Popen[bytes] | None = None

    @abstractmethod
    def argv(self) -> list[str]:
        """The command line after ``python -m loomfs.cli``."""

    def is_ready(self) -> bool:
        return self.ready.exists()

    def start(self, timeout: float = 30.0) -> Self:
        self.ready.unlink(missing_ok=True)
        with self.log_path.open("ab") as log:
            self._proc = subprocess.Popen(
                [*self.prefix, sys.executable, "-m", "loomfs.cli", *self.argv()],
                env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + timeout
        while not self.is_ready():
            if self._proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                tail = self.log_path.read_text()[-3000:]
                raise RuntimeError(f"{self.what} did not start: {tail}")
            time.sleep(0.05)
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

    def stop(self, how: int = signal.SIGTERM) -> int | None:
        """SIGTERM (or ``how``), then SIGKILL if it lingers; the exit code."""
        if self._proc is None:
            return None
        stop_process(self._proc, timeout=30, how=how)
        code = self._proc.returncode
        self._proc = None
        return code

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class SiteProcess(LoomfsProcess):
    """Runs ``loomfs <command>`` with its data in ``data_dir``, listening on free loopback
    ports; ``urls`` are what it reports once ready (``url``, and ``s3``/``fabric`` where
    those are on). Unless ``env`` says otherwise, a hub may assimilate posix volumes from
    the directory its data directory is in (a test's scratch directory)."""

    command: tuple[str, ...] = ("hub", "serve")
    #: where it listens: another namespace's address when ``prefix`` starts it there
    listen_host = "127.0.0.1"

    def __init__(
        self, data_dir: Path, env: dict[str, str] | None = None, args: tuple[str, ...] = ()
    ) -> None:
        roots = {"LOOMFS_HUB__VOLUME_ROOTS": str(data_dir.resolve().parent)}
        super().__init__(
            {**os.environ, **roots, **(env or {}), "LOOMFS_SITE__DATA_DIR": str(data_dir)},
            data_dir / "ready.json",
            data_dir / "service.log",
        )
        self.data_dir = data_dir
        self.args = args
        self.what = " ".join(self.command)
        self.urls: dict[str, str] = {}

    @property
    def url(self) -> str:
        return self.urls.get("url", "")

    @property
    def admin(self) -> tuple[str, str]:
        """The credentials of the hub's local administrator, as its own CLI finds them."""
        credentials = LocalAdmin(self.data_dir).credentials()
        assert credentials is not None, f"no local administrator in {self.data_dir}"
        return credentials

    def argv(self) -> list[str]:
        return [
            *self.command,
            *self.args,
            "--listen",
            f"{self.listen_host}:0",
            "--ready-file",
            str(self.ready),
        ]

    def start(self, timeout: float = 30.0) -> Self:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        super().start(timeout)
        try:
            self.urls = json.loads(self.ready.read_text())
        except BaseException:  # never leave a process behind that no one will stop
            self.stop()
            raise
        return self


class HubProcess(SiteProcess):
    command = ("hub", "serve")


class SpokeProcess(SiteProcess):
    command = ("spoke", "serve")
