"""Catalog conformance suite (testing layer): the same tests for every catalog engine.

A test module subclasses ``CatalogSuite`` and provides two fixtures: ``catalog`` (an open,
empty catalog) and ``reopen`` (a callable giving a second, independent connection to the
same database: for persistence and concurrency).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from ..core.catalog.base import Catalog, Delete, ExportRecords, Put, ScanRow, VolumeUpdate
from ..core.types import ChangeOp, EntryKind, VolumeState
from ..errors import (
    AlreadyExists,
    Conflict,
    DirectoryNotEmpty,
    InvalidPath,
    NotADirectory,
    NotFound,
)

Reopen = Callable[[], Awaitable[Catalog]]
FILE, DIR = EntryKind.FILE, EntryKind.DIR


def f(path: str, size: int = 1, etag: str = "e", **kw: object) -> Put:
    return Put(path, FILE, size=size, mtime_ns=1, etag=etag, mode=0o100644, **kw)  # type: ignore[arg-type]


def d(path: str, **kw: object) -> Put:
    return Put(path, DIR, mode=0o40755, **kw)  # type: ignore[arg-type]


async def tree(catalog: Catalog) -> None:
    await catalog.apply(
        [d("/v"), d("/v/a"), f("/v/a/x"), f("/v/a/y"), d("/v/a/sub"), f("/v/a/sub/z"), f("/v/b")]
    )


def scan_row(put: Put) -> ScanRow:
    parent, _, name = put.path.rpartition("/")
    return (parent, name, put.kind.value, put.size, put.mtime_ns, put.mode, put.uid, put.gid,
            put.etag, put.inode, put.link_target, put.rdev, put.nlink, put.atime_ns,
            put.ctime_ns)  # fmt: skip


def tricky(top: str) -> tuple[list[Put], list[Put]]:
    """A tree below ``top``, and a scan of it that finds every kind of difference."""
    link = EntryKind.SYMLINK
    before = [
        d(top),
        f(f"{top}/content"),
        f(f"{top}/mode"),
        f(f"{top}/etag-appears", etag=None),  # type: ignore[arg-type]
        f(f"{top}/inode-appears"),
        f(f"{top}/same", inode=7),
        f(f"{top}/becomes-dir"),
        Put(f"{top}/link", link, mode=0o120777, link_target="a"),
        Put(f"{top}/link-same", link, mode=0o120777, link_target="a"),
        d(f"{top}/dir"),
        Put(f"{top}/dev", EntryKind.CHAR_DEVICE, mode=0o600, rdev=5),
        f(f"{top}/nlink"),
        f(f"{top}/times", atime_ns=1, ctime_ns=1),
    ]
    scan = [
        d(f"{top}/becomes-dir"),
        f(f"{top}/content", size=2),
        Put(f"{top}/dev", EntryKind.CHAR_DEVICE, mode=0o600, rdev=6),  # another device
        f(f"{top}/dir/new"),
        f(f"{top}/etag-appears"),
        Put(f"{top}/fifo", EntryKind.FIFO, mode=0o644),
        f(f"{top}/inode-appears", inode=3),
        Put(f"{top}/link", link, mode=0o120777, link_target="b"),
        Put(f"{top}/link-same", link, mode=0o120777, link_target="a"),
        Put(f"{top}/mode", FILE, size=1, mtime_ns=1, etag="e", mode=0o100600),
        f(f"{top}/new"),
        f(f"{top}/nlink", nlink=2),  # a second name appeared: META
        f(f"{top}/same", inode=7),
        f(f"{top}/times", atime_ns=2, ctime_ns=2),  # times alone: no change logged
    ]
    return before, scan


class CatalogSuite:
    async def test_bulk_scan_path_decides_as_single_puts_do(self, catalog: Catalog) -> None:
        """``apply_scan`` (the diff in SQL) against ``apply`` (the diff in Python)."""
        for top in ("/puts", "/scan"):
            await catalog.apply(tricky(top)[0])
        before = {
            p.path: await catalog.get(p.path) for top in ("/puts", "/scan") for p in tricky(top)[0]
        }
        ids = {path: row_id for row_id, path in await catalog.subtree_ids("/scan")}

        head = await catalog.head_seq()
        applied = await catalog.apply(tricky("/puts")[1])
        ops = [a.change.op for a in applied if a.change is not None]
        mid = await catalog.head_seq()
        assert mid == head + len(ops)
        scanned = await catalog.apply_scan([scan_row(p) for p in tricky("/scan")[1]])
        assert await catalog.head_seq() == mid + len(ops)

        assert (scanned.created, scanned.modified, scanned.meta) == (
            ops.count(ChangeOp.CREATE), ops.count(ChangeOp.MODIFY), ops.count(ChangeOp.META)
        )  # fmt: skip
        assert sorted(scanned.seen) == sorted(
            ids[p.path] for p in tricky("/scan")[1] if p.path in ids
        )
        # the same changes in the same order, with sequence numbers that follow on
        by_puts = await catalog.changes(head, limit=100)
        assert [c.seq for c in by_puts] == list(range(head + 1, mid + len(ops) + 1))
        puts_log, scan_log = by_puts[: len(ops)], by_puts[len(ops) :]
        assert [(c.op, c.path[5:], c.kind, c.size) for c in puts_log] == [
            (c.op, c.path[5:], c.kind, c.size) for c in scan_log
        ]
        # the same rows: a new version is the change's seq, a META change keeps the old one
        for log, top in ((puts_log, "/puts"), (scan_log, "/scan")):
            for put in tricky(top)[1]:
                entry = await catalog.get(put.path)
                assert entry is not None
                assert (entry.kind, entry.size, entry.mode, entry.etag, entry.inode) == (
                    put.kind, put.size, put.mode, put.etag, put.inode
                )  # fmt: skip
                assert (entry.link_target, entry.rdev, entry.nlink) == (
                    put.link_target, put.rdev, put.nlink
                )  # fmt: skip
                old = before.get(put.path)
                change = next((c for c in log if c.path == put.path), None)
                if change is None or change.op is ChangeOp.META:
                    assert old is not None and entry.version == old.version
                else:
                    assert entry.version == change.seq
                assert change is None or change.version == entry.version
        assert {c.op for c in scan_log} == {ChangeOp.CREATE, ChangeOp.MODIFY, ChangeOp.META}

    async def test_times_alone_are_recorded_without_a_change(self, catalog: Catalog) -> None:
        await catalog.apply([d("/t"), f("/t/f", atime_ns=1, ctime_ns=1)])
        head = await catalog.head_seq()
        [applied] = await catalog.apply([f("/t/f", atime_ns=5, ctime_ns=6)])
        assert applied.change is None and await catalog.head_seq() == head
        entry = await catalog.get("/t/f")
        assert entry is not None and (entry.atime_ns, entry.ctime_ns) == (5, 6)

    async def test_hard_links_finds_the_names_of_an_inode(self, catalog: Catalog) -> None:
        await catalog.apply(
            [
                d("/h"),
                f("/h/a", inode=42, nlink=2),
                f("/h/b", inode=42, nlink=2),
                f("/h/single", inode=43),
                f("/h/other-inode", inode=44, nlink=2),
            ]
        )
        assert sorted(e.path for e in await catalog.hard_links(42)) == ["/h/a", "/h/b"]
        assert await catalog.hard_links(43) == []  # one name only: not a hard link
        await catalog.apply([f("/h/b", inode=42, nlink=1)])
        assert [e.path for e in await catalog.hard_links(42)] == ["/h/a"]

    async def test_subdirs_counts_the_directories_below_a_path(self, catalog: Catalog) -> None:
        await tree(catalog)  # /v/a holds two files and the directory sub
        await catalog.apply([d("/v/a/sub2"), d("/v/a/sub/deeper")])
        assert await catalog.subdirs("/v/a") == 2  # deeper is sub's, files are not counted
        assert await catalog.subdirs("/v") == 1 and await catalog.subdirs("/v/b") == 0
        await catalog.rename("/v/a/sub2", "/v/moved")
        await catalog.apply([Delete("/v/a/sub", recursive=True)])
        assert (await catalog.subdirs("/v/a"), await catalog.subdirs("/v")) == (0, 2)

    async def test_put_get_and_versions(self, catalog: Catalog) -> None:
        head = await catalog.head_seq()
        [a] = await catalog.apply([f("/x", size=3)])
        assert a.entry is not None and a.change is not None
        assert a.change.op is ChangeOp.CREATE and a.entry.version == head + 1
        got = await catalog.get("/x")
        assert got == a.entry
        # unchanged: no new sequence number, no change record
        [same] = await catalog.apply([f("/x", size=3)])
        assert same.change is None and await catalog.head_seq() == head + 1
        # content change: new version; mode only: META, version kept
        [mod] = await catalog.apply([f("/x", size=4)])
        assert mod.change is not None and mod.change.op is ChangeOp.MODIFY
        assert mod.entry is not None and mod.entry.version == head + 2
        [meta] = await catalog.apply([Put("/x", FILE, size=4, mtime_ns=1, etag="e", mode=0o100600)])
        assert meta.change is not None and meta.change.op is ChangeOp.META
        assert meta.entry is not None and meta.entry.version == head + 2
        assert await catalog.get("/nope") is None

    async def test_failed_precondition_rolls_back_the_whole_batch(self, catalog: Catalog) -> None:
        await catalog.apply([f("/x")])
        head = await catalog.head_seq()
        with pytest.raises(Conflict):
            await catalog.apply([f("/new"), f("/x", size=9, expect_version=head + 100)])
        assert await catalog.get("/new") is None
        assert await catalog.head_seq() == head
        with pytest.raises(AlreadyExists):
            await catalog.apply([f("/x", exclusive=True)])
        with pytest.raises(NotFound):
            await catalog.apply([f("/missing/child", check_parent=True)])
        with pytest.raises(NotADirectory):
            await catalog.apply([f("/x/child", check_parent=True)])
        with pytest.raises(NotFound):
            await catalog.apply([f("/absent", expect_version=1)])

    async def test_a_write_id_keeps_what_its_put_made(
        self, catalog: Catalog, reopen: Reopen
    ) -> None:
        [made] = await catalog.apply([f("/x", size=3, force_version=True, write_id="site:k1")])
        await catalog.apply([f("/x", size=4, force_version=True)])  # the path moves on
        assert made.entry is not None and await catalog.written("site:k1") == made.entry
        assert await catalog.written("site:other") is None
        # a rolled-back put keeps no key
        with pytest.raises(Conflict):
            await catalog.apply([f("/x", size=5, expect_version=1, write_id="site:k2")])
        assert await catalog.written("site:k2") is None
        # the first answer stands; keys live in the catalog, for every connection
        current = await catalog.get("/x")
        assert current is not None
        await catalog.remember_write("site:k1", current)
        await catalog.remember_write("site:k3", current)
        other = await reopen()
        try:
            assert await other.written("site:k1") == made.entry
            assert await other.written("site:k3") == current
        finally:
            await other.close()

    async def test_list_is_bytewise_and_paged(self, catalog: Catalog) -> None:
        names = ["b", "B", "a-c", "a", "é", "a.b", "z" * 200, "_", "0"]
        await catalog.apply([d("/dir"), *[f(f"/dir/{n}") for n in names]])
        await catalog.apply([f("/dir2")])
        listed = [e.name for e in await catalog.list_dir("/dir")]
        assert listed == sorted(names, key=lambda n: n.encode())
        page1 = await catalog.list_dir("/dir", limit=4)
        page2 = await catalog.list_dir("/dir", start_after=page1[-1].name, limit=100)
        assert [e.name for e in page1 + page2] == listed
        assert [e.name for e in await catalog.list_dir("/")] == ["dir", "dir2"]

    async def test_rename_moves_the_subtree_and_keeps_versions(self, catalog: Catalog) -> None:
        await tree(catalog)
        before = await catalog.get("/v/a/sub/z")
        applied = await catalog.rename("/v/a", "/v/c")
        assert applied.change is not None and applied.change.op is ChangeOp.RENAME
        assert applied.change.new_path == "/v/c"
        assert await catalog.get("/v/a") is None and await catalog.get("/v/a/x") is None
        after = await catalog.get("/v/c/sub/z")
        assert before is not None and after is not None and after.version == before.version
        assert [e.name for e in await catalog.list_dir("/v/c")] == ["sub", "x", "y"]
        with pytest.raises(InvalidPath):
            await catalog.rename("/v/c", "/v/c/sub/inside")
        with pytest.raises(AlreadyExists):
            await catalog.rename("/v/b", "/v/c")
        with pytest.raises(NotFound):
            await catalog.rename("/v/none", "/v/other")
        with pytest.raises(NotFound):
            await catalog.rename("/v/b", "/nowhere/b")

    async def test_rename_does_not_touch_siblings_sharing_a_prefix(self, catalog: Catalog) -> None:
        await catalog.apply([d("/a"), f("/a/x"), d("/a-b"), f("/a-b/y"), d("/ab"), f("/ab/z")])
        await catalog.rename("/a", "/q")
        assert await catalog.get("/a-b/y") is not None
        assert await catalog.get("/ab/z") is not None
        assert await catalog.get("/q/x") is not None

    async def test_delete(self, catalog: Catalog) -> None:
        await tree(catalog)
        await catalog.set_tags("/v/a/x", {"k": "v"})
        with pytest.raises(DirectoryNotEmpty):
            await catalog.apply([Delete("/v/a")])
        [gone] = await catalog.apply([Delete("/v/a", recursive=True)])
        assert gone.change is not None and gone.change.op is ChangeOp.DELETE
        assert await catalog.subtree_ids("/v") == [(await self._id(catalog, "/v/b"), "/v/b")]
        with pytest.raises(NotFound):
            await catalog.apply([Delete("/v/a")])
        assert (await catalog.apply([Delete("/v/a", missing_ok=True)]))[0].change is None
        with pytest.raises(InvalidPath):
            await catalog.apply([Delete("/", recursive=True)])
        # re-created under the same name, the old tags do not come back
        await catalog.apply([d("/v/a"), f("/v/a/x")])
        assert await catalog.get_tags("/v/a/x") == {}

    async def _id(self, catalog: Catalog, path: str) -> int:
        ids = {p: i for i, p in await catalog.subtree_ids("/")}
        return ids[path]

    async def test_put_then_delete_in_one_batch(self, catalog: Catalog) -> None:
        await catalog.apply([d("/t"), f("/t/x"), Delete("/t/x"), f("/t/y")])
        assert [e.name for e in await catalog.list_dir("/t")] == ["y"]

    async def test_tags(self, catalog: Catalog) -> None:
        await catalog.apply([f("/x")])
        head = await catalog.head_seq()
        assert await catalog.set_tags("/x", {"a": "1", "b": "2"}) == {"a": "1", "b": "2"}
        assert await catalog.set_tags("/x", {"a": "3"}, ["b"]) == {"a": "3"}
        assert await catalog.get_tags("/x") == {"a": "3"}
        changes = await catalog.changes(head)
        assert [c.op for c in changes] == [ChangeOp.META, ChangeOp.META]
        with pytest.raises(NotFound):
            await catalog.get_tags("/none")

    async def test_change_log_is_gap_free_and_ordered(self, catalog: Catalog) -> None:
        start = await catalog.head_seq()
        await tree(catalog)
        await catalog.rename("/v/b", "/v/bb")
        await catalog.apply([Delete("/v/bb")])
        changes = await catalog.changes(start)
        assert [c.seq for c in changes] == list(range(start + 1, start + len(changes) + 1))
        assert changes[-1].op is ChangeOp.DELETE and changes[-2].op is ChangeOp.RENAME
        assert await catalog.head_seq() == changes[-1].seq
        assert [c.seq for c in await catalog.changes(start, limit=2)] == [start + 1, start + 2]

    async def test_subtree_ids_pages_cover_everything_once(self, catalog: Catalog) -> None:
        await catalog.apply([d("/s"), *[d(f"/s/d{i}") for i in range(5)]])
        await catalog.apply([f(f"/s/d{i}/f{j}") for i in range(5) for j in range(7)])
        await catalog.apply([f("/s-sibling")])
        seen: list[str] = []
        after: tuple[str, str] | None = None
        while rows := await catalog.subtree_ids("/s", after, limit=6):
            seen.extend(p for _, p in rows)
            after = (rows[-1][1].rsplit("/", 1)[0] or "/", rows[-1][1].rsplit("/", 1)[1])
        assert len(seen) == len(set(seen)) == 5 + 35
        assert all(p.startswith("/s/") for p in seen)
        # only the rows up to an id (those a sweep may delete), still paged to the end
        cut = sorted(i for i, _ in await catalog.subtree_ids("/s"))[5]
        older: list[int] = []
        after = None
        while rows := await catalog.subtree_ids("/s", after, limit=2, max_id=cut):
            older.extend(i for i, _ in rows)
            after = (rows[-1][1].rsplit("/", 1)[0] or "/", rows[-1][1].rsplit("/", 1)[1])
        assert sorted(older) == sorted(i for i, _ in await catalog.subtree_ids("/s") if i <= cut)

    async def test_volumes(self, catalog: Catalog) -> None:
        vol = await catalog.add_volume("/datasets/x", "posix:///data/x")
        assert vol.state is VolumeState.IMPORTING and vol.checkpoint is None
        assert (await catalog.get("/datasets")) is not None
        root = await catalog.get("/datasets/x")
        assert root is not None and root.is_dir
        for overlapping in ("/datasets/x", "/datasets/x/y", "/datasets"):
            with pytest.raises(AlreadyExists):
                await catalog.add_volume(overlapping, "posix:///other")
        # a batch and its checkpoint commit together
        await catalog.apply([f("/datasets/x/a")], VolumeUpdate(vol.id, checkpoint="a"))
        [stored] = await catalog.volumes()
        assert stored.checkpoint == "a"
        with pytest.raises(Conflict):
            await catalog.apply(
                [f("/datasets/x/b"), f("/datasets/x/a", expect_version=0)],
                VolumeUpdate(vol.id, checkpoint="b"),
            )
        assert (await catalog.volumes())[0].checkpoint == "a"
        await catalog.update_volume(
            VolumeUpdate(vol.id, state=VolumeState.READY, clear_checkpoint=True, last_scan_ns=5)
        )
        [ready] = await catalog.volumes()
        assert (ready.state, ready.checkpoint, ready.last_scan_ns) == (VolumeState.READY, None, 5)
        await catalog.remove_volume("/datasets/x")
        assert await catalog.volumes() == []
        assert await catalog.get("/datasets/x/a") is None
        with pytest.raises(NotFound):
            await catalog.remove_volume("/datasets/x")

    async def test_persists_across_reopen(self, catalog: Catalog, reopen: Reopen) -> None:
        await tree(catalog)
        other = await reopen()
        try:
            assert await other.get("/v/a/sub/z") == await catalog.get("/v/a/sub/z")
            assert await other.head_seq() == await catalog.head_seq()
        finally:
            await other.close()

    async def test_concurrent_writers_get_distinct_ordered_sequence_numbers(
        self, catalog: Catalog, reopen: Reopen
    ) -> None:
        other = await reopen()
        start = await catalog.head_seq()
        try:

            async def writer(cat: Catalog, name: str) -> None:
                for i in range(20):
                    await cat.apply([f(f"/{name}{i}")])

            await asyncio.gather(writer(catalog, "a"), writer(other, "b"))
        finally:
            await other.close()
        changes = await catalog.changes(start, limit=100)
        assert [c.seq for c in changes] == list(range(start + 1, start + 41))
        assert {e.version for e in await catalog.list_dir("/", limit=100)} >= {
            c.version for c in changes
        }

    @pytest.mark.parametrize(
        ("kind", "name"), [("nfs_export", "/e"), ("smb_share", "e")], ids=["nfs", "smb"]
    )
    async def test_export_records(
        self, catalog: Catalog, reopen: Reopen, kind: str, name: str
    ) -> None:
        """One NFS export a path, one SMB share a name, seen by every process over the
        catalog; two adds of one at once: one wins."""
        other = await reopen()
        ours, theirs = catalog.export_records(), other.export_records()

        def call(records: ExportRecords, verb: str) -> Any:
            return getattr(records, f"{verb}_{kind}" if verb else f"{kind}s")

        try:
            added = await asyncio.gather(
                call(ours, "add")(name, '{"access": "ro"}'),
                call(theirs, "add")(name, '{"access": "rw"}'),
            )
            assert sorted(added) == [False, True]
            seen = await call(theirs, "")()
            assert seen == await call(ours, "")()
            assert list(seen) == [name]
            assert await call(ours, "remove")(name)
            assert not await call(theirs, "remove")(name)
            assert await call(theirs, "")() == {}
        finally:
            await other.close()
