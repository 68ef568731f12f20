"""Starting and failing truthfully (service and command layers): a site directory has one
owner process, /readyz says what is wrong with HTTP 503 rather than "ok", and what a user
can fix (a port in use, a directory that can't be made, a URL without a scheme, a hub that
dies mid-job) ends a command as one line instead of a traceback."""

from __future__ import annotations

import asyncio
import os
import shutil
import socket
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from loomfs import health
from loomfs.config import Config
from loomfs.errors import ConfigError
from loomfs.rest.server import RestServer
from loomfs.service import HubService
from loomfs.testing.fabric import fabric
from loomfs.testing.hubproc import run_cli


def hub_config(data_dir: Path) -> Config:
    """A hub that may assimilate what lies beside its data directory."""
    return Config.model_validate(
        {"site": {"data_dir": str(data_dir)}, "audit": {"enabled": False},
         "hub": {"rescan_interval": 0, "watch": False, "volume_roots": [str(data_dir.parent)]}}
    )  # fmt: skip


async def test_a_second_hub_on_one_data_directory_is_refused(tmp_path: Path) -> None:
    """Even with no audit log (whose own lock refused it before), by the directory's lock;
    the first hub's stop frees it."""
    config = hub_config(tmp_path / "hub")
    first = HubService(config)
    await first.start()
    try:
        second = HubService(config)
        with pytest.raises(ConfigError, match=f"in use by process {os.getpid()}") as refused:
            await second.start()
        assert f"data directory {tmp_path / 'hub'}" in str(refused.value)
    finally:
        await first.stop()
    third = HubService(config)
    await third.start()
    await third.stop()


async def test_readyz_is_503_when_the_data_directory_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = HubService(hub_config(tmp_path / "hub"))
    await hub.start()
    try:
        server = RestServer(hub.governed, hub, site="hub", health=hub.health)
        async with TestClient(TestServer(server.app())) as http:
            answer = await http.get("/readyz")  # no credentials: a probe has none
            assert answer.status == 200 and (await answer.json())["status"] == "ready"
            real = shutil.disk_usage

            def full(path: Path) -> Any:
                return real(path)._replace(free=0)

            monkeypatch.setattr(shutil, "disk_usage", full)
            answer = await http.get("/readyz")
            body = await answer.json()
            assert answer.status == 503 and body["status"] == "degraded"
            assert not body["checks"]["disk"]["ok"] and body["checks"]["catalog"]["ok"]
    finally:
        await hub.stop()


async def test_a_spokes_readyz_is_503_while_its_link_is_down(tmp_path: Path) -> None:
    async with fabric(tmp_path) as made:
        spoke = made.spoke
        server = RestServer(spoke, spoke=spoke, health=partial(health.spoke_checks, spoke))
        async with TestClient(TestServer(server.app())) as http:
            assert (await http.get("/readyz")).status == 200
            made.link.cut()
            for _ in range(1500):  # the spoke learns it at its next poll of the feed
                if not spoke.online:
                    break
                await asyncio.sleep(0.02)
            answer = await http.get("/readyz")
            body = await answer.json()
            assert answer.status == 503 and not body["checks"]["link"]["ok"]
            made.link.restore()


def one_line_failure(data_dir: Path, *args: str) -> str:
    """``loomfs ARGS`` that must fail with exit status 1 and one line saying why (beside
    a command's own output: the progress of an import), not a traceback."""
    result = run_cli(data_dir, *args)
    stderr = result.stderr.decode()
    errors = [line for line in stderr.splitlines() if line.startswith("loomfs:")]
    assert result.returncode == 1 and len(errors) == 1 and "Traceback" not in stderr, stderr
    return errors[0]


def test_a_port_in_use_is_one_line(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        line = one_line_failure(tmp_path / "hub", "hub", "serve", "--listen", f"127.0.0.1:{port}")
    assert "address already in use" in line and str(port) in line and "--listen" in line
    assert "Traceback" not in line


def test_a_data_directory_that_cannot_be_made_is_one_line(tmp_path: Path) -> None:
    # as root (these tests may run as root) no permission bit stops a write: a file where
    # the directory should be stops it as surely
    (tmp_path / "file").write_text("in the way")
    line = one_line_failure(tmp_path / "file" / "hub", "hub", "serve", "--listen", "127.0.0.1:0")
    assert str(tmp_path / "file") in line


def test_a_hub_url_without_a_scheme_is_one_line(tmp_path: Path) -> None:
    line = one_line_failure(tmp_path / "site", "--hub", "127.0.0.1:9", "ls", "/")
    assert "http://" in line and "127.0.0.1:9" in line


async def test_a_hub_that_dies_during_volume_add_is_one_line(tmp_path: Path) -> None:
    """A stand-in hub that starts the job's stream of progress lines and dies mid-way."""

    async def dying_hub(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        line = b'{"mount": "/x", "scanned": 5, "done": false}\n'
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: application/x-ndjson\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n" + b"%x\r\n%s\r\n" % (len(line), line)
        )
        await writer.drain()
        writer.close()  # no last chunk: the process was killed

    server = await asyncio.start_server(dying_hub, "127.0.0.1", 0)
    async with server:
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
        args = ("--hub", url, "volume", "add", "/x", f"posix://{tmp_path}")
        line = await asyncio.to_thread(one_line_failure, tmp_path / "site", *args)
    assert "before the last line" in line


async def test_readyz_is_503_when_a_volumes_directory_is_gone(tmp_path: Path) -> None:
    hub = HubService(hub_config(tmp_path / "hub"))
    await hub.start()
    try:
        (tmp_path / "data").mkdir()
        await hub.add_volume("/x", f"posix://{tmp_path / 'data'}", lambda _: None)
        checks = await hub.health()
        assert checks["volumes"] == {"ok": True, "states": {"/x": "ready"}}
        (tmp_path / "data").rmdir()  # an NFS mount gone, say
        checks = await hub.health()
        assert not checks["volumes"]["ok"] and "/x" in checks["volumes"]["error"]
    finally:
        await hub.stop()
