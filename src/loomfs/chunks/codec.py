"""Chunk frames on the wire: raw, zstd, or a delta against an older version (core layer).

A frame is ``kind(1) | raw_length | [ref_offset | ref_length] | payload_length | payload``
with LEB128 varints; the bracketed part is present for delta frames only. The low nibble
of ``kind`` is the ``FrameKind``, the high nibble the byte-shuffle width (0, 2 or 4): with
a width, the payload is each byte plane compressed on its own (``varint size | zstd``
per plane, then the odd tail raw), the Blosc/HDF5 shuffle idea: tensors and token arrays
compress better once the bytes of equal significance sit together. The receiver
always decodes against the chunk id it asked for, never against an id the sender claims,
and checks the BLAKE3 digest before handing bytes on: a damaged, truncated or misdirected
frame raises ``CorruptData`` and returns nothing.

Two delta kinds use bytes of the file version the receiver already holds. ``DELTA`` is a
zstd frame whose dictionary is a span of that version (raw-content dictionary, the
``--patch-from`` idea): bytes that the edit did not touch become back-references, so a
chunk with a few scattered edits costs about the compressed size of the edits. ``XOR`` is
the chunk XORed with the bytes at the same place in the old version, then byte-plane zstd:
a tensor whose every value moved a little keeps its signs, exponents and high mantissa
bytes, which XOR to zeros where a dictionary would find no match at all. ``SUB`` is the
same idea in arithmetic: each 4- or 2-byte word (float32, bf16) minus the word at the same
place in the old version, as an integer, zigzag-mapped so small steps either way have zero
high bytes, then byte-plane zstd. A value that moved by a few units in its last place
costs a few low bits, where XOR turns every carry across a byte into a run of set bits;
on AdamW checkpoints (``bench/float_deltas.py``) it sends 3-4% less than XOR for weights
and second moments.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, replace
from enum import IntEnum
from typing import Any, Protocol

import blake3
import numpy as np
import zstandard

from ..errors import CorruptData
from .chunkmap import MAX_CHUNK_SIZE, get_varint, put_varint


class FrameKind(IntEnum):
    RAW = 0
    ZSTD = 1
    DELTA = 2
    XOR = 3
    SUB = 4


# Frame kinds decoded against bytes of the receiver's older version.
REFERENCE_KINDS = (FrameKind.DELTA, FrameKind.XOR, FrameKind.SUB)

SHUFFLE_WIDTHS = (0, 4, 2)  # 0: bytes as they are; 4: float32/int32; 2: bf16/fp16/uint16


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
    #: a delta chooses between XOR, dictionary and byte-plane zstd by a larger sample: a
    #: 4 KiB one lands on an unrepresentative stretch of a tensor often enough to cost 7%
    #: of a fine-tuning checkpoint's delta bytes (bench/transfer.py's corpus 2); 16 KiB
    #: gets all but 0.2% of what the whole chunk would
    delta_sample_size: int = 16384


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


def _frame(
    kind: FrameKind, width: int, raw_length: int, payload: bytes | memoryview, *extra: int
) -> bytes:
    out = bytearray((kind | width << 4,))
    put_varint(out, raw_length)
    for value in extra:
        put_varint(out, value)
    put_varint(out, len(payload))
    out += payload
    return bytes(out)


def _planes(data: bytes, width: int) -> tuple[list[bytes], bytes]:
    """Byte ``i`` of every ``width``-byte element, for each ``i``; and the tail shorter than
    one element."""
    whole = len(data) - len(data) % width
    return [data[i:whole:width] for i in range(width)], data[whole:]


def pack(data: bytes, width: int, level: int) -> bytes:
    """zstd of ``data``, or with ``width`` >= 2, of each byte plane on its own: one zstd
    block shares one Huffman table, and the sign/exponent plane compresses well only
    with a table of its own."""
    if width < 2:
        return _compressor(level).compress(data)
    planes, tail = _planes(data, width)
    out = bytearray()
    for plane in planes:
        packed = _compressor(level).compress(plane)
        put_varint(out, len(packed))
        out += packed
    return bytes(out + tail)


def unpack(payload: memoryview, width: int, raw_length: int) -> bytes:
    if width < 2:
        return _decompress(payload, raw_length)
    plane_length = raw_length // width
    whole = plane_length * width
    out = bytearray(raw_length)
    pos = 0
    for i in range(width):
        size, pos = get_varint(payload, pos)
        plane = _decompress(payload[pos : pos + size], plane_length)
        if len(plane) != plane_length:
            raise CorruptData("byte plane has the wrong length")
        out[i:whole:width] = plane
        pos += size
    if len(payload) - pos != raw_length - whole:
        raise CorruptData("shuffled payload has a wrong tail")
    out[whole:] = payload[pos:]
    return bytes(out)


def xor(data: bytes, other: bytes) -> bytes:
    """Bytewise XOR of two equally long strings (big-int XOR runs in C, ~800 MB/s)."""
    return (int.from_bytes(data, "little") ^ int.from_bytes(other, "little")).to_bytes(
        len(data), "little"
    )


# Little-endian whatever the host: the wire form must not depend on the machine.
_WORDS: dict[int, np.dtype[Any]] = {4: np.dtype("<u4"), 2: np.dtype("<u2")}


def _word_span(length: int, ref_offset: int, width: int) -> tuple[int, int]:
    """Where the whole words of a chunk lie (start, end): words are aligned to the
    reference's offsets, as tensors in a file sit at aligned offsets (torch.save pads each
    to 64 bytes), so a chunk cut anywhere still pairs each float with its old value."""
    head = min(-ref_offset % width, length)
    return head, head + (length - head) // width * width


def subtract(data: bytes, base: bytes, width: int, ref_offset: int) -> bytes:
    """``SUB``'s transform: the zigzag of ``data - base`` per little-endian ``width``-byte
    word (modulo 2**bits), then the bytes around the whole words XORed, so the
    transformed buffer starts with whole words for the byte planes."""
    head, end = _word_span(len(data), ref_offset, width)
    words = _WORDS[width]
    new = np.frombuffer(data, words, (end - head) // width, head)
    old = np.frombuffer(base, words, (end - head) // width, head)
    diff = new - old  # wraps modulo 2**bits, exactly what the decoder undoes
    top = diff >> (8 * width - 1)  # 1 where the signed difference is negative
    zigzag = (diff << 1) ^ (np.zeros_like(top) - top)
    words_out: bytes = zigzag.tobytes()
    return words_out + xor(data[:head] + data[end:], base[:head] + base[end:])


def add_back(packed: bytes, base: bytes, width: int, ref_offset: int) -> bytes:
    """The inverse of ``subtract``: the chunk from its transform and the same ``base``."""
    head, end = _word_span(len(base), ref_offset, width)
    words = _WORDS[width]
    zigzag = np.frombuffer(packed, words, (end - head) // width)
    old = np.frombuffer(base, words, (end - head) // width, head)
    diff = (zigzag >> 1) ^ (np.zeros_like(zigzag) - (zigzag & 1))
    edges = xor(packed[end - head :], base[:head] + base[end:])
    words_out: bytes = (old + diff).tobytes()
    return edges[:head] + words_out + edges[head:]


def numeric(data: bytes, settings: CodecSettings = DEFAULT_SETTINGS) -> bool:
    """Whether ``data`` compresses better as byte planes (token ids, tensors): a frame of
    its own shuffles it, where a bundle's shared stream could not."""
    return _best_width(data, settings)[0] != 0


def _best_width(data: bytes, settings: CodecSettings) -> tuple[int, float]:
    """The shuffle width that compresses a sample from the middle best, and the sample's
    compressed/raw ratio there. Small chunks are their own sample."""
    sample = _sample(data, settings)
    if not sample:
        return 0, 1.0
    plain = len(pack(sample, 0, 1))
    # Byte planes must win by 3% to count: on random bytes every width ties, and a chunk
    # called numeric by a tie would get numeric treatment (XOR deltas) for no reason.
    size, width = min([(plain, 0)] + [(len(pack(sample, w, 1)), w) for w in SHUFFLE_WIDTHS if w])
    if size > plain * 0.97:
        size, width = plain, 0
    return width, size / len(sample)


def _sample(data: bytes, settings: CodecSettings) -> bytes:
    """``sample_size`` bytes from the middle of ``data``, starting on a 4-byte boundary
    of it so that byte planes of the sample are byte planes of the whole."""
    middle = max(0, len(data) // 2 - settings.sample_size // 2) // 4 * 4
    return data[middle : middle + settings.sample_size]


def encode_chunk(data: bytes | memoryview, settings: CodecSettings = DEFAULT_SETTINGS) -> bytes:
    """One frame for ``data``: zstd (shuffled if that pays) or the bytes as they are."""
    raw = bytes(data)
    return _plain(raw, *_best_width(raw, settings), settings)


def _plain(raw: bytes, width: int, ratio: float, settings: CodecSettings) -> bytes:
    """The zstd frame of ``raw`` with the sample's verdict (width, ratio), or raw."""
    if ratio < settings.keep_ratio:
        packed = pack(raw, width, settings.level)
        if len(packed) < len(raw) * settings.keep_ratio:
            return _frame(FrameKind.ZSTD, width, len(raw), packed)
    return _frame(FrameKind.RAW, 0, len(raw), raw)


# How far from the planner's estimate the encoder looks for where a chunk's bytes sit in
# the older version, and how much old data around that spot serves as the dictionary.
# Scattered inserts drift a chunk by a random walk: about 20 KiB after 1000 inserted rows.
SEARCH_RADIUS = 256 << 10
DELTA_SLACK = 16 << 10
PROBE = 32


def locate(data: bytes, region: bytes, region_start: int, estimate: int) -> int | None:
    """Where ``data`` most likely starts in the older version, of which ``region`` holds
    the bytes from ``region_start`` on: four 32-byte probes from the chunk are looked up
    nearest to where ``estimate`` puts them, and the median offset they vote for wins.
    A probe that hits an edit finds nothing or a stray spot, and the median ignores it.
    None when no probe is found at all: the region shares no 32-byte run with the chunk."""
    votes = []
    for eighth in (1, 3, 5, 7):
        at = len(data) * eighth // 8
        probe = data[at : at + PROBE]
        if len(probe) < PROBE:
            continue
        center = max(0, estimate + at - region_start)
        hits = (region.find(probe, center), region.rfind(probe, 0, center + PROBE))
        found = [hit for hit in hits if hit >= 0]
        if found:
            votes.append(region_start + min(found, key=lambda hit: abs(hit - center)) - at)
    if not votes:
        return None
    return sorted(votes)[len(votes) // 2]


def encode_delta(
    data: bytes | memoryview,
    reference: Reference,
    estimate: int,
    settings: CodecSettings = DEFAULT_SETTINGS,
) -> bytes:
    """A delta frame for ``data`` against the older version the receiver holds, or a plain
    frame if no delta pays. ``estimate`` is where the planner expects the chunk's bytes
    in ``reference``; ``locate`` refines it from the bytes themselves.

    If the chunk is numeric and XOR against the old bytes at that spot compresses a sample
    better than the chunk alone (a tensor whose values moved a little), the frame is
    ``XOR``. Otherwise it is a
    dictionary ``DELTA`` over the old bytes around the spot; for numeric data (a sample
    that prefers byte planes) plain byte-plane zstd is tried too, since a dictionary
    finds no matches in values that all changed. Text is not compressed twice: its
    dictionary delta is never much larger than plain zstd.
    """
    raw = bytes(data)
    region_start = max(0, estimate - SEARCH_RADIUS)
    region = reference.read(region_start, estimate + len(raw) + SEARCH_RADIUS - region_start)
    if not region:
        return encode_chunk(raw, settings)
    located = locate(raw, region, region_start, estimate)
    aligned = estimate if located is None else located
    at = aligned - region_start
    probe = replace(settings, sample_size=settings.delta_sample_size)
    plain_width, plain_ratio = _best_width(raw, probe)
    # XOR only for numeric data (the sample prefers byte planes): XOR of two unrelated
    # texts is skewed ASCII that zstd shrinks a little, fooling the sample test, while
    # the dictionary delta finds the real matches.
    numeric = None
    if plain_width and at >= 0 and at + len(raw) <= len(region):
        base = region[at : at + len(raw)]
        numeric, clear = _numeric_delta(raw, base, aligned, plain_width, plain_ratio, probe)
        if numeric is not None and clear:
            return numeric
    # Numeric or incompressible data with no 32-byte run in common (an unrelated file,
    # values that all changed, random bytes beside random bytes): a dictionary finds
    # nothing either, so spare its cost, which is a zstd dictionary load of ~560 KiB per
    # chunk. Other data keeps it: shorter matches (snappy-compressed Parquet pages) pay.
    delta = None
    if located is not None or not (plain_width or plain_ratio >= settings.keep_ratio):
        start = min(max(0, at - DELTA_SLACK), len(region))
        window = region[start : max(start, at + len(raw) + DELTA_SLACK)]
        delta = _dictionary_delta(raw, window, region_start + start, settings)
        if not plain_width and len(delta) < len(raw) * settings.keep_ratio:
            return delta
    plain = _plain(raw, plain_width, plain_ratio, settings)
    return min((f for f in (plain, delta, numeric) if f is not None), key=len)


# A numeric delta whose sample beats plain zstd's by 5% is taken on the sample's word;
# from there to 5% worse than plain, both are packed whole and the smaller goes:
# a 16 KiB sample misjudges such close calls often enough to cost 1.3% of a fine-tuning
# checkpoint's update bytes (bench/float_deltas.py). XOR must beat SUB's sample by 3%:
# on float data SUB is smaller on the whole chunk nearly every time the samples tie.
CLEAR_WIN, CLOSE_CALL, XOR_MARGIN = 0.95, 1.05, 0.97


def _numeric_delta(
    raw: bytes, base: bytes, ref_offset: int, word: int, plain_ratio: float, probe: CodecSettings
) -> tuple[bytes | None, bool]:
    """The ``SUB`` or ``XOR`` frame of ``raw`` against ``base`` (the old bytes at the same
    place, ``ref_offset`` in the reference), and whether its sample won clearly over
    plain zstd's; None where it is not even a close call. ``word`` is the shuffle width
    the chunk's own sample chose: the word size ``SUB`` subtracts in."""
    subbed = subtract(raw, base, word, ref_offset)
    sample = _sample(subbed, probe)
    kind, width, body = FrameKind.SUB, word, subbed
    ratio = len(pack(sample, word, 1)) / max(len(sample), 1)
    xored = xor(raw, base)
    xor_width, xor_ratio = _best_width(xored, probe)
    if xor_ratio < ratio * XOR_MARGIN:
        kind, width, body, ratio = FrameKind.XOR, xor_width, xored, xor_ratio
    if ratio >= plain_ratio * CLOSE_CALL:
        return None, False
    packed = pack(body, width, probe.level)
    if len(packed) >= len(raw) * probe.keep_ratio:
        return None, False
    frame = _frame(kind, width, len(raw), packed, ref_offset, len(raw))
    return frame, ratio < plain_ratio * CLEAR_WIN


def _dictionary_delta(raw: bytes, window: bytes, window_at: int, settings: CodecSettings) -> bytes:
    if not window:
        return encode_chunk(raw, settings)
    dictionary = zstandard.ZstdCompressionDict(window, dict_type=zstandard.DICT_TYPE_RAWCONTENT)
    compressor = zstandard.ZstdCompressor(
        level=settings.level, dict_data=dictionary, write_content_size=False
    )
    packed = compressor.compress(raw)
    return _frame(FrameKind.DELTA, 0, len(raw), packed, window_at, len(window))


@dataclass(frozen=True, slots=True)
class _Header:
    kind: FrameKind
    width: int
    raw_length: int
    ref_offset: int
    ref_length: int
    payload_at: int
    payload_length: int


def _parse_header(view: memoryview, pos: int) -> _Header:
    if pos >= len(view):
        raise CorruptData("empty frame")
    kind_byte = view[pos]
    kind, width = kind_byte & 0x0F, kind_byte >> 4
    if kind not in FrameKind.__members__.values() or width not in SHUFFLE_WIDTHS:
        raise CorruptData(f"unknown frame kind {kind_byte:#x}")
    if kind == FrameKind.SUB and width not in _WORDS:
        raise CorruptData(f"SUB frame without a word size {kind_byte:#x}")
    has_reference = kind in REFERENCE_KINDS
    fields = []
    pos += 1
    for _ in range(4 if has_reference else 2):
        value, pos = get_varint(view, pos)
        fields.append(value)
    raw_length, *ref, payload_length = fields
    ref_offset, ref_length = ref if has_reference else (0, 0)
    return _Header(FrameKind(kind), width, raw_length, ref_offset, ref_length, pos, payload_length)


def frame_length(buf: bytes | memoryview, pos: int = 0) -> int:
    """The length of the frame that starts at ``pos`` (for splitting a batch of frames)."""
    view = memoryview(buf)
    header = _parse_header(view, pos)
    end = header.payload_at + header.payload_length
    if end > len(view):
        raise CorruptData("frame truncated")
    return end - pos


def decode_frame(
    frame: bytes | memoryview, expected_id: bytes, reference: Reference | None = None
) -> bytes:
    """The chunk bytes of one whole frame, verified against ``expected_id``.

    Raises ``CorruptData`` for any malformed, truncated or over-long frame, a delta frame
    without its reference, or bytes whose digest is not ``expected_id``.
    """
    view = memoryview(frame)
    header = _parse_header(view, 0)
    if header.payload_at + header.payload_length != len(view):
        raise CorruptData("frame truncated or followed by stray bytes")
    if header.raw_length > MAX_CHUNK_SIZE:
        raise CorruptData(f"frame claims a {header.raw_length}-byte chunk")
    payload = view[header.payload_at :]
    if header.kind == FrameKind.RAW:
        data = bytes(payload)
    elif header.kind == FrameKind.ZSTD:
        data = unpack(payload, header.width, header.raw_length)
    elif header.kind == FrameKind.DELTA:
        dictionary = zstandard.ZstdCompressionDict(
            _reference_bytes(header, reference), dict_type=zstandard.DICT_TYPE_RAWCONTENT
        )
        data = _decompress(payload, header.raw_length, dictionary)
    else:
        base = _reference_bytes(header, reference)
        packed = unpack(payload, header.width, header.raw_length)
        if len(base) != len(packed):
            raise CorruptData(f"{header.kind.name} frame and its reference differ in length")
        if header.kind == FrameKind.XOR:
            data = xor(packed, base)
        else:
            data = add_back(packed, base, header.width, header.ref_offset)
    if len(data) != header.raw_length or chunk_id(data) != expected_id:
        raise CorruptData(f"chunk {expected_id.hex()[:16]} failed verification")
    return data


def _reference_bytes(header: _Header, reference: Reference | None) -> bytes:
    if reference is None:
        raise CorruptData("delta frame received without its reference version")
    ref = reference.read(header.ref_offset, header.ref_length)
    if len(ref) != header.ref_length:
        raise CorruptData("reference version is shorter than the delta frame expects")
    return ref


def _decompress(
    payload: memoryview, raw_length: int, dictionary: zstandard.ZstdCompressionDict | None = None
) -> bytes:
    decompressor = zstandard.ZstdDecompressor(dict_data=dictionary)
    try:
        # max_output_size bounds the allocation for frames without a content size (0
        # would mean unbounded; the caller's length check catches a 1-byte overrun).
        return decompressor.decompress(payload, max_output_size=max(raw_length, 1))
    except zstandard.ZstdError as exc:
        raise CorruptData(f"zstd frame does not decode: {exc}") from exc
