"""Namespace conformance suite (testing layer): one set of tests for every implementation.

The hub in-process, the hub through its
REST API, and later the spoke all run these same tests, including a stateful Hypothesis
model that drives random operations against a dict and compares every answer.
"""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import AbstractAsyncContextManager
from typing import Any, TypeVar

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test

from ..core.types import EntryKind, Principal
from ..errors import (
    AlreadyExists,
    Conflict,
    DirectoryNotEmpty,
    InvalidArgument,
    InvalidPath,
    IsADirectory,
    NotADirectory,
    NotFound,
    NotSupported,
    PermissionDenied,
)
from ..namespace.base import Namespace
from .loop import LoopThread

WHO = Principal(user="tester", protocol="test")


async def _stream(data: bytes, piece: int = 65536) -> AsyncIterator[bytes]:
    for i in range(0, len(data), piece):
        yield data[i : i + piece]
        await asyncio.sleep(0)


NamespaceFactory = Callable[[], AbstractAsyncContextManager[tuple[Namespace, str]]]
T = TypeVar("T")


class NamespaceSuite:
    """Subclasses provide the fixture ``ns_factory``: an async context manager giving a
    namespace and an empty writable directory in one of its volumes."""

    @pytest.fixture
    async def ns_top(self, ns_factory: NamespaceFactory) -> AsyncIterator[tuple[Namespace, str]]:
        async with ns_factory() as pair:
            yield pair

    @pytest.fixture
    def ns(self, ns_top: tuple[Namespace, str]) -> Namespace:
        return ns_top[0]

    @pytest.fixture
    def top(self, ns_top: tuple[Namespace, str]) -> str:
        return ns_top[1]

    async def test_write_read_stat(self, ns: Namespace, top: str) -> None:
        entry = await ns.write_bytes(WHO, f"{top}/a.txt", b"hello")
        assert (entry.size, entry.kind.value, entry.name) == (5, "file", "a.txt")
        assert await ns.read_bytes(WHO, f"{top}/a.txt") == b"hello"
        stat = await ns.stat(WHO, f"{top}/a.txt")
        assert stat.version == entry.version and stat.size == 5
        again = await ns.write_bytes(WHO, f"{top}/a.txt", b"hello, again")
        assert again.version > entry.version
        assert await ns.read_bytes(WHO, f"{top}/a.txt") == b"hello, again"
        empty = await ns.write_bytes(WHO, f"{top}/empty", b"")
        assert empty.size == 0 and await ns.read_bytes(WHO, f"{top}/empty") == b""

    async def test_large_streamed_write_and_ranges(self, ns: Namespace, top: str) -> None:
        data = os.urandom(3 * 1024 * 1024 + 12345)
        entry = await ns.write(WHO, f"{top}/big.bin", _stream(data))
        assert entry.size == len(data)
        assert await ns.read_bytes(WHO, f"{top}/big.bin") == data
        for offset, length in [(0, 1), (1 << 20, 4096), (len(data) - 10, 100), (5, None)]:
            got = await ns.read_bytes(WHO, f"{top}/big.bin", offset, length)
            want = data[offset : None if length is None else offset + length]
            assert got == want, (offset, length)
        assert await ns.read_bytes(WHO, f"{top}/big.bin", len(data) + 5, 10) == b""
        async with await ns.read(WHO, f"{top}/big.bin", 100, 50) as reader:
            assert (reader.offset, reader.length, reader.entry.version) == (100, 50, entry.version)
            assert await reader.read_all() == data[100:150]

    async def test_preconditions(self, ns: Namespace, top: str) -> None:
        first = await ns.write_bytes(WHO, f"{top}/p", b"1")
        with pytest.raises(AlreadyExists):
            await ns.write_bytes(WHO, f"{top}/p", b"2", exclusive=True)
        with pytest.raises(Conflict):
            await ns.write_bytes(WHO, f"{top}/p", b"2", if_version=first.version + 1000)
        assert await ns.read_bytes(WHO, f"{top}/p") == b"1"
        second = await ns.write_bytes(WHO, f"{top}/p", b"2", if_version=first.version)
        with pytest.raises(Conflict):
            await ns.read(WHO, f"{top}/p", if_version=first.version)
        async with await ns.read(WHO, f"{top}/p", if_version=second.version) as reader:
            assert await reader.read_all() == b"2"
        with pytest.raises(NotFound):
            await ns.write_bytes(WHO, f"{top}/none", b"x", if_version=1)
        with pytest.raises(Conflict):
            await ns.remove(WHO, f"{top}/p", if_version=first.version)

    async def test_parents_and_kinds(self, ns: Namespace, top: str) -> None:
        with pytest.raises(NotFound):
            await ns.write_bytes(WHO, f"{top}/no/such/dir/f", b"x")
        await ns.mkdir(WHO, f"{top}/d")
        with pytest.raises(IsADirectory):
            await ns.write_bytes(WHO, f"{top}/d", b"x")
        with pytest.raises(IsADirectory):
            await ns.read_bytes(WHO, f"{top}/d")
        await ns.write_bytes(WHO, f"{top}/f", b"x")
        with pytest.raises(NotADirectory):
            await ns.write_bytes(WHO, f"{top}/f/child", b"x")
        with pytest.raises(NotADirectory):
            [e async for e in ns.list(WHO, f"{top}/f")]
        with pytest.raises(NotFound):
            await ns.stat(WHO, f"{top}/missing")
        with pytest.raises(NotFound):
            await ns.read_bytes(WHO, f"{top}/missing")

    async def test_mkdir(self, ns: Namespace, top: str) -> None:
        made = await ns.mkdir(WHO, f"{top}/x/y/z", parents=True)
        assert made.is_dir
        assert (await ns.stat(WHO, f"{top}/x/y")).is_dir
        with pytest.raises(AlreadyExists):
            await ns.mkdir(WHO, f"{top}/x")
        assert (await ns.mkdir(WHO, f"{top}/x", exist_ok=True)).is_dir
        with pytest.raises(NotFound):
            await ns.mkdir(WHO, f"{top}/q/r")

    async def test_list_order_pages_and_limits(self, ns: Namespace, top: str) -> None:
        names = [f"n{i:03d}" for i in range(25)] + ["A", "b-c", "b", "é"]
        await ns.mkdir(WHO, f"{top}/l")
        for name in names:
            await ns.write_bytes(WHO, f"{top}/l/{name}", name.encode())
        listed = [e.name async for e in ns.list(WHO, f"{top}/l")]
        assert listed == sorted(names, key=lambda n: n.encode())
        first = [e.name async for e in ns.list(WHO, f"{top}/l", limit=10)]
        rest = [e.name async for e in ns.list(WHO, f"{top}/l", start_after=first[-1])]
        assert first + rest == listed
        walked = [e.path async for e in ns.walk(WHO, top)]
        assert f"{top}/l/n000" in walked and f"{top}/l" in walked

    async def test_rename(self, ns: Namespace, top: str) -> None:
        await ns.mkdir(WHO, f"{top}/src/inner", parents=True)
        v = await ns.write_bytes(WHO, f"{top}/src/inner/f", b"data")
        moved = await ns.rename(WHO, f"{top}/src", f"{top}/dst")
        assert moved.path == f"{top}/dst"
        assert not await ns.exists(WHO, f"{top}/src")
        assert await ns.read_bytes(WHO, f"{top}/dst/inner/f") == b"data"
        assert (await ns.stat(WHO, f"{top}/dst/inner/f")).version == v.version
        await ns.write_bytes(WHO, f"{top}/a", b"a")
        await ns.write_bytes(WHO, f"{top}/b", b"b")
        with pytest.raises(AlreadyExists):
            await ns.rename(WHO, f"{top}/a", f"{top}/b")
        await ns.rename(WHO, f"{top}/a", f"{top}/b", overwrite=True)
        assert await ns.read_bytes(WHO, f"{top}/b") == b"a"
        with pytest.raises(NotFound):
            await ns.rename(WHO, f"{top}/a", f"{top}/c")
        with pytest.raises(InvalidPath):
            await ns.rename(WHO, f"{top}/dst", f"{top}/dst/inner/deeper")

    async def test_remove(self, ns: Namespace, top: str) -> None:
        await ns.mkdir(WHO, f"{top}/r/s", parents=True)
        await ns.write_bytes(WHO, f"{top}/r/s/f", b"x")
        await ns.write_bytes(WHO, f"{top}/r/g", b"y")
        with pytest.raises(DirectoryNotEmpty):
            await ns.remove(WHO, f"{top}/r")
        await ns.remove(WHO, f"{top}/r/g")
        assert not await ns.exists(WHO, f"{top}/r/g")
        await ns.remove(WHO, f"{top}/r", recursive=True)
        assert not await ns.exists(WHO, f"{top}/r")
        with pytest.raises(NotFound):
            await ns.remove(WHO, f"{top}/r")

    async def test_set_attrs(self, ns: Namespace, top: str) -> None:
        written = await ns.write_bytes(WHO, f"{top}/m", b"x")
        chmodded = await ns.set_attrs(WHO, f"{top}/m", mode=0o600)
        assert chmodded.mode & 0o7777 == 0o600 and chmodded.version == written.version
        owned = await ns.set_attrs(WHO, f"{top}/m", uid=1234, gid=4321)
        assert (owned.uid, owned.gid, owned.mode & 0o7777) == (1234, 4321, 0o600)
        mtime = 1_500_000_000_123_456_789
        touched = await ns.set_attrs(WHO, f"{top}/m", mtime_ns=mtime)
        assert touched.mtime_ns == mtime and touched.version > written.version
        stat = await ns.stat(WHO, f"{top}/m")
        assert (stat.uid, stat.mode & 0o7777, stat.mtime_ns) == (1234, 0o600, mtime)
        assert await ns.read_bytes(WHO, f"{top}/m") == b"x"
        await ns.mkdir(WHO, f"{top}/md")
        assert (await ns.set_attrs(WHO, f"{top}/md", mode=0o700)).mode & 0o7777 == 0o700
        with pytest.raises(NotFound):
            await ns.set_attrs(WHO, f"{top}/none", mode=0o600)

    async def test_symlink(self, ns: Namespace, top: str) -> None:
        await ns.write_bytes(WHO, f"{top}/target", b"pointed at")
        try:
            link = await ns.symlink(WHO, f"{top}/link", "target")
        except NotSupported:
            # a volume without symlinks (S3) refuses cleanly and leaves nothing behind
            assert not await ns.exists(WHO, f"{top}/link")
            return
        assert (link.kind.value, link.link_target) == ("symlink", "target")
        assert (await ns.stat(WHO, f"{top}/link")).link_target == "target"
        assert f"{top}/link" in [e.path async for e in ns.list(WHO, top)]
        with pytest.raises(AlreadyExists):
            await ns.symlink(WHO, f"{top}/link", "elsewhere")
        with pytest.raises(NotFound):
            await ns.symlink(WHO, f"{top}/no/such/link", "target")
        await ns.remove(WHO, f"{top}/link")
        assert await ns.read_bytes(WHO, f"{top}/target") == b"pointed at"

    async def test_special_files(self, ns: Namespace, top: str) -> None:
        try:
            fifo = await ns.mknod(WHO, f"{top}/fifo", stat.S_IFIFO | 0o640)
        except NotSupported:
            # a volume without special files (S3) refuses cleanly and leaves nothing behind
            assert not await ns.exists(WHO, f"{top}/fifo")
            return
        assert (fifo.kind, fifo.mode & 0o7777, fifo.size) == (EntryKind.FIFO, 0o640, 0)
        sock = await ns.mknod(WHO, f"{top}/sock", stat.S_IFSOCK | 0o600)
        assert sock.kind is EntryKind.SOCKET
        assert {e.name: e.kind async for e in ns.list(WHO, top)} == {
            "fifo": EntryKind.FIFO,
            "sock": EntryKind.SOCKET,
        }
        with pytest.raises(AlreadyExists):
            await ns.mknod(WHO, f"{top}/fifo", stat.S_IFIFO | 0o640)
        for not_special in (stat.S_IFDIR | 0o755, stat.S_IFREG | 0o644, 0o644):
            with pytest.raises(InvalidArgument):
                await ns.mknod(WHO, f"{top}/bad", not_special)
        assert not await ns.exists(WHO, f"{top}/bad")
        with pytest.raises(NotFound):
            await ns.mknod(WHO, f"{top}/no/such/fifo", stat.S_IFIFO | 0o600)
        owned = await ns.set_attrs(WHO, f"{top}/fifo", mode=0o604, uid=1234, gid=4321)
        assert (owned.kind, owned.mode & 0o7777, owned.uid) == (EntryKind.FIFO, 0o604, 1234)
        moved = await ns.rename(WHO, f"{top}/fifo", f"{top}/fifo2")
        assert moved.kind is EntryKind.FIFO
        assert (await ns.stat(WHO, f"{top}/fifo2")).kind is EntryKind.FIFO
        await ns.remove(WHO, f"{top}/fifo2")
        assert not await ns.exists(WHO, f"{top}/fifo2")

    async def test_hard_links(self, ns: Namespace, top: str) -> None:
        await ns.write_bytes(WHO, f"{top}/one", b"shared")
        try:
            two = await ns.link(WHO, f"{top}/one", f"{top}/two")
        except NotSupported:
            assert not await ns.exists(WHO, f"{top}/two")
            return
        assert (two.kind, two.nlink) == (EntryKind.FILE, 2)
        assert (await ns.stat(WHO, f"{top}/one")).nlink == 2
        assert await ns.read_bytes(WHO, f"{top}/two") == b"shared"
        # a change through one name shows through the other
        await ns.write_bytes(WHO, f"{top}/one", b"changed through one")
        assert await ns.read_bytes(WHO, f"{top}/two") == b"changed through one"
        assert (await ns.stat(WHO, f"{top}/two")).size == len(b"changed through one")
        await ns.set_attrs(WHO, f"{top}/two", mode=0o600)
        assert (await ns.stat(WHO, f"{top}/one")).mode & 0o7777 == 0o600
        with pytest.raises(AlreadyExists):
            await ns.link(WHO, f"{top}/one", f"{top}/two")
        with pytest.raises(NotFound):
            await ns.link(WHO, f"{top}/none", f"{top}/three")
        await ns.mkdir(WHO, f"{top}/d")
        with pytest.raises(PermissionDenied):
            await ns.link(WHO, f"{top}/d", f"{top}/d2")
        assert not await ns.exists(WHO, f"{top}/d2")
        await ns.remove(WHO, f"{top}/one")
        left = await ns.stat(WHO, f"{top}/two")
        assert left.nlink == 1
        assert await ns.read_bytes(WHO, f"{top}/two") == b"changed through one"

    async def test_tags(self, ns: Namespace, top: str) -> None:
        await ns.write_bytes(WHO, f"{top}/t", b"x")
        assert await ns.get_tags(WHO, f"{top}/t") == {}
        assert await ns.set_tags(WHO, f"{top}/t", {"split": "train", "owner": "ml"}) == {
            "owner": "ml",
            "split": "train",
        }
        assert await ns.set_tags(WHO, f"{top}/t", {}, ["owner"]) == {"split": "train"}
        with pytest.raises(InvalidArgument):
            await ns.set_tags(WHO, f"{top}/t", {"": "empty key"})
        with pytest.raises(NotFound):
            await ns.get_tags(WHO, f"{top}/none")

    async def test_stat_tags_and_read_entry(self, ns: Namespace, top: str) -> None:
        await ns.write_bytes(WHO, f"{top}/e", b"0123456789")
        await ns.set_tags(WHO, f"{top}/e", {"k": "v"})
        entry, tags = await ns.stat_tags(WHO, f"{top}/e")
        stat = await ns.stat(WHO, f"{top}/e")
        assert (entry.version, entry.size, tags) == (stat.version, 10, {"k": "v"})
        with pytest.raises(NotFound):
            await ns.stat_tags(WHO, f"{top}/none")
        async with await ns.read_entry(WHO, entry, 2, 3) as reader:
            assert (reader.entry.version, reader.offset) == (entry.version, 2)
            assert await reader.read_all() == b"234"
        await ns.write_bytes(WHO, f"{top}/e", b"changed")
        with pytest.raises(Conflict):  # the entry names a version that is gone
            await ns.read_entry(WHO, entry)
        fresh, _ = await ns.stat_tags(WHO, f"{top}/e")
        async with await ns.read_entry(WHO, fresh) as reader:
            assert await reader.read_all() == b"changed"

    @pytest.mark.parametrize(
        "bad",
        ["relative/path", "/a/../b", "/a/./b", "/a/\x00b", "/" + "n" * 256, "/..", ""],
    )
    async def test_invalid_paths_are_refused(self, ns: Namespace, top: str, bad: str) -> None:
        path = bad if not bad.startswith("/") or bad == "/.." else top + bad
        for call in (
            ns.stat(WHO, path),
            ns.write_bytes(WHO, path, b"x"),
            ns.mkdir(WHO, path),
            ns.remove(WHO, path),
        ):
            with pytest.raises(InvalidPath):
                await call

    async def test_outside_volumes_is_refused(self, ns: Namespace, top: str) -> None:
        with pytest.raises(PermissionDenied):
            await ns.write_bytes(WHO, "/not-a-volume-file", b"x")
        with pytest.raises(PermissionDenied):
            await ns.mkdir(WHO, "/not-a-volume-dir")

    def test_stateful_model(self, ns_factory: NamespaceFactory) -> None:
        """Random sequences of writes, removes, renames, mkdirs and reads behave exactly like
        a dict model; Hypothesis shrinks any failing sequence to a minimal one."""
        with LoopThread() as loop:
            machine = _model_machine(ns_factory, loop)
            run_state_machine_as_test(
                machine,
                settings=settings(
                    max_examples=12,
                    stateful_step_count=15,
                    deadline=None,
                    database=None,
                    suppress_health_check=list(HealthCheck),
                ),
            )


NAMES = st.sampled_from(["a", "b", "c", "d/e"])


def _model_machine(factory: NamespaceFactory, loop: LoopThread) -> type[RuleBasedStateMachine]:
    class Model(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self._cm = factory()
            self.ns, self.top = loop.run(self._cm.__aenter__())
            loop.run(self.ns.mkdir(WHO, f"{self.top}/d"))
            self.model: dict[str, bytes] = {}

        def _expect_error(self, coro: Coroutine[Any, Any, Any], error: type[Exception]) -> None:
            try:
                loop.run(coro)
            except error:
                return
            raise AssertionError(f"expected {error.__name__}")

        @rule(name=NAMES, data=st.binary(max_size=300))
        def write(self, name: str, data: bytes) -> None:
            loop.run(self.ns.write_bytes(WHO, f"{self.top}/{name}", data))
            self.model[name] = data

        @rule(name=NAMES)
        def remove(self, name: str) -> None:
            path = f"{self.top}/{name}"
            if name in self.model:
                loop.run(self.ns.remove(WHO, path))
                del self.model[name]
            else:
                self._expect_error(self.ns.remove(WHO, path), NotFound)

        @rule(src=NAMES, dst=NAMES)
        def rename(self, src: str, dst: str) -> None:
            coro = self.ns.rename(WHO, f"{self.top}/{src}", f"{self.top}/{dst}", overwrite=True)
            if src not in self.model:
                self._expect_error(coro, NotFound)
            elif src == dst:
                coro.close()
            else:
                loop.run(coro)
                self.model[dst] = self.model.pop(src)

        @rule(name=NAMES, offset=st.integers(0, 400), length=st.none() | st.integers(0, 400))
        def read(self, name: str, offset: int, length: int | None) -> None:
            coro = self.ns.read_bytes(WHO, f"{self.top}/{name}", offset, length)
            if name not in self.model:
                self._expect_error(coro, NotFound)
                return
            want = self.model[name][offset : None if length is None else offset + length]
            assert loop.run(coro) == want

        @invariant()
        def listing_matches(self) -> None:
            async def sizes() -> dict[str, int]:
                top = {e.name: e.size async for e in self.ns.list(WHO, self.top) if not e.is_dir}
                sub = {f"d/{e.name}": e.size async for e in self.ns.list(WHO, f"{self.top}/d")}
                return top | sub

            assert loop.run(sizes()) == {k: len(v) for k, v in self.model.items()}

        def teardown(self) -> None:
            loop.run(self._cm.__aexit__(None, None, None))

    return Model
