"""S3 lifecycle configurations over boto3: kept and given back as sent, refused as S3
refuses them, and applied by the hub's expiry task (run here at chosen times, not waited
for): current objects, old versions, lone delete markers and stale multipart uploads."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from email.utils import parsedate_to_datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from loomfs.hub.lifecycle import Expirer
from loomfs.namespace import lifecycle
from test_s3_gateway import Gateway, governed_gateway
from test_s3_gateway import error_code as _code

if TYPE_CHECKING:
    from mypy_boto3_s3 import S3Client

DAY = lifecycle.DAY_S


@pytest.fixture
def gw(tmp_path: Path) -> Iterator[Gateway]:
    gateway = governed_gateway(tmp_path)
    yield gateway
    gateway.stop()


def _keys(s3: S3Client, bucket: str) -> set[str]:
    return {o["Key"] for o in s3.list_objects_v2(Bucket=bucket).get("Contents", [])}


def _uploads(s3: S3Client, bucket: str) -> set[str]:
    return {u["Key"] for u in s3.list_multipart_uploads(Bucket=bucket).get("Uploads", [])}


def _expire(gw: Gateway, at: float) -> int:
    expirer = Expirer(gw.gateway.ns, gw.catalog)
    expirer.hooks.append(gw.gateway.expire_uploads)
    return gw.call(expirer.run_once(at))


RULES: list[Any] = [
    {"ID": "one", "Expiration": {"Days": 1}, "Prefix": "expire1/", "Status": "Enabled"},
    {"ID": "off", "Expiration": {"Days": 1}, "Prefix": "keep/", "Status": "Disabled"},
    {
        "ID": "tagged",
        "Expiration": {"Days": 1},
        "Filter": {"And": {"Prefix": "tagged/", "Tags": [{"Key": "k", "Value": "v"}]}},
        "Status": "Enabled",
    },
    {
        "ID": "uploads",
        "Filter": {"Prefix": "mp/"},
        "Status": "Enabled",
        "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 2},
    },
]


def test_a_lifecycle_is_kept_as_sent_and_refused_as_s3_refuses(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket="lcb")
    assert _code(s3.get_bucket_lifecycle_configuration, Bucket="lcb") == (
        "NoSuchLifecycleConfiguration"
    )
    s3.put_bucket_lifecycle_configuration(Bucket="lcb", LifecycleConfiguration={"Rules": RULES})
    assert s3.get_bucket_lifecycle_configuration(Bucket="lcb")["Rules"] == RULES
    bad: list[tuple[Any, str]] = [
        ({**RULES[0], "Status": "enabled"}, "MalformedXML"),
        ({**RULES[0], "ID": "a" * 256}, "InvalidArgument"),
        ({**RULES[0], "Transitions": [{"Days": 1, "StorageClass": "GLACIER"}]},
         "InvalidStorageClass"),
    ]  # fmt: skip
    for rule, code in bad:
        config: Any = {"Rules": [rule]}
        put = s3.put_bucket_lifecycle_configuration
        assert _code(put, Bucket="lcb", LifecycleConfiguration=config) == code
    same: Any = {"Rules": [RULES[0], {**RULES[2], "ID": "one"}]}
    put = s3.put_bucket_lifecycle_configuration
    assert _code(put, Bucket="lcb", LifecycleConfiguration=same) == "InvalidArgument"
    assert s3.get_bucket_lifecycle_configuration(Bucket="lcb")["Rules"] == RULES  # unchanged
    no_id: Any = {"Rules": [{"Prefix": "", "Status": "Enabled", "Expiration": {"Days": 3}}]}
    s3.put_bucket_lifecycle_configuration(Bucket="lcb", LifecycleConfiguration=no_id)
    (given,) = s3.get_bucket_lifecycle_configuration(Bucket="lcb")["Rules"]
    assert given["ID"] and given["Expiration"] == {"Days": 3}
    assert s3.delete_bucket_lifecycle(Bucket="lcb")["ResponseMetadata"]["HTTPStatusCode"] == 204
    assert _code(s3.get_bucket_lifecycle_configuration, Bucket="lcb") == (
        "NoSuchLifecycleConfiguration"
    )


def test_the_hub_expires_objects_and_uploads_by_the_rules(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket="lcb")
    for key in ("expire1/a", "expire1/b/c", "keep/a", "tagged/x", "tagged/y", "other/z"):
        s3.put_object(Bucket="lcb", Key=key, Body=b"x")
    s3.put_object_tagging(
        Bucket="lcb", Key="tagged/x", Tagging={"TagSet": [{"Key": "k", "Value": "v"}]}
    )
    for key in ("mp/u", "other/u"):
        s3.create_multipart_upload(Bucket="lcb", Key=key)
    s3.put_bucket_lifecycle_configuration(Bucket="lcb", LifecycleConfiguration={"Rules": RULES})
    # PUT, GET and HEAD say when the first enabled rule that picks the object expires it
    put = s3.put_object(Bucket="lcb", Key="expire1/a", Body=b"x")
    got = s3.get_object(Bucket="lcb", Key="expire1/a")
    tagged = s3.head_object(Bucket="lcb", Key="tagged/x")
    answers: list[tuple[Any, datetime, str]] = [
        (put, got["LastModified"], "one"),
        (got, got["LastModified"], "one"),
        (tagged, tagged["LastModified"], "tagged"),
    ]
    for response, modified, rule in answers:
        header = response["ResponseMetadata"]["HTTPHeaders"]["x-amz-expiration"]
        assert header.endswith(f'rule-id="{rule}"')
        # S3's way: the midnight (UTC) after the mtime plus the rule's day
        when = parsedate_to_datetime(header.split('"')[1])
        assert (when.hour, when.minute, when.second) == (0, 0, 0)
        assert timedelta(0) <= when - (modified + timedelta(days=1)) <= timedelta(days=1)
    for key in ("keep/a", "tagged/y", "other/z"):
        assert (
            "x-amz-expiration"
            not in s3.head_object(Bucket="lcb", Key=key)["ResponseMetadata"]["HTTPHeaders"]
        )
    now = time.time()
    everything = {"expire1/a", "expire1/b/c", "keep/a", "tagged/x", "tagged/y", "other/z"}
    assert _expire(gw, now + DAY / 2) == 0
    assert _keys(s3, "lcb") == everything
    assert _expire(gw, now + 1.5 * DAY) == 3
    assert _keys(s3, "lcb") == {"keep/a", "tagged/y", "other/z"}
    assert _uploads(s3, "lcb") == {"mp/u", "other/u"}
    _expire(gw, now + 2.5 * DAY)
    assert _uploads(s3, "lcb") == {"other/u"}
    # the expiry left no empty directory behind: the bucket empties and goes as S3's does
    for key in _keys(s3, "lcb"):
        s3.delete_object(Bucket="lcb", Key=key)
    s3.abort_multipart_upload(
        Bucket="lcb",
        Key="other/u",
        UploadId=s3.list_multipart_uploads(Bucket="lcb")["Uploads"][0]["UploadId"],
    )
    s3.delete_bucket(Bucket="lcb")


def test_the_hub_expires_old_versions_and_lone_delete_markers(gw: Gateway) -> None:
    s3 = gw.client()
    s3.create_bucket(Bucket="vlb")
    s3.put_bucket_versioning(Bucket="vlb", VersioningConfiguration={"Status": "Enabled"})
    for body in (b"1", b"2", b"3"):
        s3.put_object(Bucket="vlb", Key="nc/a", Body=body)
        s3.put_object(Bucket="vlb", Key="cur/a", Body=body)
    s3.put_object(Bucket="vlb", Key="nc/gone", Body=b"g")
    s3.delete_object(Bucket="vlb", Key="nc/gone")
    rules: Any = [
        {"ID": "nc", "Prefix": "nc/", "Status": "Enabled",
         "NoncurrentVersionExpiration": {"NoncurrentDays": 1},
         "Expiration": {"ExpiredObjectDeleteMarker": True}},
        {"ID": "cur", "Prefix": "cur/", "Status": "Enabled", "Expiration": {"Days": 1}},
    ]  # fmt: skip
    s3.put_bucket_lifecycle_configuration(Bucket="vlb", LifecycleConfiguration={"Rules": rules})
    now = time.time()
    assert _expire(gw, now + DAY / 2) == 0
    _expire(gw, now + 1.5 * DAY)
    listed = s3.list_object_versions(Bucket="vlb")
    versions = sorted((v["Key"], v["IsLatest"]) for v in listed.get("Versions", []))
    markers = sorted((m["Key"], m["IsLatest"]) for m in listed.get("DeleteMarkers", []))
    # nc/a keeps only its current version, nc/gone (a marker over an old version) is gone
    # whole; cur/a expired as a removal in a versioned bucket: a marker over its versions
    assert versions == [("cur/a", False)] * 3 + [("nc/a", True)]
    assert markers == [("cur/a", True)]
    assert s3.get_object(Bucket="vlb", Key="nc/a")["Body"].read() == b"3"
