"""The catalog conformance suite on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from loomfs.core.catalog.base import Catalog
from loomfs.core.registry import open_catalog
from loomfs.errors import ConfigError, UnsupportedScheme
from loomfs.testing.catalog_suite import CatalogSuite, Reopen, d, f

#: small commits the kill -9 test makes: several of the non-durable catalog's checkpoints
COMMITS = 1000


@pytest.fixture
def reopen(catalog_url: str) -> Reopen:
    async def open_again() -> Catalog:
        cat = open_catalog(catalog_url)
        await cat.open()
        return cat

    return open_again


class TestCatalog(CatalogSuite):
    pass


def test_unknown_scheme_names_the_known_ones() -> None:
    with pytest.raises(UnsupportedScheme, match=r"known: .*postgresql://.*sqlite://"):
        open_catalog("mysql://localhost/x")


@pytest.mark.parametrize("url", ["sqlite://relative.db", "sqlite:///"])
def test_sqlite_url_must_name_an_absolute_file(url: str) -> None:
    with pytest.raises(ConfigError):
        open_catalog(url)


async def test_newer_schema_is_refused(tmp_path: Path) -> None:
    url = f"sqlite://{tmp_path}/c.db"
    cat = open_catalog(url)
    await cat.open()
    await cat.close()
    with sqlite3.connect(f"{tmp_path}/c.db") as conn:
        conn.execute("INSERT INTO schema_version (version) VALUES (999)")
    again = open_catalog(url)
    with pytest.raises(RuntimeError, match="newer than this loomfs"):
        await again.open()
    await again.close()


async def test_sqlite_lookups_see_each_commit_without_the_catalog_thread(tmp_path: Path) -> None:
    """Lookups by key are answered on the event loop by a second connection: they see each
    commit made just before, and are answered while the catalog's thread is busy."""
    cat = open_catalog(f"sqlite://{tmp_path}/c.db")
    await cat.open()
    try:
        await cat.apply([d("/d")])
        for i in range(50):
            assert await cat.get(f"/d/f{i}") is None
            await cat.apply([f(f"/d/f{i}", size=i)])
            got = await cat.get_many([f"/d/f{i}", "/d"])
            assert got[f"/d/f{i}"].size == i and got["/d"].is_dir
            await cat.apply([f(f"/d/f{i}", size=i + 1, etag="v2")])
            again = await cat.get(f"/d/f{i}")
            assert again is not None and again.size == i + 1

        busy = threading.Event()
        held = asyncio.get_running_loop().run_in_executor(cat._executor, busy.wait)  # type: ignore[attr-defined]
        try:
            found = await asyncio.wait_for(cat.get("/d/f7"), 60)  # hangs (fails) if queued
            assert found is not None and found.size == 8
        finally:
            busy.set()
            await held
    finally:
        await cat.close()


class TestSqliteNotDurable(CatalogSuite):
    """The suite on SQLite as a mount's own hub runs it (``durable=False``), where small
    changes are committed on the event loop by a connection of their own."""

    @pytest.fixture
    async def catalog(self, tmp_path: Path) -> AsyncIterator[Catalog]:
        cat = open_catalog(f"sqlite://{tmp_path}/c.db")
        cat.durable = False
        await cat.open()
        yield cat
        await cat.close()

    @pytest.fixture
    def reopen(self, tmp_path: Path) -> Reopen:
        async def open_again() -> Catalog:
            cat = open_catalog(f"sqlite://{tmp_path}/c.db")
            cat.durable = False
            await cat.open()
            return cat

        return open_again


async def test_sqlite_not_durable_commits_while_the_catalog_thread_is_busy(
    tmp_path: Path,
) -> None:
    """Not durable, a small change commits on the event loop, without waiting for the
    catalog's thread; one that finds that thread holding the write lock is committed by
    the thread after it, in that order, and nothing of it is committed twice."""
    cat = open_catalog(f"sqlite://{tmp_path}/c.db")
    cat.durable = False
    await cat.open()
    try:
        await cat.apply([d("/d")])
        busy = threading.Event()
        held = asyncio.get_running_loop().run_in_executor(cat._executor, busy.wait)  # type: ignore[attr-defined]
        try:
            [made] = await asyncio.wait_for(cat.apply([f("/d/a")]), 60)  # hangs if queued
            assert made.change is not None
        finally:
            busy.set()
            await held

        started, release = threading.Event(), threading.Event()

        def hold_the_lock(cur: Any) -> None:
            started.set()
            release.wait()
            cur.execute(
                "INSERT INTO tags (entry_id, key, value) "
                "SELECT id, 'k', 'v' FROM entries WHERE parent = '/d' AND name = 'a'"
            )

        locked = asyncio.ensure_future(cat._run(cat._write, hold_the_lock))  # type: ignore[attr-defined]
        await asyncio.to_thread(started.wait)
        queued = asyncio.ensure_future(cat.apply([f("/d/b")]))
        await asyncio.sleep(0)  # it tried the lock, found it taken, and waits for the thread
        assert not queued.done()
        release.set()
        await locked
        [second] = await queued
        assert second.change is not None and second.change.seq == made.change.seq + 1
        assert await cat.get_tags("/d/a") == {"k": "v"}
        assert [c.path for c in await cat.changes(made.change.seq)] == ["/d/b"]
    finally:
        await cat.close()


def test_sqlite_not_durable_keeps_what_it_acknowledged_through_kill_9(tmp_path: Path) -> None:
    """A change a non-durable catalog acknowledged is in the database after the process is
    killed right after (nothing flushed it: it is in the WAL, which the kernel holds), and
    the WAL is checkpointed on the way, not left to grow."""
    db = tmp_path / "c.db"
    script = f"""
import asyncio, os, signal
from loomfs.core.registry import open_catalog
from loomfs.testing.catalog_suite import d, f

async def main():
    cat = open_catalog("sqlite://{db}")
    cat.durable = False
    await cat.open()
    await cat.apply([d("/d")])
    for i in range({COMMITS}):
        await cat.apply([f(f"/d/f{{i}}")])
    os.kill(os.getpid(), signal.SIGKILL)

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", script], check=False, capture_output=True)
    assert done.returncode == -signal.SIGKILL, done.stderr.decode()
    with sqlite3.connect(db) as conn:
        (count,) = conn.execute("SELECT count(*) FROM entries WHERE parent = '/d'").fetchone()
        # the frames in the WAL since its last checkpoint: far fewer than one a commit
        _, frames, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
    assert count == COMMITS
    assert frames < COMMITS // 2
