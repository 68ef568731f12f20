"""POST Object, the browser form upload (protocol layer): the form, its signature, its policy.

A form posted to a bucket's URL (multipart/form-data) carries the key, the fields that
become the object's headers (Content-Type, x-amz-meta-*, acl, tagging), a policy document
saying what the form may hold (base64 JSON: an expiration and conditions), the policy's
signature (SigV4: x-amz-signature, the day's signing key over the policy; V2: signature,
HMAC-SHA1 of it) and, last, the file. Here the fields are read (bounded in size), the
signature is verified and every condition checked, as S3 does: each field but the
signature's own, the file, an additional checksum of the file (x-amz-checksum-*, checked
as a PUT's) and x-ignore-* must be named by a condition, the bucket too.
The file's bytes then go into the object by the gateway's own write, as the signer, so
the namespace decides whether that user may write there, as for a PUT. A form with no
policy is unsigned: the anonymous caller's, where the gateway allows those.
"""

from __future__ import annotations

import base64
import binascii
import calendar
import hashlib
import hmac
import json
import re
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import BodyPartReader, web

from . import sigv4
from .errors import S3Error

MAX_FIELDS = 64 << 10  # bytes of all fields but the file together
SIGNATURE_FIELDS = frozenset(
    {
        "policy",
        "signature",
        "awsaccesskeyid",
        "x-amz-signature",
        "x-amz-algorithm",
        "x-amz-credential",
        "x-amz-date",
        "x-amz-security-token",
        "file",
    }
)
_EXPIRATION = re.compile(r"^(\d{4})-(\d{2})-(\d{2})T(\d{2}):(\d{2}):(\d{2})(\.\d+)?Z$")


@dataclass(slots=True)
class Form:
    fields: dict[str, str]  # by lower-case name, the file's excluded
    filename: str | None
    file: BodyPartReader

    @property
    def key(self) -> str:
        """The object key, '${filename}' replaced by the uploaded file's name."""
        key = self.fields.get("key")
        if not key:
            raise S3Error("InvalidArgument", "a POST form must contain a field named 'key'")
        return key.replace("${filename}", self.filename or "")

    async def chunks(self) -> AsyncIterator[bytes]:
        while chunk := await self.file.read_chunk(1 << 20):
            yield chunk


async def read_form(request: web.Request) -> Form:
    """The form's fields up to its file, whose bytes are left to stream."""
    try:
        reader = await request.multipart()
    except (ValueError, AssertionError) as exc:
        raise S3Error("MalformedPOSTRequest", "the body is not multipart/form-data") from exc
    fields: dict[str, str] = {}
    size = 0
    while True:
        part = await reader.next()
        if part is None:
            raise S3Error("InvalidArgument", "a POST form must contain one file field, last")
        if not isinstance(part, BodyPartReader):
            raise S3Error("MalformedPOSTRequest", "a POST form's parts may not be nested")
        name = (part.name or "").lower()
        if name == "file":
            return Form(fields, part.filename, part)
        value = bytearray()
        while chunk := await part.read_chunk(4096):
            size += len(chunk)
            if size > MAX_FIELDS:
                raise S3Error(
                    "MalformedPOSTRequest", f"the form's fields exceed {MAX_FIELDS} bytes"
                )
            value += chunk
        try:
            fields[name] = value.decode()
        except UnicodeDecodeError:
            raise S3Error("MalformedPOSTRequest", f"the field {name} is not UTF-8") from None


SecretLookup = Callable[[str], Awaitable[str | None]]


async def signer(form: Form, lookup: SecretLookup, region: str) -> str | None:
    """The access key that signed the form's policy (None for a form without a policy);
    S3's error if the signature is missing or wrong."""
    f = form.fields
    policy = f.get("policy")
    if policy is None:
        if f.keys() & {"signature", "x-amz-signature"}:
            raise S3Error("InvalidArgument", "a signed POST form must carry its policy")
        return None
    if "x-amz-signature" in f:
        if f.get("x-amz-algorithm") != sigv4.ALGORITHM:
            raise S3Error("InvalidArgument", f"x-amz-algorithm must be {sigv4.ALGORITHM}")
        found = sigv4.CREDENTIAL.match(f.get("x-amz-credential", ""))
        if found is None:
            raise S3Error(
                "InvalidArgument", "x-amz-credential must be KEY/DATE/REGION/s3/aws4_request"
            )
        access_key, day, scope_region, service = found.groups()
        if scope_region != region or service != "s3":
            raise S3Error("InvalidArgument", f"the credential's scope must be {region}/s3")
        secret = await _secret(lookup, access_key)
        expected = hmac.new(
            sigv4.signing_key(secret, day, region, service), policy.encode(), hashlib.sha256
        ).hexdigest()
        given = f["x-amz-signature"]
    elif "signature" in f:
        access_key = f.get("awsaccesskeyid", "")
        secret = await _secret(lookup, access_key)
        digest = hmac.new(secret.encode(), policy.encode(), hashlib.sha1).digest()
        expected, given = base64.b64encode(digest).decode(), f["signature"]
    else:
        raise S3Error("InvalidArgument", "a POST form with a policy must carry its signature")
    if not hmac.compare_digest(expected, given):
        raise S3Error(
            "SignatureDoesNotMatch",
            "the request signature we calculated does not match the signature you provided",
        )
    return access_key


async def _secret(lookup: SecretLookup, access_key: str) -> str:
    secret = await lookup(access_key) if access_key else None
    if secret is None:
        raise S3Error("InvalidAccessKeyId", "the access key id does not exist in our records")
    return secret


def _invalid(reason: str) -> S3Error:
    return S3Error("InvalidPolicyDocument", f"invalid policy document: {reason}")


def _denied(reason: str) -> S3Error:
    return S3Error("AccessDenied", f"invalid according to policy: {reason}")


@dataclass(frozen=True, slots=True)
class Policy:
    """A POST policy: until when it holds, what each field must be, the size range."""

    expiration: float
    # (operator, lower-case field name, value): 'eq' or 'starts-with'
    conditions: tuple[tuple[str, str, str], ...]
    length: tuple[int, int] | None

    @classmethod
    def parse(cls, encoded: str) -> Policy:
        try:
            document = json.loads(base64.b64decode(encoded, validate=True))
        except (binascii.Error, ValueError):
            raise _invalid("not base64-encoded JSON") from None
        if not isinstance(document, dict):
            raise _invalid("not a JSON object")
        expiration, listed = document.get("expiration"), document.get("conditions")
        found = _EXPIRATION.match(expiration) if isinstance(expiration, str) else None
        if found is None:
            raise _invalid("expiration must be a time such as 2026-12-01T12:00:00.000Z")
        if not isinstance(listed, list):
            raise _invalid("conditions must be a list")
        fields = tuple(int(n) for n in found.groups()[:6])
        conditions: list[tuple[str, str, str]] = []
        length = None
        for condition in listed:
            if isinstance(condition, dict):
                if not condition:
                    raise _invalid("a condition may not be empty")
                conditions += [("eq", str(k).lower(), _text(v)) for k, v in condition.items()]
                continue
            if not isinstance(condition, list) or not condition:
                raise _invalid(f"a condition must be an object or a list: {condition!r}")
            operator = str(condition[0]).lower()
            if operator == "content-length-range":
                length = _length_range(condition)
            elif operator in ("eq", "starts-with") and len(condition) == 3:
                name = str(condition[1])
                if not name.startswith("$"):
                    raise _invalid(f"a field is named with '$': {name}")
                conditions.append((operator, name[1:].lower(), _text(condition[2])))
            else:
                raise _invalid(f"unknown condition {condition!r}")
        return cls(float(calendar.timegm((*fields, 0, 0, 0))), tuple(conditions), length)

    def check(self, fields: dict[str, str], now: float) -> None:
        """AccessDenied unless the policy holds now for ``fields`` (lower-case names, the
        bucket's and the final key included)."""
        if now > self.expiration:
            raise _denied("policy expired")
        for operator, name, value in self.conditions:
            actual = fields.get(name, "")
            if operator == "eq" and actual != value:
                raise _denied(f"policy condition failed: ['eq', '${name}', {value!r}]")
            if operator == "starts-with" and not actual.startswith(value):
                raise _denied(f"policy condition failed: ['starts-with', '${name}', {value!r}]")
        named = {name for _, name, _ in self.conditions}
        for name in fields:
            if (
                name not in named
                and name not in SIGNATURE_FIELDS
                and not name.startswith(("x-ignore-", "x-amz-checksum-"))
            ):
                raise _denied(f"extra input fields: {name}")

    async def sized(self, data: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """``data``, refused (before the write commits) outside the content-length-range."""
        low, high = self.length or (0, None)
        size = 0
        async for chunk in data:
            size += len(chunk)
            if high is not None and size > high:
                raise S3Error(
                    "EntityTooLarge", "your proposed upload exceeds the maximum allowed size"
                )
            yield chunk
        if size < low:
            raise S3Error(
                "EntityTooSmall", "your proposed upload is smaller than the minimum allowed size"
            )


def _text(value: Any) -> str:
    if not isinstance(value, str):
        raise _invalid(f"a condition's value must be a string: {value!r}")
    return value


def _length_range(condition: list[Any]) -> tuple[int, int]:
    if len(condition) != 3 or not all(isinstance(v, int) for v in condition[1:]):
        raise _invalid("content-length-range needs a minimum and a maximum")
    low, high = condition[1], condition[2]
    if low < 0 or high < low:
        raise _invalid("content-length-range must be 0 <= minimum <= maximum")
    return low, high
