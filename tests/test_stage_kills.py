"""kill -9 and SIGINT of a hub process at each stage of a write over REST: after it starts
again, the file is exactly its old state or exactly its new one (volume bytes, catalog,
reads and a rescan agree), and a write it acknowledged is there."""

from __future__ import annotations

import asyncio
import os
import signal
import textwrap
from pathlib import Path

import aiohttp
import pytest

from loomfs.core.backends.posix import TEMP_PREFIX
from loomfs.core.types import Principal
from loomfs.rest.client import RestNamespace
from loomfs.rest.wire import API
from loomfs.testing.hubproc import HubProcess

WHO = Principal(user="tester")
OLD, NEW = b"old content " * 1000, b"the new bytes " * 5000

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


# kill -9 between the rename and the catalog's commit leaves the new bytes at the name and
# the old entry in the catalog (a read serves the one with the other's size) until a rescan:
# no start-up recovery undoes a rename the catalog never recorded yet (an intent record
# before the rename would). Strict: it fails the suite once that is fixed, to be unmarked.
TORN = pytest.mark.xfail(
    strict=True, reason="no recovery of a rename the catalog did not record (issue 22)"
)
CASES = [
    pytest.param(stage, how, id=case, marks=[TORN] if case == "renamed-kill-9" else [])
    for stage in ("staged", "renamed", "recorded")
    for how, name in ((signal.SIGKILL, "kill-9"), (signal.SIGINT, "sigint"))
    for case in [f"{stage}-{name}"]
]


@pytest.mark.parametrize(("stage", "how"), CASES)
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
        finally:
            await admin.close()
        async with aiohttp.ClientSession() as http:
            put = asyncio.create_task(http.put(f"{hub.url}{API}/files/v/f", data=NEW))
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
        finally:
            await client.close()
        assert read in (OLD, NEW) and entry.size == len(read)
        assert on_disk == {"f": read}  # the volume as the catalog says, and nothing else
        assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0)
        if acknowledged:
            assert read == NEW, f"{stage}: a write the hub acknowledged is lost"
    finally:
        hub.stop()
