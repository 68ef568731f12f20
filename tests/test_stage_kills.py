"""kill -9 and SIGINT of a hub process at each stage of a write over REST: after it starts
again, the file is exactly its old state or exactly its new one (volume bytes, catalog,
reads and a rescan agree), a write it acknowledged is there, and its writer's retry lands
it once; the intent log that makes it so names every write begun and not ended."""

from __future__ import annotations

import asyncio
import os
import signal
import tempfile
import textwrap
from collections import Counter
from pathlib import Path

import aiohttp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.core.backends.posix import TEMP_PREFIX
from loomfs.core.types import Principal
from loomfs.hub.intents import IntentLog
from loomfs.rest.client import RestNamespace
from loomfs.rest.wire import API, WRITE_ID_HEADER
from loomfs.testing.hubproc import HubProcess

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
""")


def pausing_hub(tmp: Path, stage: str) -> tuple[HubProcess, Path]:
    hooks = tmp / "hooks"
    hooks.mkdir(exist_ok=True)
    (hooks / "sitecustomize.py").write_text(PAUSE_AT_STAGE)
    at = tmp / "reached"
    path = os.pathsep.join(p for p in (str(hooks), os.environ.get("PYTHONPATH")) if p)
    env = {"PYTHONPATH": path, "LOOMFS_TEST_STAGE": stage, "LOOMFS_TEST_AT": str(at)}
    return HubProcess(tmp / "site", env), at


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
    hub, at = pausing_hub(tmp_path, stage)
    hub.start()
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
            for _ in range(1500):
                if at.exists() or put.done():
                    break
                await asyncio.sleep(0.02)
            assert at.read_text() == stage, "the write never reached its stage"
            if how == signal.SIGKILL:
                hub.kill()
            else:
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
    with the idempotency key of its last write begun."""
    with tempfile.TemporaryDirectory() as tmp:
        log = IntentLog(Path(tmp) / "writes.intents", durable=False)
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
        finally:
            log.close()
