"""Starting truthfully (service layer): a site directory has one owner process, and a
hub's /healthz says what is wrong with HTTP 503 rather than "ok"."""

from __future__ import annotations

import asyncio
import os
import shutil
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


def hub_config(data_dir: Path) -> Config:
    return Config.model_validate(
        {"site": {"data_dir": str(data_dir)}, "audit": {"enabled": False},
         "hub": {"rescan_interval": 0, "watch": False}}
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


async def test_healthz_is_503_when_the_data_directory_is_full(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hub = HubService(hub_config(tmp_path / "hub"))
    await hub.start()
    try:
        server = RestServer(hub.governed, hub, site="hub", health=hub.health)
        async with TestClient(TestServer(server.app())) as http:
            answer = await http.get("/healthz")  # no credentials: a probe has none
            assert answer.status == 200 and (await answer.json())["status"] == "ok"
            real = shutil.disk_usage

            def full(path: Path) -> Any:
                return real(path)._replace(free=0)

            monkeypatch.setattr(shutil, "disk_usage", full)
            answer = await http.get("/healthz")
            body = await answer.json()
            assert answer.status == 503 and body["status"] == "degraded"
            assert not body["checks"]["disk"]["ok"] and body["checks"]["catalog"]["ok"]
    finally:
        await hub.stop()


async def test_a_spokes_healthz_is_503_while_its_link_is_down(tmp_path: Path) -> None:
    async with fabric(tmp_path) as made:
        spoke = made.spoke
        server = RestServer(spoke, spoke=spoke, health=partial(health.spoke_checks, spoke))
        async with TestClient(TestServer(server.app())) as http:
            assert (await http.get("/healthz")).status == 200
            made.link.cut()
            for _ in range(1500):  # the spoke learns it at its next poll of the feed
                if not spoke.online:
                    break
                await asyncio.sleep(0.02)
            answer = await http.get("/healthz")
            body = await answer.json()
            assert answer.status == 503 and not body["checks"]["link"]["ok"]
            made.link.restore()
