"""A hub and a spoke as real processes, set up with the commands a user types: site
identities, pinning, attach, reads and writes at the spoke, warm-up, sync, and a spoke
killed with kill -9 while its write-back journal holds acknowledged writes."""

from __future__ import annotations

import asyncio
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from loomfs.testing.hubproc import HubProcess, SpokeProcess, cli_ok, run_cli, spoke_args
from loomfs.testing.wan import LinkEmulator


async def aok(data_dir: Path, *args: str, stdin: bytes | None = None) -> str:
    """``ok`` off the event loop, which runs the emulated link meanwhile."""
    return await asyncio.to_thread(cli_ok, data_dir, *args, stdin=stdin)


async def test_hub_and_spoke_from_the_command_line(tmp_path: Path) -> None:
    hub_dir, spoke_dir, data = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    (data / "train").mkdir(parents=True)
    for i in range(3):
        (data / "train" / f"shard-{i}.jsonl").write_text(f'{{"shard": {i}}}\n' * 1000)
    cli_ok(hub_dir, "site", "init", "--name", "hub-eu", "--label", "region=eu")
    cli_ok(spoke_dir, "site", "init", "--name", "gpu-west", "--label", "region=us-west")
    pinned = cli_ok(
        hub_dir, "site", "add", "gpu-west", "--cert", str(spoke_dir / "identity/site.pem")
    )
    assert "region=us-west" in pinned  # the labels travel in the certificate
    wrong = run_cli(hub_dir, "site", "add", "other", "--cert", str(spoke_dir / "identity/site.pem"))
    assert wrong.returncode == 1 and b"names site 'gpu-west'" in wrong.stderr

    with HubProcess(
        hub_dir, {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0", "LOOMFS_HUB__LEASE_TTL": "3"}
    ) as hub:
        cli_ok(hub_dir, "--hub", hub.url, "volume", "add", "/datasets/sample", f"posix://{data}")
        fabric = urlsplit(hub.urls["fabric"])
        async with LinkEmulator(fabric.hostname or "", fabric.port or 0, latency=0.002) as link:
            args = spoke_args(
                hub_dir, f"https://127.0.0.1:{link.port}", "/datasets/sample", "--write-back"
            )
            spoke = await asyncio.to_thread(SpokeProcess(spoke_dir, args=args).start)
            try:
                at_spoke = ("--hub", spoke.url)
                listing = await aok(spoke_dir, *at_spoke, "ls", "/datasets/sample/train")
                assert listing.split() == [
                    "shard-0.jsonl", "shard-1.jsonl", "shard-2.jsonl",
                ]  # fmt: skip
                warmed = await aok(spoke_dir, "warm", "/datasets/sample/train", "--site", spoke.url)
                assert "3 files" in warmed
                shard = await aok(
                    spoke_dir, *at_spoke, "cat", "/datasets/sample/train/shard-1.jsonl"
                )
                assert shard.startswith('{"shard": 1}\n')
                await aok(
                    spoke_dir, *at_spoke, "put", "-", "/datasets/sample/out.txt", stdin=b"result"
                )
                await aok(spoke_dir, "sync", "--site", spoke.url)
                assert (data / "out.txt").read_bytes() == b"result"

                # with the link cut, writes are acknowledged from the journal...
                link.cut()
                for i in range(3):
                    await aok(spoke_dir, *at_spoke, "put", "-", f"/datasets/sample/ck-{i}.pt",
                       stdin=f"checkpoint {i}".encode())  # fmt: skip
                # ...and survive kill -9 of the spoke
                spoke.kill()
                link.restore()
                await asyncio.to_thread(spoke.start)
                await aok(spoke_dir, "sync", "--site", spoke.url)
                for i in range(3):
                    assert (data / f"ck-{i}.pt").read_bytes() == f"checkpoint {i}".encode()
                assert not [p for p in data.iterdir() if ".conflict-" in p.name]
                changes = await aok(hub_dir, "--hub", hub.url, "changes", "--limit", "50")
                for i in range(3):  # each acknowledged write committed exactly once
                    assert changes.count(f"ck-{i}.pt") == 1, changes
            finally:
                await asyncio.to_thread(spoke.stop)

        # a revoked spoke is refused (its next request, without a restart of the hub)
        cli_ok(hub_dir, "site", "revoke", "gpu-west")
        listed = cli_ok(hub_dir, "site", "list")
        assert "revoked" in listed
        await asyncio.sleep(2.5)  # the hub re-reads the pinned set every 2 s
        direct = spoke_args(hub_dir, hub.urls["fabric"], "/datasets/sample", "--write-back")
        with pytest.raises(RuntimeError, match="not trusted by the hub"):
            SpokeProcess(spoke_dir, args=direct).start()
