"""pytest fixtures for real servers (testing layer), shared by the test suite.

Servers start once per session on free ports and stop by their own process id.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from ..core.catalog.base import Catalog
from ..core.registry import open_catalog
from .postgres import PostgresServer
from .seaweedfs import SeaweedFS


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    with SeaweedFS() as server:
        yield server


@pytest.fixture
def s3_env(seaweedfs: SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> None:
    """The SeaweedFS credentials in the standard AWS variables, where S3 volumes look."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", seaweedfs.access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", seaweedfs.secret_key)
    monkeypatch.setenv("AWS_DEFAULT_REGION", seaweedfs.region)


@pytest.fixture(scope="session")
def postgres() -> Iterator[PostgresServer]:
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=["sqlite", "postgresql"])
def catalog_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite://{tmp_path / 'catalog.db'}"
    server: PostgresServer = request.getfixturevalue("postgres")
    return server.create_database()


@pytest.fixture
async def catalog(catalog_url: str) -> AsyncIterator[Catalog]:
    cat = open_catalog(catalog_url)
    await cat.open()
    yield cat
    await cat.close()


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` ("4m") mounted at the new directory ``where``, unmounted after:
    a real ENOSPC, not a simulated one (mounting it needs root)."""
    if os.geteuid() != 0:
        pytest.fail("this test mounts a tmpfs and must run as root (CI and make test do)")
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@contextlib.contextmanager
def filled(fs: Path) -> Iterator[None]:
    """The file system ``fs`` full to its last page while inside, by a file of its own
    (``fs``/filler, removed after)."""
    fd = os.open(fs / "filler", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for block in (1 << 20, 64 << 10, 4096):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, bytes(block))
        yield
    finally:
        os.close(fd)
        os.unlink(fs / "filler")


@pytest.fixture
def tiny_fs(tmp_path: Path) -> Iterator[Path]:
    """A 1 MiB tmpfs."""
    with tmpfs(tmp_path / "tiny", "1m") as mnt:
        yield mnt
