"""S3 public access blocks over boto3: kept as the namespace's own (``core.acl``), and
binding as S3's four flags say, at the namespace (so for every protocol), not only S3."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from botocore import UNSIGNED

from loomfs.core.acl import ANONYMOUS
from loomfs.core.types import Principal
from loomfs.errors import PermissionDenied
from test_s3_gateway import Gateway, governed_gateway
from test_s3_gateway import error_code as _code

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET, FOLDER = "pab", "/data/buckets/pab"
NOBODY = Principal(ANONYMOUS, protocol="sftp")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = governed_gateway(tmp_path)
    yield gateway
    gateway.stop()


def _block(s3: S3Client, **flags: bool) -> None:
    names = ("BlockPublicAcls", "IgnorePublicAcls", "BlockPublicPolicy", "RestrictPublicBuckets")
    conf: Any = {name: flags.get(name, False) for name in names}
    s3.put_public_access_block(Bucket=BUCKET, PublicAccessBlockConfiguration=conf)
    assert s3.get_public_access_block(Bucket=BUCKET)["PublicAccessBlockConfiguration"] == conf


def _public_policy(principal: Any = "*") -> str:
    return json.dumps(
        {"Version": "2012-10-17", "Statement": [
            {"Effect": "Allow", "Principal": principal, "Action": "s3:ListBucket",
             "Resource": f"arn:aws:s3:::{BUCKET}"},
            {"Effect": "Allow", "Principal": principal, "Action": "s3:GetObject",
             "Resource": f"arn:aws:s3:::{BUCKET}/*"},
        ]}
    )  # fmt: skip


def _read_as_nobody(gw: Gateway, key: str) -> bytes | None:
    """The object's bytes read by the anonymous caller of another protocol, None if refused."""
    try:
        return gw.call(gw.gateway.ns.read_bytes(NOBODY, f"{FOLDER}/{key}"))
    except PermissionDenied:
        return None


def test_ignore_public_acls_and_block_public_acls(gw: Gateway) -> None:
    s3, anonymous = gw.client(), gw.client(signature_version=UNSIGNED)
    s3.create_bucket(Bucket=BUCKET)
    assert _code(s3.get_public_access_block, Bucket=BUCKET) == (
        "NoSuchPublicAccessBlockConfiguration"
    )
    s3.put_bucket_acl(Bucket=BUCKET, ACL="public-read")
    s3.put_object(Bucket=BUCKET, Key="k", Body=b"public", ACL="public-read")
    assert anonymous.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"public"
    assert _read_as_nobody(gw, "k") == b"public"
    _block(s3, IgnorePublicAcls=True)
    assert _code(anonymous.get_object, Bucket=BUCKET, Key="k") == "AccessDenied"
    assert _code(anonymous.list_objects, Bucket=BUCKET) == "AccessDenied"
    assert _read_as_nobody(gw, "k") is None  # not only over S3
    assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"public"  # the owner's
    _block(s3, BlockPublicAcls=True)
    assert anonymous.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"public"  # kept
    for canned in ("public-read", "public-read-write", "authenticated-read"):
        put = s3.put_object
        assert _code(put, Bucket=BUCKET, Key="new", Body=b"x", ACL=canned) == "AccessDenied"
        assert _code(s3.put_object_acl, Bucket=BUCKET, Key="k", ACL=canned) == "AccessDenied"
    assert _code(s3.head_object, Bucket=BUCKET, Key="new") == "404"  # refused before the write
    s3.put_object(Bucket=BUCKET, Key="new", Body=b"x", ACL="private")
    s3.delete_public_access_block(Bucket=BUCKET)
    assert _code(s3.get_public_access_block, Bucket=BUCKET) == (
        "NoSuchPublicAccessBlockConfiguration"
    )
    s3.put_object_acl(Bucket=BUCKET, Key="new", ACL="public-read")


def test_block_public_policy_and_restrict_public_buckets(gw: Gateway) -> None:
    s3, anonymous = gw.client(), gw.client(signature_version=UNSIGNED)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key="k", Body=b"v")
    _block(s3, BlockPublicPolicy=True)
    put = s3.put_bucket_policy
    assert _code(put, Bucket=BUCKET, Policy=_public_policy()) == "AccessDenied"
    assert _code(s3.get_bucket_policy, Bucket=BUCKET) == "NoSuchBucketPolicy"
    # refused as public before it is translated (alone, s3:GetObject is no namespace right)
    get_only = json.loads(_public_policy())
    del get_only["Statement"][0]
    assert _code(put, Bucket=BUCKET, Policy=json.dumps(get_only)) == "AccessDenied"
    s3.delete_public_access_block(Bucket=BUCKET)
    assert _code(put, Bucket=BUCKET, Policy=json.dumps(get_only)) == "MalformedPolicy"
    _block(s3, BlockPublicPolicy=True)
    s3.put_bucket_policy(Bucket=BUCKET, Policy=_public_policy({"AWS": "bob"}))
    s3.delete_public_access_block(Bucket=BUCKET)
    s3.put_bucket_policy(Bucket=BUCKET, Policy=_public_policy())
    assert anonymous.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"v"
    _block(s3, RestrictPublicBuckets=True)
    assert _code(anonymous.get_object, Bucket=BUCKET, Key="k") == "AccessDenied"
    assert _read_as_nobody(gw, "k") is None
    assert s3.get_object(Bucket=BUCKET, Key="k")["Body"].read() == b"v"
    bob = gw.client(gw.bob.access_key, gw.bob.secret)
    assert _code(bob.get_object, Bucket=BUCKET, Key="k") == "AccessDenied"
