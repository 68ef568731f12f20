"""s3fs (fsspec's S3 file system, on aiobotocore) as a real client of the S3 gateway of a
running hub: write, list, ranged reads, multipart, removal, and the same files seen over
the REST API and on the volume's disk."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

try:
    import s3fs
except ImportError as exc:  # a clear failure, not a silent skip
    raise ImportError("s3fs is missing: pip install 's3fs>=2026.9' (in the dev extra)") from exc

from loomfs.core.types import Principal
from loomfs.rest.client import RestNamespace
from loomfs.testing.hubproc import HubProcess
from loomfs.testing.s3gateway import BUCKET_ROOT, s3_gateway_hub

USER = ("ines", "INESACCESSKEY0000000", "ines-secret-" + "s" * 28)
ME = Principal(USER[0])


class Site(NamedTuple):
    hub: HubProcess
    volume: Path  # the posix volume's directory: BUCKET_ROOT's files on disk


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    scratch = tmp_path_factory.mktemp("s3fs")
    with s3_gateway_hub(scratch, [USER]) as hub:
        yield Site(hub, scratch / "volume")


@pytest.fixture
def fs(site: Site) -> s3fs.S3FileSystem:
    return s3fs.S3FileSystem(
        key=USER[1],
        secret=USER[2],
        endpoint_url=site.hub.urls["s3"],
        client_kwargs={"region_name": "us-east-1"},
        config_kwargs={"s3": {"addressing_style": "path"}, "retries": {"max_attempts": 1}},
        skip_instance_cache=True,
        use_listings_cache=False,
    )


def test_write_list_read_ranges_remove(site: Site, fs: s3fs.S3FileSystem) -> None:
    fs.mkdir("fsspec")  # CreateBucket
    assert "fsspec" in [p.rstrip("/") for p in fs.ls("", detail=False)]
    body = os.urandom(100_000)
    fs.pipe_file("fsspec/dir/a.bin", body)
    fs.pipe_file("fsspec/dir/sub/b.txt", b"hello from s3fs")
    assert (site.volume / "fsspec" / "dir" / "a.bin").read_bytes() == body
    assert sorted(fs.ls("fsspec/dir", detail=False)) == ["fsspec/dir/a.bin", "fsspec/dir/sub"]
    assert fs.find("fsspec") == ["fsspec/dir/a.bin", "fsspec/dir/sub/b.txt"]
    info = fs.info("fsspec/dir/a.bin")
    assert info["size"] == len(body) and info["type"] == "file"
    # ranges: cat_file asks for them with Range, an open file for its read-ahead blocks
    assert fs.cat_file("fsspec/dir/a.bin", start=10, end=20) == body[10:20]
    assert fs.cat_file("fsspec/dir/a.bin", start=-7) == body[-7:]
    with fs.open("fsspec/dir/a.bin", "rb", block_size=8192) as f:
        f.seek(50_000)
        assert f.read(20_000) == body[50_000:70_000]
    fs.rm("fsspec/dir/sub/b.txt")
    assert not fs.exists("fsspec/dir/sub/b.txt")
    assert not (site.volume / "fsspec" / "dir" / "sub").exists()  # left empty: pruned
    fs.rm("fsspec/dir", recursive=True)
    assert fs.find("fsspec") == []
    fs.rmdir("fsspec")  # DeleteBucket
    assert not fs.exists("fsspec")


def test_multipart_write_through_an_open_file(site: Site, fs: s3fs.S3FileSystem) -> None:
    fs.mkdir("big")
    body = os.urandom(12 << 20)
    # 5 MiB blocks: s3fs sends this as a multipart upload of three parts
    with fs.open("big/parts.bin", "wb", block_size=5 << 20) as f:
        for pos in range(0, len(body), 1 << 20):
            f.write(body[pos : pos + (1 << 20)])
    assert fs.info("big/parts.bin")["ETag"].strip('"').endswith("-3")
    assert (site.volume / "big" / "parts.bin").read_bytes() == body
    assert (
        fs.cat_file("big/parts.bin", start=(5 << 20) - 3, end=(5 << 20) + 3)
        == body[(5 << 20) - 3 : (5 << 20) + 3]
    )


def test_s3fs_and_rest_see_the_same_files(site: Site, fs: s3fs.S3FileSystem) -> None:
    fs.mkdir("both")
    fs.pipe_file("both/from-s3fs.txt", b"written by s3fs")
    path = f"{BUCKET_ROOT}/both/from-s3fs.txt"

    async def over_rest() -> tuple[bytes, bytes]:
        rest = RestNamespace(site.hub.url, credentials=(USER[1], USER[2]))
        try:
            whole, part = await rest.read_bytes(ME, path), await rest.read_bytes(ME, path, 8, 2)
            await rest.write_bytes(ME, f"{BUCKET_ROOT}/both/from-rest.txt", b"over REST")
        finally:
            await rest.close()
        return whole, part

    assert asyncio.run(over_rest()) == (b"written by s3fs", b"by")
    assert fs.cat_file("both/from-rest.txt") == b"over REST"
    assert fs.find("both") == ["both/from-rest.txt", "both/from-s3fs.txt"]


def test_wrong_secret_is_refused(site: Site) -> None:
    wrong = s3fs.S3FileSystem(
        key=USER[1],
        secret="not-the-secret-" + "x" * 25,
        endpoint_url=site.hub.urls["s3"],
        client_kwargs={"region_name": "us-east-1"},
        config_kwargs={"retries": {"max_attempts": 1}},
        skip_instance_cache=True,
    )
    with pytest.raises(PermissionError):
        wrong.ls("")


def test_rm_recursive_of_a_bucket_with_folder_markers(site: Site, fs: s3fs.S3FileSystem) -> None:
    """s3fs asks whether a bucket is versioned before it removes it whole (and failed on
    501); folder markers ('dir/', as consoles make them) list, so they go too."""
    fs.mkdir("whole")
    fs.pipe_file("whole/a/b.txt", b"b")
    fs.call_s3("put_object", Bucket="whole", Key="empty/", Body=b"")
    fs.call_s3("put_object", Bucket="whole", Key="a/", Body=b"")
    assert not fs.is_bucket_versioned("whole")
    assert fs.isdir("whole/empty") and fs.isdir("whole/a")
    fs.rm("whole", recursive=True)
    assert not fs.exists("whole")
    assert not (site.volume / "whole").exists()
