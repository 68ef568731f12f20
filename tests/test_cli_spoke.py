"""A hub and a spoke as real processes, set up with the commands a user types: site
identities, pinning, attach, reads and writes at the spoke, warm-up, sync, /readyz with the
link cut, a spoke killed with kill -9 while its write-back journal holds acknowledged
writes; and spokes that cannot link (or share a cache directory) refused with one line."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from loomfs.testing.hubproc import HubProcess, SpokeProcess, cli_ok, run_cli, spoke_args
from loomfs.testing.wan import LinkEmulator


def health_status(url: str) -> int:
    """The HTTP status of ``url``'s /readyz, asked with no credentials (as a probe asks)."""
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=30) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as refused:
        return refused.code


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
        hub_dir,
        "site",
        "add",
        "gpu-west",
        "--offline",
        "--cert",
        str(spoke_dir / "identity/site.pem"),
    )
    assert "region=us-west" in pinned  # the labels travel in the certificate
    wrong = run_cli(
        hub_dir, "site", "add", "other", "--offline", "--cert", str(spoke_dir / "identity/site.pem")
    )
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

                assert await asyncio.to_thread(health_status, spoke.url) == 200
                # with the link cut, writes are acknowledged from the journal...
                link.cut()
                for _ in range(1500):  # /readyz says so once the spoke noticed
                    if await asyncio.to_thread(health_status, spoke.url) == 503:
                        break
                    await asyncio.sleep(0.02)
                else:
                    raise AssertionError("/readyz never said the link is down")
                # ...cached files are still served...
                cached = await aok(
                    spoke_dir, *at_spoke, "cat", "/datasets/sample/train/shard-1.jsonl"
                )
                assert cached.startswith('{"shard": 1}\n')
                for i in range(3):
                    put = await aok(spoke_dir, *at_spoke, "put", "-", f"/datasets/sample/ck-{i}.pt",
                       stdin=f"checkpoint {i}".encode())  # fmt: skip
                    assert "journaled at the spoke" in put and "version 0" not in put, put
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
        cli_ok(hub_dir, "--hub", hub.url, "site", "revoke", "gpu-west")
        listed = cli_ok(hub_dir, "--hub", hub.url, "site", "list")
        assert "revoked" in listed
        await asyncio.sleep(2.5)  # the hub re-reads the pinned set every 2 s
        direct = spoke_args(hub_dir, hub.urls["fabric"], "/datasets/sample", "--write-back")
        with pytest.raises(RuntimeError, match="not trusted by the hub"):
            SpokeProcess(spoke_dir, args=direct).start()


def refused_start(data_dir: Path, *args: str) -> str:
    """``loomfs ARGS`` that must exit non-zero at once: its one line of standard error
    (a command that keeps serving is killed after 60 s and fails the test)."""
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(data_dir)}
    try:
        result = subprocess.run(
            [sys.executable, "-m", "loomfs.cli", *args],
            capture_output=True, check=False, timeout=60, env=env,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        raise AssertionError(f"`loomfs {' '.join(args)}` kept running") from None
    lines = [line for line in result.stderr.decode().splitlines() if line.strip()]
    assert result.returncode != 0 and len(lines) == 1, result.stderr.decode()
    return lines[0]


def test_a_spoke_that_cannot_link_says_why_and_exits(tmp_path: Path) -> None:
    hub_dir, spoke_dir, stranger = tmp_path / "hub", tmp_path / "spoke", tmp_path / "stranger"
    data = tmp_path / "data"
    data.mkdir()
    cli_ok(hub_dir, "site", "init", "--name", "hub-eu")
    cli_ok(spoke_dir, "site", "init", "--name", "gpu-west")
    cli_ok(stranger, "site", "init", "--name", "stranger")
    spoke_cert = str(spoke_dir / "identity/site.pem")
    with HubProcess(hub_dir, {"LOOMFS_FABRIC__LISTEN": "127.0.0.1:0"}) as hub:
        cli_ok(hub_dir, "--hub", hub.url, "volume", "add", "/datasets/sample", f"posix://{data}")
        fabric = hub.urls["fabric"]
        serve = ("spoke", "serve", "--listen", "127.0.0.1:0")

        unpinned = refused_start(spoke_dir, *serve, *spoke_args(hub_dir, fabric, "/datasets"))
        assert "refused this site's certificate" in unpinned
        assert "loomfs site add gpu-west --cert" in unpinned and spoke_cert in unpinned

        cli_ok(hub_dir, "--hub", hub.url, "site", "add", "gpu-west", "--cert", spoke_cert)
        wrong_hub = spoke_args(hub_dir, fabric, "/datasets")
        wrong_hub = (
            *wrong_hub[:2],
            "--hub-cert",
            str(stranger / "identity/site.pem"),
            *wrong_hub[4:],
        )
        assert "is not the hub pinned in" in refused_start(spoke_dir, *serve, *wrong_hub)

        rest = hub.url.replace("http://", "https://")  # the REST port, not the fabric one
        rest_port = refused_start(spoke_dir, *serve, *spoke_args(hub_dir, rest, "/datasets"))
        assert "does not answer TLS" in rest_port and "fabric" in rest_port
        plain = refused_start(spoke_dir, *serve, *spoke_args(hub_dir, hub.url, "/datasets"))
        assert "must be https://HOST:PORT" in plain

        missing = refused_start(spoke_dir, *serve, *spoke_args(hub_dir, fabric, "/nowhere"))
        assert "the hub has no /nowhere to attach" in missing

        # one spoke per cache directory (one journal): a second one is refused at once
        good = spoke_args(hub_dir, fabric, "/datasets/sample")
        with SpokeProcess(spoke_dir, args=good) as first:
            second = refused_start(spoke_dir, *serve, *good)
            assert (
                f"cache directory {spoke_dir / 'cache'} is in use by process {first.pid}" in second
            )
