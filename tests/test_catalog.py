"""The catalog conformance suite on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from loomfs.core.catalog.base import Catalog
from loomfs.core.registry import open_catalog
from loomfs.errors import ConfigError, UnsupportedScheme
from loomfs.testing.catalog_suite import CatalogSuite, Reopen


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
