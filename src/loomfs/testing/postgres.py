"""A throwaway PostgreSQL server for tests, the demo and benchmarks (testing layer).

Runs Debian's PostgreSQL binaries on a free loopback port in a temporary directory, with
trust authentication on loopback only, and stops it by its own process id. PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` system user that
Debian's package creates.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any

import psycopg

from .ports import free_port, stop_process, wait_for_port

INSTALL_HINT = "install PostgreSQL with 'make test' or 'apt-get install -y postgresql'"


def _bindir() -> Path:
    found = shutil.which("pg_ctl")
    candidates = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), reverse=True)
    if candidates:
        return candidates[0].parent
    if found:
        return Path(os.path.realpath(found)).parent
    raise RuntimeError(f"PostgreSQL server binaries (initdb, postgres) not found: {INSTALL_HINT}")


class PostgresServer:
    def __init__(self) -> None:
        self.bindir = _bindir()
        self.port = free_port()
        self._tmp = tempfile.TemporaryDirectory(prefix="loomfs-pg-")
        self.datadir = Path(self._tmp.name) / "data"
        self._proc: subprocess.Popen[bytes] | None = None
        self._as_user: dict[str, Any] = {}
        if os.geteuid() == 0:
            try:
                user = pwd.getpwnam("postgres")
            except KeyError:
                raise RuntimeError(
                    f"no 'postgres' system user to run the server as: {INSTALL_HINT}"
                ) from None
            os.chown(self._tmp.name, user.pw_uid, user.pw_gid)
            self._as_user = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}

    @property
    def base_url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}"

    def start(self) -> PostgresServer:
        log = Path(self._tmp.name) / "initdb.log"
        with log.open("wb") as out:
            result = subprocess.run(
                [str(self.bindir / "initdb"), "-D", str(self.datadir), "-U", "postgres",
                 "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C.UTF-8"],
                stdout=out, stderr=subprocess.STDOUT, check=False, **self._as_user,
            )  # fmt: skip
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed: {log.read_text()[-2000:]}")
        self._proc = subprocess.Popen(
            [str(self.bindir / "postgres"), "-D", str(self.datadir), "-p", str(self.port),
             "-k", self._tmp.name, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off",
             "-c", "max_connections=200"],
            stdout=(Path(self._tmp.name) / "server.log").open("wb"), stderr=subprocess.STDOUT,
            start_new_session=True, **self._as_user,
        )  # fmt: skip
        wait_for_port(self.port, 60, self._proc)
        # the port opens before recovery ends ("the database system is starting up")
        deadline = time.monotonic() + 60
        while True:
            try:
                psycopg.connect(f"{self.base_url}/postgres", connect_timeout=5).close()
                return self
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    raise
                time.sleep(0.1)

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        name = f"loomfs_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(f"{self.base_url}/postgres", autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return f"{self.base_url}/{name}"

    def stop(self) -> None:
        if self._proc is not None:
            stop_process(self._proc)
            self._proc = None
        with contextlib.suppress(OSError):
            self._tmp.cleanup()

    def __enter__(self) -> PostgresServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
