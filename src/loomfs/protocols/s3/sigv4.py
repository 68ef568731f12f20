"""AWS Signature Version 4 as S3 checks it (protocol layer): headers, presigned URLs, chunks.

Pure functions over what the request carries; the secret comes from the user registry via
a lookup the caller passes in. The canonical request is rebuilt from the decoded path and
query, encoded the way AWS's S3 signer encodes them (each byte outside the unreserved set
as %XX, '/' kept in the path), so a client and this server agree byte for byte.
Signatures are compared in constant time.
"""

from __future__ import annotations

import calendar
import datetime
import functools
import hashlib
import hmac
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import quote

from .errors import S3Error

ALGORITHM = "AWS4-HMAC-SHA256"
UNSIGNED = "UNSIGNED-PAYLOAD"
STREAMING = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
STREAMING_UNSIGNED_TRAILER = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
MAX_SKEW_S = 15 * 60
MAX_PRESIGN_S = 7 * 24 * 3600
MAX_CHUNK_HEADER = 4096

CREDENTIAL = re.compile(r"^([^/]+)/(\d{8})/([^/]+)/([^/]+)/aws4_request$")
_HEX64 = re.compile(r"^[0-9a-f]{64}$")

SecretLookup = Callable[[str], Awaitable[str | None]]


@dataclass(frozen=True, slots=True)
class Verified:
    """A request whose signature checked out."""

    access_key: str
    payload: str  # the x-amz-content-sha256 the signature covers (hex, UNSIGNED, STREAMING)
    amz_date: str
    scope: str
    signature: str  # seed of a streaming upload's chunk chain
    signing_key: bytes


def _uri(value: str, *, keep_slash: bool) -> str:
    return quote(value, safe="/~" if keep_slash else "~")


def canonical_query(query: Mapping[str, str] | list[tuple[str, str]]) -> str:
    items = query.items() if isinstance(query, Mapping) else query
    pairs = sorted(
        (_uri(k, keep_slash=False), _uri(v, keep_slash=False))
        for k, v in items
        if k != "X-Amz-Signature"
    )
    return "&".join(f"{k}={v}" for k, v in pairs)


def _header_value(value: str) -> str:
    return " ".join(value.split())


@functools.lru_cache(maxsize=1024)
def signing_key(secret: str, date: str, region: str, service: str) -> bytes:
    # the same for every request of a key on one day: four HMACs saved per request, and a
    # removed key still fails, since its secret is looked up before this is asked
    key = f"AWS4{secret}".encode()
    for part in (date, region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    return key


def _sign(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()


def string_to_sign(amz_date: str, scope: str, canonical_request: str) -> str:
    digest = hashlib.sha256(canonical_request.encode()).hexdigest()
    return f"{ALGORITHM}\n{amz_date}\n{scope}\n{digest}"


def canonical_request(
    method: str,
    path: str,
    query: list[tuple[str, str]],
    headers: Mapping[str, str],
    signed: list[str],
    payload: str,
) -> str:
    lines = [f"{name}:{_header_value(headers.get(name, ''))}\n" for name in signed]
    return "\n".join(
        [
            method,
            _uri(path, keep_slash=True),
            canonical_query(query),
            "".join(lines),
            ";".join(signed),
            payload,
        ]
    )


_AMZ_DATE = re.compile(r"^(\d{4})(\d{2})(\d{2})T(\d{2})(\d{2})(\d{2})Z$")


def parse_amz_date(value: str) -> float:
    # by hand: time.strptime was a visible share of a small GET's cost (profiled)
    match = _AMZ_DATE.match(value)
    try:
        if match is None:
            raise ValueError(value)
        year, month, day, hour, minute, second = map(int, match.groups())
        datetime.datetime(year, month, day, hour, minute, second)  # refuses 20260231
    except ValueError:
        raise S3Error("AccessDenied", f"invalid X-Amz-Date {value!r}") from None
    return calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))


def _request_time(headers: Mapping[str, str]) -> tuple[str, float]:
    """The signed time (ISO basic form, as in the string to sign) and its epoch seconds:
    X-Amz-Date, or else the Date header (which SDKs sign instead when it is present)."""
    amz_date = headers.get("x-amz-date")
    if amz_date:
        return amz_date, parse_amz_date(amz_date)
    try:
        when = parsedate_to_datetime(headers.get("date") or "").timestamp()
    except (TypeError, ValueError):
        raise S3Error(
            "AccessDenied", "a signed request needs an X-Amz-Date or Date header"
        ) from None
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when)), when


def _parse_authorization(header: str) -> tuple[str, list[str], str]:
    algorithm, _, rest = header.partition(" ")
    if algorithm != ALGORITHM:
        raise S3Error(
            "InvalidArgument" if algorithm.startswith("AWS4") else "AccessDenied",
            f"unsupported authorization type {algorithm!r}; use {ALGORITHM}",
        )
    fields: dict[str, str] = {}
    for part in rest.split(","):
        name, sep, value = part.strip().partition("=")
        if not sep:
            raise S3Error("AuthorizationHeaderMalformed", f"malformed part {part.strip()!r}")
        fields[name] = value
    try:
        return fields["Credential"], fields["SignedHeaders"].split(";"), fields["Signature"]
    except KeyError as exc:
        raise S3Error("AuthorizationHeaderMalformed", f"missing {exc.args[0]}") from None


class Verifier:
    """Checks request signatures for one region."""

    def __init__(self, region: str, clock: Callable[[], float] = time.time) -> None:
        self.region = region
        self.clock = clock

    async def verify(
        self,
        method: str,
        path: str,
        query: list[tuple[str, str]],
        headers: Mapping[str, str],
        lookup: SecretLookup,
    ) -> Verified:
        """Raise ``S3Error`` unless the request is signed by a known key, in time;
        ``lookup`` finds an access key's secret. ``headers`` have lower-case names."""
        q = dict(query)
        auth = headers.get("authorization")
        if auth is not None:
            credential, signed, signature = _parse_authorization(auth)
            payload = headers.get("x-amz-content-sha256")
            if payload is None:
                raise S3Error("InvalidRequest", "missing required header x-amz-content-sha256")
            amz_date, when = _request_time(headers)
            if abs(self.clock() - when) > MAX_SKEW_S:
                raise S3Error(
                    "RequestTimeTooSkewed",
                    "the difference between the request time and the server's time is too large",
                )
        elif "X-Amz-Signature" in q:
            if q.get("X-Amz-Algorithm") != ALGORITHM:
                raise S3Error(
                    "AuthorizationQueryParametersError", f"X-Amz-Algorithm must be {ALGORITHM}"
                )
            try:
                credential = q["X-Amz-Credential"]
                signed = q["X-Amz-SignedHeaders"].split(";")
                signature = q["X-Amz-Signature"]
                amz_date = q["X-Amz-Date"]
                expires = int(q["X-Amz-Expires"])
            except (KeyError, ValueError) as exc:
                raise S3Error(
                    "AuthorizationQueryParametersError", f"bad or missing query parameter {exc}"
                ) from None
            if not 0 < expires <= MAX_PRESIGN_S:
                raise S3Error(
                    "AccessDenied", f"X-Amz-Expires must be between 1 and {MAX_PRESIGN_S} seconds"
                )
            when = parse_amz_date(amz_date)
            now = self.clock()
            if now > when + expires:
                raise S3Error("AccessDenied", "Request has expired")
            if when - now > MAX_SKEW_S:
                raise S3Error("AccessDenied", "Request is not valid yet (X-Amz-Date in the future)")
            payload = q.get("X-Amz-Content-Sha256", UNSIGNED)
        else:
            raise S3Error("AccessDenied", "anonymous access is not allowed; sign the request")

        match = CREDENTIAL.match(credential)
        if match is None:
            raise S3Error("AuthorizationHeaderMalformed", "malformed Credential")
        access_key, date, region, service = match.groups()
        if service != "s3":
            raise S3Error("AuthorizationHeaderMalformed", f"the service must be s3, not {service}")
        if region != self.region:
            raise S3Error(
                "AuthorizationHeaderMalformed",
                f"the region {region!r} is wrong; expecting {self.region!r}",
            )
        if date != amz_date[:8]:
            raise S3Error("AuthorizationHeaderMalformed", "the credential date is not X-Amz-Date's")
        if "host" not in signed:
            raise S3Error("AccessDenied", "the host header must be signed")
        if payload not in (UNSIGNED, STREAMING, STREAMING_UNSIGNED_TRAILER) and not _HEX64.match(
            payload
        ):
            raise S3Error("InvalidArgument", "x-amz-content-sha256 is not a SHA-256 or known mode")
        secret = await lookup(access_key)
        if secret is None:
            raise S3Error("InvalidAccessKeyId", "the access key id does not exist in our records")
        scope = f"{date}/{region}/{service}/aws4_request"
        key = signing_key(secret, date, region, service)
        request = canonical_request(method, path, query, headers, signed, payload)
        expected = _sign(key, string_to_sign(amz_date, scope, request))
        if not hmac.compare_digest(expected, signature):
            raise S3Error(
                "SignatureDoesNotMatch",
                "the request signature we calculated does not match the signature you provided",
            )
        return Verified(access_key, payload, amz_date, scope, signature, key)


class PayloadChecker:
    """Wraps a body stream and raises at its end if it is not what the signature covers,
    before the consumer (a namespace write) can commit it."""

    def __init__(self, verified: Verified, expected_length: int | None) -> None:
        self.verified = verified
        self.expected_length = expected_length
        self.trailers: dict[str, str] = {}  # of an aws-chunked body, once it has ended

    async def plain(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        digest = hashlib.sha256() if _HEX64.match(self.verified.payload) else None
        async for chunk in body:
            if digest is not None:
                digest.update(chunk)
            yield chunk
        if digest is not None and digest.hexdigest() != self.verified.payload:
            raise S3Error(
                "XAmzContentSHA256Mismatch",
                "the provided x-amz-content-sha256 does not match what was computed",
            )

    async def chunked(self, body: ChunkReader) -> AsyncIterator[bytes]:
        """Decode ``aws-chunked`` framing; with the signed mode, check every chunk's
        signature against the chain seeded by the request's signature."""
        signed = self.verified.payload == STREAMING
        previous = self.verified.signature
        total = 0
        while True:
            header = await body.readline()
            size_text, _, ext = header.strip().partition(b";")
            try:
                size = int(size_text, 16)
            except ValueError:
                raise S3Error("IncompleteBody", "malformed aws-chunked chunk header") from None
            digest = hashlib.sha256()
            remaining = size
            while remaining:
                data = await body.read(min(remaining, 1 << 20))
                if not data:
                    raise S3Error("IncompleteBody", "the body ended inside a chunk")
                remaining -= len(data)
                digest.update(data)
                # passed on before its signature is checked: the consumer is an atomic
                # write that this generator's exception aborts, so nothing unverified lands
                yield data
            if signed:
                name, _, claimed = ext.decode("latin-1").partition("=")
                text = "\n".join(
                    [
                        "AWS4-HMAC-SHA256-PAYLOAD",
                        self.verified.amz_date,
                        self.verified.scope,
                        previous,
                        EMPTY_SHA256,
                        digest.hexdigest(),
                    ]
                )
                expected = _sign(self.verified.signing_key, text)
                if name.strip() != "chunk-signature" or not hmac.compare_digest(
                    expected, claimed.strip()
                ):
                    raise S3Error("SignatureDoesNotMatch", "a chunk signature does not match")
                previous = expected
            if size == 0:
                break
            if await body.readline() != b"\r\n":
                raise S3Error("IncompleteBody", "a chunk does not end with CRLF")
            total += size
        # trailers (checksums of the unsigned-trailer mode) end with an empty line
        while (line := await body.readline()) not in (b"\r\n", b""):
            name, sep, value = line.decode("latin-1").partition(":")
            if len(line) > MAX_CHUNK_HEADER or not sep:
                raise S3Error("IncompleteBody", "malformed trailer")
            self.trailers[name.strip().lower()] = value.strip()
        if self.expected_length is not None and total != self.expected_length:
            raise S3Error(
                "IncompleteBody",
                f"x-amz-decoded-content-length says {self.expected_length}, got {total}",
            )


class ChunkReader:
    """What ``PayloadChecker.chunked`` needs of a body: lines and counted reads."""

    def __init__(
        self, readline: Callable[[], Awaitable[bytes]], read: Callable[[int], Awaitable[bytes]]
    ) -> None:
        self._readline = readline
        self.read = read

    async def readline(self) -> bytes:
        line = await self._readline()
        if len(line) > MAX_CHUNK_HEADER:
            raise S3Error("IncompleteBody", "an aws-chunked header line is too long")
        return line
