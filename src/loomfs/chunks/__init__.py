"""Chunks: the unit of transfer and dedup between sites (core layer, no network).

FastCDC cuts files into content-defined chunks named by BLAKE3 (``cdc``), a ``ChunkMap``
lists them per file version (``chunkmap``), frames carry them raw, zstd-compressed or as
a delta against an older version (``codec``), ``plan`` picks the chunks a receiver lacks,
and ``pipeline`` runs hashing and compression on a thread pool.
"""

from .cdc import DEFAULT_WINDOW, ChunkWindow, chunk_map_of, chunk_map_of_file, iter_chunks
from .chunkmap import ChunkEntry, ChunkMap
from .codec import (
    BytesReference,
    CodecSettings,
    FileReference,
    FrameKind,
    Reference,
    chunk_id,
    decode_frame,
    encode_chunk,
    encode_delta,
    frame_length,
)
from .pipeline import ChunkPipeline
from .plan import ChunkToSend, choose_reference, plan_transfer

__all__ = [
    "DEFAULT_WINDOW",
    "BytesReference",
    "ChunkEntry",
    "ChunkMap",
    "ChunkPipeline",
    "ChunkToSend",
    "ChunkWindow",
    "CodecSettings",
    "FileReference",
    "FrameKind",
    "Reference",
    "choose_reference",
    "chunk_id",
    "chunk_map_of",
    "chunk_map_of_file",
    "decode_frame",
    "encode_chunk",
    "encode_delta",
    "frame_length",
    "iter_chunks",
    "plan_transfer",
]
