"""kill -9 and SIGINT of a hub process at each stage of a write over REST, and of a
write-back spoke at each stage of its upload. Once the hub is back, the file is exactly
its old state or exactly its new one (volume bytes, catalog, reads and a rescan agree), a
write it acknowledged is there, and its writer's retry lands it once; once the spoke is
back, what it acknowledged is at the hub once. The intent log that makes the hub's so
names every write begun and not ended."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.core.backends.posix import TEMP_PREFIX
from loomfs.core.types import Principal
from loomfs.errors import LoomError
from loomfs.hub.intents import IntentLog
from loomfs.rest.client import RestNamespace
from loomfs.rest.wire import API, WRITE_ID_HEADER
from loomfs.testing.hubproc import (
    HubProcess,
    LoomfsProcess,
    SpokeProcess,
    cli_ok,
    spoke_args,
)
from loomfs.testing.ports import free_port

WHO = Principal(user="tester")
OLD, NEW = b"old content " * 1000, b"the new bytes " * 5000
FILE = f"{API}/files/v/f"

# Imported by the hub's interpreter at its start (sitecustomize): the write stops at the
# stage LOOMFS_TEST_STAGE names, says so in the file LOOMFS_TEST_AT names, and goes on
# after a pause, long enough for the test's signal to arrive there.
PAUSE_AT_STAGE = textwrap.dedent("""
    import asyncio, os, time
    from pathlib import Path

    STAGE, AT = os.environ.get("LOOMFS_TEST_STAGE"), os.environ.get("LOOMFS_TEST_AT")
    if STAGE and AT:
        from loomfs.core.backends.posix import PosixBackend
        from loomfs.hub.namespace import HubNamespace

        def reached():
            Path(AT).write_text(STAGE)
            time.sleep(3)

        commit, record = PosixBackend._commit, HubNamespace._apply_record

        def paused_commit(self, staged, mode):
            if STAGE == "staged":  # every byte spooled, nothing renamed yet
                reached()
            info = commit(self, staged, mode)
            if STAGE == "renamed":  # at its name on the volume; the catalog not told
                reached()
            return info

        async def paused_record(self, *args, **kwargs):
            applied = await record(self, *args, **kwargs)
            if STAGE == "recorded":  # in the catalog; the answer not yet sent
                Path(AT).write_text(STAGE)
                await asyncio.sleep(3)
            return applied

        PosixBackend._commit = paused_commit
        HubNamespace._apply_record = paused_record

        rename, delete = PosixBackend.rename, PosixBackend.delete

        async def paused_rename(self, src, dst):
            await rename(self, src, dst)
            if STAGE == "moved":  # moved on the volume; the catalog not told
                Path(AT).write_text(STAGE)
                await asyncio.sleep(3)

        async def paused_delete(self, key):
            await delete(self, key)
            if STAGE == "removed":  # one file of a directory's removed; the catalog not told
                Path(AT).write_text(STAGE)
                await asyncio.sleep(3)

        PosixBackend.rename = paused_rename
        PosixBackend.delete = paused_delete

        from loomfs.spoke.namespace import SpokeNamespace

        upload, send = SpokeNamespace._upload, SpokeNamespace._send

        async def paused_upload(self, *args, **kwargs):
            if STAGE == "journaled":  # acknowledged, durable in the journal, not yet sent
                Path(AT).write_text(STAGE)
                await asyncio.sleep(3)
            return await upload(self, *args, **kwargs)

        async def paused_send(self, *args, **kwargs):
            entry = await send(self, *args, **kwargs)
            if STAGE == "uploaded":  # committed at the hub, still in the journal
                Path(AT).write_text(STAGE)
                await asyncio.sleep(3)
            return entry

        SpokeNamespace._upload = paused_upload
        SpokeNamespace._send = paused_send
""")


def pausing(tmp: Path, stage: str) -> tuple[dict[str, str], Path]:
    """The environment of a process that pauses at ``stage``, and the file saying it has."""
    hooks = tmp / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(PAUSE_AT_STAGE)
    at = tmp / "reached"
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path, "LOOMFS_TEST_STAGE": stage, "LOOMFS_TEST_AT": str(at)}, at


async def reached(at: Path, stage: str, task: asyncio.Future[Any] | None = None) -> None:
    for _ in range(1500):
        if at.exists() or (task is not None and task.done()):
            break
        await asyncio.sleep(0.02)
    assert at.exists() and at.read_text() == stage, f"{stage} was never reached"


def stop(process: LoomfsProcess, how: signal.Signals) -> None:
    """kill -9 at once, or SIGINT and let it stop (SIGKILL if it lingers)."""
    if how == signal.SIGKILL:
        process.kill()
    else:
        os.killpg(process.pid, signal.SIGINT)
    process.stop()


def visible(volume: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in volume.iterdir() if not p.name.startswith(TEMP_PREFIX)}


# kill -9 between the rename and the catalog's commit left the new bytes at the name under
# the catalog's old entry (a read served the one with the other's size) until a rescan
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "sigint"])
@pytest.mark.parametrize("stage", ["staged", "renamed", "recorded"])
async def test_a_hub_stopped_at_any_stage_of_a_write_is_old_or_new(
    tmp_path: Path, stage: str, how: signal.Signals
) -> None:
    volume = tmp_path / "data"
    volume.mkdir()
    (volume / "f").write_bytes(OLD)
    env, at = pausing(tmp_path, stage)
    hub = HubProcess(tmp_path / "site", env).start()
    try:
        admin = RestNamespace(hub.url, credentials=hub.admin)
        try:
            await admin.add_volume("/v", f"posix://{volume}")
            head = (await admin.changes(0, 1)).head
        finally:
            await admin.close()
        key = {WRITE_ID_HEADER: "the-write"}
        async with aiohttp.ClientSession() as http:
            put = asyncio.create_task(http.put(f"{hub.url}{FILE}", data=NEW, headers=key))
            await reached(at, stage, put)
            if how == signal.SIGKILL:
                hub.kill()
            else:  # the answer comes, or the link drops, while it stops
                os.killpg(hub.pid, signal.SIGINT)
            try:
                acknowledged = (await put).status == 201
            except aiohttp.ClientError:
                acknowledged = False
        hub.stop()  # SIGINT: it stops by itself (SIGTERM, then SIGKILL, if it lingers)
        at.unlink()
        hub.env.pop("LOOMFS_TEST_STAGE")
        hub.start()
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            entry = await client.stat(WHO, "/v/f")
            read = await client.read_bytes(WHO, "/v/f")
            on_disk = visible(volume)
            stats = await client.rescan("/v")
            # its writer tries it again, as a spoke replays its journal: it lands once
            async with (
                aiohttp.ClientSession() as http,
                http.put(f"{hub.url}{FILE}", data=NEW, headers=key) as again,
            ):
                assert again.status == 201, await again.text()
            assert await client.read_bytes(WHO, "/v/f") == NEW
            feed = await client.changes(head, 1000)
            landed = [c for c in feed.changes if c.path == "/v/f"]
        finally:
            await client.close()
        said = f"{stage}, acknowledged {acknowledged}: {entry}, read {len(read)} bytes, {stats}"
        assert read in (OLD, NEW) and entry.size == len(read), said
        assert on_disk == {"f": read}, said  # the volume as the catalog says, nothing else
        assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0), said
        if acknowledged:
            assert read == NEW, f"{stage}: a write the hub acknowledged is lost"
        assert len(landed) == 1, f"{said}; landed {landed}"
    finally:
        hub.stop()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.sampled_from(["/v/a", "/v/b", "/v/c"])), max_size=30))
def test_the_intent_log_names_every_write_begun_and_not_ended(
    steps: list[tuple[bool, str]],
) -> None:
    """Writes of a few paths begin and end interleaved (one path twice at once too); the
    log a crash leaves at any point names exactly the paths with a write still open, each
    with the idempotency key of its last write begun; and it is emptied past its bound
    (small here, so that it is) whenever no write is open."""
    keep, line = 64, 40  # a line here is at most 40 bytes
    with tempfile.TemporaryDirectory() as tmp:
        log = IntentLog(Path(tmp) / "writes.intents", durable=False, keep=keep)
        log.open()
        open_: Counter[str] = Counter()
        last: dict[str, str] = {}
        try:
            for number, (begins, path) in enumerate(steps):
                if begins:
                    asyncio.run(log.begin(path, f"spoke:{number}"))
                    open_[path] += 1
                    last[path] = f"spoke:{number}"
                elif open_[path]:
                    log.end(path)
                    open_[path] -= 1
                crashed = IntentLog(log.path, durable=False)
                assert crashed.unfinished() == {p: last[p] for p in sorted(open_) if open_[p]}
                if not begins and not +open_:
                    assert log.path.stat().st_size < keep + line
        finally:
            log.close()


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "sigint"])
@pytest.mark.parametrize("stage", ["journaled", "uploaded"])
async def test_a_spoke_stopped_at_any_stage_of_a_write_back_loses_nothing(
    tmp_path: Path, stage: str, how: signal.Signals
) -> None:
    """A write-back spoke acknowledged a write (its journal durable): stopped before the
    upload or after the hub's commit but before the journal let go of it, once it is back
    the write is at the hub, with its bytes, exactly once."""
    hub_dir, spoke_dir, volume = tmp_path / "hub", tmp_path / "spoke", tmp_path / "data"
    volume.mkdir()
    cli_ok(hub_dir, "site", "init", "--name", "hub")
    cli_ok(spoke_dir, "site", "init", "--name", "gpu-west")
    cert = str(spoke_dir / "identity/site.pem")
    cli_ok(hub_dir, "site", "add", "gpu-west", "--cert", cert, "--offline")
    fabric_port = {"LOOMFS_FABRIC__LISTEN": f"127.0.0.1:{free_port()}"}
    with HubProcess(hub_dir, fabric_port) as hub:
        cli_ok(hub_dir, "--hub", hub.url, "volume", "add", "/vol", f"posix://{volume}")
        env, at = pausing(tmp_path, stage)
        args = spoke_args(hub_dir, hub.urls["fabric"], "/vol", "--write-back")
        spoke = SpokeProcess(spoke_dir, env, args)
        await asyncio.to_thread(spoke.start)
        try:
            client = RestNamespace(spoke.url)
            try:
                written = await client.write_bytes(WHO, "/vol/ckpt.pt", NEW)
            finally:
                await client.close()
            assert written.version == 0  # acknowledged from the journal
            await reached(at, stage)
            await asyncio.to_thread(stop, spoke, how)
            spoke.env.pop("LOOMFS_TEST_STAGE")
            await asyncio.to_thread(spoke.start)
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
            assert await at_hub.read_bytes(WHO, "/vol/ckpt.pt") == NEW
            feed = await at_hub.changes(0, 10_000)
            landed = [c for c in feed.changes if c.path == "/vol/ckpt.pt"]
            assert len(landed) == 1, f"{stage}: landed {landed}"
        finally:
            await at_hub.close()
    assert (volume / "ckpt.pt").read_bytes() == NEW


@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "sigint"])
@pytest.mark.parametrize("stage", ["moved", "removed"])
async def test_a_hub_stopped_in_a_move_or_a_removal_agrees_with_its_volume(
    tmp_path: Path, stage: str, how: signal.Signals
) -> None:
    """Stopped after the volume moved a file (or removed the first file of a directory it
    removes) and before the catalog heard: once back, the catalog lists what the volume
    holds, the move done or not (the file under one name, whole), the removal part way."""
    volume = tmp_path / "data"
    (volume / "d").mkdir(parents=True)
    (volume / "f").write_bytes(OLD)
    for name in ("a", "b", "c"):
        (volume / "d" / name).write_bytes(name.encode())
    env, at = pausing(tmp_path, stage)
    hub = HubProcess(tmp_path / "site", env).start()
    try:
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            await client.add_volume("/v", f"posix://{volume}")
            change: asyncio.Future[Any] = asyncio.ensure_future(
                client.rename(WHO, "/v/f", "/v/g")
                if stage == "moved"
                else client.remove(WHO, "/v/d", recursive=True)
            )
            await reached(at, stage, change)
            await asyncio.to_thread(stop, hub, how)
            with contextlib.suppress(LoomError, aiohttp.ClientError):
                await change
        finally:
            await client.close()
        at.unlink()
        hub.env.pop("LOOMFS_TEST_STAGE")
        hub.start()
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            listed = {e.path async for e in client.walk(WHO, "/v")}
            stats = await client.rescan("/v")
            names = [n for n in ("f", "g") if f"/v/{n}" in listed]
            assert len(names) == 1, listed  # under one name
            assert await client.read_bytes(WHO, f"/v/{names[0]}") == OLD
        finally:
            await client.close()
        on_disk = {
            "/v/" + str(p.relative_to(volume))
            for p in volume.rglob("*")
            if not p.name.startswith(TEMP_PREFIX)
        }
        assert listed == on_disk, f"{stage}: {listed} in the catalog, {on_disk} on the volume"
        assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0), stats
    finally:
        hub.stop()
