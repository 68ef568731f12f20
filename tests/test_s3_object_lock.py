"""S3 object lock over boto3, and the same lock held by the namespace for every caller:
a version under retention or legal hold is never removed for good, and a COMPLIANCE
retention is never shortened, whoever asks and over whichever protocol."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loomfs.core.types import SYSTEM, WriteTags
from loomfs.errors import InvalidArgument, PermissionDenied
from loomfs.namespace.objectlock import Lock
from test_s3_gateway import Gateway, governed_gateway
from test_s3_gateway import error_code as _code

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

BUCKET, FOLDER = "locked", "/data/buckets/locked"
LATER = datetime.datetime(2099, 1, 1, tzinfo=datetime.UTC)


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = governed_gateway(tmp_path)
    yield gateway
    gateway.stop()


def _versions(s3: S3Client) -> list[str]:
    return [v["VersionId"] for v in s3.list_object_versions(Bucket=BUCKET).get("Versions", [])]


def test_a_bucket_with_object_lock_keeps_locked_versions(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket="plain")
    assert _code(s3.get_object_lock_configuration, Bucket="plain") == (
        "ObjectLockConfigurationNotFoundError"
    )
    conf: Any = {"ObjectLockEnabled": "Enabled",
                 "Rule": {"DefaultRetention": {"Mode": "GOVERNANCE", "Days": 1}}}  # fmt: skip
    put_conf = s3.put_object_lock_configuration
    assert _code(put_conf, Bucket="plain", ObjectLockConfiguration=conf) == "InvalidBucketState"
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    assert s3.get_bucket_versioning(Bucket=BUCKET)["Status"] == "Enabled"
    suspend: Any = {"Status": "Suspended"}
    put_versioning = s3.put_bucket_versioning
    assert _code(put_versioning, Bucket=BUCKET, VersioningConfiguration=suspend) != ""
    s3.put_object_lock_configuration(Bucket=BUCKET, ObjectLockConfiguration=conf)
    got = s3.get_object_lock_configuration(Bucket=BUCKET)["ObjectLockConfiguration"]
    assert got == conf
    # the default retention: a new object is held for a day, a version removal refused
    first = s3.put_object(Bucket=BUCKET, Key="k", Body=b"one")["VersionId"]
    assert s3.get_object_retention(Bucket=BUCKET, Key="k")["Retention"]["Mode"] == "GOVERNANCE"
    delete = s3.delete_object
    assert _code(delete, Bucket=BUCKET, Key="k", VersionId=first) == "AccessDenied"
    # an overwrite keeps the locked version; the new one has its own (default) retention
    second = s3.put_object(Bucket=BUCKET, Key="k", Body=b"two")["VersionId"]
    assert _code(delete, Bucket=BUCKET, Key="k", VersionId=first) == "AccessDenied"
    s3.put_object_legal_hold(Bucket=BUCKET, Key="k", VersionId=second,
                             LegalHold={"Status": "ON"})  # fmt: skip
    assert s3.get_object_legal_hold(Bucket=BUCKET, Key="k")["LegalHold"]["Status"] == "ON"
    # the bucket owner may bypass a governance retention, never a legal hold
    s3.delete_object(Bucket=BUCKET, Key="k", VersionId=first, BypassGovernanceRetention=True)
    assert _versions(s3) == [second]
    bypass: Any = {"BypassGovernanceRetention": True}
    assert _code(delete, Bucket=BUCKET, Key="k", VersionId=second, **bypass) == "AccessDenied"
    # nor may another protocol remove it, or clear the lock's tags behind S3
    path = f"{FOLDER}/k"
    with pytest.raises(PermissionDenied):
        gw.call(gw.ns.remove_version(SYSTEM, path, second, bypass=True))
    with pytest.raises(PermissionDenied):
        gw.call(gw.ns.set_tags(SYSTEM, path, {}, ["lock.hold"]))
    s3.put_object_legal_hold(Bucket=BUCKET, Key="k", LegalHold={"Status": "OFF"})
    s3.delete_object(Bucket=BUCKET, Key="k", VersionId=second, BypassGovernanceRetention=True)
    assert _versions(s3) == []


def test_a_compliance_retention_is_only_lengthened(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    vid = s3.put_object(Bucket=BUCKET, Key="k", Body=b"x", ObjectLockMode="COMPLIANCE",
                        ObjectLockRetainUntilDate=LATER)["VersionId"]  # fmt: skip
    retention = s3.get_object_retention(Bucket=BUCKET, Key="k", VersionId=vid)["Retention"]
    assert retention == {"Mode": "COMPLIANCE", "RetainUntilDate": LATER}
    head = s3.head_object(Bucket=BUCKET, Key="k")
    assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("COMPLIANCE", LATER)
    sooner: Any = {"Mode": "COMPLIANCE", "RetainUntilDate": LATER - datetime.timedelta(days=1)}
    put = s3.put_object_retention
    assert _code(put, Bucket=BUCKET, Key="k", Retention=sooner,
                 BypassGovernanceRetention=True) == "AccessDenied"  # fmt: skip
    governance: Any = {"Mode": "GOVERNANCE", "RetainUntilDate": LATER}
    assert _code(put, Bucket=BUCKET, Key="k", Retention=governance) == "AccessDenied"
    longer: Any = {"Mode": "COMPLIANCE", "RetainUntilDate": LATER + datetime.timedelta(days=1)}
    s3.put_object_retention(Bucket=BUCKET, Key="k", Retention=longer)
    delete = s3.delete_object
    assert _code(delete, Bucket=BUCKET, Key="k", VersionId=vid,
                 BypassGovernanceRetention=True) == "AccessDenied"  # fmt: skip
    with pytest.raises(PermissionDenied):
        gw.call(gw.ns.set_lock(SYSTEM, f"{FOLDER}/k", vid, Lock(), bypass=True))
    # a removal without a version only hides it behind a delete marker: it is kept
    s3.delete_object(Bucket=BUCKET, Key="k")
    assert _versions(s3) == [vid]


def test_a_bucket_goes_with_its_versions_never_with_locked_ones(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    vid = s3.put_object(Bucket=BUCKET, Key="a/k", Body=b"x")["VersionId"]
    s3.put_object_legal_hold(Bucket=BUCKET, Key="a/k", LegalHold={"Status": "ON"})
    marker = s3.delete_object(Bucket=BUCKET, Key="a/k")["VersionId"]
    assert _code(s3.delete_bucket, Bucket=BUCKET) == "BucketNotEmpty"  # its versions are kept
    s3.delete_object(Bucket=BUCKET, Key="a/k", VersionId=marker)
    assert s3.get_object(Bucket=BUCKET, Key="a/k")["Body"].read() == b"x"  # back
    s3.delete_object(Bucket=BUCKET, Key="a/k")
    assert _versions(s3) == [vid]  # kept, though its directory was pruned
    # a removal of the tree would take the locked version along: refused
    with pytest.raises(PermissionDenied):
        gw.call(gw.ns.remove(SYSTEM, FOLDER, recursive=True))
    s3.put_object_legal_hold(Bucket=BUCKET, Key="a/k", VersionId=vid, LegalHold={"Status": "OFF"})
    gw.call(gw.ns.remove(SYSTEM, FOLDER, recursive=True))
    store = gw.ns.version_store
    assert store is not None
    assert gw.call(store.rows(FOLDER)) == []  # no rows left behind


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


def test_a_new_objects_lock_commits_with_its_bytes(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket=BUCKET, ObjectLockEnabledForBucket=True)
    s3.create_bucket(Bucket="plain")
    # lock headers on a bucket without object lock: refused before anything is written
    asked: Any = {"ObjectLockMode": "GOVERNANCE", "ObjectLockRetainUntilDate": LATER}
    assert _code(s3.put_object, Bucket="plain", Key="k", Body=b"x", **asked) == "InvalidRequest"
    assert _code(s3.head_object, Bucket="plain", Key="k") == "404"
    # the namespace takes a lock in the write's own tags (one commit), checked as set_lock's
    path = f"{FOLDER}/n"
    until = repr(LATER.timestamp())
    lock = WriteTags({"lock.mode": "COMPLIANCE", "lock.until": until})
    entry = gw.call(gw.ns.write(SYSTEM, path, _one(b"n"), tags=lock))
    assert Lock.of(gw.call(gw.ns.get_tags(SYSTEM, path))) == Lock("COMPLIANCE", LATER.timestamp())
    with pytest.raises(PermissionDenied):
        gw.call(gw.ns.remove_version(SYSTEM, path, str(entry.version), bypass=True))
    for bad, where in (
        ({"lock.mode": "FOREVER", "lock.until": until}, path),
        ({"lock.mode": "COMPLIANCE"}, path),
        ({"lock.mode": "COMPLIANCE", "lock.until": until}, "/data/buckets/plain/n"),
    ):
        with pytest.raises(InvalidArgument):
            gw.call(gw.ns.write(SYSTEM, where, _one(b"x"), tags=WriteTags(bad)))
    with pytest.raises(PermissionDenied):  # users still never set a lock's tags directly
        gw.call(gw.ns.set_tags(SYSTEM, path, {"lock.hold": "ON"}))
    # lock headers on CreateMultipartUpload are kept with the upload, applied on Complete
    upload = s3.create_multipart_upload(Bucket=BUCKET, Key="m", ObjectLockLegalHoldStatus="ON",
                                        **asked)["UploadId"]  # fmt: skip
    etag = s3.upload_part(Bucket=BUCKET, Key="m", UploadId=upload, PartNumber=1,
                          Body=b"part")["ETag"]  # fmt: skip
    parts: Any = {"Parts": [{"PartNumber": 1, "ETag": etag}]}
    s3.complete_multipart_upload(Bucket=BUCKET, Key="m", UploadId=upload, MultipartUpload=parts)
    head = s3.head_object(Bucket=BUCKET, Key="m")
    assert (head["ObjectLockMode"], head["ObjectLockRetainUntilDate"]) == ("GOVERNANCE", LATER)
    assert head["ObjectLockLegalHoldStatus"] == "ON"
    assert _code(s3.create_multipart_upload, Bucket="plain", Key="m", **asked) == ("InvalidRequest")
