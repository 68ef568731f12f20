"""When a change is durable: every change at once for a hub (S3, REST, spokes), POSIX's
contract for a mount's own hub (``[fuse] durable_each_change = false``): a change survives
a crash of the process once its call returned, and power loss once ``fsync`` returned.

Power loss can't be had here; what it depends on can: which descriptors are fsynced, and
when. A crash is a real kill -9 of a real mount."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from loomfs.config import load_config
from loomfs.core.types import SYSTEM
from loomfs.service import HubService
from loomfs.testing.fuse import FUSE_MISSING, MountProcess, prepare_site


@pytest.fixture
def fsynced(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The paths the volume and the catalog fsync (the real fsync runs too)."""
    seen: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        seen.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    yield seen


@pytest.fixture
def site(tmp_path: Path) -> Path:
    """A site with one posix volume, /vol, at ``tmp_path``/vol; its config file."""
    vol = tmp_path / "vol"
    vol.mkdir()
    return prepare_site(tmp_path, {"/vol": vol})


async def _hub(config: Path, *, durable: bool) -> AsyncIterator[HubService]:
    service = HubService(load_config(config), durable=durable)
    await service.catalog.open()
    await service.namespace.load_volumes()
    try:
        yield service
    finally:
        await service.namespace.close()
        await service.catalog.close()


@pytest.fixture
async def durable_hub(site: Path) -> AsyncIterator[HubService]:
    async for service in _hub(site, durable=True):
        yield service


@pytest.fixture
async def posix_hub(site: Path) -> AsyncIterator[HubService]:
    async for service in _hub(site, durable=False):
        yield service


async def test_a_hub_flushes_each_write_before_acknowledging_it(
    durable_hub: HubService, fsynced: list[str], tmp_path: Path
) -> None:
    await durable_hub.namespace.write_bytes(SYSTEM, "/vol/a", b"bytes")
    staged, directory = fsynced  # (SQLite flushes its own commits, outside Python)
    assert Path(staged).parent == tmp_path / "vol"  # the content, before its rename
    assert directory == str(tmp_path / "vol")  # the rename into the directory
    fsynced.clear()
    await durable_hub.namespace.persist(SYSTEM, "/vol/a")
    assert fsynced == []  # nothing was left to flush


async def test_posix_durability_flushes_on_persist(
    posix_hub: HubService, fsynced: list[str], tmp_path: Path
) -> None:
    ns = posix_hub.namespace
    await ns.write_bytes(SYSTEM, "/vol/a", b"bytes")
    await ns.mkdir(SYSTEM, "/vol/d")
    await ns.write_bytes(SYSTEM, "/vol/d/b", b"more")
    assert fsynced == []
    await ns.persist(SYSTEM, "/vol/a")
    wal = f"{posix_hub.config.site.data_dir / 'catalog.db'}-wal"
    assert fsynced == [str(tmp_path / "vol/a"), str(tmp_path / "vol"), wal]
    fsynced.clear()
    await ns.persist(SYSTEM, "/vol/d")  # fsyncdir: the names in it, and its own name
    await ns.persist(SYSTEM, "/vol")  # the volume's root
    assert fsynced == [str(tmp_path / "vol/d"), str(tmp_path / "vol"), wal,
                       str(tmp_path / "vol"), wal]  # fmt: skip
    assert await ns.read_bytes(SYSTEM, "/vol/d/b") == b"more"


def _require_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.fail(FUSE_MISSING)


async def test_kill_9_of_a_mount_loses_no_acknowledged_change(site: Path, tmp_path: Path) -> None:
    """Creates, writes, an unlink and a rename through a mount whose hub does not flush
    each change: after a kill -9 of the mount, every change whose call returned is in the
    catalog and on the volume, and the two agree."""
    _require_fuse()
    files = {f"f{i:03}": os.urandom(i * 37) for i in range(200)}
    mount = MountProcess(site, tmp_path / "mnt")
    with mount:
        target = tmp_path / "mnt/vol/sub"
        target.mkdir()
        for name, data in files.items():
            (target / name).write_bytes(data)
        os.unlink(target / "f000")
        os.rename(target / "f001", target / "renamed")
        mount.kill()
    files["renamed"] = files.pop("f001")
    del files["f000"]
    async for service in _hub(site, durable=True):
        ns = service.namespace
        assert sorted([e.name async for e in ns.list(SYSTEM, "/vol/sub")]) == sorted(files)
        for name, data in files.items():
            assert await ns.read_bytes(SYSTEM, f"/vol/sub/{name}") == data
            entry, st = (
                await ns.stat(SYSTEM, f"/vol/sub/{name}"),
                os.lstat(tmp_path / "vol/sub" / name),
            )
            assert (entry.size, entry.inode, entry.mtime_ns) == (
                st.st_size,
                st.st_ino,
                st.st_mtime_ns,
            )
        # a rescan finds no name the catalog lacks or holds in excess (a directory's own
        # mtime reaches the catalog when the hub notices it, crash or not)
        stats = await ns.sync_volume("/vol")
        assert (stats.created, stats.deleted) == (0, 0), stats
