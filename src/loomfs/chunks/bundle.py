"""Bundles: many small files' bytes as one zstd frame, deltas included (core layer).

A spoke fetching a tree of small files asks for many of them in one request
(``ChunkLink.fetch_small``); the hub answers one frame of all their bytes, in the order
asked. One frame, not one per file, because real trees of small files (source, packages)
repeat themselves across files: licences, headers, imports, the same idioms in every
module. Compressed alone, each file starts from nothing; in one stream, zstd finds those
repeats in the files before (lodash 4.17.21, 1,054 files: 250 KB as separate level-3
frames, 191 KB as one level-12 stream, where ``rsync -az`` sends 280 KB).

Deltas ride the same frame: the bases (the versions of changed files that the receiver
said it holds and the sender still has) are joined into one raw-content dictionary, so
an edited file costs about its edits (``--patch-from``, as ``codec.DELTA`` does per
chunk). Both ends build the dictionary from bytes they verified against the same BLAKE3
ids, and the receiver checks every file it decodes against the id the sender named for
it: a damaged frame or a wrong base raises ``CorruptData`` and hands nothing on.

On the wire (``POST /v1/chunks/small``) the ask is zstd-compressed JSON ``{"small": N,
"files": [[path, version, held id hex or ""], ...], "holds": filter hex}`` (paths of one
tree share most of their bytes), the answer ``varint head length | head | frame``, the
head zstd-compressed JSON ``{"files": [[how, size, id hex], ...], "bases": [index, ...]}``
with ``how`` one of ``SKIP`` (sent alone, if at all), ``HELD`` (the receiver's held bytes
of that path, id "", or, id named, bytes it holds under any path) or ``SENT`` (in the
frame, in order).

Dedup against any file the receiver holds (a copy, a rename, the same licence in every
package) costs it a Bloom filter of the ids of the small files it holds, ``holds``: 12
bits an id, a twentieth of the ids themselves. The sender names the id of a file whose
id the filter may hold; the receiver finds the bytes by that id and checks them against
it, and a false positive (about 0.3%) or bytes gone since are fetched alone.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from typing import Any

import zstandard

from ..errors import CorruptData
from .chunkmap import get_varint, put_varint
from .codec import chunk_id

# Level of a bundle's frame: 12 takes lodash's 1.4 MB in 0.13 s on one core (191 KB; 9:
# 200 KB in 0.07 s), 19 saves a further 11% for 25 times the time, on the hub's encoder
# threads, which every spoke shares.
LEVEL = 12
MAX_BYTES = 16 << 20  # bytes of files (and, apart, of bases) in one bundle
MAX_FILES = 4096  # files asked in one bundle
MAX_HEAD = 4 << 20  # bytes of an ask's or an answer's JSON, decompressed
SKIP, HELD, SENT = 0, 1, 2
HOLD_BITS = 12  # filter bits per held id: 0.3% false positives with 8 probes
HOLD_PROBES = 8  # each 4 bytes of the (uniformly random) BLAKE3 id
MAX_HOLDS = 1 << 17  # ids in one filter (192 KB)
_MIN_WINDOW_LOG = 20


def _params(total: int) -> zstandard.ZstdCompressionParameters:
    # A base is only matched within the window: it must span the bases and the files.
    window = max(_MIN_WINDOW_LOG, (max(total, 1) - 1).bit_length())
    return zstandard.ZstdCompressionParameters.from_level(
        LEVEL, window_log=window, write_content_size=True
    )


def _dictionary(bases: Sequence[bytes]) -> zstandard.ZstdCompressionDict | None:
    joined = b"".join(bases)
    if not joined:
        return None
    return zstandard.ZstdCompressionDict(joined, dict_type=zstandard.DICT_TYPE_RAWCONTENT)


def encode(datas: Sequence[bytes], bases: Sequence[bytes] = ()) -> bytes:
    """One frame of ``datas`` joined, against ``bases`` (the receiver's, in order)."""
    total = sum(map(len, datas)) + sum(map(len, bases))
    compressor = zstandard.ZstdCompressor(
        dict_data=_dictionary(bases), compression_params=_params(total)
    )
    return compressor.compress(b"".join(datas))


def decode(
    frame: bytes, sizes: Sequence[int], ids: Sequence[bytes], bases: Sequence[bytes] = ()
) -> list[bytes]:
    """The files of ``frame``, of ``sizes`` and BLAKE3 ``ids`` in order, each verified."""
    expected = sum(sizes)
    if expected > MAX_BYTES or any(size < 0 for size in sizes):
        raise CorruptData(f"a bundle claims {expected} bytes of files")
    try:
        decompressor = zstandard.ZstdDecompressor(
            dict_data=_dictionary(bases), max_window_size=1 << 27
        )
        joined = decompressor.decompress(frame, max_output_size=expected) if frame else b""
    except zstandard.ZstdError as exc:
        raise CorruptData(f"a bundle does not decode: {exc}") from None
    if len(joined) != expected:
        raise CorruptData(f"a bundle holds {len(joined)} bytes, not {expected}")
    out = []
    view = memoryview(joined)
    pos = 0
    for size, cid in zip(sizes, ids, strict=True):
        data = bytes(view[pos : pos + size])
        pos += size
        if chunk_id(data) != cid:
            raise CorruptData("a file of a bundle does not match its id")
        out.append(data)
    return out


def holds(ids: Collection[bytes]) -> bytes:
    """The Bloom filter of the BLAKE3 ``ids`` (at most ``MAX_HOLDS``) a receiver holds."""
    if len(ids) > MAX_HOLDS:
        raise ValueError(f"a filter holds at most {MAX_HOLDS} ids")
    bits = bytearray(max(8, (len(ids) * HOLD_BITS + 7) // 8))
    for cid in ids:
        for pos in _probes(cid, len(bits) * 8):
            bits[pos >> 3] |= 1 << (pos & 7)
    return bytes(bits)


def may_hold(bits: bytes, cid: bytes) -> bool:
    """Whether the filter ``bits`` may hold ``cid`` (an empty filter holds nothing)."""
    return bool(bits) and all(bits[p >> 3] >> (p & 7) & 1 for p in _probes(cid, len(bits) * 8))


def _probes(cid: bytes, nbits: int) -> list[int]:
    return [int.from_bytes(cid[4 * i : 4 * i + 4], "little") % nbits for i in range(HOLD_PROBES)]


def pack(value: Any) -> bytes:
    """An ask or an answer's head: compact JSON, zstd-compressed."""
    text = json.dumps(value, separators=(",", ":")).encode()
    return zstandard.ZstdCompressor(level=LEVEL, write_content_size=True).compress(text)


def unpack(data: bytes) -> Any:
    try:
        text = zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_HEAD)
        return json.loads(text)
    except (zstandard.ZstdError, ValueError) as exc:
        raise CorruptData(f"a bundle's head does not decode: {exc}") from None


def answer(head: Any, frame: bytes) -> bytes:
    out = bytearray()
    packed = pack(head)
    put_varint(out, len(packed))
    return bytes(out) + packed + frame


def split(body: bytes) -> tuple[Any, bytes]:
    """An answer's head (decoded) and frame."""
    length, pos = get_varint(memoryview(body), 0)
    if pos + length > len(body):
        raise CorruptData("a bundle's answer is truncated")
    return unpack(body[pos : pos + length]), body[pos + length :]
