"""The catalog conformance suite on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import asyncio
import sqlite3
import threading
from pathlib import Path

import pytest

from loomfs.core.catalog.base import Catalog
from loomfs.core.registry import open_catalog
from loomfs.errors import ConfigError, UnsupportedScheme
from loomfs.testing.catalog_suite import CatalogSuite, Reopen, d, f


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
