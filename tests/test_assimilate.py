"""Assimilation: import, rescans, inotify, lazy detection, resume after kill -9, bad input."""

from __future__ import annotations

import asyncio
import errno
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loomfs.config import Config
from loomfs.core.registry import open_catalog
from loomfs.core.types import ChangeOp, EntryKind, Principal, VolumeState
from loomfs.errors import (
    AlreadyExists,
    AuthenticationFailed,
    BackendUnavailable,
    Conflict,
    NotFound,
    PermissionDenied,
    UnsupportedScheme,
)
from loomfs.hub.namespace import HubNamespace
from loomfs.service import HubService
from loomfs.testing.ports import free_port
from loomfs.testing.seaweedfs import SeaweedFS

WHO = Principal(user="tester")


def make_tree(root: Path, dirs: int = 5, files: int = 20) -> set[str]:
    """A small tree; returns every relative path in it (directories too)."""
    made: set[str] = set()
    for d in range(dirs):
        sub = root / f"d{d}" / "nested"
        sub.mkdir(parents=True)
        made |= {f"d{d}", f"d{d}/nested"}
        for f in range(files):
            (sub / f"f{f}.bin").write_bytes(b"x" * (f + d))
            made.add(f"d{d}/nested/f{f}.bin")
    (root / "top.txt").write_text("top")
    made.add("top.txt")
    return made


@pytest.fixture
async def hub(tmp_path: Path) -> AsyncIterator[HubNamespace]:
    catalog = open_catalog(f"sqlite://{tmp_path / 'catalog.db'}")
    await catalog.open()
    namespace = HubNamespace(catalog)
    yield namespace
    await namespace.close()
    await catalog.close()


async def tree_of(hub: HubNamespace, top: str) -> dict[str, tuple[str, int]]:
    return {
        e.path[len(top) + 1 :]: (e.kind.value, e.size if not e.is_dir else 0)
        async for e in hub.walk(WHO, top)
    }


def disk_tree(root: Path) -> dict[str, tuple[str, int]]:
    out: dict[str, tuple[str, int]] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            out[os.path.relpath(os.path.join(dirpath, name), root)] = ("dir", 0)
        for name in filenames:
            path = os.path.join(dirpath, name)
            out[os.path.relpath(path, root)] = ("file", os.path.getsize(path))
    return out


async def test_import_matches_the_tree_and_rescan_finds_changes(
    hub: HubNamespace, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    made = make_tree(root)
    stats = await hub.add_volume("/datasets/x", f"posix://{root}")
    assert stats.created == len(made) and stats.scanned == len(made)
    assert await tree_of(hub, "/datasets/x") == disk_tree(root)
    assert [e.name async for e in hub.list(WHO, "/")] == ["datasets"]

    # an unchanged rescan changes nothing and takes no sequence number
    head = await hub.catalog.head_seq()
    again = await hub.sync_volume("/datasets/x")
    assert (again.created, again.modified, again.deleted) == (0, 0, 0)
    assert await hub.catalog.head_seq() == head

    before = await hub.stat(WHO, "/datasets/x/top.txt")
    (root / "top.txt").write_text("changed behind loomfs's back")
    (root / "new.txt").write_text("new")
    (root / "d0" / "nested" / "f1.bin").unlink()
    for child in (root / "d1" / "nested").iterdir():
        child.unlink()
    (root / "d1" / "nested").rmdir()
    (root / "d1").rmdir()
    stats = await hub.sync_volume("/datasets/x")
    assert (stats.created, stats.modified) == (1, 2)  # top.txt, and d0/nested lost a child
    assert stats.deleted == 1 + 2 + 20  # f1.bin, d1 and d1/nested, d1's 20 files
    assert await tree_of(hub, "/datasets/x") == disk_tree(root)
    after = await hub.stat(WHO, "/datasets/x/top.txt")
    assert after.version > before.version
    ops = [c.op for c in await hub.catalog.changes(head)]
    assert ops.count(ChangeOp.MODIFY) >= 1 and ChangeOp.DELETE in ops


async def test_lazy_detection_on_read(hub: HubNamespace, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "f").write_text("old")
    await hub.add_volume("/v", f"posix://{root}")
    old = await hub.stat(WHO, "/v/f")
    (root / "f").write_text("new content")
    assert await hub.read_bytes(WHO, "/v/f") == b"new content"
    fresh = await hub.stat(WHO, "/v/f")
    assert fresh.version > old.version and fresh.size == len("new content")


async def test_change_during_read_is_an_error_not_a_mix(hub: HubNamespace, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    (root / "f").write_bytes(b"a" * (4 << 20))
    await hub.add_volume("/v", f"posix://{root}")
    async with await hub.read(WHO, "/v/f") as reader:
        chunks = reader.chunks()
        first = await anext(chunks)
        with (root / "f").open("r+b") as f:  # an in-place edit by another tool
            f.seek(3 << 20)
            f.write(b"b" * 100)
            os.utime(f.fileno(), ns=(time.time_ns(), time.time_ns() + 10**9))
        rest = [c async for c in chunks]
        with pytest.raises(Conflict):
            await reader.verify()
    assert len(first) + sum(map(len, rest)) == 4 << 20


async def test_symlink_out_of_the_volume_is_never_followed(
    hub: HubNamespace, tmp_path: Path
) -> None:
    root = tmp_path / "data"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_text("outside the volume")
    (root / "escape").symlink_to(secret)
    (root / "inside").write_text("fine")
    (root / "ok-link").symlink_to("inside")
    await hub.add_volume("/v", f"posix://{root}")
    escape = await hub.stat(WHO, "/v/escape")
    assert escape.kind is EntryKind.SYMLINK and escape.link_target == str(secret)
    with pytest.raises(PermissionDenied):
        await hub.read_bytes(WHO, "/v/escape")
    assert await hub.read_bytes(WHO, "/v/ok-link") == b"fine"


async def test_bad_volumes_are_refused_and_change_nothing(
    hub: HubNamespace, tmp_path: Path, seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch
) -> None:
    head = await hub.catalog.head_seq()
    with pytest.raises(NotFound):
        await hub.add_volume("/v", f"posix://{tmp_path / 'does-not-exist'}")
    with pytest.raises(UnsupportedScheme, match="posix://"):
        await hub.add_volume("/v", "ftp://example/x")
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    seaweedfs.create_bucket(bucket)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-secret")
    with pytest.raises(AuthenticationFailed):
        await hub.add_volume("/v", f"s3://{bucket}?endpoint={seaweedfs.endpoint}")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    with pytest.raises(NotFound):
        await hub.add_volume("/v", f"s3://no-such-bucket-{bucket}?endpoint={seaweedfs.endpoint}")
    with pytest.raises(BackendUnavailable):
        await hub.add_volume("/v", f"s3://{bucket}?endpoint=http://127.0.0.1:{free_port()}")
    assert await hub.catalog.volumes() == []
    assert await hub.catalog.head_seq() == head
    (tmp_path / "a").mkdir()
    await hub.add_volume("/v", f"posix://{tmp_path / 'a'}")
    with pytest.raises(AlreadyExists):
        await hub.add_volume("/v/inner", f"posix://{tmp_path / 'a'}")


async def test_s3_volume_rescan_finds_changes(
    hub: HubNamespace, seaweedfs: SeaweedFS, s3_env: None
) -> None:
    bucket = f"b-{uuid.uuid4().hex[:10]}"
    seaweedfs.create_bucket(bucket)
    s3 = seaweedfs.client()
    for i in range(30):
        s3.put_object(Bucket=bucket, Key=f"imgs/{i:02d}.jpg", Body=b"j" * i)
    s3.put_object(Bucket=bucket, Key="labels.csv", Body=b"a,b\n")
    stats = await hub.add_volume("/s3", f"s3://{bucket}?endpoint={seaweedfs.endpoint}")
    assert stats.created == 32  # 31 objects and the implied directory imgs/
    assert (await hub.stat(WHO, "/s3/imgs")).is_dir
    before = await hub.stat(WHO, "/s3/labels.csv")
    s3.put_object(Bucket=bucket, Key="labels.csv", Body=b"a,b\nc,d\n")
    s3.delete_object(Bucket=bucket, Key="imgs/00.jpg")
    s3.put_object(Bucket=bucket, Key="new/deep/obj", Body=b"n")
    stats = await hub.sync_volume("/s3")
    assert (stats.modified, stats.deleted, stats.created) == (1, 1, 3)
    after = await hub.stat(WHO, "/s3/labels.csv")
    assert after.version > before.version and after.size == 8
    assert await hub.read_bytes(WHO, "/s3/labels.csv") == b"a,b\nc,d\n"
    assert not await hub.exists(WHO, "/s3/imgs/00.jpg")


async def test_inotify_notices_changes_at_once(tmp_path: Path) -> None:
    root = tmp_path / "data"
    make_tree(root, dirs=2, files=3)
    config = Config.model_validate(
        {
            "site": {"data_dir": str(tmp_path / "site")},
            "hub": {"rescan_interval": 0, "watch": True, "volume_roots": [str(tmp_path)]},
        }
    )
    service = HubService(config)
    await service.start()
    try:
        await service.add_volume("/w", f"posix://{root}", lambda _: None)
        ns = service.namespace
        before = await ns.stat(WHO, "/w/top.txt")
        (root / "top.txt").write_text("edited in place by another tool")
        (root / "fresh").mkdir()
        (root / "fresh" / "file").write_text("in a new directory")
        (root / "d0" / "nested" / "f0.bin").unlink()

        async def settled() -> bool:
            top = await ns.stat(WHO, "/w/top.txt")
            return (
                top.version > before.version
                and await ns.exists(WHO, "/w/fresh/file")
                and not await ns.exists(WHO, "/w/d0/nested/f0.bin")
            )

        for _ in range(100):
            if await settled():
                break
            await asyncio.sleep(0.1)
        assert await settled()
        assert await ns.read_bytes(WHO, "/w/fresh/file") == b"in a new directory"
        # the new directory is watched too: a file made in it later is noticed as well
        (root / "fresh" / "later").write_text("after the directory was reported")
        for _ in range(100):
            if await ns.exists(WHO, "/w/fresh/later"):
                break
            await asyncio.sleep(0.1)
        assert await ns.read_bytes(WHO, "/w/fresh/later") == b"after the directory was reported"
    finally:
        await service.stop()


KILLED_IMPORT = textwrap.dedent(
    """
    import asyncio, sys
    from loomfs.core.registry import open_catalog
    from loomfs.hub.namespace import HubNamespace

    async def main():
        catalog = open_catalog(sys.argv[1])
        await catalog.open()
        hub = HubNamespace(catalog)
        hub.assimilator.batch_size = 100
        await hub.add_volume("/big", sys.argv[2])

    asyncio.run(main())
    """
)


async def test_import_killed_midway_resumes_exactly_once(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for d in range(40):
        sub = root / f"dir{d:02d}"
        sub.mkdir(parents=True)
        for f in range(250):
            (sub / f"f{f:03d}").touch()
    db = tmp_path / "catalog.db"
    url = f"sqlite://{db}"
    proc = subprocess.Popen([sys.executable, "-c", KILLED_IMPORT, url, f"posix://{root}"])
    checkpoint = None
    try:
        for _ in range(600):
            time.sleep(0.02)
            if db.exists():
                with sqlite3.connect(db) as conn:
                    try:
                        row = conn.execute("SELECT checkpoint FROM volumes").fetchone()
                    except sqlite3.OperationalError:
                        continue
                if row and row[0]:
                    checkpoint = row[0]
                    break
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    assert checkpoint is not None, "the import finished or never started before it was killed"

    catalog = open_catalog(url)
    await catalog.open()
    hub = HubNamespace(catalog)
    try:
        [volume] = await hub.load_volumes()
        assert volume.state is VolumeState.IMPORTING
        stats = await hub.sync_volume("/big")
        assert stats.resumed_after is not None
        assert await tree_of(hub, "/big") == disk_tree(root)
        created = [c.path for c in await catalog.changes(0, 100000) if c.op is ChangeOp.CREATE]
        assert len(created) == len(set(created)), "an entry was imported twice"
        assert len(created) == 40 * 251 + 1  # files, directories, and /big itself
        [done] = await catalog.volumes()
        assert done.state is VolumeState.READY and done.checkpoint is None
    finally:
        await hub.close()
        await catalog.close()


async def test_a_slow_writer_does_not_hold_up_others(hub: HubNamespace, tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    await hub.add_volume("/v", f"posix://{root}")
    release = asyncio.Event()

    async def slow_body() -> AsyncIterator[bytes]:
        yield b"slow"
        await release.wait()  # a client that stalls mid-upload
        yield b"!"

    slow = asyncio.create_task(hub.write(WHO, "/v/f", slow_body()))
    await asyncio.sleep(0.05)
    # the path's lock is not held while the slow body streams: this write goes through
    fast = await asyncio.wait_for(hub.write_bytes(WHO, "/v/f", b"fast"), timeout=30)
    assert (root / "f").read_bytes() == b"fast"
    release.set()
    last = await slow
    assert last.version > fast.version
    assert await hub.read_bytes(WHO, "/v/f") == b"slow!"


async def test_an_unreadable_directory_is_skipped_and_the_import_ends_ready(
    hub: HubNamespace, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EACCES is simulated where the posix backend lists a directory (``os.scandir``):
    as root, which these tests may run as, permission bits do not stop a read."""
    root = tmp_path / "data"
    made = make_tree(root)
    real_scandir = os.scandir
    unreadable = {str(root / "d1")}

    def scandir(fd: Any) -> Any:
        if isinstance(fd, int) and os.readlink(f"/proc/self/fd/{fd}") in unreadable:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))
        return real_scandir(fd)

    monkeypatch.setattr(os, "scandir", scandir)
    stats = await hub.add_volume("/datasets/x", f"posix://{root}")
    assert stats.skipped == 1 and stats.skipped_paths == ["/datasets/x/d1"]
    assert stats.as_dict()["skipped_paths"] == ["/datasets/x/d1"]
    assert [v.state for v in await hub.catalog.volumes()] == [VolumeState.READY]
    below = {p for p in made if p.startswith("d1/")}
    assert set(await tree_of(hub, "/datasets/x")) == made - below  # d1 itself is known

    # readable again: a rescan brings what was below it; unreadable once more, a rescan
    # keeps what the catalog knows of it rather than taking it for deleted
    unreadable.clear()
    assert (await hub.sync_volume("/datasets/x")).created == len(below)
    unreadable.add(str(root / "d1" / "nested"))
    again = await hub.sync_volume("/datasets/x")
    assert again.skipped == 1 and again.deleted == 0
    assert set(await tree_of(hub, "/datasets/x")) == made
