"""AWS Signature Version 2 as S3 checks it (protocol layer): header and query forms.

V2 is deprecated but still spoken: S3 accepts it on older buckets, and boto3 and botocore
presign with it by default for an endpoint URL that is not AWS's own. The string to sign
(https://docs.aws.amazon.com/AmazonS3/latest/userguide/RESTAuthentication.html) is the
method, Content-MD5, Content-Type, the date (empty when x-amz-date is given, the expiry
time for a presigned URL), the x-amz-* headers and the resource: the request path as
sent, with the subresources S3 lists. HMAC-SHA1, compared in constant time. V2 signs no
payload: the body is covered only by a Content-MD5 the client chose to send.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
from collections.abc import Mapping
from email.utils import parsedate_to_datetime
from urllib.parse import unquote

from .errors import S3Error
from .sigv4 import MAX_PRESIGN_S, MAX_SKEW_S, UNSIGNED, SecretLookup, Verified

# the query parameters that are part of the signed resource (as botocore's HmacV1Auth)
SUBRESOURCES = frozenset(
    {
        "accelerate", "acl", "analytics", "cors", "defaultObjectAcl", "delete", "inventory",
        "lifecycle", "location", "logging", "metrics", "notification", "object-lock",
        "partNumber", "policy", "replication", "requestPayment", "response-cache-control",
        "response-content-disposition", "response-content-encoding",
        "response-content-language", "response-content-type", "response-expires", "restore",
        "select", "select-type", "storageClass", "tagging", "torrent", "uploadId", "uploads",
        "versionId", "versioning", "versions", "website",
    }
)  # fmt: skip


def is_v2(headers: Mapping[str, str], query: Mapping[str, str]) -> bool:
    """Whether a request is signed with V2 (``headers`` with lower-case names)."""
    auth = headers.get("authorization")
    if auth is not None:
        return auth.startswith("AWS ")
    return "AWSAccessKeyId" in query and "Signature" in query


def string_to_sign(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    date: str,
    amz: Mapping[str, str],
) -> str:
    """``raw_path`` and ``raw_query`` as they came on the request line; ``amz`` the
    x-amz-* values (lower-case names)."""
    lines = [method, headers.get("content-md5", ""), headers.get("content-type", ""), date]
    lines += [f"{name}:{amz[name]}" for name in sorted(amz)]
    pairs = []
    for part in raw_query.split("&"):
        name, sep, value = part.partition("=")
        if name in SUBRESOURCES:
            pairs.append(f"{name}={unquote(value)}" if sep else name)
    if raw_path.count("/") == 1 and raw_path != "/":
        raw_path += "/"  # a bucket's own resource is '/bucket/', also path-style ('/bucket')
    resource = raw_path + ("?" + "&".join(sorted(pairs)) if pairs else "")
    return "\n".join([*lines, resource])


def _amz_headers(headers: Mapping[str, str], extra: Mapping[str, str]) -> dict[str, str]:
    amz = {k: " ".join(v.split()) for k, v in headers.items() if k.startswith("x-amz-")}
    amz.update({k.lower(): v for k, v in extra.items() if k.lower().startswith("x-amz-")})
    return amz


def _signed_time(headers: Mapping[str, str]) -> float:
    # x-amz-date, when given at all, is the request's time, even empty (then refused)
    value = headers["x-amz-date"] if "x-amz-date" in headers else headers.get("date")
    try:
        when = parsedate_to_datetime(value or "")
    except (TypeError, ValueError):
        raise S3Error(
            "AccessDenied", "a V2 signed request needs a valid Date or x-amz-date"
        ) from None
    if when.year < 1970:
        raise S3Error("AccessDenied", "the request date is before the epoch")
    return when.timestamp()


async def verify(
    method: str,
    raw_path: str,
    raw_query: str,
    headers: Mapping[str, str],
    lookup: SecretLookup,
    now: float,
) -> Verified:
    """Raise ``S3Error`` unless the V2 signature is right and in time."""
    query = dict(
        (unquote(name), unquote(value))
        for name, _, value in (p.partition("=") for p in raw_query.split("&") if p)
    )
    auth = headers.get("authorization")
    if auth is not None:
        access_key, sep, signature = auth.removeprefix("AWS ").rpartition(":")
        if not sep or not access_key or not signature:
            raise S3Error("InvalidArgument", "the Authorization header must be AWS KEY:SIGNATURE")
        when = _signed_time(headers)
        if abs(now - when) > MAX_SKEW_S:
            raise S3Error(
                "RequestTimeTooSkewed",
                "the difference between the request time and the server's time is too large",
            )
        date = "" if "x-amz-date" in headers else headers.get("date", "")
        amz = _amz_headers(headers, {})
    else:
        access_key, signature, date = query["AWSAccessKeyId"], query["Signature"], ""
        try:
            expires = int(query.get("Expires", ""))
        except ValueError:
            raise S3Error("AccessDenied", "a V2 presigned URL needs an integer Expires") from None
        if now > expires:
            raise S3Error("AccessDenied", "Request has expired")
        if expires - now > MAX_PRESIGN_S:
            raise S3Error("AccessDenied", f"Expires is more than {MAX_PRESIGN_S} s away")
        date = str(expires)
        amz = _amz_headers(headers, query)
    secret = await lookup(access_key)
    if secret is None:
        raise S3Error("InvalidAccessKeyId", "the access key id does not exist in our records")
    text = string_to_sign(method, raw_path, raw_query, headers, date, amz)
    digest = hmac.new(secret.encode(), text.encode(), hashlib.sha1).digest()
    if not hmac.compare_digest(base64.b64encode(digest).decode(), signature):
        raise S3Error(
            "SignatureDoesNotMatch",
            "the request signature we calculated does not match the signature you provided",
        )
    return Verified(access_key, UNSIGNED, date, "", signature, b"")
