"""kill -9 and SIGINT of a hub process at each stage of a write over REST, and of a
write-back spoke at each stage of its upload. Once the hub is back, the file is exactly
its old state or exactly its new one (volume bytes, catalog, reads and a rescan agree), a
write it acknowledged is there, and its writer's retry lands it once; once the spoke is
back, what it acknowledged is at the hub once. The intent log that makes the hub's so
names every write begun and not ended."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import signal
import stat
import tempfile
import threading
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import asyncssh
import pytest
from botocore.exceptions import BotoCoreError, ClientError
from hypothesis import given, settings
from hypothesis import strategies as st

from loomfs.config import load_config
from loomfs.core.backends.posix import TEMP_PREFIX, PosixBackend
from loomfs.core.types import SYSTEM, Entry, Principal
from loomfs.errors import LoomError
from loomfs.hub.intents import IntentLog, Note
from loomfs.rest.client import RestNamespace
from loomfs.rest.wire import API, WRITE_ID_HEADER
from loomfs.service import HubService
from loomfs.testing.edges import OPS, PART, USER, edge_site
from loomfs.testing.fuse import MountProcess, prepare_site
from loomfs.testing.hubproc import (
    HubProcess,
    SpokeProcess,
    cli_ok,
    spoke_args,
)
from loomfs.testing.ports import free_port
from loomfs.testing.s3gateway import gateway_client
from loomfs.testing.stages import interrupt, pausing, reached, resumed, stop

WHO = Principal(user="tester")
OLD, NEW = b"old content " * 1000, b"the new bytes " * 5000
FILE = f"{API}/files/v/f"
WRITE_STAGES = ["staged", "renamed", "recorded"]  # a write's, in the order it meets them


def on_volume(volume: Path) -> dict[str, bytes]:
    """Every name in the volume's top directory, hidden temp files too."""
    return {p.name: p.read_bytes() for p in volume.iterdir()}


# kill -9 between the rename and the catalog's commit left the new bytes at the name under
# the catalog's old entry (a read served the one with the other's size) until a rescan
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "sigint"])
@pytest.mark.parametrize("stage", WRITE_STAGES)
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
            interrupt(hub, how)  # with SIGINT, the answer comes or the link drops as it stops
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
            on_disk = on_volume(volume)
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
        # the volume as the catalog says, nothing else: no temp file the write left behind
        assert on_disk == {"f": read}, said
        assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0), said
        if acknowledged:
            assert read == NEW, f"{stage}: a write the hub acknowledged is lost"
        assert len(landed) == 1, f"{said}; landed {landed}"
    finally:
        hub.stop()


# a file with two names is written in place (a rename would cut it off from the other):
# killed in that copy, it stayed torn (empty here) under both names, the copy of its old
# bytes swept away at the next start
async def test_a_hub_killed_writing_a_hard_linked_file_in_place_leaves_it_old_or_new(
    tmp_path: Path,
) -> None:
    volume = tmp_path / "data"
    volume.mkdir()
    (volume / "f").write_bytes(OLD)
    (volume / "g").hardlink_to(volume / "f")
    env, at = pausing(tmp_path, "torn")
    hub = HubProcess(tmp_path / "site", env).start()
    try:
        admin = RestNamespace(hub.url, credentials=hub.admin)
        try:
            await admin.add_volume("/v", f"posix://{volume}")
        finally:
            await admin.close()
        async with aiohttp.ClientSession() as http:
            put = asyncio.create_task(http.put(f"{hub.url}{FILE}", data=NEW))
            await reached(at, "torn", put)
            hub.kill()
            with contextlib.suppress(aiohttp.ClientError):
                await put
        resumed(hub, at)
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            reads = [await client.read_bytes(WHO, f"/v/{n}") for n in ("f", "g")]
            sizes = [(await client.stat(WHO, f"/v/{n}")).size for n in ("f", "g")]
            stats = await client.rescan("/v")
        finally:
            await client.close()
        said = f"read {[len(r) for r in reads]} bytes, sizes {sizes}, {stats}"
        assert reads[0] in (OLD, NEW) and reads == [reads[0]] * 2, said
        assert sizes == [len(reads[0])] * 2, said
        assert on_volume(volume) == {"f": reads[0], "g": reads[0]}, said  # nothing else
        assert (volume / "f").stat().st_ino == (volume / "g").stat().st_ino  # still one file
        assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0), said
    finally:
        hub.stop()


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["begin", "note", "drop", "end", "stage", "unstage"]),
            st.sampled_from(["/v/a", "/v/b", "/v/c"]),
        ),
        max_size=30,
    )
)
def test_the_intent_log_names_every_write_begun_and_not_ended(
    steps: list[tuple[str, str]],
) -> None:
    """Writes of a few paths stage, begin and end their commits interleaved (one path
    twice at once too), some begun by a note written in another thread (as a volume's
    commit writes it) and some by a note ended without ever being written (a commit that
    never ran); the log a crash leaves at any point names exactly the paths with a commit
    still open, each with the idempotency key of its last write begun, and the paths with
    a staging still open; and it is emptied past its bound (small here, so that it is)
    whenever nothing is open."""
    keep, line = 64, 40  # a line here is at most 40 bytes
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        log = IntentLog(Path(tmp) / "writes.intents", durable=False, keep=keep)
        log.open()
        stack.callback(log.close)
        open_: Counter[str] = Counter()
        last: dict[str, str] = {}
        staging: dict[str, list[contextlib.ExitStack]] = {}
        notes: dict[str, list[Note]] = {}
        for number, (op, path) in enumerate(steps):
            if op == "begin":
                asyncio.run(log.begin(path, f"spoke:{number}"))
                open_[path] += 1
                last[path] = f"spoke:{number}"
            elif op == "note":
                note = asyncio.run(log.note(path, f"spoke:{number}"))
                writer = threading.Thread(target=note)
                writer.start()
                writer.join()
                notes.setdefault(path, []).append(note)
                open_[path] += 1
                last[path] = f"spoke:{number}"
            elif op == "drop":
                asyncio.run(log.note(path, f"spoke:{number}")).end()
            elif op == "end" and open_[path]:
                if notes.get(path):
                    notes[path].pop().end()
                else:
                    log.end(path)
                open_[path] -= 1
            elif op == "stage":
                one = contextlib.ExitStack()
                one.enter_context(log.staging(path))
                staging.setdefault(path, []).append(one)
            elif op == "unstage" and staging.get(path):
                staging[path].pop().close()
            crashed = IntentLog(log.path, durable=False)
            assert crashed.unfinished() == {p: last[p] for p in sorted(open_) if open_[p]}
            assert crashed.staged() == sorted(p for p, s in staging.items() if s)
            if op in ("end", "unstage") and not +open_ and not any(staging.values()):
                assert log.path.stat().st_size < keep + line


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


# each of these changed the volume and then the catalog with no intent noted between: a hub
# killed there came back with the directory, the link or the mode on the volume only
@pytest.mark.parametrize("stage", ["made", "linked", "chmodded"])
async def test_a_hub_killed_in_a_mkdir_a_symlink_or_a_chmod_agrees_with_its_volume(
    tmp_path: Path, stage: str
) -> None:
    volume = tmp_path / "data"
    volume.mkdir()
    (volume / "f").write_bytes(OLD)
    (volume / "f").chmod(0o644)
    env, at = pausing(tmp_path, stage)
    hub = HubProcess(tmp_path / "site", env).start()
    try:
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            await client.add_volume("/v", f"posix://{volume}")
            changes = {
                "made": lambda: client.mkdir(WHO, "/v/d"),
                "linked": lambda: client.symlink(WHO, "/v/l", "f"),
                "chmodded": lambda: client.set_attrs(WHO, "/v/f", mode=0o600),
            }
            change: asyncio.Future[Any] = asyncio.ensure_future(changes[stage]())
            await reached(at, stage, change)
            hub.kill()
            with contextlib.suppress(LoomError, aiohttp.ClientError):
                await change
        finally:
            await client.close()
        resumed(hub, at)
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            listed = {
                e.path: (e.kind.value, stat.S_IMODE(e.mode)) async for e in client.walk(WHO, "/v")
            }
            stats = await client.rescan("/v")
        finally:
            await client.close()
        kinds = {stat.S_IFDIR: "dir", stat.S_IFLNK: "symlink", stat.S_IFREG: "file"}
        held = {
            f"/v/{p.name}": (kinds[stat.S_IFMT(st.st_mode)], stat.S_IMODE(st.st_mode))
            for p in volume.iterdir()
            if (st := p.lstat())
        }
        assert listed == held, f"{stage}: {listed} in the catalog, {held} on the volume"
        assert (stats["created"], stats["modified"], stats["deleted"]) == (0, 0, 0), stats
    finally:
        hub.stop()


MULTIPART = NEW * (PART // len(NEW) + 1) + NEW  # its first part, then NEW


async def _files(client: RestNamespace, top: str) -> dict[str, tuple[object, ...]]:
    walked = client.walk(WHO, top)
    return {e.path: (e.version, e.size, e.etag, e.mtime_ns) async for e in walked if not e.is_dir}


def _s3_etag(op: str, body: bytes) -> str:
    """The ETag S3 gives ``body`` written by ``op`` (two parts, ``PART`` the first)."""
    if op == "s3-put":
        return f'"{hashlib.md5(body).hexdigest()}"'
    digests = b"".join(hashlib.md5(p).digest() for p in (body[:PART], body[PART:]))
    return f'"{hashlib.md5(digests).hexdigest()}-2"'


# the hub's stages are below every edge: S3's and SFTP's writes stop there too. An S3
# write's metadata (its ETag, user metadata) was set after its commit: kill -9 between left
# the new bytes with the old object's metadata, and no ETag of their own. A SIGINT runs the
# hub's own shutdown, which the REST write above meets at every stage; here it runs once per
# edge, where the bytes are in place and not yet recorded (the edge's spool and upload state)
@pytest.mark.parametrize(
    ("stage", "how"),
    [
        *(pytest.param(s, signal.SIGKILL, id=f"{s}-kill-9") for s in WRITE_STAGES),
        pytest.param("renamed", signal.SIGINT, id="renamed-sigint"),
    ],
)
@pytest.mark.parametrize("op", OPS)
async def test_a_hub_stopped_at_any_stage_of_an_s3_or_sftp_write_is_old_or_new(
    tmp_path: Path, op: str, stage: str, how: signal.Signals
) -> None:
    env, at = pausing(tmp_path, stage)
    sites = (tmp_path / "site", tmp_path / "data", tmp_path / "loomfs.toml")
    hub, edge = await edge_site(*sites, env, OLD)
    volume = tmp_path / "data" / "bkt"
    body = MULTIPART if op == "s3-multipart" else NEW
    try:
        admin = RestNamespace(hub.url, credentials=hub.admin)
        try:  # the old object's own metadata, as an S3 write of it would have left it
            await admin.set_tags(WHO, "/s3/bkt/existing", {"s3.meta.which": "old"})
        finally:
            await admin.close()
        write = asyncio.ensure_future(edge.write(op, "existing", body, {"which": "new"}))
        await reached(at, stage, write)
        await asyncio.to_thread(stop, hub, how)
        try:
            await write
            acknowledged = True
        except (BotoCoreError, ClientError, asyncssh.Error, OSError):
            acknowledged = False
        resumed(hub, at)
        client = RestNamespace(hub.url, credentials=hub.admin)
        try:
            entry = await client.stat(WHO, "/s3/bkt/existing")
            read = await client.read_bytes(WHO, "/s3/bkt/existing")
            files = await _files(client, "/s3")
            stats = await client.rescan("/s3")
            rescanned = await _files(client, "/s3")
        finally:
            await client.close()
        said = f"{op} {stage}, acknowledged {acknowledged}: read {len(read)} bytes, {stats}"
        assert read in (OLD, body) and entry.size == len(read), said
        assert on_volume(volume) == {"existing": read}, said  # no temp file left either
        # a rescan finds every file as the catalog has it (a directory's mtime may lag: a
        # temp file made and removed in it moves it, and its inotify events are ignored)
        assert files == rescanned, said
        if acknowledged:
            assert read == body, f"{said}: a write the hub acknowledged is lost"
        if op != "sftp":  # its metadata is the same version's as its bytes
            s3 = gateway_client(hub.urls["s3"], *USER[1:])
            head = await asyncio.to_thread(s3.head_object, Bucket="bkt", Key="existing")
            which = "new" if read == body else "old"
            assert head["Metadata"] == {"which": which}, f"{said}: {head['Metadata']}"
            if read == body:
                assert head["ETag"] == _s3_etag(op, body), f"{said}: {head['ETag']}"
        # and it goes on serving writes
        await edge.write(op, "after", body)
        assert (volume / "after").read_bytes() == body
    finally:
        hub.stop()


async def _settled_site(config: Path) -> tuple[Entry, bytes, list[object], list[object]]:
    """The site of ``config`` started again in this process (its start recovers): the
    file /v/f's entry and bytes, and the catalog's file rows before and after a rescan."""
    service = HubService(load_config(config))
    await service.start()
    try:
        ns = service.namespace

        async def files() -> list[object]:
            walked = ns.walk(SYSTEM, "/v")
            return [(e.path, e.version, e.size, e.etag) async for e in walked if not e.is_dir]

        entry = await ns.stat(SYSTEM, "/v/f")
        read = await ns.read_bytes(SYSTEM, "/v/f")
        before = await files()
        await ns.sync_volume("/v")
        return entry, read, before, await files()
    finally:
        await service.stop()


# the mount's own hub has the same stages: a write through FUSE, closed, stops there too.
# Ctrl-C between the rename and the record left the new version in the catalog and the old
# file on the volume: the cancelled commit was undone only after the stopping mount had
# noted its write as over (the undo waited for the commit's thread in a callback)
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGINT], ids=["kill-9", "sigint"])
@pytest.mark.parametrize("stage", WRITE_STAGES)
async def test_a_mount_stopped_at_any_stage_of_a_write_is_old_or_new(
    tmp_path: Path, stage: str, how: signal.Signals
) -> None:
    volume = tmp_path / "vol"
    volume.mkdir()
    (volume / "f").write_bytes(OLD)
    (tmp_path / "site").mkdir()
    config = await asyncio.to_thread(prepare_site, tmp_path / "site", {"/v": volume})
    env, at = pausing(tmp_path, stage)
    mount = MountProcess(config, tmp_path / "mnt", env=env).start()

    def write() -> None:
        with (mount.mountpoint / "v" / "f").open("wb") as file:
            file.write(NEW)

    try:
        written = asyncio.ensure_future(asyncio.to_thread(write))
        await reached(at, stage, written)
        await asyncio.to_thread(stop, mount, how)
        try:
            await written
            acknowledged = True
        except OSError:  # ENOTCONN: the mount went away under it
            acknowledged = False
    finally:
        mount.stop()
    entry, read, files, rescanned = await _settled_site(config)
    said = f"{stage}, acknowledged {acknowledged}: {entry}, read {len(read)} bytes"
    said += f"; on the volume { {k: len(v) for k, v in on_volume(volume).items()} }, {files}"
    assert read in (OLD, NEW) and entry.size == len(read), said
    assert on_volume(volume) == {"f": read}, said  # no temp file left either
    assert files == rescanned, said
    if acknowledged:
        assert read == NEW, f"{said}: a write the mount acknowledged is lost"


@settings(max_examples=50, deadline=None)
@given(
    st.dictionaries(
        st.one_of(
            st.text("abc.-", min_size=1, max_size=6).filter(lambda n: n not in (".", "..")),
            st.text("0123456789abcdef", min_size=1, max_size=16).map(lambda n: TEMP_PREFIX + n),
        ),
        st.booleans(),  # a directory, or a file
        max_size=8,
    )
)
def test_the_sweep_removes_exactly_the_temp_files_beside_a_write(names: dict[str, bool]) -> None:
    """What a stopped write leaves beside its name (its staged bytes, what it replaced
    kept aside) goes at the next start; every other name, hidden or not, stays."""
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        for name, is_dir in names.items():
            if is_dir and not name.startswith(TEMP_PREFIX):
                (root / name).mkdir()
            else:
                (root / name).write_bytes(b"x")
        removed = asyncio.run(PosixBackend(tmp).sweep("written"))
        temps = {n for n in names if n.startswith(TEMP_PREFIX)}
        assert sorted(removed) == sorted(temps)
        assert {p.name for p in root.iterdir()} == set(names) - temps
