"""Reads through symlinks: every edge that serves bytes (REST, S3, the CLI, fsspec) serves
the target's bytes, with the target's size and version, for links relative, absolute
inside the volume, chained and through linked directories; a loop or a link out of every
volume is a clear error."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import boto3
import pytest
from botocore.config import Config
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.registry import open_catalog
from loomfs.core.types import Principal
from loomfs.errors import InvalidPath, NotFound, PermissionDenied
from loomfs.hub.namespace import HubNamespace
from loomfs.rest.client import RestNamespace
from loomfs.sdk.fsspec import LoomFileSystem
from loomfs.testing.hubproc import HubProcess
from loomfs.testing.s3gateway import BUCKET_ROOT, s3_gateway_hub
from loomfs.torch import FileDataset

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

WHO = Principal(user="tester")
USER = ("lena", "LENAACCESSKEY0000000", "lena-secret-" + "s" * 28)
BUCKET = "links"
TARGET = os.urandom(70_000)  # longer than any link's target text, by far
#: link name -> how it points at d/target.bin
LINKS = {
    "relative": "d/target.bin",
    "absolute": None,  # the target's absolute path on disk, set when the volume exists
    "chain": "relative",
    "updir": "d/../d/target.bin",
    "through-dir": "linked-d/target.bin",
    "d/sibling": "target.bin",
    "d/up-and-back": "../d/target.bin",
}


@dataclass
class Site:
    hub: HubProcess
    root: Path  # the bucket's directory on disk

    def s3(self) -> S3Client:
        return boto3.client(
            "s3",
            endpoint_url=self.hub.urls["s3"],
            region_name="us-east-1",
            aws_access_key_id=USER[1],
            aws_secret_access_key=USER[2],
            config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
        )


async def _rescan(url: str, admin: tuple[str, str]) -> None:
    client = RestNamespace(url, credentials=admin)  # a rescan is administration
    try:
        await client.rescan(BUCKET_ROOT)
    finally:
        await client.close()


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    scratch = tmp_path_factory.mktemp("links")
    with s3_gateway_hub(scratch, [USER]) as hub:
        root = scratch / "volume" / BUCKET
        (root / "d").mkdir(parents=True)
        (root / "d" / "target.bin").write_bytes(TARGET)
        (root / "linked-d").symlink_to("d")
        for name, target in LINKS.items():
            (root / name).symlink_to(target or str(root / "d" / "target.bin"))
        (root / "loop-a").symlink_to("loop-b")
        (root / "loop-b").symlink_to("loop-a")
        (root / "outside").symlink_to(str(scratch / "secret"))
        (scratch / "secret").write_bytes(b"not in the namespace")
        (root / "dangling").symlink_to("d/nothing")
        (root / "dataset").mkdir()  # samples that are links, and one that is not
        (root / "dataset" / "a-plain.bin").write_bytes(b"plain sample")
        (root / "dataset" / "b-link.bin").symlink_to("../d/target.bin")
        (root / "dataset" / "c-chain.bin").symlink_to("b-link.bin")
        asyncio.run(_rescan(hub.url, hub.admin))
        yield Site(hub, root)


def _path(name: str) -> str:
    return f"{BUCKET_ROOT}/{BUCKET}/{name}"


async def _rest_reads(url: str) -> dict[str, tuple[bytes, int, int]]:
    client = RestNamespace(url)
    try:
        target = await client.stat(WHO, _path("d/target.bin"))
        out = {}
        for name in LINKS:
            async with await client.read(WHO, _path(name)) as reader:
                out[name] = (await reader.read_all(), reader.entry.size, reader.entry.version)
            # a range is resolved against the target's size, not the link's
            tail = await client.read_bytes(WHO, _path(name), len(TARGET) - 10)
            assert tail == TARGET[-10:], name
        out["target"] = (TARGET, target.size, target.version)
        return out
    finally:
        await client.close()


async def _rest_error(url: str, name: str) -> BaseException | None:
    client = RestNamespace(url)
    try:
        await client.read_bytes(WHO, _path(name))
    except Exception as exc:
        return exc
    finally:
        await client.close()
    return None


def test_rest_reads_the_target_and_refuses_links_to_no_file(site: Site) -> None:
    reads = asyncio.run(_rest_reads(site.hub.url))
    expected = reads.pop("target")
    assert reads == dict.fromkeys(LINKS, expected)
    for name, error in (("loop-a", InvalidPath), ("outside", PermissionDenied)):
        assert isinstance(asyncio.run(_rest_error(site.hub.url, name)), error), name
    assert isinstance(asyncio.run(_rest_error(site.hub.url, "dangling")), NotFound)


def test_s3_get_head_and_listing_give_the_target(site: Site) -> None:
    s3 = site.s3()
    for name in LINKS:
        got = s3.get_object(Bucket=BUCKET, Key=name)
        assert got["Body"].read() == TARGET, name
        assert got["ContentLength"] == len(TARGET), name
        head = s3.head_object(Bucket=BUCKET, Key=name)
        assert head["ContentLength"] == len(TARGET), name
        assert head["ETag"] == got["ETag"], name
        ranged = s3.get_object(Bucket=BUCKET, Key=name, Range="bytes=-5")
        assert ranged["Body"].read() == TARGET[-5:], name
    target_etag = s3.head_object(Bucket=BUCKET, Key="d/target.bin")["ETag"]
    listed = {
        o["Key"]: (o["Size"], o["ETag"])
        for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]  # no delimiter: all keys
    }
    for name in LINKS:
        assert listed[name] == (len(TARGET), target_etag), name
    # those that lead to no file are no objects
    assert not {"loop-a", "loop-b", "outside", "dangling"} & set(listed)
    for name in ("loop-a", "outside", "dangling"):
        with pytest.raises(ClientError) as refused:
            s3.get_object(Bucket=BUCKET, Key=name)
        assert refused.value.response["ResponseMetadata"]["HTTPStatusCode"] in (400, 403, 404)


def test_cli_cat_prints_the_target(site: Site) -> None:
    for name in LINKS:
        done = subprocess.run(
            [sys.executable, "-m", "loomfs.cli", "--hub", site.hub.url, "cat", _path(name)],
            capture_output=True, check=False, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode()
        assert done.stdout == TARGET, name


def test_fsspec_reads_and_sizes_the_target(site: Site) -> None:
    fs = LoomFileSystem(sites={})
    host = site.hub.url.removeprefix("http://")
    for name in LINKS:
        url = f"{host}{_path(name)}"
        info = fs.info(url)
        assert (info["size"], info["type"], info["islink"]) == (len(TARGET), "file", True)
        assert fs.cat(url) == TARGET, name
        with fs.open(url, "rb") as f:  # a buffered file reads up to info's size
            assert f.read() == TARGET, name
    sizes = {
        i["name"].rsplit("/", 1)[1]: i["size"]
        for i in fs.ls(f"{host}{_path('')}".rstrip("/"), detail=True)
    }
    assert sizes["relative"] == sizes["chain"] == sizes["absolute"] == len(TARGET)


def test_a_file_dataset_of_links_yields_and_sizes_the_targets(site: Site) -> None:
    host = site.hub.url.removeprefix("http://")
    dataset: FileDataset[bytes] = FileDataset(f"loomfs://{host}{_path('dataset')}")
    assert dataset.sizes == [len(b"plain sample"), len(TARGET), len(TARGET)]
    assert [dataset[i] for i in range(len(dataset))] == [b"plain sample", TARGET, TARGET]


# -- random chains, in process -------------------------------------------------------------

STYLES = ("relative", "absolute", "through-dir")
DIRS = ("", "a", "a/b")


@st.composite
def chains(draw: st.DrawFn) -> tuple[list[tuple[str, str]], bool]:
    """Links (directory, style), each pointing at the next, the last at the target;
    ``loop``: the last points back at the first instead."""
    hops = draw(st.lists(st.tuples(st.sampled_from(DIRS), st.sampled_from(STYLES)), min_size=1))
    return hops[:8], draw(st.booleans())


def _build(root: Path, hops: list[tuple[str, str]], loop: bool) -> str:
    """Make the links on disk; the first link's key."""
    for sub in ("data", *DIRS[1:]):
        (root / sub).mkdir(parents=True, exist_ok=True)
    (root / "data" / "f.bin").write_bytes(TARGET)
    for sub in ("data", "a"):
        (root / f"via-{sub}").symlink_to(sub)
    keys = [f"{d}/l{i}".lstrip("/") for i, (d, _) in enumerate(hops)]
    pointed = [*keys[1:], keys[0] if loop else "data/f.bin"]
    for key, (folder, style), nxt in zip(keys, hops, pointed, strict=True):
        where = root / folder
        if style == "absolute":
            text = str(root / nxt)
        elif style == "through-dir" and nxt.split("/")[0] in ("data", "a"):
            head, _, rest = nxt.partition("/")
            text = os.path.relpath(root / f"via-{head}" / rest, where)
        else:
            text = os.path.relpath(root / nxt, where)
        (root / key).symlink_to(text)
    return keys[0]


async def _follow(root: Path, catalog_path: Path, first: str, loop: bool) -> None:
    catalog = open_catalog(f"sqlite://{catalog_path}")
    await catalog.open()
    hub = HubNamespace(catalog)
    try:
        await hub.add_volume("/v", f"posix://{root}")
        if loop:
            with pytest.raises(InvalidPath):
                await hub.read_bytes(WHO, f"/v/{first}")
            return
        target = await hub.stat(WHO, "/v/data/f.bin")
        async with await hub.read(WHO, f"/v/{first}") as reader:
            assert await reader.read_all() == TARGET
            assert reader.entry == target
        assert await hub.read_bytes(WHO, f"/v/{first}", 5, 7) == TARGET[5:12]
        assert await hub.resolve(f"/v/{first}") == "/v/data/f.bin"
        assert (await hub.followed(WHO, await hub.stat(WHO, f"/v/{first}"))) == target
    finally:
        await hub.close()
        await catalog.close()


@given(chains())
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
def test_random_link_chains_read_the_target(
    tmp_path: Path, chain: tuple[list[tuple[str, str]], bool]
) -> None:
    hops, loop = chain
    work = Path(tempfile.mkdtemp(dir=tmp_path))
    root = work / "vol"
    root.mkdir()
    first = _build(root, hops, loop)
    asyncio.run(_follow(root, work / "c.db", first, loop))
