"""kill -9 of a spoke during write-back and of the hub during commits, as real processes:
after both restart, every write the spoke acknowledged is at the hub exactly once, with its
bytes, and nothing half-written is visible."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from loomfs.core.types import Principal
from loomfs.rest.client import RestNamespace
from loomfs.testing.hubproc import HubProcess, SpokeProcess, cli_ok, spoke_args
from loomfs.testing.ports import free_port
from loomfs.testing.wan import LinkEmulator

WHO = Principal(user="tester")
FILES = 24
SIZE = 256 << 10


async def write_all(spoke: RestNamespace, payloads: dict[str, bytes]) -> None:
    for name, data in payloads.items():
        await spoke.write_bytes(WHO, f"/vol/{name}", data)  # acknowledged: journal durable


async def test_kill_spoke_and_hub_mid_write_back(tmp_path: Path) -> None:
    hub_dir, spoke_dir, data = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    data.mkdir()
    cli_ok(hub_dir, "site", "init", "--name", "hub")
    cli_ok(spoke_dir, "site", "init", "--name", "gpu-west")
    cli_ok(
        hub_dir,
        "site",
        "add",
        "gpu-west",
        "--cert",
        str(spoke_dir / "identity/site.pem"),
        "--offline",
    )
    # the hub comes back on the same fabric port, behind the same link
    hub = HubProcess(
        hub_dir,
        {"LOOMFS_FABRIC__LISTEN": f"127.0.0.1:{free_port()}", "LOOMFS_HUB__LEASE_TTL": "3"},
    ).start()
    try:
        cli_ok(hub_dir, "--hub", hub.url, "volume", "add", "/vol", f"posix://{data}")
        fabric = urlsplit(hub.urls["fabric"])
        # slow enough that uploads are still under way when the processes die
        async with LinkEmulator(fabric.hostname or "", fabric.port or 0, rate=2e6) as link:
            args = spoke_args(hub_dir, f"https://127.0.0.1:{link.port}", "/vol", "--write-back")
            spoke = await asyncio.to_thread(SpokeProcess(spoke_dir, args=args).start)
            try:
                payloads = {f"ck-{i:02}.pt": os.urandom(SIZE) for i in range(FILES)}
                client = RestNamespace(spoke.url)
                try:
                    await write_all(client, payloads)
                finally:
                    await client.close()
                assert len(list(data.iterdir())) < FILES, "uploads finished before the crash"

                spoke.kill()
                await asyncio.to_thread(spoke.start)
                await asyncio.sleep(1.0)  # the restarted spoke replays; the hub commits
                hub.kill()
                await asyncio.to_thread(hub.start)

                client = RestNamespace(spoke.url)
                try:
                    async with asyncio.timeout(120):
                        await client.sync()
                finally:
                    await client.close()
            finally:
                await asyncio.to_thread(spoke.stop)

        at_hub = RestNamespace(hub.url)
        try:
            names = sorted([e.name async for e in at_hub.list(WHO, "/vol")])
            assert names == sorted(payloads), "a lost, duplicated or half-written file"
            for name, content in payloads.items():
                assert await at_hub.read_bytes(WHO, f"/vol/{name}") == content, name
            feed = await at_hub.changes(0, limit=10_000)
            commits = Counter(c.path for c in feed.changes if c.path.startswith("/vol/ck-"))
            assert set(commits.values()) == {1}, f"committed more than once: {commits}"
        finally:
            await at_hub.close()
    finally:
        hub.stop()
