"""The hub passes over the inotify echo of its own writes, and never over a real change."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from loomfs.config import Config
from loomfs.core.types import Principal
from loomfs.hub.namespace import HubNamespace
from loomfs.service import HubService

WHO = Principal(user="tester")


@pytest.fixture
async def watched(tmp_path: Path) -> AsyncIterator[tuple[HubService, Path]]:
    root = tmp_path / "data"
    root.mkdir()
    config = Config.model_validate(
        {
            "site": {"data_dir": str(tmp_path / "site")},
            "hub": {"rescan_interval": 0, "watch": True, "volume_roots": [str(root)]},
        }
    )
    service = HubService(config)
    await service.start()
    try:
        await service.add_volume("/w", f"posix://{root}", lambda _: None)
        yield service, root
    finally:
        await service.stop()


def refreshed(ns: HubNamespace, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths ``ns`` goes on to re-read and compare with the catalog, one by one."""
    seen: list[str] = []
    original = ns.refresh

    async def refresh(path: str) -> object:
        seen.append(path)
        return await original(path)

    monkeypatch.setattr(ns, "refresh", refresh)
    return seen


async def test_own_write_echo_is_passed_over(
    watched: tuple[HubService, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, root = watched
    ns = service.namespace
    written = await ns.write_bytes(WHO, "/w/mine.txt", b"written by the hub")
    (root / "theirs.txt").write_text("written by another tool")
    seen = refreshed(ns, monkeypatch)
    await ns.refresh_all(["/w/mine.txt", "/w/theirs.txt"])
    assert seen == ["/w/theirs.txt"]
    assert (await ns.stat(WHO, "/w/mine.txt")).version == written.version
    assert await ns.read_bytes(WHO, "/w/theirs.txt") == b"written by another tool"


async def test_own_removal_and_rename_echoes_are_passed_over(
    watched: tuple[HubService, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, _ = watched
    ns = service.namespace
    for name in ("gone", "old", "kept"):
        await ns.write_bytes(WHO, f"/w/{name}", name.encode())
    await ns.remove(WHO, "/w/gone")
    await ns.rename(WHO, "/w/old", "/w/new")
    seen = refreshed(ns, monkeypatch)
    await ns.refresh_all(["/w/gone", "/w/old", "/w/new", "/w/kept"])
    assert seen == []
    assert [e.name async for e in ns.list(WHO, "/w")] == ["kept", "new"]


async def test_outside_creation_after_own_removal_lands(
    watched: tuple[HubService, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    service, root = watched
    ns = service.namespace
    await ns.write_bytes(WHO, "/w/again", b"first")
    await ns.remove(WHO, "/w/again")
    (root / "again").write_bytes(b"made again elsewhere")
    seen = refreshed(ns, monkeypatch)
    await ns.refresh_all(["/w/again"])
    assert seen == ["/w/again"]
    assert await ns.read_bytes(WHO, "/w/again") == b"made again elsewhere"


@pytest.mark.parametrize("how", ["same size in place", "replaced", "removed", "chmod"])
async def test_outside_change_right_after_own_write_lands(
    watched: tuple[HubService, Path], how: str
) -> None:
    """Another tool changes the file the hub has just written, before the echo of the
    hub's write is handled: the change is recorded all the same."""
    service, root = watched
    ns = service.namespace
    written = await ns.write_bytes(WHO, "/w/f.bin", b"hub bytes!")
    target = root / "f.bin"
    if how == "same size in place":
        with target.open("r+b") as f:
            f.write(b"HUB")
    elif how == "replaced":
        target.unlink()
        target.write_bytes(b"their bytes")
    elif how == "removed":
        target.unlink()
    else:
        target.chmod(0o600)

    async def recorded() -> bool:
        if how == "removed":
            return not await ns.exists(WHO, "/w/f.bin")
        if how == "chmod":  # a change of metadata only: a new row, the same version
            return (await ns.stat(WHO, "/w/f.bin")).mode & 0o777 == 0o600
        return (await ns.stat(WHO, "/w/f.bin")).version > written.version

    # through the watcher, as it happens
    for _ in range(100):
        if await recorded():
            break
        await asyncio.sleep(0.1)
    assert await recorded()
    if how == "same size in place":
        assert await ns.read_bytes(WHO, "/w/f.bin") == b"HUB bytes!"
    elif how == "replaced":
        assert await ns.read_bytes(WHO, "/w/f.bin") == b"their bytes"


async def test_outside_change_before_echo_batch_is_read(
    watched: tuple[HubService, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race, handled by ``refresh_all`` itself: the path is in the hub's notes,
    but the file is no longer what the hub wrote, so it is re-read and recorded."""
    service, root = watched
    ns = service.namespace
    await ns.write_bytes(WHO, "/w/g.bin", b"0123456789")
    with (root / "g.bin").open("r+b") as f:
        f.write(b"abc")
    seen = refreshed(ns, monkeypatch)
    await ns.refresh_all(["/w/g.bin"])
    assert seen == ["/w/g.bin"]
    assert await ns.read_bytes(WHO, "/w/g.bin") == b"abc3456789"


async def test_watcher_survives_a_tree_deeper_than_path_max(
    watched: tuple[HubService, Path], tmp_path: Path
) -> None:
    """A directory tree moved into the volume whose paths pass PATH_MAX: the part that
    can't be watched is left to rescans, and the watcher goes on noticing changes."""
    service, root = watched
    outside = tmp_path / "deep"
    outside.mkdir()
    fd = os.open(outside, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):  # 20 x 255 characters: past PATH_MAX (4096)
            os.mkdir("d" * 255, dir_fd=fd)
            step = os.open("d" * 255, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = step
    finally:
        os.close(fd)
    os.rename(outside, root / "deep")
    (root / "after.txt").write_text("noticed")
    for _ in range(100):
        if await service.namespace.exists(WHO, "/w/after.txt"):
            break
        await asyncio.sleep(0.1)
    assert await service.namespace.exists(WHO, "/w/after.txt")
