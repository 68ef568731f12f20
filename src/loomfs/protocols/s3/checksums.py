"""S3's additional checksums of a request body (protocol layer).

SDKs send one by default with every upload (botocore since 1.36: x-amz-checksum-crc32), and
S3 refuses the upload with BadDigest when the body it received does not match: a body cut
short behind a Content-Length that says less, a proxy that changed bytes. The gateway
checks CRC32, SHA-1 and SHA-256, which the standard library computes at memory speed;
CRC32C and CRC64NVME have no such implementation here and are accepted unchecked (a pure
Python CRC would cost more than the transfer).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

from .errors import S3Error

PREFIX = "x-amz-checksum-"
UNCHECKED = frozenset({"crc32c", "crc64nvme"})
NOT_DIGESTS = frozenset({"type", "algorithm", "mode"})  # x-amz-checksum-* that name, not carry


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


class _Crc32:
    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes, /) -> None:
        self.value = zlib.crc32(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(4, "big")


def _hash(algorithm: str) -> _Hash | None:
    if algorithm == "crc32":
        return _Crc32()
    if algorithm in ("sha1", "sha256"):
        return hashlib.new(algorithm)
    return None


def expected(headers: Mapping[str, str]) -> tuple[str, bytes] | None:
    """The checksum an upload's headers (lower-case names) declare: (algorithm, digest),
    or None when there is none this gateway can check. A malformed value is refused."""
    for name, value in headers.items():
        if not name.startswith(PREFIX) or name[len(PREFIX) :] in NOT_DIGESTS:
            continue
        algorithm = name[len(PREFIX) :]
        if algorithm in UNCHECKED:
            return None
        probe = _hash(algorithm)
        if probe is None:
            raise S3Error("InvalidRequest", f"{name} is not a checksum S3 knows")
        try:
            digest = base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            digest = b""
        if len(digest) != len(probe.digest()):
            raise S3Error("InvalidRequest", f"the value of {name} is not valid")
        return algorithm, digest
    return None


async def checked(
    body: AsyncIterator[bytes], algorithm: str, digest: bytes
) -> AsyncIterator[bytes]:
    """``body`` as it is, raising BadDigest at its end (before a write can commit it) when
    it does not have the declared checksum."""
    running = _hash(algorithm)
    assert running is not None
    async for chunk in body:
        running.update(chunk)
        yield chunk
    if running.digest() != digest:
        raise S3Error(
            "BadDigest", f"the {algorithm.upper()} you specified did not match the calculated one"
        )
