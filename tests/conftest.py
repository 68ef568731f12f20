"""Shared fixtures: one real SeaweedFS S3 server for the whole test session."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from loomfs.testing.seaweedfs import SeaweedFS


@pytest.fixture(scope="session")
def seaweedfs() -> Iterator[SeaweedFS]:
    with SeaweedFS() as server:
        yield server
