"""Chunk frames on the wire: raw, zstd, or zstd-delta against an older version (core layer).

A frame is ``kind(1) | raw_length | [ref_offset | ref_length] | payload_length | payload``
with LEB128 varints; the bracketed part is present for delta frames only. The receiver
always decodes against the chunk id it asked for, never against an id the sender claims,
and checks the BLAKE3 digest before handing bytes on: a damaged, truncated or misdirected
frame raises ``CorruptData`` and returns nothing.

Delta frames are zstd frames whose dictionary is a span of the file version the receiver
already holds (raw-content dictionary, the ``--patch-from`` idea): bytes that the edit did
not touch become back-references, so a chunk with a few scattered edits costs about the
compressed size of the edits.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from enum import IntEnum
from typing import Protocol

import blake3
import zstandard

from ..errors import CorruptData
from .chunkmap import get_varint, put_varint

# Chunks are bounded by the chunker's max size; anything claiming more is a forged or
# corrupt header, and refusing it keeps a bad frame from making us allocate gigabytes.
MAX_CHUNK_SIZE = 16 << 20


class FrameKind(IntEnum):
    RAW = 0
    ZSTD = 1
    DELTA = 2


class Reference(Protocol):
    """The older version a delta frame was made against, as the receiver holds it."""

    def read(self, offset: int, length: int) -> bytes: ...


@dataclass(frozen=True, slots=True)
class BytesReference:
    """A reference held in memory (small files, tests)."""

    data: bytes

    def read(self, offset: int, length: int) -> bytes:
        return self.data[offset : offset + length]


class FileReference:
    """A reference version in a local file (a cache file at the receiver, a volume file at
    the sender), read with ``pread`` so concurrent decoders share one descriptor."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, offset: int, length: int) -> bytes:
        return os.pread(self._fd, length, offset)

    def close(self) -> None:
        os.close(self._fd)

    def __enter__(self) -> FileReference:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def chunk_id(data: bytes | memoryview) -> bytes:
    """The id of a chunk: its BLAKE3 digest (32 bytes)."""
    return blake3.blake3(data).digest()


@dataclass(frozen=True, slots=True)
class CodecSettings:
    """How hard to compress and when not to bother.

    ``sample_size`` bytes from the middle of a chunk are compressed first: random-looking
    data (JPEG, video, already-compressed shards) shows it at once, and skipping the full
    attempt keeps incompressible data near plain-copy speed. ``keep_ratio``: compressed
    output is sent only when it saves at least 2%, else decoding costs more than it saves.
    """

    level: int = 3
    sample_size: int = 4096
    keep_ratio: float = 0.98


DEFAULT_SETTINGS = CodecSettings()

# zstandard compressor objects are not safe to share between threads but cost an
# allocation to create, so each worker thread keeps one per level.
_local = threading.local()


def _compressor(level: int) -> zstandard.ZstdCompressor:
    cache: dict[int, zstandard.ZstdCompressor] | None = getattr(_local, "compressors", None)
    if cache is None:
        cache = _local.compressors = {}
    if level not in cache:
        cache[level] = zstandard.ZstdCompressor(level=level, write_content_size=False)
    return cache[level]


def _frame(kind: FrameKind, raw_length: int, payload: bytes | memoryview, *extra: int) -> bytes:
    out = bytearray((kind,))
    put_varint(out, raw_length)
    for value in extra:
        put_varint(out, value)
    put_varint(out, len(payload))
    out += payload
    return bytes(out)


def _looks_incompressible(data: memoryview, settings: CodecSettings) -> bool:
    if len(data) <= settings.sample_size * 4:
        return False
    middle = len(data) // 2
    sample = data[middle : middle + settings.sample_size]
    return len(_compressor(1).compress(sample)) >= len(sample) * settings.keep_ratio


def encode_chunk(data: bytes | memoryview, settings: CodecSettings = DEFAULT_SETTINGS) -> bytes:
    """One frame for ``data``: zstd when that pays, else the bytes as they are."""
    view = memoryview(data)
    if not _looks_incompressible(view, settings):
        packed = _compressor(settings.level).compress(view)
        if len(packed) < len(view) * settings.keep_ratio:
            return _frame(FrameKind.ZSTD, len(view), packed)
    return _frame(FrameKind.RAW, len(view), view)


def encode_delta(
    data: bytes | memoryview,
    reference: bytes,
    ref_offset: int,
    settings: CodecSettings = DEFAULT_SETTINGS,
) -> bytes:
    """A delta frame for ``data`` against ``reference`` (bytes the receiver holds at
    ``ref_offset`` of its older version), or ``encode_chunk``'s frame if the delta saves
    nothing. The delta is never much larger than plain zstd (the dictionary only adds match
    candidates), so plain zstd is not tried as well: that would double the CPU per chunk.
    """
    view = memoryview(data)
    if not reference:
        return encode_chunk(view, settings)
    dictionary = zstandard.ZstdCompressionDict(reference, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    packed = zstandard.ZstdCompressor(
        level=settings.level, dict_data=dictionary, write_content_size=False, write_dict_id=False
    ).compress(view)
    if len(packed) < len(view) * settings.keep_ratio:
        return _frame(FrameKind.DELTA, len(view), packed, ref_offset, len(reference))
    return encode_chunk(view, settings)


def frame_length(buf: bytes | memoryview, pos: int = 0) -> int:
    """The length of the frame that starts at ``pos`` (for splitting a batch of frames)."""
    view = memoryview(buf)
    _, payload_at, payload_length = _parse_header(view, pos)
    end = payload_at + payload_length
    if end > len(view):
        raise CorruptData("frame truncated")
    return end - pos


def _parse_header(view: memoryview, pos: int) -> tuple[tuple[int, ...], int, int]:
    if pos >= len(view):
        raise CorruptData("empty frame")
    kind = view[pos]
    if kind not in FrameKind.__members__.values():
        raise CorruptData(f"unknown frame kind {kind}")
    fields = [kind]
    pos += 1
    for _ in range(4 if kind == FrameKind.DELTA else 2):
        value, pos = get_varint(view, pos)
        fields.append(value)
    *header, payload_length = fields
    return tuple(header), pos, payload_length


def decode_frame(
    frame: bytes | memoryview, expected_id: bytes, reference: Reference | None = None
) -> bytes:
    """The chunk bytes of one whole frame, verified against ``expected_id``.

    Raises ``CorruptData`` for any malformed, truncated or over-long frame, a delta frame
    without its reference, or bytes whose digest is not ``expected_id``.
    """
    view = memoryview(frame)
    header, payload_at, payload_length = _parse_header(view, 0)
    if payload_at + payload_length != len(view):
        raise CorruptData("frame truncated or followed by stray bytes")
    kind, raw_length = header[0], header[1]
    if raw_length > MAX_CHUNK_SIZE:
        raise CorruptData(f"frame claims a {raw_length}-byte chunk")
    payload = view[payload_at:]
    if kind == FrameKind.RAW:
        data = bytes(payload)
    else:
        data = _decompress(kind, raw_length, payload, header, reference)
    if len(data) != raw_length or chunk_id(data) != expected_id:
        raise CorruptData(f"chunk {expected_id.hex()[:16]} failed verification")
    return data


def _decompress(
    kind: int,
    raw_length: int,
    payload: memoryview,
    header: tuple[int, ...],
    reference: Reference | None,
) -> bytes:
    if kind == FrameKind.DELTA:
        if reference is None:
            raise CorruptData("delta frame received without its reference version")
        ref_offset, ref_length = header[2], header[3]
        ref = reference.read(ref_offset, ref_length)
        if len(ref) != ref_length:
            raise CorruptData("reference version is shorter than the delta frame expects")
        dictionary = zstandard.ZstdCompressionDict(ref, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
        decompressor = zstandard.ZstdDecompressor(dict_data=dictionary)
    else:
        decompressor = zstandard.ZstdDecompressor()
    try:
        # max_output_size bounds the allocation for frames without a content size.
        return decompressor.decompress(payload, max_output_size=raw_length)
    except zstandard.ZstdError as exc:
        raise CorruptData(f"zstd frame does not decode: {exc}") from exc
