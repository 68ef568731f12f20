"""S3's additional checksums of a request body (protocol layer).

SDKs send one by default with every upload (botocore since 1.36: x-amz-checksum-crc32), and
S3 refuses the upload with BadDigest when the body it received does not match: a body cut
short behind a Content-Length that says less, a proxy that changed bytes. The checksum
comes in a header, or for an aws-chunked body in the trailer that x-amz-trailer names (what
SDKs send over HTTPS). The gateway checks every algorithm S3 has: CRC32, SHA-1 and
SHA-256 with the standard library, CRC32C and CRC64NVME with ``awscrt`` (the AWS common
runtime botocore itself uses for them), all at memory speed.

A checksum that checked is kept with the object (``Declared.value``) and answered to
HeadObject and GetObject with ChecksumMode=ENABLED. A multipart object's is COMPOSITE, the
checksum of its parts' checksums with '-<parts>' after it (``composite``), as S3 makes it
for CRC32, CRC32C, SHA-1 and SHA-256; or FULL_OBJECT, of the whole object's bytes (S3's
only kind for CRC64NVME), computed as the parts stream into the object (``hashed``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import zlib
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from dataclasses import dataclass
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


ALGORITHMS = ("crc32", "crc32c", "crc64nvme", "sha1", "sha256")
FULL_OBJECT_ONLY = frozenset({"crc64nvme"})


def algorithm_of(value: str | None) -> str | None:
    """An x-amz-checksum-algorithm value ('CRC32'), lower-cased; None if absent."""
    if not value:
        return None
    if value.lower() not in ALGORITHMS:
        raise S3Error("InvalidRequest", f"{value} is not a checksum algorithm S3 knows")
    return value.lower()


@dataclass(frozen=True, slots=True)
class Declared:
    """The checksum an upload declares: its algorithm and the digest it must have, which
    an aws-chunked body's trailer gives only once the body has ended."""

    algorithm: str
    expected: Callable[[], bytes]

    @property
    def value(self) -> str:
        """The digest as S3 writes it (base64), once the body has ended."""
        return base64.b64encode(self.expected()).decode()

    def kept(self) -> Kept:
        """What a single upload's object is kept with, once the body has ended."""
        return Kept(self.algorithm, "FULL_OBJECT", self.value)


def as_kept(declared: Declared | None) -> Callable[[], Kept | None]:
    """When the body has ended: the checksum an upload's object is kept with, if any."""
    return declared.kept if declared is not None else lambda: None


def composite(algorithm: str, part_values: Iterable[str]) -> str:
    """A multipart object's COMPOSITE checksum: of its parts' digests, '-<count>' after."""
    running = _hash(algorithm)
    assert running is not None
    count = 0
    for value in part_values:
        running.update(decode(algorithm, value))
        count += 1
    return f"{base64.b64encode(running.digest()).decode()}-{count}"


async def hashed(
    body: AsyncIterator[bytes], algorithm: str, done: Callable[[str], None]
) -> AsyncIterator[bytes]:
    """``body`` as it is; ``done`` gets its FULL_OBJECT checksum (base64) at its end."""
    running = _hash(algorithm)
    assert running is not None
    async for chunk in body:
        running.update(chunk)
        yield chunk
    done(base64.b64encode(running.digest()).decode())


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


def declared(headers: Mapping[str, str], trailers: Mapping[str, str]) -> Declared | None:
    """The checksum an upload declares (names lower-case) in a header or, named by
    x-amz-trailer, in the ``trailers`` after an aws-chunked body; None when there is none."""
    trailer = headers.get("x-amz-trailer", "").strip().lower()
    if trailer:
        if not trailer.startswith(PREFIX):
            return None
        algorithm = _algorithm(trailer)
        return Declared(algorithm, lambda: decode(algorithm, trailers.get(trailer)))
    name = next(
        (n for n in headers if n.startswith(PREFIX) and n[len(PREFIX) :] not in NOT_DIGESTS), None
    )
    if name is None:
        return None
    algorithm = _algorithm(name)
    digest = decode(algorithm, headers[name])
    return Declared(algorithm, lambda: digest)


async def checked(body: AsyncIterator[bytes], checksum: Declared) -> AsyncIterator[bytes]:
    """``body`` as it is, raising BadDigest at its end (before a write can commit it) when
    it does not have the declared checksum."""
    running = _hash(checksum.algorithm)
    assert running is not None
    async for chunk in body:
        running.update(chunk)
        yield chunk
    if running.digest() != checksum.expected():
        raise S3Error(
            "BadDigest",
            f"the {checksum.algorithm.upper()} you specified did not match the calculated one",
        )


KINDS = ("FULL_OBJECT", "COMPOSITE")


@dataclass(frozen=True, slots=True)
class Kept:
    """The checksum an object is kept with: as a tag '<version> <algorithm> <kind> <value>',
    valid while the object is at that version (a change behind loomfs's back drops it)."""

    algorithm: str
    kind: str  # FULL_OBJECT or COMPOSITE
    value: str

    def text(self) -> str:
        return f"{self.algorithm} {self.kind} {self.value}"

    @classmethod
    def parse(cls, text: str | None) -> Kept | None:
        fields = (text or "").split(" ")
        return cls(*fields) if len(fields) == 3 else None

    def tag(self, version: int) -> str:
        return f"{version} {self.text()}"

    @classmethod
    def of(cls, version: int, tag: str | None) -> Kept | None:
        kept_version, _, text = (tag or "").partition(" ")
        return cls.parse(text) if kept_version == str(version) else None

    @property
    def element(self) -> str:
        """Its name in XML documents (ChecksumCRC32, ChecksumSHA256, ...)."""
        return "Checksum" + self.algorithm.upper()

    def headers(self) -> dict[str, str]:
        return {PREFIX + self.algorithm: self.value, PREFIX + "type": self.kind}
