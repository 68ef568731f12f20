"""Server-side encryption over boto3 (SSE-S3, SSE-KMS, SSE-C, bucket default encryption),
and the same encryption kept by the namespace for every protocol: the volume holds only
ciphertext, an SSE-C object is refused to any reader without its key (SFTP, REST, the
namespace API), an SSE-S3 or SSE-KMS one reads as its plaintext for whoever may read it."""

from __future__ import annotations

import asyncio
import base64
import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import urllib3
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from loomfs.core.registry import open_catalog
from loomfs.core.streams import aiter_bytes
from loomfs.core.types import SYSTEM, Principal
from loomfs.core.users import UserRegistry
from loomfs.errors import InvalidArgument, KeyRequired, NotSupported
from loomfs.namespace.governed import GovernedNamespace
from loomfs.namespace.sse import Kind, Sealing
from loomfs.rest import wire
from loomfs.testing.s3gateway import BUCKET_ROOT, gateway_client, s3_gateway_hub
from loomfs.testing.sftp import make_key, openssh_sftp, sftp_batch
from test_s3_gateway import Gateway, governed_gateway
from test_s3_gateway import error_code as _code

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET, FOLDER = "sealed", "/data/buckets/sealed"
KEY = bytes(range(32))
SSE_C: dict[str, Any] = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": KEY}
OTHER_C: dict[str, Any] = {"SSECustomerAlgorithm": "AES256", "SSECustomerKey": os.urandom(32)}
# boto3's parameters for each kind, and the header its answers carry
KINDS: dict[str, tuple[dict[str, Any], dict[str, str]]] = {
    "sse-s3": ({"ServerSideEncryption": "AES256"}, {"ServerSideEncryption": "AES256"}),
    "sse-kms": (
        {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "testkey-2"},
        {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "testkey-2"},
    ),
    "sse-c": (SSE_C, {"SSECustomerAlgorithm": "AES256"}),
}
NFS = Principal("alice", protocol="nfs")


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = governed_gateway(tmp_path)
    gateway.client().create_bucket(Bucket=BUCKET)
    yield gateway
    gateway.stop()


def _on_disk(gw: Gateway, key: str) -> bytes:
    return (gw.root / "buckets" / BUCKET / key).read_bytes()


def _governed(gw: Gateway) -> GovernedNamespace:
    assert isinstance(gw.served, GovernedNamespace)
    return gw.served


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    kind=st.sampled_from(sorted(KINDS)),
    size=st.integers(0, 70_000),
    start=st.integers(0, 70_000),
    span=st.integers(1, 40_000),
)
def test_every_kind_round_trips_by_range_and_is_ciphertext_on_disk(
    gw: Gateway, kind: str, size: int, start: int, span: int
) -> None:
    """Whatever the kind and the range, a GET returns the plaintext's bytes there, the
    answers say how the object is encrypted, and the volume holds other bytes of the same
    size (CTR: a range of the plaintext is that range of the file)."""
    s3, (asked, said) = gw.client(), KINDS[kind]
    body = os.urandom(size)
    put = s3.put_object(Bucket=BUCKET, Key="k", Body=body, **asked)
    assert {k: put.get(k) for k in said} == said
    read = asked if kind == "sse-c" else {}
    head = s3.head_object(Bucket=BUCKET, Key="k", **read)
    assert {k: head.get(k) for k in said} == said and head["ContentLength"] == size
    disk = _on_disk(gw, "k")
    assert len(disk) == size and (size < 16 or disk != body)
    if size:
        start %= size
        end = min(size, start + span) - 1
        got = s3.get_object(Bucket=BUCKET, Key="k", Range=f"bytes={start}-{end}", **read)
        assert got["Body"].read() == body[start : end + 1]
    assert s3.get_object(Bucket=BUCKET, Key="k", **read)["Body"].read() == body


def test_sse_c_needs_its_key_for_every_read(gw: Gateway) -> None:
    s3 = gw.client()
    s3.put_object(Bucket=BUCKET, Key="c", Body=b"customer secret", **SSE_C)
    s3.put_object(Bucket=BUCKET, Key="plain", Body=b"plain")
    get, head = s3.get_object, s3.head_object
    assert _code(get, Bucket=BUCKET, Key="c") == "InvalidRequest"
    assert _code(get, Bucket=BUCKET, Key="c", **OTHER_C) == "InvalidRequest"
    assert _code(head, Bucket=BUCKET, Key="c") == "400"  # a HEAD's error has no body
    assert _code(get, Bucket=BUCKET, Key="plain", **SSE_C) == "InvalidArgument"
    # a KMS key id without aws:kms, or one the key store does not have
    put = s3.put_object
    assert _code(put, Bucket=BUCKET, Key="x", Body=b"x", SSEKMSKeyId="testkey-1") == (
        "InvalidArgument"
    )
    unknown = {"ServerSideEncryption": "aws:kms", "SSEKMSKeyId": "nosuchkey"}
    assert _code(put, Bucket=BUCKET, Key="x", Body=b"x", **unknown) == "InvalidArgument"
    # a copy reads its source with the source's key, and encrypts as the copy asks
    copy = s3.copy_object
    assert _code(copy, Bucket=BUCKET, Key="cp", CopySource=f"{BUCKET}/c") == "InvalidRequest"
    copy(Bucket=BUCKET, Key="cp", CopySource=f"{BUCKET}/c",
         CopySourceSSECustomerAlgorithm="AES256", CopySourceSSECustomerKey=KEY,
         ServerSideEncryption="AES256")  # fmt: skip
    assert get(Bucket=BUCKET, Key="cp")["Body"].read() == b"customer secret"
    # a multipart upload: each part and the Complete bring the same key
    uid = s3.create_multipart_upload(Bucket=BUCKET, Key="mp", **SSE_C)["UploadId"]
    part = s3.upload_part
    assert _code(part, Bucket=BUCKET, Key="mp", UploadId=uid, PartNumber=1, Body=b"p") == (
        "InvalidRequest"
    )
    assert _code(part, Bucket=BUCKET, Key="mp", UploadId=uid, PartNumber=1, Body=b"p",
                 **OTHER_C) == "InvalidRequest"  # fmt: skip
    first = b"p" * (5 << 20)  # all but the last part are at least 5 MiB
    etag = part(Bucket=BUCKET, Key="mp", UploadId=uid, PartNumber=1, Body=first, **SSE_C)
    parts: Any = {"Parts": [{"ETag": etag["ETag"], "PartNumber": 1}]}
    done = s3.complete_multipart_upload
    assert _code(done, Bucket=BUCKET, Key="mp", UploadId=uid, MultipartUpload=parts) == (
        "InvalidRequest"
    )
    copied = s3.upload_part_copy(Bucket=BUCKET, Key="mp", UploadId=uid, PartNumber=2,
                                 CopySource=f"{BUCKET}/plain", **SSE_C)  # fmt: skip
    assert copied["SSECustomerAlgorithm"] == "AES256"
    parts["Parts"].append({"ETag": copied["CopyPartResult"]["ETag"], "PartNumber": 2})
    answer = done(Bucket=BUCKET, Key="mp", UploadId=uid, MultipartUpload=parts, **SSE_C)
    said = answer["ResponseMetadata"]["HTTPHeaders"]
    assert said["x-amz-server-side-encryption-customer-algorithm"] == "AES256"
    assert get(Bucket=BUCKET, Key="mp", **SSE_C)["Body"].read() == first + b"plain"
    assert _code(get, Bucket=BUCKET, Key="mp") == "InvalidRequest"
    # what describes the object without reading it needs the key as a read does
    attributes = s3.get_object_attributes
    assert _code(attributes, Bucket=BUCKET, Key="mp", ObjectAttributes=["ObjectSize"]) == (
        "InvalidRequest"
    )
    encoded: dict[str, Any] = {  # botocore encodes the key for GET and PUT, not here
        "SSECustomerAlgorithm": "AES256",
        "SSECustomerKey": base64.b64encode(KEY).decode(),
        "SSECustomerKeyMD5": base64.b64encode(hashlib.md5(KEY).digest()).decode(),
    }
    sized = attributes(Bucket=BUCKET, Key="mp", ObjectAttributes=["ObjectSize"], **encoded)
    assert sized["ObjectSize"] == len(first) + len(b"plain")


def test_sse_c_is_refused_to_other_protocols_and_sse_s3_is_plain_to_them(gw: Gateway) -> None:
    """What NFS, SFTP, FUSE and REST call (the governed namespace, with no key): an SSE-C
    object is refused with a permission error (EACCES at a POSIX edge) that says why, an
    SSE-S3 one reads as its plaintext; the encryption tags cannot be edited, nor the
    encrypted file given a second name its tags would not follow."""
    s3, ns = gw.client(), _governed(gw)
    s3.put_object(Bucket=BUCKET, Key="c", Body=b"customer secret", **SSE_C)
    s3.put_object(Bucket=BUCKET, Key="s", Body=b"server secret", ServerSideEncryption="AES256")
    with pytest.raises(KeyRequired, match="SSE-C") as err:
        gw.call(ns.read_bytes(NFS, f"{FOLDER}/c"))
    assert err.value.errno == errno.EACCES and isinstance(err.value, PermissionError)
    assert gw.call(ns.read_bytes(NFS, f"{FOLDER}/s")) == b"server secret"
    with pytest.raises(KeyRequired):  # a range, as NFS reads, is refused alike
        gw.call(ns.read_bytes(NFS, f"{FOLDER}/c", 3, 4))
    with pytest.raises(InvalidArgument, match="encrypted"):
        gw.call(ns.set_tags(SYSTEM, f"{FOLDER}/s", {}, ["sse.kind"]))
    with pytest.raises(NotSupported, match="encrypted"):
        gw.call(ns.link(SYSTEM, f"{FOLDER}/s", f"{FOLDER}/second"))
    # an overwrite by another protocol stores what it sends, its old tags gone with it
    gw.call(ns.write_bytes(NFS, f"{FOLDER}/c", b"now plain"))
    assert _on_disk(gw, "c") == b"now plain"
    assert s3.get_object(Bucket=BUCKET, Key="c")["Body"].read() == b"now plain"
    assert not [k for k in gw.tags(f"{FOLDER}/c") if k.startswith("sse.")]
    # and so does a FUSE or SMB close: its content and attributes in one change
    smb = aiter_bytes(b"closed over smb")
    gw.call(ns.write_with_attrs(NFS, f"{FOLDER}/s", smb, if_version=None, attrs={"mode": 0o600}))
    assert _on_disk(gw, "s") == b"closed over smb"
    assert gw.call(ns.read_bytes(NFS, f"{FOLDER}/s")) == b"closed over smb"


def test_bucket_default_encryption_holds_for_every_writer(gw: Gateway) -> None:
    s3, ns = gw.client(), _governed(gw)
    get_conf = s3.get_bucket_encryption
    assert _code(get_conf, Bucket=BUCKET) == "ServerSideEncryptionConfigurationNotFoundError"
    conf: Any = {"Rules": [{"ApplyServerSideEncryptionByDefault": {
        "SSEAlgorithm": "aws:kms", "KMSMasterKeyID": "testkey-1"}}]}  # fmt: skip
    s3.put_bucket_encryption(Bucket=BUCKET, ServerSideEncryptionConfiguration=conf)
    rules = get_conf(Bucket=BUCKET)["ServerSideEncryptionConfiguration"]["Rules"]
    assert (
        rules[0]["ApplyServerSideEncryptionByDefault"]
        == conf["Rules"][0]["ApplyServerSideEncryptionByDefault"]
    )
    put = s3.put_object(Bucket=BUCKET, Key="deep/k", Body=b"by default")
    assert put["ServerSideEncryption"] == "aws:kms" and put["SSEKMSKeyId"] == "testkey-1"
    assert _on_disk(gw, "deep/k") != b"by default"
    # another protocol's write below the bucket is encrypted alike
    gw.call(ns.write_bytes(NFS, f"{FOLDER}/deep/nfs", b"over nfs"))
    assert _on_disk(gw, "deep/nfs") != b"over nfs"
    assert s3.get_object(Bucket=BUCKET, Key="deep/nfs")["ServerSideEncryption"] == "aws:kms"
    assert gw.call(ns.read_bytes(NFS, f"{FOLDER}/deep/nfs")) == b"over nfs"
    assert ns.writes_attrs(f"{FOLDER}/deep/smb")  # a FUSE or SMB close, encrypted alike
    smb = aiter_bytes(b"over smb")
    gw.call(ns.write_with_attrs(NFS, f"{FOLDER}/deep/smb", smb, if_version=None, attrs={}))
    assert _on_disk(gw, "deep/smb") != b"over smb"
    assert gw.call(ns.read_bytes(NFS, f"{FOLDER}/deep/smb")) == b"over smb"
    s3.delete_bucket_encryption(Bucket=BUCKET)
    assert _code(get_conf, Bucket=BUCKET) == "ServerSideEncryptionConfigurationNotFoundError"
    s3.put_object(Bucket=BUCKET, Key="deep/k", Body=b"plain again")
    assert _on_disk(gw, "deep/k") == b"plain again"
    bad: Any = {"Rules": [{"ApplyServerSideEncryptionByDefault": {"SSEAlgorithm": "DES"}}]}
    put_conf = s3.put_bucket_encryption
    assert _code(put_conf, Bucket=BUCKET, ServerSideEncryptionConfiguration=bad) == ("MalformedXML")
    assert gw.call(ns.default_sealing(SYSTEM, FOLDER)) is None
    gw.call(ns.set_default_sealing(SYSTEM, FOLDER, Sealing(Kind.SERVER)))
    gw.call(ns.rename(SYSTEM, f"{FOLDER}/deep", f"{FOLDER}/moved"))
    gw.call(ns.write_bytes(NFS, f"{FOLDER}/moved/n", b"moved below a default"))
    assert _on_disk(gw, "moved/n") != b"moved below a default"


def test_old_versions_keep_their_encryption(gw: Gateway) -> None:
    """A versioned overwrite keeps the old ciphertext with its own tags: the old version
    reads as it was, the new plain one as it is; a delete marker's 404 says it is one."""
    s3 = gw.client()
    s3.put_bucket_versioning(Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    first = s3.put_object(Bucket=BUCKET, Key="v", Body=b"sealed one", **SSE_C)["VersionId"]
    s3.put_object(Bucket=BUCKET, Key="v", Body=b"plain two")
    old = s3.get_object(Bucket=BUCKET, Key="v", VersionId=first, **SSE_C)
    assert old["Body"].read() == b"sealed one"
    get = s3.get_object
    assert _code(get, Bucket=BUCKET, Key="v", VersionId=first) == "InvalidRequest"
    assert s3.get_object(Bucket=BUCKET, Key="v")["Body"].read() == b"plain two"
    s3.delete_object(Bucket=BUCKET, Key="v")
    for call in (s3.get_object, s3.head_object):
        with pytest.raises(Exception) as err:
            call(Bucket=BUCKET, Key="v")
        answer = err.value.response["ResponseMetadata"]  # type: ignore[attr-defined]
        assert answer["HTTPStatusCode"] == 404
        assert answer["HTTPHeaders"].get("x-amz-delete-marker") == "true"
    s3.put_object(Bucket=BUCKET, Key="other", Body=b"x")
    with pytest.raises(Exception) as err:
        s3.head_object(Bucket=BUCKET, Key="missing")
    headers = err.value.response["ResponseMetadata"]["HTTPHeaders"]  # type: ignore[attr-defined]
    assert headers["x-amz-delete-marker"] == "false"


# -- against a hub: SFTP and REST read what S3 wrote ----------------------------------------


def _credentials(user: str) -> tuple[str, str]:
    return f"{user}key".upper().ljust(16, "X"), f"{user}-secret".ljust(16, "x")


async def _ssh_key(tmp: Path, user: str) -> None:
    (tmp / "keys").mkdir()
    catalog = open_catalog(f"sqlite://{tmp / 'hub' / 'catalog.db'}")
    await catalog.open()
    try:
        await UserRegistry(catalog).add_ssh_key(user, make_key(tmp / "keys" / user))
    finally:
        await catalog.close()


def test_a_hub_refuses_sse_c_over_sftp_and_rest_and_serves_sse_s3(tmp_path: Path) -> None:
    openssh_sftp()  # fails with how to install it
    user = "owner"
    sftp = '[sftp]\nlisten = "127.0.0.1:0"\nroot = "/"\n[hub]\nkms_keys = ["testkey-1"]\n'
    with s3_gateway_hub(tmp_path, [(user, *_credentials(user))], sftp) as hub:
        asyncio.run(_ssh_key(tmp_path, user))
        s3: S3Client = gateway_client(hub.urls["s3"], *_credentials(user))
        s3.create_bucket(Bucket=BUCKET)
        s3.put_object(Bucket=BUCKET, Key="c", Body=b"customer secret", **SSE_C)
        s3.put_object(Bucket=BUCKET, Key="k", Body=b"kms secret", ServerSideEncryption="aws:kms")
        volume = tmp_path / "volume" / BUCKET
        assert b"secret" not in (volume / "c").read_bytes() + (volume / "k").read_bytes()
        assert (tmp_path / "hub" / "sse" / "kms" / "testkey-1.key").stat().st_mode & 0o077 == 0
        port = int(hub.urls["sftp"].rpartition(":")[2])
        # one session: the batch stops at the first refusal, so the SSE-KMS get goes first
        got = {key: tmp_path / f"got-{key}" for key in "kc"}
        gets = "".join(f"get {BUCKET_ROOT}/{BUCKET}/{key} {got[key]}\n" for key in "kc")
        done = sftp_batch(port, user, tmp_path / "keys" / user, gets, cwd=tmp_path)
        assert done.returncode != 0 and "denied" in done.stderr.lower(), done.stderr
        assert got["k"].read_bytes() == b"kms secret"
        assert not got["c"].exists() or got["c"].read_bytes() == b""  # made, never written
        auth = {"Authorization": wire.basic_authorization(*_credentials(user))}
        url = f"{hub.url}/v1/files{BUCKET_ROOT}/{BUCKET}"
        refused = urllib3.request("GET", f"{url}/c", headers=auth)
        assert refused.status == 403 and b"SSE-C" in refused.data
        assert urllib3.request("GET", f"{url}/k", headers=auth).data == b"kms secret"
