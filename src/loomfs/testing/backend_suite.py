"""The conformance suite every storage backend passes (testing layer).

``BackendSuite`` is a plain class of async tests; a test module subclasses it as
``TestSomething`` and provides a ``backend`` fixture that yields a fresh, empty volume.
The same tests then run against posix and S3 (and any later backend), the way fsspec's
abstract tests run against every file system.
"""

from __future__ import annotations

import random
from collections.abc import AsyncIterator

import pytest

from ..core.backends.base import Backend
from ..core.streams import aiter_bytes
from ..core.types import EntryKind, ObjectInfo
from ..errors import (
    AlreadyExists,
    Conflict,
    DirectoryNotEmpty,
    InvalidArgument,
    IsADirectory,
    NotADirectory,
    NotFound,
)

MIB = 1 << 20


def payload(size: int, seed: int = 0) -> bytes:
    return random.Random(seed).randbytes(size)


async def pieces(data: bytes, piece: int) -> AsyncIterator[bytes]:
    """``data`` in pieces of an odd size, so writers see chunks across their buffers."""
    for pos in range(0, len(data), piece):
        yield data[pos : pos + piece]


async def put(backend: Backend, key: str, data: bytes) -> ObjectInfo:
    return await backend.write(key, aiter_bytes(data))


async def get(backend: Backend, key: str, offset: int = 0, length: int | None = None) -> bytes:
    if length is None:
        length = (await backend.stat(key)).size
    async with await backend.open_read(key, offset, length) as source:
        return await source.read_all()


async def scan_all(
    backend: Backend, prefix: str = "", start_after: str | None = None
) -> list[ObjectInfo]:
    return [info async for batch in backend.scan(prefix, start_after) for info in batch]


async def children(backend: Backend, key: str) -> list[tuple[str, EntryKind]]:
    return [(i.key, i.kind) async for batch in backend.list_dir(key) for i in batch]


async def make_tree(backend: Backend) -> None:
    """A tree whose names sort differently as plain names and as sort keys
    ('data' < 'data.csv' < 'data/'), with an empty directory and nested files."""
    for d in ("data", "data/sub", "empty", "zz"):
        await backend.mkdir(d)
    for key in ("data.csv", "data-1", "data/a", "data/sub/b", "data/sub/c", "zz/y", "a"):
        await put(backend, key, key.encode())


class BackendSuite:
    """Conformance tests; a subclass supplies the ``backend`` fixture."""

    async def test_round_trip_empty_and_small(self, backend: Backend) -> None:
        empty = await put(backend, "empty.bin", b"")
        small = await put(backend, "small.txt", b"hello loomfs")
        assert (empty.kind, empty.size) == (EntryKind.FILE, 0)
        assert (small.key, small.size) == ("small.txt", 12)
        assert await get(backend, "empty.bin") == b""
        assert await get(backend, "small.txt") == b"hello loomfs"

    async def test_round_trip_multi_mib(self, backend: Backend) -> None:
        data = payload(3 * MIB + 4321)
        info = await backend.write("big.bin", pieces(data, 300_007))
        assert info.size == len(data)
        assert await get(backend, "big.bin") == data

    async def test_ranged_reads(self, backend: Backend) -> None:
        data = payload(2 * MIB + 17, seed=1)
        await put(backend, "r.bin", data)
        assert await get(backend, "r.bin", 1000, 5000) == data[1000:6000]
        assert await get(backend, "r.bin", MIB - 3, MIB + 10) == data[MIB - 3 : 2 * MIB + 7]
        # A range running past the end is cut short; one starting past it is empty.
        assert await get(backend, "r.bin", len(data) - 7, 100) == data[-7:]
        assert await get(backend, "r.bin", len(data) + 5, 10) == b""
        with pytest.raises(InvalidArgument):
            await backend.open_read("r.bin", -1, 10)

    async def test_stat_file_and_dir(self, backend: Backend) -> None:
        await backend.mkdir("d")
        written = await put(backend, "d/f", b"12345")
        f = await backend.stat("d/f")
        d = await backend.stat("d")
        root = await backend.stat("")
        assert (f.key, f.kind, f.size, f.etag) == ("d/f", EntryKind.FILE, 5, written.etag)
        assert f.mtime_ns > 0
        assert (d.key, d.kind, d.sort_key) == ("d", EntryKind.DIR, "d/")
        assert root.kind is EntryKind.DIR

    async def test_not_found(self, backend: Backend) -> None:
        with pytest.raises(NotFound):
            await backend.stat("nope")
        with pytest.raises(NotFound):
            await backend.open_read("nope", 0, 10)
        with pytest.raises(NotFound):
            await backend.delete("nope")
        with pytest.raises(NotFound):
            await put(backend, "no/parent", b"x")

    async def test_files_and_dirs_dont_mix(self, backend: Backend) -> None:
        await backend.mkdir("d")
        await put(backend, "d/f", b"x")
        with pytest.raises(IsADirectory):
            await put(backend, "d", b"would hide a directory")
        with pytest.raises(NotADirectory):
            await children(backend, "d/f")
        assert await get(backend, "d/f") == b"x"

    async def test_mkdir_and_already_exists(self, backend: Backend) -> None:
        info = await backend.mkdir("new")
        assert (info.key, info.kind) == ("new", EntryKind.DIR)
        assert await children(backend, "new") == []
        await put(backend, "file", b"x")
        with pytest.raises(AlreadyExists):
            await backend.mkdir("new")
        with pytest.raises(AlreadyExists):
            await backend.mkdir("file")
        with pytest.raises(NotFound):
            await backend.mkdir("missing/child")

    async def test_delete_file_and_dirs(self, backend: Backend) -> None:
        await backend.mkdir("d")
        await put(backend, "d/f", b"x")
        with pytest.raises(DirectoryNotEmpty):
            await backend.delete("d")
        await backend.delete("d/f")
        with pytest.raises(NotFound):
            await backend.stat("d/f")
        await backend.delete("d")
        with pytest.raises(NotFound):
            await backend.stat("d")

    async def test_rename_file(self, backend: Backend) -> None:
        await put(backend, "src", b"content")
        await backend.mkdir("dir")
        await backend.rename("src", "dir/dst")
        assert await get(backend, "dir/dst") == b"content"
        with pytest.raises(NotFound):
            await backend.stat("src")

    async def test_rename_dir_tree(self, backend: Backend) -> None:
        await make_tree(backend)
        await backend.rename("data", "moved")
        keys = [(i.key, i.kind) for i in await scan_all(backend, "moved")]
        assert keys == [
            ("moved/a", EntryKind.FILE),
            ("moved/sub", EntryKind.DIR),
            ("moved/sub/b", EntryKind.FILE),
            ("moved/sub/c", EntryKind.FILE),
        ]
        assert await get(backend, "moved/sub/c") == b"data/sub/c"
        assert await scan_all(backend, "data") == []
        with pytest.raises(NotFound):
            await backend.stat("data")

    async def test_rename_onto_existing(self, backend: Backend) -> None:
        await put(backend, "a", b"a")
        await put(backend, "b", b"b")
        await backend.mkdir("d")
        for dst in ("b", "d"):
            with pytest.raises(AlreadyExists):
                await backend.rename("a", dst)
        assert await get(backend, "a") == b"a"
        assert await get(backend, "b") == b"b"

    async def test_scan_order_and_dirs(self, backend: Backend) -> None:
        await make_tree(backend)
        items = await scan_all(backend)
        keys = [i.sort_key for i in items]
        assert keys == sorted(keys)
        assert keys == [
            "a",
            "data-1",
            "data.csv",
            "data/",
            "data/a",
            "data/sub/",
            "data/sub/b",
            "data/sub/c",
            "empty/",
            "zz/",
            "zz/y",
        ]
        sizes = {i.key: i.size for i in items if i.kind is EntryKind.FILE}
        assert sizes["data/sub/b"] == len(b"data/sub/b")

    async def test_scan_prefix(self, backend: Backend) -> None:
        await make_tree(backend)
        assert [i.key for i in await scan_all(backend, "data/sub")] == [
            "data/sub/b",
            "data/sub/c",
        ]
        assert await scan_all(backend, "no-such-dir") == []

    async def test_scan_resume(self, backend: Backend) -> None:
        await make_tree(backend)
        everything = [i.sort_key for i in await scan_all(backend)]
        for cut in range(len(everything)):
            rest = [i.sort_key for i in await scan_all(backend, "", everything[cut])]
            assert rest == everything[cut + 1 :], everything[cut]
        # Resuming from a key that doesn't exist (it was deleted since) works as well.
        rest = [i.sort_key for i in await scan_all(backend, "", "data/b")]
        assert rest == everything[everything.index("data/sub/") :]

    async def test_list_dir(self, backend: Backend) -> None:
        await make_tree(backend)
        assert await children(backend, "") == [
            ("a", EntryKind.FILE),
            ("data-1", EntryKind.FILE),
            ("data.csv", EntryKind.FILE),
            ("data", EntryKind.DIR),
            ("empty", EntryKind.DIR),
            ("zz", EntryKind.DIR),
        ]
        assert await children(backend, "data") == [
            ("data/a", EntryKind.FILE),
            ("data/sub", EntryKind.DIR),
        ]
        assert await children(backend, "empty") == []
        with pytest.raises(NotFound):
            await children(backend, "missing")

    async def test_overwrite_changes_etag(self, backend: Backend) -> None:
        first = await put(backend, "f", b"one")
        second = await put(backend, "f", b"two!")
        assert first.etag != second.etag
        assert (await backend.stat("f")).etag == second.etag
        assert await get(backend, "f") == b"two!"

    async def test_stale_expect_conflicts(self, backend: Backend) -> None:
        first = await put(backend, "f", b"version one")
        async with await backend.open_read("f", 0, 7, expect=first) as source:
            assert await source.read_all() == b"version"
        await put(backend, "f", b"version two")
        with pytest.raises(Conflict):
            await backend.open_read("f", 0, 7, expect=first)

    async def test_atomic_replace(self, backend: Backend) -> None:
        old = payload(MIB + 3, seed=2)
        new = payload(MIB + 3, seed=3)
        first = await put(backend, "f", old)
        async with await backend.open_read("f", 0, len(old), expect=first) as reader:
            await put(backend, "f", new)
            # A read that began before the replace sees only the old bytes (posix: the open
            # file keeps the old inode; S3: an object version is immutable).
            assert await reader.read_all() == old
        with pytest.raises(Conflict):
            await backend.open_read("f", 0, len(old), expect=first)
        assert await get(backend, "f") == new
