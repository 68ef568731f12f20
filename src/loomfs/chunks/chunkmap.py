"""Chunk maps: the ordered chunk list of one file version and its wire form (core layer).

A ``ChunkMap`` is what the hub stores in its catalog per file version and sends to a spoke
before any chunk moves, so its serialization is compact: offsets are implied by the
lengths (they are contiguous by construction), lengths are LEB128 varints and ids are the
raw 32-byte BLAKE3 digests. About 35 bytes per chunk, 0.05% of a 64 KiB chunk.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from ..errors import CorruptData

ID_SIZE = 32
# Chunks are bounded by the chunker's max size; anything claiming more is a forged or
# corrupt header, and refusing it keeps a bad frame from making us allocate gigabytes.
MAX_CHUNK_SIZE = 16 << 20
_MAGIC = b"LCM\x01"


@dataclass(frozen=True, slots=True)
class ChunkEntry:
    """One chunk of a file: where it sits and the BLAKE3 digest of its bytes."""

    offset: int
    length: int
    id: bytes

    @property
    def end(self) -> int:
        return self.offset + self.length


class ChunkMap(Sequence[ChunkEntry]):
    """The chunks of one file version, in file order, covering it without gaps."""

    __slots__ = ("_entries", "size")

    def __init__(self, entries: Sequence[ChunkEntry]) -> None:
        position = 0
        for entry in entries:
            if entry.offset != position or entry.length <= 0 or len(entry.id) != ID_SIZE:
                raise ValueError(f"chunk entries must be contiguous with 32-byte ids: {entry}")
            position = entry.end
        self._entries: tuple[ChunkEntry, ...] = tuple(entries)
        self.size = position

    @classmethod
    def from_lengths(cls, pieces: Sequence[tuple[int, bytes]]) -> ChunkMap:
        """Build a map from ``(length, id)`` pairs in file order."""
        entries = []
        offset = 0
        for length, chunk_id in pieces:
            entries.append(ChunkEntry(offset, length, chunk_id))
            offset += length
        return cls(entries)

    def __len__(self) -> int:
        return len(self._entries)

    @overload
    def __getitem__(self, index: int) -> ChunkEntry: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[ChunkEntry, ...]: ...
    def __getitem__(self, index: int | slice) -> ChunkEntry | tuple[ChunkEntry, ...]:
        return self._entries[index]

    def __iter__(self) -> Iterator[ChunkEntry]:
        return iter(self._entries)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ChunkMap) and self._entries == other._entries

    def __hash__(self) -> int:
        return hash(self._entries)

    def __repr__(self) -> str:
        return f"ChunkMap({len(self)} chunks, {self.size} bytes)"

    def ids(self) -> set[bytes]:
        return {entry.id for entry in self._entries}

    def serialize(self) -> bytes:
        out = bytearray(_MAGIC)
        put_varint(out, len(self._entries))
        for entry in self._entries:
            put_varint(out, entry.length)
            out += entry.id
        return bytes(out)

    @classmethod
    def deserialize(cls, data: bytes | memoryview) -> ChunkMap:
        """Parse ``serialize()`` output; anything malformed or truncated raises CorruptData."""
        view = memoryview(data)
        if bytes(view[: len(_MAGIC)]) != _MAGIC:
            raise CorruptData("not a chunk map (bad magic or version)")
        count, pos = get_varint(view, len(_MAGIC))
        pieces = []
        for _ in range(count):
            length, pos = get_varint(view, pos)
            if length == 0 or pos + ID_SIZE > len(view):
                raise CorruptData("chunk map truncated or holds an empty chunk")
            pieces.append((length, bytes(view[pos : pos + ID_SIZE])))
            pos += ID_SIZE
        if pos != len(view):
            raise CorruptData(f"chunk map has {len(view) - pos} trailing bytes")
        return cls.from_lengths(pieces)


def put_varint(out: bytearray, value: int) -> None:
    """Append ``value`` (>= 0) as an unsigned LEB128 varint."""
    if value < 0:
        raise ValueError("varints are unsigned")
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def get_varint(view: memoryview, pos: int) -> tuple[int, int]:
    """Read an unsigned LEB128 varint at ``pos``; return it and the position after it."""
    value = 0
    shift = 0
    while True:
        if pos >= len(view):
            raise CorruptData("truncated varint")
        byte = view[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise CorruptData("varint longer than 64 bits")
