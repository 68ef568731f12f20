"""S3's additional checksums of a request body (protocol layer).

SDKs send one by default with every upload (botocore since 1.36: x-amz-checksum-crc32), and
S3 refuses the upload with BadDigest when the body it received does not match: a body cut
short behind a Content-Length that says less, a proxy that changed bytes. The checksum
comes in a header, or for an aws-chunked body in the trailer that x-amz-trailer names (what
SDKs send over HTTPS). The gateway checks every algorithm S3 has: CRC32, SHA-1 and
SHA-256 with the standard library, CRC32C and CRC64NVME with ``awscrt`` (the AWS common
runtime botocore itself uses for them), all at memory speed.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

from awscrt import checksums as crt

from .errors import S3Error

PREFIX = "x-amz-checksum-"
NOT_DIGESTS = frozenset({"type", "algorithm", "mode"})  # x-amz-checksum-* that name, not carry


class _Hash(Protocol):
    def update(self, data: bytes, /) -> None: ...
    def digest(self) -> bytes: ...


class _Crc:
    """A running CRC of ``width`` bytes, as S3 encodes it (big-endian)."""

    def __init__(self, step: Callable[[bytes, int], int], width: int) -> None:
        self.step, self.width, self.value = step, width, 0

    def update(self, data: bytes, /) -> None:
        self.value = self.step(data, self.value)

    def digest(self) -> bytes:
        return self.value.to_bytes(self.width, "big")


CRCS: dict[str, tuple[Callable[[bytes, int], int], int]] = {
    "crc32": (zlib.crc32, 4),
    "crc32c": (crt.crc32c, 4),
    "crc64nvme": (crt.crc64nvme, 8),
}


def _hash(algorithm: str) -> _Hash | None:
    if algorithm in CRCS:
        return _Crc(*CRCS[algorithm])
    if algorithm in ("sha1", "sha256"):
        return hashlib.new(algorithm)
    return None


def _algorithm(name: str) -> str:
    """The algorithm an x-amz-checksum-* name carries."""
    algorithm = name[len(PREFIX) :]
    if _hash(algorithm) is None:
        raise S3Error("InvalidRequest", f"{name} is not a checksum S3 knows")
    return algorithm


def decode(algorithm: str, value: str | None) -> bytes:
    """A base64 checksum value, refused unless it has the algorithm's length."""
    probe = _hash(algorithm)
    assert probe is not None
    try:
        digest = base64.b64decode(value or "", validate=True)
    except (binascii.Error, ValueError):
        digest = b""
    if len(digest) != len(probe.digest()):
        raise S3Error("InvalidRequest", f"the value of {PREFIX}{algorithm} is not valid")
    return digest


def declared(
    headers: Mapping[str, str], trailers: Mapping[str, str]
) -> tuple[str, Callable[[], bytes]] | None:
    """The checksum an upload declares (names lower-case) in a header or, named by
    x-amz-trailer, in the ``trailers`` after an aws-chunked body: (algorithm, the expected
    digest, to be asked once the body has ended). None when there is none."""
    trailer = headers.get("x-amz-trailer", "").strip().lower()
    if trailer:
        if not trailer.startswith(PREFIX):
            return None
        algorithm = _algorithm(trailer)
        return algorithm, lambda: decode(algorithm, trailers.get(trailer))
    name = next(
        (n for n in headers if n.startswith(PREFIX) and n[len(PREFIX) :] not in NOT_DIGESTS), None
    )
    if name is None:
        return None
    algorithm = _algorithm(name)
    digest = decode(algorithm, headers[name])
    return algorithm, lambda: digest


async def checked(
    body: AsyncIterator[bytes], algorithm: str, expected: Callable[[], bytes]
) -> AsyncIterator[bytes]:
    """``body`` as it is, raising BadDigest at its end (before a write can commit it) when
    it does not have the declared checksum."""
    running = _hash(algorithm)
    assert running is not None
    async for chunk in body:
        running.update(chunk)
        yield chunk
    if running.digest() != expected():
        raise S3Error(
            "BadDigest", f"the {algorithm.upper()} you specified did not match the calculated one"
        )
